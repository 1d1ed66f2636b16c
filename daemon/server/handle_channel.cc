#include "daemon/server/handle_channel.h"

#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/server/handle_packet.h"

namespace commd::server {

absl::StatusOr<std::unique_ptr<HandleChannel>> HandleChannel::Start(
    HandleChannelOptions options, EventLoop* loop, SessionRegistry* sessions,
    prometheus::Registry* registry) {
  std::unique_ptr<HandleChannel> channel(new HandleChannel(std::move(options), loop, sessions));
  HandleChannel* self = channel.get();
  AcceptorOptions accept = self->options_.accept;
  accept.type = SOCK_SEQPACKET;
  accept.socket_label = "handles.sock";
  accept.max_connections_field = "transport.max_fd_connections";
  // The client's first packet is an OpenSession; this answer arrives in its place, so the
  // client hears which limit it met instead of finding its connection closed.
  accept.explain = [](int fd, const absl::Status& why) {
    v1::HandleResponse response;
    response.set_code(static_cast<int>(why.code()));
    response.set_message(std::string(why.message()));
    (void)SendMessage(fd, response.SerializeAsString());
  };
  ASSIGN_OR_RETURN(self->acceptor_,
                   Acceptor::Start(std::move(accept), loop, registry,
                                   [self](UniqueFd conn, const PeerCredentials& peer) {
                                     self->OnAccept(std::move(conn), peer);
                                   }));
  return channel;
}

void HandleChannel::OnAccept(UniqueFd conn, const PeerCredentials& peer) {
  const int fd = conn.get();
  if (absl::Status s = loop_->Add(fd, [this, fd](uint32_t) { OnReadable(fd); }); !s.ok()) {
    COMMD_LOG(WARNING, "fd_channel") << "cannot watch connection: " << s;
    acceptor_->Closed(peer.uid);
    return;
  }
  Connection& c = connections_[fd];
  c.fd = std::move(conn);
  c.uid = peer.uid;
  c.serial = next_serial_++;
  loop_->RunAt(absl::Now() + options_.session_timeout,
               [this, fd, serial = c.serial] { CheckSessionOpened(fd, serial); });
}

void HandleChannel::CheckSessionOpened(int fd, uint64_t serial) {
  auto it = connections_.find(fd);
  if (it == connections_.end() || it->second.serial != serial ||
      !it->second.session_tokens.empty()) {
    return;
  }
  acceptor_->CountDropped("no_session");
  Drop(fd, "");  // counted, not logged: one line per idle connection would be a log flood
}

void HandleChannel::Drop(int fd, absl::string_view why) {
  if (!why.empty()) COMMD_LOG(WARNING, "fd_channel") << "dropping connection: " << why;
  loop_->Remove(fd);
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  for (const std::string& token : it->second.session_tokens) sessions_->CloseForDisconnect(token);
  acceptor_->Closed(it->second.uid);
  connections_.erase(it);
}

void HandleChannel::OnReadable(int fd) {
  auto received = ReceiveMessage(fd, options_.max_packet_bytes);
  if (!received.ok()) {
    // A closed peer is the normal end of a connection; anything else is worth a line.
    return Drop(fd, absl::IsUnavailable(received.status()) ? "" : received.status().ToString());
  }
  if (!received->has_value()) return;  // spurious wake-up
  ReceivedMessage* message = &**received;
  auto peer = GetPeerCredentials(fd);
  if (!peer.ok()) return Drop(fd, peer.status().ToString());
  absl::StatusOr<v1::HandleRequest> request =
      ParseHandlePacket(message->bytes, message->truncated, options_.max_packet_bytes);
  if (!request.ok()) {
    return Drop(fd, absl::StrCat(request.status().message(), " from pid ", peer->pid));
  }
  std::vector<UniqueFd> fds;
  const v1::HandleResponse response = Dispatch(*request, *peer, &connections_[fd], &fds);
  std::vector<int> raw;
  for (const UniqueFd& f : fds) raw.push_back(f.get());
  if (absl::Status s = SendMessage(fd, response.SerializeAsString(), raw); !s.ok()) {
    Drop(fd, s.ToString());
  }
}

v1::HandleResponse HandleChannel::Dispatch(const v1::HandleRequest& request,
                                           const PeerCredentials& peer, Connection* connection,
                                           std::vector<UniqueFd>* fds) {
  v1::HandleResponse response;
  switch (request.request_case()) {
    case v1::HandleRequest::kOpenSession: {
      auto session = sessions_->Open(peer, request.open_session().job_id());
      if (!session.ok()) {
        response.set_code(static_cast<int>(session.status().code()));
        response.set_message(std::string(session.status().message()));
        break;
      }
      connection->session_tokens.push_back((*session)->token);
      auto* out = response.mutable_open_session();
      out->set_session_token((*session)->token);
      out->set_uid((*session)->uid);
      out->set_pid((*session)->pid);
      out->set_job_id((*session)->job_id);
      out->set_daemon_version(options_.daemon_version);
      break;
    }
    case v1::HandleRequest::kImport:
      return Import(request.import(), peer, fds);
    case v1::HandleRequest::kCloseSession: {
      // Only a session this connection opened: the token alone proves nothing here.
      auto& tokens = connection->session_tokens;
      auto it = std::find(tokens.begin(), tokens.end(), request.close_session().session_token());
      if (it == tokens.end() || !sessions_->Close(*it)) {
        response.set_code(static_cast<int>(absl::StatusCode::kNotFound));
        response.set_message("no open session with that token on this connection");
        break;
      }
      tokens.erase(it);
      response.mutable_close_session();
      break;
    }
    case v1::HandleRequest::REQUEST_NOT_SET:
      response.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      response.set_message("empty request");
      break;
  }
  return response;
}

v1::HandleResponse HandleChannel::Import(const v1::ImportRequest& request,
                                         const PeerCredentials& peer, std::vector<UniqueFd>* fds) {
  v1::HandleResponse response;
  const std::vector<std::string> tokens(request.tokens().begin(), request.tokens().end());
  absl::StatusOr<std::vector<ImportedFd>> imported;
  if (tokens.empty() || tokens.size() > static_cast<size_t>(kMaxFdsPerMessage)) {
    imported = absl::InvalidArgumentError(absl::StrCat(
        "import of ", tokens.size(), " tokens; allowed 1 to ", kMaxFdsPerMessage, " per request"));
  } else if (!options_.importer) {
    imported = absl::UnimplementedError("this daemon hands out no memory");
  } else {
    imported = options_.importer(tokens, peer.pid);
  }
  if (!imported.ok()) {
    response.set_code(static_cast<int>(imported.status().code()));
    response.set_message(std::string(imported.status().message()));
    return response;
  }
  for (ImportedFd& f : *imported) {
    response.mutable_import()->add_sizes(f.bytes);
    fds->push_back(std::move(f.fd));
  }
  return response;
}

}  // namespace commd::server
