#include "tests/integration/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace commd::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Writes all of `data` to `fd`; false when the peer is gone.
bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

TcpProxy::TcpProxy(int target_port) : target_port_(target_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = Loopback(0);
  socklen_t len = sizeof(a);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::cerr << "TcpProxy: cannot listen on loopback: errno " << errno << "\n";
    std::abort();
  }
  port_ = ntohs(a.sin_port);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { Run(); });
}

TcpProxy::~TcpProxy() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  thread_.join();
  absl::MutexLock lock(&mu_);
  while (!pairs_.empty()) ClosePair(pairs_.size() - 1);
  for (int fd : silent_) ::close(fd);
  ::close(listen_fd_);
  ::close(wake_fd_);
}

std::string TcpProxy::endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

void TcpProxy::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void TcpProxy::ClosePair(size_t i) {
  ::close(pairs_[i].client);
  ::close(pairs_[i].server);
  pairs_.erase(pairs_.begin() + static_cast<std::ptrdiff_t>(i));
}

void TcpProxy::Cut() {
  absl::MutexLock lock(&mu_);
  refusing_ = true;
  while (!pairs_.empty()) ClosePair(pairs_.size() - 1);
  Wake();
}

void TcpProxy::Resume() {
  absl::MutexLock lock(&mu_);
  refusing_ = false;
}

void TcpProxy::Blackhole() {
  absl::MutexLock lock(&mu_);
  for (const Pair& p : pairs_) {
    ::close(p.server);
    silent_.push_back(p.client);
  }
  pairs_.clear();
  Wake();
}

void TcpProxy::Accept() {
  const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (client < 0) return;
  absl::MutexLock lock(&mu_);
  if (refusing_) {
    ::close(client);
    return;
  }
  const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = Loopback(target_port_);
  if (server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (server >= 0) ::close(server);
    ::close(client);
    return;
  }
  const int one = 1;
  ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  pairs_.push_back({client, server});
}

void TcpProxy::Run() {
  std::vector<char> buffer(1 << 16);
  while (true) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      for (const Pair& p : pairs_) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.server, POLLIN, 0});
      }
    }
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) {
      uint64_t n;
      (void)!::read(wake_fd_, &n, sizeof(n));
      continue;  // the pairs changed: poll them anew
    }
    if (fds[0].revents & POLLIN) Accept();
    absl::MutexLock lock(&mu_);
    for (size_t f = 2; f < fds.size(); ++f) {
      if (fds[f].revents == 0) continue;
      // The pair of this fd, if it is still open (Cut and Blackhole wake the poll first).
      size_t i = 0;
      while (i < pairs_.size() && pairs_[i].client != fds[f].fd && pairs_[i].server != fds[f].fd) {
        ++i;
      }
      if (i == pairs_.size()) continue;
      const int to = pairs_[i].client == fds[f].fd ? pairs_[i].server : pairs_[i].client;
      const ssize_t n = ::recv(fds[f].fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) ||
          (n > 0 && !WriteAll(to, buffer.data(), static_cast<size_t>(n)))) {
        ClosePair(i);
      }
    }
  }
}

}  // namespace commd::testing
