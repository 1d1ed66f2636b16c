// Status propagation macros (this Abseil has none) and the errno bridge.
//
//   RETURN_IF_ERROR(DoThing());
//   ASSIGN_OR_RETURN(auto fd, OpenSocket(path));
//   SYS_RETURN_IF_ERROR(fchmod(fd, 0660));   // retries EINTR, keeps file:line and the call
#ifndef COMMD_COMMON_STATUS_MACROS_H_
#define COMMD_COMMON_STATUS_MACROS_H_

#include <cerrno>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace commd {

// Maps an errno value to the closest status code.
absl::StatusCode ErrnoToCode(int err);

// "<what>: <strerror> [file:line]" with the code ErrnoToCode(err) gives.
absl::Status ErrnoStatus(int err, absl::string_view what, const char* file = nullptr, int line = 0);

}  // namespace commd

#define COMMD_CONCAT_INNER_(a, b) a##b
#define COMMD_CONCAT_(a, b) COMMD_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status commd_status_ = (expr);         \
    if (!commd_status_.ok()) return commd_status_; \
  } while (0)

#define COMMD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  COMMD_ASSIGN_OR_RETURN_IMPL_(COMMD_CONCAT_(commd_statusor_, __LINE__), lhs, expr)

// Evaluates a system call that returns -1 and sets errno on failure, retrying on EINTR. The
// value of the call is discarded; use SYS_ASSIGN_OR_RETURN to keep it.
#define SYS_RETURN_IF_ERROR(call)                                                       \
  do {                                                                                  \
    long commd_rc_;                                                                     \
    do {                                                                                \
      commd_rc_ = static_cast<long>(call);                                              \
    } while (commd_rc_ == -1 && errno == EINTR);                                        \
    if (commd_rc_ == -1) return ::commd::ErrnoStatus(errno, #call, __FILE__, __LINE__); \
  } while (0)

#define COMMD_SYS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, call)                        \
  long tmp;                                                                     \
  do {                                                                          \
    tmp = static_cast<long>(call);                                              \
  } while (tmp == -1 && errno == EINTR);                                        \
  if (tmp == -1) return ::commd::ErrnoStatus(errno, #call, __FILE__, __LINE__); \
  lhs = tmp

#define SYS_ASSIGN_OR_RETURN(lhs, call) \
  COMMD_SYS_ASSIGN_OR_RETURN_IMPL_(COMMD_CONCAT_(commd_sysrc_, __LINE__), lhs, call)

#endif  // COMMD_COMMON_STATUS_MACROS_H_
