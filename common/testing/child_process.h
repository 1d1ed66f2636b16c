// Processes started and watched from outside: the real commd binary on a runtime dir of the
// caller's, any other child with its output captured, and the temporary directories they
// use. The integration tests (tests/integration/daemon_process.h adds the metrics scrape)
// and commd-bench (its private daemon) share this one launcher.
//
//   commd::testing::TempDir dir;                       // removed with its contents
//   ASSIGN_OR_RETURN(auto daemon, DaemonProcess::Start(dir.Join("run")));
//   ... connect to daemon->runtime_dir() ...
//   ASSIGN_OR_RETURN(ProcessResult r, daemon->Stop());  // SIGTERM, then its exit
//
// Children die with the process that started them (PR_SET_PDEATHSIG), so none outlives a
// killed test or benchmark. Not thread-safe: one thread drives each object.
#ifndef COMMD_COMMON_TESTING_CHILD_PROCESS_H_
#define COMMD_COMMON_TESTING_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace commd::testing {

// A fresh directory under $TMPDIR (or /tmp) named <prefix>-XXXXXX, removed with its
// contents (std::filesystem::remove_all) on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "commd-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
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

// Runs `argv` to completion (killed after `timeout`), capturing its output. argv[0] without
// a '/' is looked up in $PATH.
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(30),
                         const std::vector<std::string>& extra_env = {});

// A process started in its own process group, its stdout and stderr captured in a file.
// Killed (SIGKILL) on destruction if still running, and with its parent if that dies first.
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

// The real commd binary on a runtime dir of the caller's.
class DaemonProcess : public ChildProcess {
 public:
  struct Options {
    std::vector<std::string> extra_args;
    std::vector<std::string> extra_env;  // "NAME=value"
    bool wait_ready = true;
    std::string binary;  // empty: DefaultBinary()
  };

  // The commd this library was built with (the build tree's, or the Bazel runfiles path).
  static std::string DefaultBinary();

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

// Writes `config` (textproto) to <dir>/commd.textproto and starts the daemon on <dir>/run
// with it; `binary` as in DaemonProcess::Options.
absl::StatusOr<std::unique_ptr<DaemonProcess>> StartDaemonWithConfig(
    const TempDir& dir, const std::string& config, std::vector<std::string> extra_args = {},
    const std::string& binary = "");

}  // namespace commd::testing

#endif  // COMMD_COMMON_TESTING_CHILD_PROCESS_H_
