// The daemon as a process: start, refuse, stop, reload, and every bad start-up input.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "daemon/config/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(DaemonLifecycleTest, ServesWithSecureSocketsAndStopsCleanlyOnSigterm) {
  TempDir tmp;
  const std::string dir = tmp.Join("run");
  auto daemon = DaemonProcess::Start(dir);
  ASSERT_TRUE(daemon.ok()) << daemon.status();

  EXPECT_EQ(ModeOf(dir) & 07777, 0750u);
  EXPECT_TRUE(S_ISSOCK(ModeOf(dir + "/commd.sock")));
  EXPECT_EQ(ModeOf(dir + "/commd.sock") & 0777, 0660u);
  EXPECT_TRUE(S_ISSOCK(ModeOf(dir + "/handles.sock")));
  EXPECT_EQ(ModeOf(dir + "/handles.sock") & 0777, 0660u);
  std::ifstream lock(dir + "/commd.lock");
  pid_t holder = 0;
  lock >> holder;
  EXPECT_EQ(holder, (*daemon)->pid());

  // Log lines carry time, level and component.
  EXPECT_THAT((*daemon)->Log(),
              ::testing::ContainsRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-"
                                       "9]{3}Z INFO daemon: commd ready"));

  auto stopped = (*daemon)->Stop(SIGTERM, absl::Seconds(5));
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->exit_code, 0) << stopped->output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/commd.sock"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/handles.sock"));
  EXPECT_THAT(stopped->output, HasSubstr("stopped"));
}

