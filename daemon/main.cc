// commd: wires flags, config, signals and the Daemon together. Logic lives in the classes.
#include <cstdio>

#include "common/log.h"
#include "daemon/config/config.h"
#include "daemon/daemon.h"
#include "daemon/flags.h"
#include "daemon/process.h"
#include "daemon/server/acceptor.h"

int main(int argc, char** argv) {
  auto flags = commd::ParseDaemonFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "commd: %s\nTry 'commd --help'.\n",
                 std::string(flags.status().message()).c_str());
    return 2;
  }
  if (flags->help) return std::fputs(commd::DaemonUsage(), stdout) < 0;
  if (flags->version) return std::printf("commd %s\n", commd::DaemonVersion()) < 0;
  if (flags->print_default_config) {
    const auto text = commd::config::DefaultConfigText();
    return std::fwrite(text.data(), 1, text.size(), stdout) != text.size();
  }
  auto config = commd::ResolveConfig(*flags);
  if (!config.ok()) {
    std::fprintf(stderr, "commd: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  commd::SetMinLogLevel(commd::ToLogSeverity(config->log_level()));
  // Every client costs the daemon a few fds; the usual soft limit of 1024 would cap clients
  // far below the hard limit the administrator set.
  if (auto fds = commd::server::RaiseOpenFileLimit(); fds.ok()) {
    COMMD_LOG(INFO, "daemon") << "open file limit " << *fds;
  } else {
    COMMD_LOG(WARNING, "daemon") << "cannot raise the open file limit: " << fds.status();
  }
  if (auto s = commd::BlockDaemonSignals(); !s.ok()) {
    COMMD_LOG(ERROR, "daemon") << s;
    return 1;
  }
  auto daemon = commd::Daemon::Start(*config);
  if (!daemon.ok()) {
    COMMD_LOG(ERROR, "daemon") << "cannot start: " << daemon.status().message();
    return 1;
  }
  auto reload = [&] {
    auto fresh = commd::ResolveConfig(*flags);
    if (!fresh.ok()) {
      COMMD_LOG(ERROR, "daemon") << "SIGHUP: keeping the current config: " << fresh.status();
      return;
    }
    (*daemon)->Reload(*fresh);
  };
  auto run = commd::RunUntilStopped(**daemon, reload);
  if (!run.ok()) {
    COMMD_LOG(ERROR, "daemon") << run;
    return 1;
  }
  return 0;
}
