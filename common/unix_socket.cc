#include "common/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace commd {
namespace {

absl::StatusOr<sockaddr_un> MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' has length ",
                                                   path.size(), "; allowed 1 to ",
                                                   sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, mode_t mode) {
  ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddress(path));
  SYS_ASSIGN_OR_RETURN(int raw, ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  UniqueFd fd(raw);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind ", path));
  }
  SYS_RETURN_IF_ERROR(::chmod(path.c_str(), mode));
  SYS_RETURN_IF_ERROR(::listen(fd.get(), SOMAXCONN));
  return fd;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path, int type) {
  ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddress(path));
  SYS_ASSIGN_OR_RETURN(int raw, ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  UniqueFd fd(raw);
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == ENOENT || err == ECONNREFUSED) {
      return absl::UnavailableError(
          absl::StrCat("no commd listening on ", path, " (", std::strerror(err), ")"));
    }
    return ErrnoStatus(err, absl::StrCat("connect ", path));
  }
  return fd;
}

absl::Status SendMessage(int sock, absl::string_view bytes, std::span<const int> fds) {
  if (fds.size() > static_cast<size_t>(kMaxFdsPerMessage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("message carries ", fds.size(), " fds; allowed at most ", kMaxFdsPerMessage));
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  if (!fds.empty()) {
    const size_t payload = sizeof(int) * fds.size();
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(payload);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(payload);
    std::memcpy(CMSG_DATA(cmsg), fds.data(), payload);
  }
  SYS_ASSIGN_OR_RETURN(ssize_t sent, ::sendmsg(sock, &msg, MSG_NOSIGNAL));
  if (static_cast<size_t>(sent) != bytes.size()) {
    return absl::UnavailableError(
        absl::StrCat("short send: ", sent, " of ", bytes.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ReceivedMessage>> ReceiveMessage(int sock, size_t max_bytes) {
  ReceivedMessage out;
  out.bytes.resize(max_bytes);
  iovec iov{out.bytes.data(), out.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN) return std::nullopt;
    return ErrnoStatus(errno, "recvmsg");
  }
  // Take ownership of every fd before any early return, so none leaks.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if (n == 0 && out.fds.empty()) return absl::UnavailableError("connection closed by peer");
  out.truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  out.bytes.resize(static_cast<size_t>(n));
  return out;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  SYS_RETURN_IF_ERROR(::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len));
  PeerCredentials out{cred.pid, cred.uid, cred.gid, {}};
  // Group membership is usually supplementary, so the primary gid alone would miss it.
  out.groups.resize(64);
  socklen_t glen = static_cast<socklen_t>(out.groups.size() * sizeof(gid_t));
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, out.groups.data(), &glen) != 0 &&
      errno == ERANGE) {
    out.groups.resize(glen / sizeof(gid_t));
    SYS_RETURN_IF_ERROR(::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, out.groups.data(), &glen));
  }
  out.groups.resize(glen / sizeof(gid_t));
  return out;
}

}  // namespace commd
