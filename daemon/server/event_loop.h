// A single-threaded epoll loop for the daemon's small non-gRPC I/O: the fd channel's
// connections and the pidfds that tell when a client process exits.
//
//   EventLoop loop;                       // starts its thread
//   loop.Add(fd, [](uint32_t events) { ... });   // callback runs on the loop thread
//   loop.RunAt(absl::Now() + absl::Seconds(1), [] { ... });   // so does this one
//
// Add/Remove/RunAt are thread-safe. Callbacks run on the loop thread only, one at a time, and
// may call Add/Remove/RunAt themselves. A callback must not block.
#ifndef COMMD_DAEMON_SERVER_EVENT_LOOP_H_
#define COMMD_DAEMON_SERVER_EVENT_LOOP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace commd::server {

class EventLoop {
 public:
  using Callback = std::function<void(uint32_t events)>;

  static absl::StatusOr<std::unique_ptr<EventLoop>> Create();
  ~EventLoop();  // stops the thread; the fds themselves are owned by whoever added them

  // Watches `fd` for `events` (input by default; hang-up and errors always).
  absl::Status Add(int fd, Callback callback, uint32_t events = kInput);
  void Remove(int fd);
  // Runs `callback` on the loop thread at `when` (or soon after). Pending ones are dropped
  // when the loop stops. Components that may be destroyed first must check, in the callback,
  // that what it refers to still exists.
  void RunAt(absl::Time when, std::function<void()> callback);

  static constexpr uint32_t kInput = 0x001 | 0x2000;  // EPOLLIN | EPOLLRDHUP
  static constexpr uint32_t kHangUp = 0x2000;         // EPOLLRDHUP (HUP/ERR always)

 private:
  EventLoop() = default;
  void Run();
  // Runs the timers that are due; returns the epoll timeout until the next one (-1: none).
  int RunDueTimers();

  UniqueFd epoll_;
  UniqueFd wake_;  // eventfd: a new timer, or the end of Run()
  std::thread thread_;
  absl::Mutex mu_;
  std::unordered_map<int, std::shared_ptr<Callback>> callbacks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_timer_ ABSL_GUARDED_BY(mu_) = 0;  // keeps equal times in scheduling order
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_EVENT_LOOP_H_
