#include "tests/integration/daemon_process.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "daemon/config/config.h"

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
  ::execv(args[0], args.data());
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

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base != nullptr ? base : "/tmp", "/commd-test-XXXXXX");
  path_ = ::mkdtemp(tmpl.data());
}

TempDir::~TempDir() {
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

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::string& runtime_dir,
                                                                    const Options& options) {
  std::unique_ptr<DaemonProcess> d(new DaemonProcess());
  d->runtime_dir_ = runtime_dir;
  std::vector<std::string> argv = {COMMD_BINARY, "--runtime-dir", runtime_dir, "--metrics-address",
                                   "127.0.0.1:0"};
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  RETURN_IF_ERROR(d->Spawn(argv, options.extra_env));
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

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  ASSIGN_OR_RETURN(config::HostPort hp, config::ParseHostPort(address));
  SYS_ASSIGN_OR_RETURN(int raw, ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  UniqueFd fd(raw);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(hp.port));
  if (::inet_pton(AF_INET, hp.host.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", hp.host));
  }
  SYS_RETURN_IF_ERROR(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)));
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\nConnection: close\r\n\r\n");
  SYS_RETURN_IF_ERROR(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL));
  std::string response;
  char buf[65536];
  for (;;) {
    SYS_ASSIGN_OR_RETURN(ssize_t n, ::recv(fd.get(), buf, sizeof(buf), 0));
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::InternalError(absl::StrCat("not an HTTP response: ", response.substr(0, 200)));
  }
  if (response.find(" 200 ") == std::string::npos || response.find(" 200 ") > body) {
    return absl::InternalError(
        absl::StrCat("HTTP error: ", response.substr(0, response.find('\r'))));
  }
  return response.substr(body + 4);
}

namespace {

const std::regex& LabelRegex() {
  static const std::regex kLabel(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)")re");
  return kLabel;
}

// `a="x"` strings of a label list such as `a="x",b="y"`.
std::set<std::string> LabelsOf(const std::string& text) {
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), LabelRegex());
       it != std::sregex_iterator(); ++it) {
    out.insert(it->str());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(const std::string& text) {
  // name{labels} value [timestamp]; labels re-sorted so lookups need not know the order.
  static const std::regex kSample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$)");
  const std::regex& kLabel = LabelRegex();
  std::map<std::string, double> out;
  for (absl::string_view raw : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string line(raw);
    if (line[0] == '#') {
      if (line.rfind("# HELP ", 0) != 0 && line.rfind("# TYPE ", 0) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("bad comment line: ", line));
      }
      continue;
    }
    std::smatch m;
    if (!std::regex_match(line, m, kSample)) {
      return absl::InvalidArgumentError(absl::StrCat("bad sample line: ", line));
    }
    std::vector<std::string> labels;
    const std::string label_text = m[3];
    for (auto it = std::sregex_iterator(label_text.begin(), label_text.end(), kLabel);
         it != std::sregex_iterator(); ++it) {
      labels.push_back(absl::StrCat((*it)[1].str(), "=\"", (*it)[2].str(), "\""));
    }
    std::sort(labels.begin(), labels.end());
    double value = 0;
    const std::string v = m[4];
    if (v == "+Inf") {
      value = HUGE_VAL;
    } else if (v == "-Inf") {
      value = -HUGE_VAL;
    } else if (v == "NaN") {
      value = NAN;
    } else if (!absl::SimpleAtod(v, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value in: ", line));
    }
    const std::string key = labels.empty()
                                ? m[1].str()
                                : absl::StrCat(m[1].str(), "{", absl::StrJoin(labels, ","), "}");
    out[key] = value;
  }
  return out;
}

double MetricValue(const DaemonProcess& daemon, const std::string& key) {
  auto metrics = Scrape(daemon);
  if (!metrics.ok()) return -1;
  const size_t brace = key.find('{');
  const std::string name = key.substr(0, brace);
  const std::set<std::string> want =
      brace == std::string::npos ? std::set<std::string>{} : LabelsOf(key.substr(brace));
  double sum = 0;
  for (auto it = metrics->lower_bound(name); it != metrics->end(); ++it) {
    const std::string& series = it->first;
    if (series.compare(0, name.size(), name) != 0) break;
    if (series.size() > name.size() && series[name.size()] != '{') continue;  // a longer name
    const std::set<std::string> have = LabelsOf(series.substr(name.size()));
    if (std::includes(have.begin(), have.end(), want.begin(), want.end())) sum += it->second;
  }
  return sum;
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> StartDaemonWithConfig(
    const TempDir& dir, const std::string& config, std::vector<std::string> extra_args) {
  std::ofstream(dir.Join("commd.textproto")) << config << "\n";
  extra_args.insert(extra_args.begin(), {"--config", dir.Join("commd.textproto")});
  return DaemonProcess::Start(dir.Join("run"), {.extra_args = std::move(extra_args)});
}

absl::StatusOr<std::map<std::string, double>> Scrape(const DaemonProcess& daemon) {
  ASSIGN_OR_RETURN(std::string body, HttpGet(daemon.metrics_address(), "/metrics"));
  return ParsePrometheusText(body);
}

}  // namespace commd::testing
