#include "daemon/server/process_exit.h"

#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace commd::server {
namespace {

// From linux/pidfd.h (6.15+), which the build machine's headers may predate. Only the first
// version of the struct (64 bytes) is asked for; the kernel takes the size from the ioctl.
struct PidfdInfo {
  uint64_t mask;
  uint64_t cgroupid;
  uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code;
};
static_assert(sizeof(PidfdInfo) == 64);  // PIDFD_INFO_SIZE_VER0
constexpr uint64_t kPidfdInfoExit = 1ull << 3;
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfo);

// The status the kernel kept for a reaped process; none before it is reaped (or on an older
// kernel).
std::optional<int> FromPidfd(int pidfd) {
  PidfdInfo info{};
  info.mask = kPidfdInfoExit;
  if (::ioctl(pidfd, kPidfdGetInfo, &info) != 0 || (info.mask & kPidfdInfoExit) == 0) {
    return std::nullopt;
  }
  return info.exit_code;
}

// A zombie's exit_code (field 52 of /proc/<pid>/stat, counted from 1); none unless the
// process is a zombie.
std::optional<int> FromProcStat(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  // The command name (field 2) is in parentheses and may hold anything, spaces too.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipWhitespace());
  // fields[0] is field 3 (state); field 52 is fields[49].
  int code = 0;
  if (fields.size() < 50 || fields[0] != "Z" || !absl::SimpleAtoi(fields[49], &code)) {
    return std::nullopt;
  }
  return code;
}

}  // namespace

bool ProcessExit::clean() const {
  return known && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

std::string ProcessExit::ToString() const {
  if (!known) return "exited, status unknown";
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* name = ::sigabbrev_np(sig);
    return absl::StrCat("killed by ",
                        name != nullptr ? absl::StrCat("SIG", name) : absl::StrCat("signal ", sig),
                        WCOREDUMP(wait_status) ? " (core dumped)" : "");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

ProcessExit ReadProcessExit(int pidfd, pid_t pid) {
  if (auto status = FromPidfd(pidfd)) return {.known = true, .wait_status = *status};
  const std::optional<int> zombie = FromProcStat(pid);
  // Reaped in between: /proc may already show another process under the same pid.
  if (auto status = FromPidfd(pidfd)) return {.known = true, .wait_status = *status};
  if (zombie) return {.known = true, .wait_status = *zombie};
  return {};
}

}  // namespace commd::server
