#include "daemon/server/runtime_dir_lock.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/runtime_dir.h"
#include "common/status_macros.h"

namespace commd::server {
namespace {

absl::Status PrepareDirectory(const std::string& dir, gid_t gid) {
  std::error_code ec;
  const std::filesystem::path path(dir);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("cannot create runtime dir ", dir));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("runtime dir ", dir, " is not a directory"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat("runtime dir ", dir, " belongs to uid ",
                                                    st.st_uid, ", not to this daemon's uid ",
                                                    ::geteuid()));
  }
  if ((st.st_mode & 07777) != 0750 && ::chmod(dir.c_str(), 0750) != 0) {
    return ErrnoStatus(errno, absl::StrCat("chmod 0750 ", dir));
  }
  if (gid != static_cast<gid_t>(-1) && ::chown(dir.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return ErrnoStatus(errno, absl::StrCat("chown ", dir, " to group ", gid));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return ErrnoStatus(errno, absl::StrCat("runtime dir ", dir, " is not writable"));
  }
  return absl::OkStatus();
}

std::string ReadHolder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  int pid = 0;
  if (n > 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)), &pid)) {
    return absl::StrCat("pid ", pid);
  }
  return "unknown pid";
}

}  // namespace

absl::StatusOr<gid_t> LookupGroup(const std::string& name, const char* config_field) {
  if (name.empty()) return static_cast<gid_t>(-1);
  struct group* g = ::getgrnam(name.c_str());
  if (g == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("group '", name, "' does not exist (", config_field, ")"));
  }
  return g->gr_gid;
}

absl::StatusOr<std::unique_ptr<RuntimeDirLock>> RuntimeDirLock::Acquire(const std::string& dir,
                                                                        gid_t gid) {
  RETURN_IF_ERROR(PrepareDirectory(dir, gid));
  const std::string lock_path = absl::StrCat(dir, "/", kLockFileName);
  const int raw = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (raw < 0) return ErrnoStatus(errno, absl::StrCat("cannot open lock file ", lock_path));
  UniqueFd lock(raw);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat("another commd (", ReadHolder(lock.get()),
                                                        ") is running on ", dir, "; it holds ",
                                                        lock_path));
    }
    return ErrnoStatus(errno, absl::StrCat("flock ", lock_path));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  SYS_RETURN_IF_ERROR(::ftruncate(lock.get(), 0));
  SYS_RETURN_IF_ERROR(::pwrite(lock.get(), pid.data(), pid.size(), 0));
  std::unique_ptr<RuntimeDirLock> out(new RuntimeDirLock(dir, gid, std::move(lock)));
  // We hold the lock, so any socket here belongs to a daemon that died without cleaning up.
  for (const std::string& stale : {out->grpc_socket(), out->handle_socket()}) {
    if (::unlink(stale.c_str()) == 0) {
      COMMD_LOG(INFO, "runtime_dir") << "removed stale socket " << stale;
    }
  }
  return out;
}

RuntimeDirLock::~RuntimeDirLock() {
  ::unlink(grpc_socket().c_str());
  ::unlink(handle_socket().c_str());
}

std::string RuntimeDirLock::grpc_socket() const { return absl::StrCat(dir_, "/", kGrpcSocketName); }
std::string RuntimeDirLock::handle_socket() const {
  return absl::StrCat(dir_, "/", kHandleSocketName);
}

absl::Status RuntimeDirLock::SecureSocket(const std::string& path) const {
  SYS_RETURN_IF_ERROR(::chmod(path.c_str(), 0660));
  if (gid_ != static_cast<gid_t>(-1)) {
    SYS_RETURN_IF_ERROR(::chown(path.c_str(), static_cast<uid_t>(-1), gid_));
  }
  return absl::OkStatus();
}

}  // namespace commd::server
