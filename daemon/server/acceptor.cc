#include "daemon/server/acceptor.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace commd::server {
namespace {

UniqueFd OpenReserve() { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

std::string SoftFdLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return "unknown";
  return absl::StrCat(limit.rlim_cur);
}

}  // namespace

Acceptor::Acceptor(AcceptorOptions options, EventLoop* loop, prometheus::Registry* registry,
                   OnAccept on_accept)
    : options_(std::move(options)), loop_(loop), on_accept_(std::move(on_accept)) {
  refused_ = &prometheus::BuildCounter()
                  .Name("commd_connections_refused_total")
                  .Help(
                      "Connections the daemon closed at accept: reason fd_limit (out of "
                      "file descriptors), limit (node-wide cap) or per_uid_limit")
                  .Register(*registry);
  dropped_ = &prometheus::BuildCounter()
                  .Name("commd_connections_dropped_total")
                  .Help(
                      "Accepted connections the daemon closed: reason no_session (no "
                      "session used within transport.session_timeout_ms)")
                  .Register(*registry);
  open_ = &prometheus::BuildGauge()
               .Name("commd_connections")
               .Help("Connections open on each of the daemon's sockets")
               .Register(*registry)
               .Add({{"socket", options_.socket_label}});
}

absl::StatusOr<std::unique_ptr<Acceptor>> Acceptor::Start(AcceptorOptions options, EventLoop* loop,
                                                          prometheus::Registry* registry,
                                                          OnAccept on_accept) {
  std::unique_ptr<Acceptor> a(
      new Acceptor(std::move(options), loop, registry, std::move(on_accept)));
  ASSIGN_OR_RETURN(a->listener_,
                   ListenUnix(a->options_.path, a->options_.type | SOCK_NONBLOCK, 0660));
  a->reserve_ = OpenReserve();
  Acceptor* self = a.get();
  RETURN_IF_ERROR(loop->Add(self->listener_.get(), [self](uint32_t) { self->OnReadable(); }));
  return a;
}

void Acceptor::OnReadable() {
  // A bounded batch per wake-up keeps one busy socket from starving the loop's other work.
  for (int i = 0; i < 64; ++i) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) return OnFdLimit(err);
      if (err != EAGAIN && err != EINTR && err != ECONNABORTED) {
        COMMD_LOG(WARNING, "transport")
            << options_.socket_label << ": accept: " << std::strerror(err);
      }
      return;
    }
    UniqueFd conn(fd);
    auto peer = GetPeerCredentials(fd);
    if (!peer.ok()) continue;  // closes it; the peer is already gone
    std::string reason;
    if (absl::Status admitted = Admit(peer->uid, &reason); !admitted.ok()) {
      Refuse(fd, reason, admitted);
      continue;
    }
    on_accept_(std::move(conn), *peer);
  }
}

absl::Status Acceptor::Admit(uid_t uid, std::string* reason) {
  absl::MutexLock lock(&mu_);
  if (total_ >= options_.max_connections) {
    *reason = "limit";
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.socket_label, " has ", total_, " of its ", options_.max_connections,
                     " connections open (", options_.max_connections_field, ")"));
  }
  uint32_t& mine = per_uid_[uid];
  if (mine >= options_.max_per_uid) {
    *reason = "per_uid_limit";
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", uid, " holds ", mine, " of its ", options_.max_per_uid, " connections to ",
        options_.socket_label, " (limits.per_uid.fd_connections)"));
  }
  ++mine;
  ++total_;
  open_->Set(total_);
  return absl::OkStatus();
}

void Acceptor::Closed(uid_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  if (it == per_uid_.end() || total_ == 0) return;
  if (--it->second == 0) per_uid_.erase(it);
  --total_;
  open_->Set(total_);
}

void Acceptor::CountDropped(absl::string_view reason) {
  dropped_->Add({{"socket", options_.socket_label}, {"reason", std::string(reason)}}).Increment();
}

void Acceptor::CountRefused(absl::string_view reason) {
  refused_->Add({{"socket", options_.socket_label}, {"reason", std::string(reason)}}).Increment();
}

void Acceptor::Refuse(int fd, absl::string_view reason, const absl::Status& why) {
  CountRefused(reason);
  LogState& log = log_state_[std::string(reason)];
  ++log.since;
  const absl::Time now = absl::Now();
  if (now - log.last >= options_.log_interval) {
    COMMD_LOG(WARNING, "transport")
        << options_.socket_label << ": refused " << log.since << " connection(s) (" << reason
        << ") since the last report; latest: " << why.message();
    log.last = now;
    log.since = 0;
  }
  if (options_.explain && fd >= 0) options_.explain(fd, why);
}

void Acceptor::OnFdLimit(int err) {
  // Level-triggered epoll would report the listener again at once: without this the loop
  // spins on a full fd table (a core and a log line per turn).
  if (reserve_.valid()) {
    reserve_.reset();
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      UniqueFd conn(fd);
      // No explanation: writing one could need memory the failure says is short.
      Refuse(-1, "fd_limit",
             absl::ResourceExhaustedError(absl::StrCat(
                 "out of file descriptors (", std::strerror(err), ", RLIMIT_NOFILE ", SoftFdLimit(),
                 "); accepting again every ", absl::FormatDuration(options_.backoff))));
    }
    reserve_ = OpenReserve();
  }
  loop_->Remove(listener_.get());
  paused_ = true;
  loop_->RunAt(absl::Now() + options_.backoff, [this] { Resume(); });
}

void Acceptor::Resume() {
  if (!reserve_.valid()) reserve_ = OpenReserve();
  paused_ = false;
  if (absl::Status s = loop_->Add(listener_.get(), [this](uint32_t) { OnReadable(); }); !s.ok()) {
    COMMD_LOG(ERROR, "transport") << options_.socket_label << ": cannot watch listener: " << s;
  }
}

absl::StatusOr<uint64_t> RaiseOpenFileLimit() {
  rlimit limit{};
  SYS_RETURN_IF_ERROR(::getrlimit(RLIMIT_NOFILE, &limit));
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    SYS_RETURN_IF_ERROR(::setrlimit(RLIMIT_NOFILE, &limit));
  }
  return static_cast<uint64_t>(limit.rlim_cur);
}

}  // namespace commd::server
