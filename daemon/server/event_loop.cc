#include "daemon/server/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace commd::server {

absl::StatusOr<std::unique_ptr<EventLoop>> EventLoop::Create() {
  std::unique_ptr<EventLoop> loop(new EventLoop());
  SYS_ASSIGN_OR_RETURN(int ep, ::epoll_create1(EPOLL_CLOEXEC));
  loop->epoll_.reset(ep);
  SYS_ASSIGN_OR_RETURN(int ev, ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  loop->wake_.reset(ev);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = loop->wake_.get();
  SYS_RETURN_IF_ERROR(::epoll_ctl(loop->epoll_.get(), EPOLL_CTL_ADD, loop->wake_.get(), &e));
  loop->thread_ = std::thread([l = loop.get()] { l->Run(); });
  return loop;
}

EventLoop::~EventLoop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

absl::Status EventLoop::Add(int fd, Callback callback, uint32_t events) {
  static_assert(kInput == (EPOLLIN | EPOLLRDHUP) && kHangUp == EPOLLRDHUP);
  absl::MutexLock lock(&mu_);
  epoll_event e{};
  e.events = events;
  e.data.fd = fd;
  SYS_RETURN_IF_ERROR(::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e));
  callbacks_[fd] = std::make_shared<Callback>(std::move(callback));
  return absl::OkStatus();
}

void EventLoop::Remove(int fd) {
  absl::MutexLock lock(&mu_);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  callbacks_.erase(fd);
}

void EventLoop::RunAt(absl::Time when, std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    timers_.emplace(std::make_pair(when, next_timer_++), std::move(callback));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

int EventLoop::RunDueTimers() {
  for (;;) {
    std::function<void()> due;
    {
      absl::MutexLock lock(&mu_);
      if (timers_.empty()) return -1;
      const absl::Duration left = timers_.begin()->first.first - absl::Now();
      if (left > absl::ZeroDuration()) {
        // Round up, so a timer is never run early and the loop never spins on a 0 timeout.
        return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60000));
      }
      due = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
    }
    due();
  }
}

void EventLoop::Run() {
  epoll_event events[64];
  for (;;) {
    const int timeout = RunDueTimers();
    const int n = ::epoll_wait(epoll_.get(), events, 64, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      COMMD_LOG(ERROR, "event_loop") << "epoll_wait: " << std::strerror(errno);
      return;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_.get()) {
        uint64_t count;
        [[maybe_unused]] ssize_t r = ::read(wake_.get(), &count, sizeof(count));
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        continue;
      }
      std::shared_ptr<Callback> cb;
      {
        absl::MutexLock lock(&mu_);
        auto it = callbacks_.find(fd);
        if (it == callbacks_.end()) continue;  // removed by an earlier callback of this batch
        cb = it->second;
      }
      (*cb)(events[i].events);
    }
  }
}

}  // namespace commd::server
