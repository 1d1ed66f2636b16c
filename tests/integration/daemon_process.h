// Test support: the real commd binary started on a temporary runtime dir, and the small
// tools tests use to look at it from outside (an HTTP scrape, /proc counts, child processes).
#ifndef COMMD_TESTS_INTEGRATION_DAEMON_PROCESS_H_
#define COMMD_TESTS_INTEGRATION_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace commd::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr together
};

// Runs `argv` to completion (killed after `timeout`), capturing its output.
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(30),
                         const std::vector<std::string>& extra_env = {});

// A process started for a test, its stdout and stderr captured in a file. Killed (SIGKILL)
// on destruction if still running, and with the test process if that dies first.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {});
  virtual ~ChildProcess();

  pid_t pid() const { return pid_; }
  std::string Log() const;  // everything it printed so far
  // Waits until its output contains `text` (false on timeout or exit without it).
  bool WaitForLog(const std::string& text, absl::Duration timeout) const;
  // Sends `sig` and waits up to `timeout` for the exit; DEADLINE_EXCEEDED (after a SIGKILL)
  // if it does not exit in time.
  absl::StatusOr<ProcessResult> Stop(int sig = 15, absl::Duration timeout = absl::Seconds(10));
  // Waits for an exit that is under way.
  absl::StatusOr<ProcessResult> Wait(absl::Duration timeout);

  int CountOpenFds() const;
  int CountMappings() const;
  // Shared memory the process holds: open memfds, and mappings of memfds.
  int CountMemfds() const;
  int CountMemfdMappings() const;
  long RssKib() const;

 protected:
  ChildProcess() = default;
  absl::Status Spawn(const std::vector<std::string>& argv,
                     const std::vector<std::string>& extra_env);

 private:
  mutable pid_t pid_ = -1;
  std::string log_path_;
  TempDir log_dir_;
};

// The real commd binary on a runtime dir of the test's.
class DaemonProcess : public ChildProcess {
 public:
  struct Options {
    std::vector<std::string> extra_args;
    std::vector<std::string> extra_env;  // "NAME=value"
    bool wait_ready = true;
  };

  // Starts commd with --runtime-dir <dir> --metrics-address 127.0.0.1:0 plus `extra_args`
  // and waits for "commd ready" (or its exit).
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::string& runtime_dir,
                                                              const Options& options);
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::string& runtime_dir) {
    return Start(runtime_dir, Options{});
  }

  const std::string& runtime_dir() const { return runtime_dir_; }
  const std::string& metrics_address() const { return metrics_address_; }

 private:
  std::string runtime_dir_;
  std::string metrics_address_;
};

// GET http://<address><path>; returns the body of a 200 answer.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path);

// Prometheus text exposition, parsed: "name{a=\"x\",b=\"y\"}" (labels sorted) -> value.
// Fails on a line that is not valid exposition format.
absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(const std::string& text);

// Scrape + parse.
absl::StatusOr<std::map<std::string, double>> Scrape(const DaemonProcess& daemon);

// The sum of the samples of metric `x` that carry every label `key` names, as PromQL's
// sum(x{a="1"}) would give: `x{a="1",b="2"}` is one series, `x{a="1"}` adds up every `b`, `x`
// every series. 0 when none matches, -1 when the scrape failed.
double MetricValue(const DaemonProcess& daemon, const std::string& key);

// Writes `config` to <dir>/commd.textproto and starts the daemon on <dir>/run with it.
absl::StatusOr<std::unique_ptr<DaemonProcess>> StartDaemonWithConfig(
    const TempDir& dir, const std::string& config, std::vector<std::string> extra_args = {});

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_DAEMON_PROCESS_H_
