// Deadlines for calls that wait on other clients (rendezvous, store waits): one thread runs
// each callback when its time comes, unless it was cancelled first.
//
//   TimerQueue timers;
//   TimerId id = timers.Schedule(absl::Now() + absl::Seconds(10), [] { ... });
//   timers.Cancel(id);   // true if it had not run yet
//
// Thread-safe. Callbacks run on the queue's thread, one at a time, with no lock held; they
// must not block.
#ifndef COMMD_DAEMON_SERVER_TIMER_QUEUE_H_
#define COMMD_DAEMON_SERVER_TIMER_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace commd::server {

using TimerId = uint64_t;

class TimerQueue {
 public:
  TimerQueue();
  ~TimerQueue();  // pending callbacks are dropped, not run

  TimerId Schedule(absl::Time when, std::function<void()> callback);
  bool Cancel(TimerId id);

 private:
  void Run();

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  TimerId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Ordered by (time, id) so equal times keep their scheduling order.
  std::map<std::pair<absl::Time, TimerId>, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
  std::map<TimerId, absl::Time> when_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_TIMER_QUEUE_H_
