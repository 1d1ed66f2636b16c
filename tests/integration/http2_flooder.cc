// A hostile HTTP/2 peer for tests: opens CONNECTIONS connections to a unix socket, speaks just
// enough HTTP/2 to be taken for a client (the connection preface and an empty SETTINGS
// frame), then sends PINGS PING frames on each as fast as the socket takes them and never
// reads a byte of what the server answers. It keeps the connections open for HOLD_MS in all,
// then prints what happened and exits.
//
//   http2_flooder SOCKET CONNECTIONS PINGS HOLD_MS
//   -> "sent <bytes> pings <n> closed_by_server <k> of <connections>"
//
// Bounded: fixed counts, a fixed duration, one unix socket; it stops by itself.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// A frame header: 24-bit length, type, flags, 31-bit stream id (RFC 9113, section 4.1).
std::string Frame(uint8_t type, const std::string& payload) {
  const size_t n = payload.size();
  std::string f = {static_cast<char>(n >> 16),
                   static_cast<char>(n >> 8),
                   static_cast<char>(n),
                   static_cast<char>(type),
                   0,
                   0,
                   0,
                   0,
                   0};
  return f + payload;
}

struct Conn {
  int fd = -1;
  std::string pending;  // bytes accepted by nobody yet
  int pings_left = 0;
  bool closed = false;
};

int Connect(const char* path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: http2_flooder SOCKET CONNECTIONS PINGS HOLD_MS\n");
    return 2;
  }
  const int connections = std::atoi(argv[2]);
  const int pings = std::atoi(argv[3]);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::atoi(argv[4]));
  const std::string ping = Frame(6, std::string(8, 'p'));  // PING, not an ACK
  std::vector<Conn> conns(connections);
  for (Conn& c : conns) {
    c.fd = Connect(argv[1]);
    if (c.fd < 0) {
      std::printf("cannot connect to %s\n", argv[1]);
      return 1;
    }
    c.pending = std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + Frame(4, "");
    c.pings_left = pings;
  }
  uint64_t sent = 0, pings_sent = 0;
  while (std::chrono::steady_clock::now() < end) {
    bool wrote = false;
    for (Conn& c : conns) {
      if (c.closed) continue;
      // Batches of 256 pings keep the syscall count low and the server busy.
      while (c.pending.size() < 4096 && c.pings_left > 0) {
        c.pending += ping;
        --c.pings_left;
      }
      if (c.pending.empty()) continue;
      const ssize_t n = ::send(c.fd, c.pending.data(), c.pending.size(), MSG_NOSIGNAL);
      if (n > 0) {
        // Count whole pings only: the preface is in the first bytes.
        pings_sent += static_cast<uint64_t>(n) / ping.size();
        sent += static_cast<uint64_t>(n);
        c.pending.erase(0, static_cast<size_t>(n));
        wrote = true;
      } else if (n < 0 && errno != EAGAIN) {
        c.closed = true;  // EPIPE/ECONNRESET: the server cut us off
      }
    }
    if (!wrote) {
      // Nothing left to send or every socket full: look for hang-ups, never read.
      std::vector<pollfd> fds;
      for (Conn& c : conns) fds.push_back({c.fd, static_cast<short>(c.closed ? 0 : POLLRDHUP), 0});
      ::poll(fds.data(), fds.size(), 20);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) conns[i].closed = true;
      }
    }
  }
  int closed = 0;
  for (Conn& c : conns) closed += c.closed ? 1 : 0;
  std::printf("sent %llu pings %llu closed_by_server %d of %d\n",
              static_cast<unsigned long long>(sent), static_cast<unsigned long long>(pings_sent),
              closed, connections);
  return 0;
}
