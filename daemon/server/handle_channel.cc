#include "daemon/server/handle_channel.h"

#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/server/handle_packet.h"

namespace commd::server {

absl::StatusOr<std::unique_ptr<HandleChannel>> HandleChannel::Start(HandleChannelOptions options,
                                                                    EventLoop* loop,
                                                                    SessionRegistry* sessions) {
  std::unique_ptr<HandleChannel> channel(new HandleChannel(std::move(options), loop, sessions));
  ASSIGN_OR_RETURN(channel->listener_,
                   ListenUnix(channel->options_.path, SOCK_SEQPACKET | SOCK_NONBLOCK, 0660));
  HandleChannel* self = channel.get();
  RETURN_IF_ERROR(loop->Add(self->listener_.get(), [self](uint32_t) { self->OnAccept(); }));
  return channel;
}

void HandleChannel::OnAccept() {
  for (;;) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR) {
        COMMD_LOG(WARNING, "fd_channel") << "accept: " << std::strerror(errno);
      }
      return;
    }
    UniqueFd conn(fd);
    if (connections_.size() >= options_.max_connections) {
      COMMD_LOG(WARNING, "fd_channel") << "refusing connection: " << connections_.size()
                                       << " open, limit " << options_.max_connections;
      continue;  // closes it
    }
    if (absl::Status s = loop_->Add(fd, [this, fd](uint32_t) { OnReadable(fd); }); !s.ok()) {
      COMMD_LOG(WARNING, "fd_channel") << "cannot watch connection: " << s;
      continue;
    }
    connections_[fd].fd = std::move(conn);
  }
}

void HandleChannel::Drop(int fd, absl::string_view why) {
  if (!why.empty()) COMMD_LOG(WARNING, "fd_channel") << "dropping connection: " << why;
  loop_->Remove(fd);
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  for (const std::string& token : it->second.session_tokens) sessions_->CloseForDisconnect(token);
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
