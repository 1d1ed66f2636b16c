#include "daemon/server/timer_queue.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace commd::server {
namespace {

TEST(TimerQueueTest, RunsInDeadlineOrderAndSkipsCancelled) {
  TimerQueue timers;
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification done;
  const absl::Time now = absl::Now();
  timers.Schedule(now + absl::Milliseconds(60), [&] {
    absl::MutexLock l(&mu);
    order.push_back(3);
    done.Notify();
  });
  timers.Schedule(now + absl::Milliseconds(20), [&] {
    absl::MutexLock l(&mu);
    order.push_back(1);
  });
  const TimerId cancelled = timers.Schedule(now + absl::Milliseconds(30), [&] {
    absl::MutexLock l(&mu);
    order.push_back(99);
  });
  timers.Schedule(now + absl::Milliseconds(40), [&] {
    absl::MutexLock l(&mu);
    order.push_back(2);
  });
  EXPECT_TRUE(timers.Cancel(cancelled));
  EXPECT_FALSE(timers.Cancel(cancelled));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock l(&mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(TimerQueueTest, AnEarlierTimerAddedWhileWaitingRunsFirst) {
  TimerQueue timers;
  std::atomic<int> first{0};
  absl::Notification done;
  timers.Schedule(absl::Now() + absl::Seconds(30), [&] { first.store(2); });
  timers.Schedule(absl::Now() + absl::Milliseconds(10), [&] {
    first.store(1);
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(first.load(), 1);
}

TEST(TimerQueueTest, DestructionDropsPendingCallbacks) {
  std::atomic<bool> ran{false};
  {
    TimerQueue timers;
    timers.Schedule(absl::Now() + absl::Hours(1), [&] { ran = true; });
  }
  EXPECT_FALSE(ran.load());
}

}  // namespace
}  // namespace commd::server
