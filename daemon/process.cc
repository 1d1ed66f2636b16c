#include "daemon/process.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <systemd/sd-daemon.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"

namespace commd {
namespace {

sigset_t DaemonSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&set, sig);
  return set;
}

// Milliseconds between WATCHDOG=1 pings: half of what systemd asked for, or -1 for none.
int WatchdogIntervalMs() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return -1;
  return static_cast<int>(usec / 2000);
}

}  // namespace

absl::Status BlockDaemonSignals() {
  sigset_t set = DaemonSignals();
  if (int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0) {
    return ErrnoStatus(rc, "pthread_sigmask");
  }
  return absl::OkStatus();
}

absl::Status RunUntilStopped(Daemon& daemon, const std::function<void()>& reload) {
  sigset_t set = DaemonSignals();
  SYS_ASSIGN_OR_RETURN(int raw, ::signalfd(-1, &set, SFD_CLOEXEC));
  UniqueFd sfd(raw);
  const int watchdog_ms = WatchdogIntervalMs();
  sd_notifyf(0, "READY=1\nSTATUS=serving on %s, metrics on %s", daemon.runtime_dir().c_str(),
             daemon.metrics_address().c_str());
  COMMD_LOG_ALWAYS("daemon") << "commd ready: runtime dir " << daemon.runtime_dir()
                             << ", metrics http://" << daemon.metrics_address() << "/metrics";
  for (;;) {
    pollfd p{sfd.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, watchdog_ms);
    if (watchdog_ms > 0) sd_notify(0, "WATCHDOG=1");
    if (n <= 0) continue;
    signalfd_siginfo info{};
    if (::read(sfd.get(), &info, sizeof(info)) != sizeof(info)) continue;
    switch (info.ssi_signo) {
      case SIGHUP:
        reload();
        break;
      case SIGUSR1:
        daemon.DumpAll("signal");
        break;
      default:
        COMMD_LOG_ALWAYS("daemon")
            << "signal " << info.ssi_signo << " from pid " << info.ssi_pid << ": stopping";
        sd_notify(0, "STOPPING=1");
        daemon.Shutdown();
        COMMD_LOG_ALWAYS("daemon") << "stopped";
        return absl::OkStatus();
    }
  }
}

}  // namespace commd
