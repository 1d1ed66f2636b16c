// The gRPC socket (commd.sock), accepted by the daemon itself rather than by gRPC, so that
// every gRPC connection has kernel-verified credentials and can be held to account:
//
// - The Acceptor caps connections node-wide and per uid and never spins on a full fd table.
// - Each accepted socket goes to gRPC with grpc::AddInsecureChannelFromFd, under which gRPC
//   names the call's peer "fd:<N>" (N the socket's fd in the daemon). The daemon keeps the
//   peer's SO_PEERCRED and the socket's inode for N, so a handler can tell which process a
//   call came from: a session token is honoured only on connections of the process that
//   opened the session (Verify). A copied token is useless to any other process.
// - A connection that carries no call with a valid session within the session timeout is
//   shut down, and so is one whose peer leaves the daemon's writes unread for the write
//   stall timeout. Both go through a duplicate of the connection's fd that the daemon
//   keeps: gRPC itself (1.51) defers closing a connection until its pending writes finish,
//   which never happens when the peer does not read, while it goes on reading and
//   answering PINGs from the daemon's memory. The duplicate also tells when the connection
//   ended, to release its count.
//
//   ASSIGN_OR_RETURN(auto conns, GrpcConnections::Start(options, loop, registry));
//   conns->Serve(server.get());            // after BuildAndStart
//   RETURN_IF_ERROR(conns->Verify(ctx->peer(), session));   // in every handler
//   conns->Stop();                         // before the server shuts down
//
// Thread-safe.
#ifndef COMMD_DAEMON_SERVER_GRPC_CONNECTIONS_H_
#define COMMD_DAEMON_SERVER_GRPC_CONNECTIONS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "daemon/server/acceptor.h"
#include "daemon/server/event_loop.h"
#include "daemon/server/sessions.h"
#include "grpcpp/server.h"

namespace commd::server {

struct GrpcConnectionsOptions {
  // Path, caps (transport.max_grpc_connections, limits.per_uid.fd_connections) and
  // back-off; the rest is filled in here.
  AcceptorOptions accept;
  absl::Duration session_timeout = absl::Seconds(10);  // transport.session_timeout_ms
  // A connection whose peer leaves the daemon's answers unread this long is shut down
  // (transport.write_stall_timeout_ms).
  absl::Duration write_stall_timeout = absl::Seconds(5);
};

class GrpcConnections {
 public:
  // Listens on options.accept.path (mode 0660) but accepts nothing until Serve. `loop` and
  // `registry` must outlive this object; the loop must be stopped before it is destroyed.
  static absl::StatusOr<std::unique_ptr<GrpcConnections>> Start(GrpcConnectionsOptions options,
                                                                EventLoop* loop,
                                                                prometheus::Registry* registry);

  // Hands every connection accepted from now on to `server` (started, not shut down).
  void Serve(grpc::Server* server);
  // Stops handing connections to the server (call before shutting it down); later ones are
  // closed at once.
  void Stop();

  // OK when the call whose peer gRPC names `peer` came from the process that opened
  // `session`; marks that connection as carrying a session. UNAUTHENTICATED otherwise.
  absl::Status Verify(absl::string_view peer, const Session& session);

 private:
  struct Connection {
    UniqueFd watch;  // a duplicate of gRPC's fd: to shut the socket down and see it end
    ino_t inode = 0;
    PeerCredentials peer;
    uint64_t serial = 0;
    bool has_session = false;
    absl::Time stalled_since = absl::InfiniteFuture();  // when its unread answers piled up
  };

  GrpcConnections(GrpcConnectionsOptions options, EventLoop* loop)
      : options_(std::move(options)), loop_(loop) {}
  void OnAccept(UniqueFd conn, const PeerCredentials& peer);
  void OnHangUp(int fd, uint64_t serial);
  void CheckSession(int fd, uint64_t serial);
  // Shuts down connections whose peers stopped reading; reschedules itself.
  void SweepStalledWriters();

  const GrpcConnectionsOptions options_;
  EventLoop* const loop_;
  std::unique_ptr<Acceptor> acceptor_;
  // Held while a connection is handed to the server, so Stop waits for that to finish.
  absl::Mutex serve_mu_;
  grpc::Server* server_ ABSL_GUARDED_BY(serve_mu_) = nullptr;
  absl::Mutex mu_;
  // By gRPC's fd number (the N of "fd:N").
  std::unordered_map<int, Connection> connections_ ABSL_GUARDED_BY(mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_GRPC_CONNECTIONS_H_
