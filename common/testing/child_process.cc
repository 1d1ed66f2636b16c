#include "common/testing/child_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace commd::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// fork+exec with stdout/stderr to `log_path`; the child gets its own process group so a
// test can kill whatever it spawns.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log_path,
            const std::vector<std::string>& extra_env) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // Die with the test, even when the test itself is killed (a timeout), so no daemon or
  // client outlives it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::setpgid(0, 0);
  const int out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ::dup2(out, 1);
  ::dup2(out, 2);
  for (const std::string& kv : extra_env) ::putenv(const_cast<char*>(kv.c_str()));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

// Polls waitpid until the child exits or `timeout` passes.
bool WaitExit(pid_t pid, absl::Duration timeout, int* status) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

ProcessResult ToResult(int status, std::string output) {
  ProcessResult r;
  r.output = std::move(output);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

int CountDirEntries(const std::string& path) {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator(path, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

}  // namespace

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base != nullptr ? base : "/tmp", "/", prefix, "-XXXXXX");
  // Left empty when mkdtemp fails (e.g. $TMPDIR missing); users check path().
  if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

ProcessResult RunProcess(const std::vector<std::string>& argv, absl::Duration timeout,
                         const std::vector<std::string>& extra_env) {
  TempDir dir;
  const std::string log = dir.Join("out");
  const pid_t pid = Spawn(argv, log, extra_env);
  int status = 0;
  if (!WaitExit(pid, timeout, &status)) {
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  return ToResult(status, ReadFile(log));
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  std::unique_ptr<ChildProcess> child(new ChildProcess());
  RETURN_IF_ERROR(child->Spawn(argv, extra_env));
  return child;
}

absl::Status ChildProcess::Spawn(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& extra_env) {
  log_path_ = log_dir_.Join("output");
  pid_ = commd::testing::Spawn(argv, log_path_, extra_env);
  if (pid_ < 0) return ErrnoStatus(errno, "fork");
  return absl::OkStatus();
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
}

std::string ChildProcess::Log() const { return ReadFile(log_path_); }

bool ChildProcess::WaitForLog(const std::string& text, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Log().find(text) != std::string::npos) return true;
    int status;
    if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;  // exited; what it printed is all there is
      return Log().find(text) != std::string::npos;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

absl::StatusOr<ProcessResult> ChildProcess::Stop(int sig, absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("process is not running");
  ::kill(pid_, sig);
  return Wait(timeout);
}

absl::StatusOr<ProcessResult> ChildProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("process already reaped");
  int status = 0;
  if (!WaitExit(pid_, timeout, &status)) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return absl::DeadlineExceededError(
        absl::StrCat("process did not exit within ", absl::FormatDuration(timeout)));
  }
  pid_ = -1;
  return ToResult(status, Log());
}

int ChildProcess::CountOpenFds() const {
  return CountDirEntries(absl::StrCat("/proc/", pid_, "/fd"));
}

int ChildProcess::CountMappings() const {
  const std::string maps = ReadFile(absl::StrCat("/proc/", pid_, "/maps"));
  return static_cast<int>(std::count(maps.begin(), maps.end(), '\n'));
}

int ChildProcess::CountMemfds() const {
  std::error_code ec;
  int n = 0;
  const std::string dir = absl::StrCat("/proc/", pid_, "/fd");
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code link_ec;
    const auto target = std::filesystem::read_symlink(it->path(), link_ec);
    if (!link_ec && target.string().rfind("/memfd:", 0) == 0) ++n;
  }
  return n;
}

int ChildProcess::CountMemfdMappings() const {
  int n = 0;
  for (absl::string_view line :
       absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid_, "/maps")), '\n')) {
    if (absl::StrContains(line, "/memfd:")) ++n;
  }
  return n;
}

long ChildProcess::RssKib() const {
  for (absl::string_view line :
       absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid_, "/status")), '\n')) {
    if (absl::ConsumePrefix(&line, "VmRSS:")) {
      long kib = 0;
      line = absl::StripSuffix(absl::StripAsciiWhitespace(line), "kB");
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib)) return kib;
    }
  }
  return -1;
}

std::string DaemonProcess::DefaultBinary() { return COMMD_BINARY; }

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::string& runtime_dir,
                                                                    const Options& options) {
  std::unique_ptr<DaemonProcess> d(new DaemonProcess());
  d->runtime_dir_ = runtime_dir;
  const std::string binary = options.binary.empty() ? DefaultBinary() : options.binary;
  std::vector<std::string> argv = {binary, "--runtime-dir", runtime_dir, "--metrics-address",
                                   "127.0.0.1:0"};
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  // Dumps a test does not direct elsewhere go beside the runtime dir (the test's temporary
  // dir), never into the machine's default (/var/lib/commd/dumps as root).
  std::vector<std::string> env = options.extra_env;
  if (std::none_of(env.begin(), env.end(),
                   [](const std::string& e) { return e.rfind("STATE_DIRECTORY=", 0) == 0; })) {
    env.push_back("STATE_DIRECTORY=" +
                  std::filesystem::path(runtime_dir).parent_path().append("state").string());
  }
  RETURN_IF_ERROR(d->Spawn(argv, env));
  if (!options.wait_ready) return d;
  if (!d->WaitForLog("commd ready", absl::Seconds(30))) {
    return absl::DeadlineExceededError(absl::StrCat("commd did not get ready: ", d->Log()));
  }
  static const std::regex kMetrics(R"(metrics http://([^/ ]+)/metrics)");
  std::smatch m;
  const std::string log = d->Log();
  if (!std::regex_search(log, m, kMetrics)) {
    return absl::InternalError(absl::StrCat("no metrics address in the log: ", log));
  }
  d->metrics_address_ = m[1];
  return d;
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> StartDaemonWithConfig(
    const TempDir& dir, const std::string& config, std::vector<std::string> extra_args,
    const std::string& binary) {
  std::ofstream(dir.Join("commd.textproto")) << config << "\n";
  extra_args.insert(extra_args.begin(), {"--config", dir.Join("commd.textproto")});
  return DaemonProcess::Start(dir.Join("run"),
                              {.extra_args = std::move(extra_args), .binary = binary});
}

}  // namespace commd::testing
