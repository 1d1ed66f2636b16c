#include "common/status_macros.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace commd {

absl::StatusCode ErrnoToCode(int err) {
  switch (err) {
    case 0:
      return absl::StatusCode::kOk;
    case EINVAL:
    case ENAMETOOLONG:
    case E2BIG:
    case EBADF:
    case ENOTDIR:
      return absl::StatusCode::kInvalidArgument;
    case ENOENT:
    case ESRCH:
    case ENXIO:
    case ENODEV:
      return absl::StatusCode::kNotFound;
    case EEXIST:
    case EADDRINUSE:
      return absl::StatusCode::kAlreadyExists;
    case EPERM:
    case EACCES:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case EDQUOT:
      return absl::StatusCode::kResourceExhausted;
    case EAGAIN:
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
      return absl::StatusCode::kUnavailable;
    case ETIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case ENOSYS:
    case EOPNOTSUPP:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status ErrnoStatus(int err, absl::string_view what, const char* file, int line) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (file != nullptr) absl::StrAppend(&msg, " [", file, ":", line, "]");
  return absl::Status(ErrnoToCode(err), msg);
}

}  // namespace commd