// Reads datagrams from `fd` until `done` says so or 10 s pass; returns them joined.
std::string ReadNotifications(int fd, const std::function<bool(const std::string&)>& done) {
  std::string all;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done(all) && absl::Now() < deadline) {
    char buf[4096];
    const timeval tv{0, 100000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) all.append(buf, static_cast<size_t>(n)).append("\n");
  }
  return all;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(DaemonLifecycleTest, SpeaksSystemdNotifyAndJournalFormat) {
  TempDir tmp;
  const std::string notify_path = tmp.Join("notify.sock");
  const int notify = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", notify_path.c_str());
  ASSERT_EQ(::bind(notify, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);

  auto daemon = DaemonProcess::Start(
      tmp.Join("run"), {.extra_env = {"NOTIFY_SOCKET=" + notify_path, "WATCHDOG_USEC=200000",
                                      "JOURNAL_STREAM=8:12345"}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string running =
      ReadNotifications(notify, [](const std::string& s) { return Count(s, "WATCHDOG=1") >= 3; });
  EXPECT_THAT(running, HasSubstr("READY=1"));
  EXPECT_THAT(running, HasSubstr("STATUS=serving on " + tmp.Join("run")));
  EXPECT_GE(Count(running, "WATCHDOG=1"), 3);
  EXPECT_LT(running.find("READY=1"), running.find("WATCHDOG=1"));

  ASSERT_TRUE((*daemon)->Stop().ok());
  const std::string stopping = ReadNotifications(
      notify, [](const std::string& s) { return s.find("STOPPING=1") != std::string::npos; });
  EXPECT_THAT(stopping, HasSubstr("STOPPING=1"));
  ::close(notify);

  // Under the journal each line carries its syslog priority and no timestamp of its own, and
  // the CUDA situation is said exactly once.
  const std::string log = (*daemon)->Log();
  EXPECT_THAT(log, HasSubstr("<6>INFO daemon: commd ready"));
  EXPECT_THAT(log, ::testing::Not(::testing::ContainsRegex("^[0-9]{4}-")));
  EXPECT_EQ(Count(log, " cuda: "), 1) << log;
}

TEST(DaemonLifecycleTest, SecondDaemonOnSameDirRefusesAndNamesTheHolder) {
  TempDir tmp;
  const std::string dir = tmp.Join("run");
  auto first = DaemonProcess::Start(dir);
  ASSERT_TRUE(first.ok()) << first.status();

  ProcessResult r =
      RunProcess({COMMD_BINARY, "--runtime-dir", dir, "--metrics-address", "127.0.0.1:0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat("another commd (pid ", (*first)->pid(), ")")));
  EXPECT_THAT(r.output, HasSubstr(dir + "/commd.lock"));

  // The first daemon still serves.
  ClientOptions copts;
  copts.runtime_dir = dir;
  auto client = Client::Connect(copts);
  ASSERT_TRUE(client.ok()) << client.status();
  auto status = (*client)->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->pid(), (*first)->pid());
}

TEST(DaemonLifecycleTest, StaleSocketsOfACrashedDaemonAreReplaced) {
  TempDir tmp;
  const std::string dir = tmp.Join("run");
  {
    auto crashed = DaemonProcess::Start(dir);
    ASSERT_TRUE(crashed.ok()) << crashed.status();
    ASSERT_TRUE((*crashed)->Stop(SIGKILL).ok());
  }
  ASSERT_TRUE(std::filesystem::exists(dir + "/commd.sock"));  // left behind by SIGKILL
  auto restarted = DaemonProcess::Start(dir);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_THAT((*restarted)->Log(), HasSubstr("removed stale socket " + dir + "/commd.sock"));
  ClientOptions copts;
  copts.runtime_dir = dir;
  auto client = Client::Connect(copts);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->GetStatus().ok());
}

TEST(DaemonLifecycleTest, SighupReloadsTheLogLevel) {
  TempDir tmp;
  const std::string config = tmp.Join("commd.textproto");
  WriteFile(config, "log_level: WARNING\n");
  auto daemon = DaemonProcess::Start(tmp.Join("run"), {.extra_args = {"--config", config}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  // At WARNING, the session line (INFO) is not written.
  ClientOptions copts;
  copts.runtime_dir = tmp.Join("run");
  { ASSERT_TRUE(Client::Connect(copts).ok()); }
  EXPECT_THAT((*daemon)->Log(), ::testing::Not(HasSubstr("session opened")));

  WriteFile(config, "log_level: INFO\n");
  ::kill((*daemon)->pid(), SIGHUP);
  ASSERT_TRUE((*daemon)->WaitForLog("reloaded: log level INFO", absl::Seconds(10)));
  { ASSERT_TRUE(Client::Connect(copts).ok()); }
  EXPECT_TRUE((*daemon)->WaitForLog("session opened", absl::Seconds(10)));

  // A broken file on reload keeps the running config and says why.
  WriteFile(config, "log_level: LOUD\n");
  ::kill((*daemon)->pid(), SIGHUP);
  EXPECT_TRUE((*daemon)->WaitForLog("SIGHUP: keeping the current config", absl::Seconds(10)));
  auto stopped = (*daemon)->Stop();
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->exit_code, 0);
}

TEST(DaemonLifecycleTest, HelpVersionAndDefaultConfig) {
  ProcessResult help = RunProcess({COMMD_BINARY, "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("--runtime-dir DIR"));
  EXPECT_THAT(help.output, HasSubstr("--print-default-config"));
  ProcessResult version = RunProcess({COMMD_BINARY, "--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_THAT(version.output, ::testing::MatchesRegex("commd [0-9]+\\.[0-9]+\\.[0-9]+\n"));
  ProcessResult defaults = RunProcess({COMMD_BINARY, "--print-default-config"});
  EXPECT_EQ(defaults.exit_code, 0);
  auto parsed = config::ParseConfig(defaults.output, "printed");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->SerializeAsString(), config::DefaultConfig().SerializeAsString());
}

struct BadStart {
  std::string name;
  std::vector<std::string> args;  // {CONFIG} is replaced by a file holding `config`
  std::string config;
  int exit_code;
  std::vector<std::string> output_parts;
};

class BadStartTest : public ::testing::TestWithParam<BadStart> {};

TEST_P(BadStartTest, ExitsNonZeroWithTheReason) {
  TempDir tmp;
  const std::string config = tmp.Join("bad.textproto");
  WriteFile(config, GetParam().config);
  std::vector<std::string> argv = {COMMD_BINARY, "--runtime-dir", tmp.Join("run")};
  for (const std::string& a : GetParam().args) argv.push_back(a == "{CONFIG}" ? config : a);
  if (std::find(argv.begin(), argv.end(), "--metrics-address") == argv.end()) {
    argv.insert(argv.end(), {"--metrics-address", "127.0.0.1:0"});
  }
  ProcessResult r = RunProcess(argv);
  EXPECT_EQ(r.exit_code, GetParam().exit_code) << r.output;
  for (std::string part : GetParam().output_parts) {
    if (part.rfind("{CONFIG}", 0) == 0) part = config + part.substr(8);
    EXPECT_THAT(r.output, HasSubstr(part));
  }
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("commd ready")));
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, BadStartTest,
    ::testing::Values(
        BadStart{"UnknownField",
                 {"--config", "{CONFIG}"},
                 "log_level: INFO\nruntime_dri: \"/x\"\n",
                 1,
                 {"{CONFIG}:2", "runtime_dri"}},
        BadStart{"WrongType",
                 {"--config", "{CONFIG}"},
                 "limits {\n  max_sessions: \"lots\"\n}\n",
                 1,
                 {"{CONFIG}:2", "max_sessions"}},
        BadStart{"OutOfRange",
                 {"--config", "{CONFIG}"},
                 "limits { max_message_bytes: 1 }\n",
                 1,
                 {"{CONFIG}:1", "limits.max_message_bytes = 1", "allowed 4096 to 268435456"}},
        BadStart{"MissingConfig",
                 {"--config", "/nonexistent/commd.textproto"},
                 "",
                 1,
                 {"/nonexistent/commd.textproto"}},
        BadStart{"BadLogLevelFlag",
                 {"--log-level", "chatty"},
                 "",
                 1,
                 {"--log-level 'chatty'", "debug, info, warning, error"}},
        BadStart{"BadMetricsFlag",
                 {"--metrics-address", "nohost"},
                 "",
                 1,
                 {"--metrics-address", "HOST:PORT"}},
        BadStart{"NodeNameWithoutACluster",
                 {"--node-name", "gpu-node-7"},
                 "",
                 1,
                 {"--node-name names this node in a cluster: the config has no cluster section"}},
        BadStart{"BadNodeNameFlag",
                 {"--config", "{CONFIG}", "--node-name", "gpu node/7"},
                 "cluster { etcd_endpoints: \"127.0.0.1:1\" }\n",
                 1,
                 {"--node-name \"gpu node/7\" must be 1 to 128 of letters, digits and . _ - :"}},
        BadStart{"UnknownFlag",
                 {"--frobnicate"},
                 "",
                 2,
                 {"unknown argument '--frobnicate'", "commd --help"}},
        BadStart{"FlagWithoutValue", {"--config"}, "", 2, {"--config needs a value"}}),
    [](const auto& info) { return info.param.name; });

TEST(DaemonLifecycleTest, MetricsAddressInUseIsReported) {
  // Hold a port, then ask the daemon for it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(sa.sin_port));
  TempDir tmp;
  ProcessResult r =
      RunProcess({COMMD_BINARY, "--runtime-dir", tmp.Join("run"), "--metrics-address", address});
  ::close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cannot serve metrics on " + address));
  // Nothing is left behind that would block the next start.
  EXPECT_FALSE(std::filesystem::exists(tmp.Join("run/commd.sock")));
}

TEST(DaemonLifecycleTest, UnusableRuntimeDirIsReported) {
  TempDir tmp;
  WriteFile(tmp.Join("file"), "not a directory");
  ProcessResult r = RunProcess(
      {COMMD_BINARY, "--runtime-dir", tmp.Join("file/run"), "--metrics-address", "127.0.0.1:0"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cannot create runtime dir " + tmp.Join("file/run")));

  if (::geteuid() != 0) {
    // Root may write anywhere; for everyone else a read-only parent is refused too.
    ASSERT_EQ(::mkdir(tmp.Join("ro").c_str(), 0500), 0);
    r = RunProcess(
        {COMMD_BINARY, "--runtime-dir", tmp.Join("ro/run"), "--metrics-address", "127.0.0.1:0"});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr("Permission denied"));
  }
}

}  // namespace
}  // namespace commd::testing
