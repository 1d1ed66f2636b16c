// A TCP forwarder on loopback between clients and one server, for tests of what losing a
// connection does to a client: the daemon talks to etcd through it, and the test cuts or
// silences the connections at will.
//
//   TcpProxy proxy(etcd_port);            // listens on a free loopback port
//   ... daemon with etcd_endpoints: proxy.endpoint() ...
//   proxy.Cut();                          // every connection closed; new ones refused
//   proxy.Resume();                       // served again
//   proxy.Blackhole();                    // half-open: the clients' connections stay open but
//                                         // silent, the server's ends are closed
//
// Thread-safe; one thread of its own forwards the bytes.
#ifndef COMMD_TESTS_INTEGRATION_TCP_PROXY_H_
#define COMMD_TESTS_INTEGRATION_TCP_PROXY_H_

#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace commd::testing {

class TcpProxy {
 public:
  explicit TcpProxy(int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  std::string endpoint() const;  // 127.0.0.1:PORT
  // Closes every connection at both ends and closes new ones at once, until Resume.
  void Cut();
  void Resume();
  // Every connection open now goes silent for its client (nothing forwarded either way, no
  // FIN or RST: what a peer that vanished looks like) and is closed towards the server. New
  // connections are served as usual.
  void Blackhole();

 private:
  struct Pair {
    int client;
    int server;
  };
  void Run();
  void Accept();
  void ClosePair(size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_fd_ = -1;  // eventfd: commands for the thread
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool refusing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Pair> pairs_ ABSL_GUARDED_BY(mu_);
  std::vector<int> silent_ ABSL_GUARDED_BY(mu_);  // clients' ends kept open, never read
  std::thread thread_;
};

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_TCP_PROXY_H_
