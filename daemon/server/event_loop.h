// A single-threaded epoll loop for the daemon's small non-gRPC I/O: the fd channel's
// connections and the pidfds that tell when a client process exits.
//
//   EventLoop loop;                       // starts its thread
//   loop.Add(fd, [](uint32_t events) { ... });   // callback runs on the loop thread
//
// Add/Remove are thread-safe. Callbacks run on the loop thread only, one at a time, and may
// call Add/Remove themselves. A callback must not block.
#ifndef COMMD_DAEMON_SERVER_EVENT_LOOP_H_
#define COMMD_DAEMON_SERVER_EVENT_LOOP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"

namespace commd::server {

class EventLoop {
 public:
  using Callback = std::function<void(uint32_t events)>;

  static absl::StatusOr<std::unique_ptr<EventLoop>> Create();
  ~EventLoop();  // stops the thread; the fds themselves are owned by whoever added them

  // Watches `fd` for input (EPOLLIN, plus hang-up and errors).
  absl::Status Add(int fd, Callback callback);
  void Remove(int fd);

 private:
  EventLoop() = default;
  void Run();

  UniqueFd epoll_;
  UniqueFd wake_;  // eventfd that ends Run()
  std::thread thread_;
  absl::Mutex mu_;
  std::unordered_map<int, std::shared_ptr<Callback>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_EVENT_LOOP_H_
