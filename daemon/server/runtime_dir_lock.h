// Exclusive ownership of a runtime directory: one daemon per directory.
//
// Acquire creates the directory (mode 0750, group = the socket group when given), takes an
// flock on commd.lock (released by the kernel when the daemon dies, however it dies), writes
// the daemon's pid into it, and removes sockets a crashed daemon left behind. A second daemon
// on the same directory fails and names the pid holding the lock.
#ifndef COMMD_DAEMON_SERVER_RUNTIME_DIR_LOCK_H_
#define COMMD_DAEMON_SERVER_RUNTIME_DIR_LOCK_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace commd::server {

class RuntimeDirLock {
 public:
  // `gid` of -1 leaves the directory's group alone.
  static absl::StatusOr<std::unique_ptr<RuntimeDirLock>> Acquire(const std::string& dir, gid_t gid);
  // Removes the sockets (not the lock file: unlinking it would race a starting daemon).
  ~RuntimeDirLock();

  const std::string& dir() const { return dir_; }
  std::string grpc_socket() const;
  std::string handle_socket() const;
  // Sets mode 0660 and group `gid_` on a socket created in the directory.
  absl::Status SecureSocket(const std::string& path) const;

 private:
  RuntimeDirLock(std::string dir, gid_t gid, UniqueFd lock)
      : dir_(std::move(dir)), gid_(gid), lock_(std::move(lock)) {}

  std::string dir_;
  gid_t gid_;
  UniqueFd lock_;
};

// Resolves a group name to its gid; empty name gives -1 (no change).
absl::StatusOr<gid_t> LookupGroup(const std::string& name, const char* config_field);

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_RUNTIME_DIR_LOCK_H_
