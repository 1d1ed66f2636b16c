#include "daemon/server/timer_queue.h"

#include "absl/time/clock.h"

namespace commd::server {

TimerQueue::TimerQueue() : thread_([this] { Run(); }) {}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

TimerId TimerQueue::Schedule(absl::Time when, std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  const TimerId id = next_id_++;
  timers_.emplace(std::make_pair(when, id), std::move(callback));
  when_[id] = when;
  return id;
}

bool TimerQueue::Cancel(TimerId id) {
  absl::MutexLock lock(&mu_);
  auto it = when_.find(id);
  if (it == when_.end()) return false;
  timers_.erase({it->second, id});
  when_.erase(it);
  return true;
}

void TimerQueue::Run() {
  for (;;) {
    std::function<void()> due;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        if (stopping_) return;
        const absl::Time next =
            timers_.empty() ? absl::InfiniteFuture() : timers_.begin()->first.first;
        if (next <= absl::Now()) break;
        // Sleep until the earliest deadline, or until Schedule/Cancel changes which one is
        // earliest (the condition is re-checked whenever they release the mutex).
        auto changed = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          const absl::Time now_next =
              timers_.empty() ? absl::InfiniteFuture() : timers_.begin()->first.first;
          return stopping_ || now_next != next;
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed), next);
      }
      auto first = timers_.begin();
      due = std::move(first->second);
      when_.erase(first->first.second);
      timers_.erase(first);
    }
    due();
  }
}

}  // namespace commd::server
