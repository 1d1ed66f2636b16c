#include "daemon/server/grpc_connections.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "grpcpp/server_posix.h"

namespace commd::server {
namespace {

// How often connections are checked for peers that stopped reading.
constexpr absl::Duration kSweepInterval = absl::Milliseconds(250);
// Unread bytes queued towards a peer above which it counts as not reading: more than a
// healthy client ever leaves in its socket, less than the socket holds.
constexpr int kStalledBytes = 64 * 1024;

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcConnections>> GrpcConnections::Start(
    GrpcConnectionsOptions options, EventLoop* loop, prometheus::Registry* registry) {
  std::unique_ptr<GrpcConnections> c(new GrpcConnections(std::move(options), loop));
  GrpcConnections* self = c.get();
  AcceptorOptions accept = self->options_.accept;
  accept.type = SOCK_STREAM;
  accept.socket_label = "commd.sock";
  accept.max_connections_field = "transport.max_grpc_connections";
  ASSIGN_OR_RETURN(self->acceptor_,
                   Acceptor::Start(std::move(accept), loop, registry,
                                   [self](UniqueFd conn, const PeerCredentials& peer) {
                                     self->OnAccept(std::move(conn), peer);
                                   }));
  return c;
}

void GrpcConnections::Serve(grpc::Server* server) {
  {
    absl::MutexLock lock(&serve_mu_);
    server_ = server;
  }
  loop_->RunAt(absl::Now() + kSweepInterval, [this] { SweepStalledWriters(); });
}

void GrpcConnections::SweepStalledWriters() {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [fd, c] : connections_) {
      int unread = 0;
      if (::ioctl(c.watch.get(), SIOCOUTQ, &unread) != 0 || unread < kStalledBytes) {
        c.stalled_since = absl::InfiniteFuture();
        continue;
      }
      if (c.stalled_since == absl::InfiniteFuture()) c.stalled_since = now;
      if (now - c.stalled_since >= options_.write_stall_timeout) {
        ::shutdown(c.watch.get(), SHUT_RDWR);
        c.stalled_since = absl::InfiniteFuture();
        acceptor_->CountDropped("not_reading");
      }
    }
  }
  loop_->RunAt(now + kSweepInterval, [this] { SweepStalledWriters(); });
}

void GrpcConnections::Stop() {
  absl::MutexLock lock(&serve_mu_);
  server_ = nullptr;
}

void GrpcConnections::OnAccept(UniqueFd conn, const PeerCredentials& peer) {
  struct stat st {};
  UniqueFd watch(::fcntl(conn.get(), F_DUPFD_CLOEXEC, 0));
  if (!watch.valid() || ::fstat(conn.get(), &st) != 0) {
    acceptor_->CountRefused("fd_limit");
    acceptor_->Closed(peer.uid);
    return;
  }
  const int fd = conn.get();
  const int watch_fd = watch.get();
  uint64_t serial;
  {
    absl::MutexLock lock(&mu_);
    serial = next_serial_++;
    // A number gRPC closed may be handed out again before its hang-up was seen here.
    if (auto old = connections_.find(fd); old != connections_.end()) {
      loop_->Remove(old->second.watch.get());
      acceptor_->Closed(old->second.peer.uid);
      connections_.erase(old);
    }
    connections_[fd] = Connection{std::move(watch), st.st_ino, peer, serial, false};
  }
  if (absl::Status s = loop_->Add(
          watch_fd, [this, fd, serial](uint32_t) { OnHangUp(fd, serial); }, EventLoop::kHangUp);
      !s.ok()) {
    COMMD_LOG(WARNING, "transport") << "cannot watch gRPC connection: " << s;
    OnHangUp(fd, serial);
    return;
  }
  {
    absl::MutexLock lock(&serve_mu_);
    if (server_ == nullptr) {
      OnHangUp(fd, serial);
      return;  // closes `conn`: the server is not (or no longer) serving
    }
    grpc::AddInsecureChannelFromFd(server_, conn.release());
  }
  loop_->RunAt(absl::Now() + options_.session_timeout,
               [this, fd, serial] { CheckSession(fd, serial); });
}

void GrpcConnections::OnHangUp(int fd, uint64_t serial) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.serial != serial) return;
  loop_->Remove(it->second.watch.get());
  acceptor_->Closed(it->second.peer.uid);
  connections_.erase(it);
}

void GrpcConnections::CheckSession(int fd, uint64_t serial) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.serial != serial || it->second.has_session) return;
  // gRPC notices the shutdown, closes its end, and the hang-up releases the entry.
  ::shutdown(it->second.watch.get(), SHUT_RDWR);
  acceptor_->CountDropped("no_session");
}

absl::Status GrpcConnections::Verify(absl::string_view peer, const Session& session) {
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) {
    return absl::UnauthenticatedError(
        absl::StrCat("call from peer '", peer, "', not a connection the daemon accepted"));
  }
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(fd);
  struct stat st {};
  // The inode tells a live connection from a later socket that reuses its fd number.
  if (it == connections_.end() || ::fstat(fd, &st) != 0 || st.st_ino != it->second.inode) {
    return absl::UnauthenticatedError("the call's connection has closed");
  }
  const PeerCredentials& caller = it->second.peer;
  if (caller.pid != session.pid) {
    return absl::UnauthenticatedError(
        absl::StrCat("session token of pid ", session.pid, " (uid ", session.uid,
                     ") presented by pid ", caller.pid, " (uid ", caller.uid,
                     "): a session's token is honoured only from the process that opened it"));
  }
  it->second.has_session = true;
  return absl::OkStatus();
}

}  // namespace commd::server
