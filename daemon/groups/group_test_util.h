// For the groups' unit tests: a fake of the pending RPC (the only fake; the registry, the
// allocation table, host memory and the timer queue are the real ones) and a harness that
// owns a registry (over the daemon's default limits) and joins ranks through it.
#ifndef COMMD_DAEMON_GROUPS_GROUP_TEST_UTIL_H_
#define COMMD_DAEMON_GROUPS_GROUP_TEST_UTIL_H_

#include <unistd.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/config/config.h"
#include "daemon/groups/group_registry.h"
#include "daemon/memory/allocation_table.h"
#include "daemon/memory/memory_backend.h"
#include "daemon/server/rpc.h"
#include "daemon/server/timer_queue.h"
#include "prometheus/registry.h"

namespace commd::groups::testing {

// Records how the call finished; Cancel() plays a client that went away.
class FakePendingCall : public server::PendingCall {
 public:
  void Finish(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    ++finishes_;
    status_ = status;
  }
  void OnCancel(std::function<void()> callback) override {
    absl::MutexLock lock(&mu_);
    on_cancel_ = std::move(callback);
  }
  void Cancel() {
    std::function<void()> callback;
    {
      absl::MutexLock lock(&mu_);
      callback = std::move(on_cancel_);
    }
    if (callback) callback();
  }
  // The status once finished (waiting up to `wait` for a timer to finish it), else none.
  std::optional<absl::Status> Await(absl::Duration wait = absl::ZeroDuration()) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return status_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&done), wait);
    return status_;
  }
  int finishes() {
    absl::MutexLock lock(&mu_);
    return finishes_;
  }

 private:
  absl::Mutex mu_;
  std::optional<absl::Status> status_ ABSL_GUARDED_BY(mu_);
  int finishes_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

struct Joining {
  std::shared_ptr<FakePendingCall> call = std::make_shared<FakePendingCall>();
  std::unique_ptr<v1::JoinGroupResponse> response = std::make_unique<v1::JoinGroupResponse>();
};

struct Asking {
  std::shared_ptr<FakePendingCall> call = std::make_shared<FakePendingCall>();
  std::unique_ptr<v1::SymmetricAllocation> response = std::make_unique<v1::SymmetricAllocation>();
};

class Harness {
 public:
  explicit Harness(GroupsOptions options = Options()) {
    options.on_rank_death = [this](const RankDeath& d) {
      absl::MutexLock lock(&mu_);
      deaths_.push_back(d);
    };
    options.on_rendezvous_timeout = [this](const GroupSnapshot& g, std::vector<int> joined,
                                           std::vector<int> missing) {
      absl::MutexLock lock(&mu_);
      timeouts_.push_back({g.name, joined, missing});
    };
    groups_ = std::make_unique<GroupRegistry>(options, &memory_, timers_.get(), &registry_);
  }
  ~Harness() {
    timers_.reset();  // its callbacks call into the registry
    groups_.reset();
  }

  static GroupsOptions Options() {
    GroupsOptions o;
    o.release_grace = absl::ZeroDuration();
    o.ring_capacity = 64;
    o.max_groups = 8;
    o.max_groups_forming_per_uid = 4;
    return o;
  }

  // A session of this process (handles are made for a live pid).
  std::shared_ptr<const server::Session> Session(const std::string& token, uid_t uid = 1001,
                                                 const std::string& job = "job") {
    return std::make_shared<const server::Session>(
        server::Session{.token = token, .job_id = job, .uid = uid, .pid = getpid()});
  }

  Joining Join(const std::shared_ptr<const server::Session>& session, const std::string& name,
               int world_size, int rank, int64_t timeout_ms = 0,
               const std::string& description = "") {
    v1::JoinGroupRequest request;
    request.set_name(name);
    request.set_description(description);
    request.set_world_size(world_size);
    request.set_rank(rank);
    request.set_global_rank(-1);
    request.set_timeout_ms(timeout_ms);
    Joining j;
    groups_->Join(session, request, j.response.get(), j.call);
    return j;
  }

  Asking Allocate(const std::shared_ptr<const server::Session>& session, uint64_t group_id,
                  uint64_t bytes, int64_t timeout_ms = 0, bool host_memory = false) {
    v1::AllocateSymmetricRequest request;
    request.set_group_id(group_id);
    request.set_bytes(bytes);
    request.set_timeout_ms(timeout_ms);
    request.set_host_memory(host_memory);
    Asking a;
    groups_->AllocateSymmetric(session, request, a.response.get(), a.call);
    return a;
  }

  // A formed group of `world_size` ranks, one session each ("r0", "r1", ...); its id.
  uint64_t Form(const std::string& name, int world_size) {
    std::vector<Joining> joins;
    for (int r = 0; r < world_size; ++r) {
      joins.push_back(Join(Session(name + "/r" + std::to_string(r)), name, world_size, r));
    }
    for (Joining& j : joins) {
      if (!j.call->Await().value_or(absl::UnknownError("unfinished")).ok()) return 0;
    }
    return joins[0].response->group_id();
  }

  GroupRegistry& groups() { return *groups_; }
  memory::AllocationTable& memory() { return memory_; }

  struct Timeout {
    std::string group;
    std::vector<int> joined, missing;
  };
  std::vector<RankDeath> deaths() {
    absl::MutexLock lock(&mu_);
    return deaths_;
  }
  std::vector<Timeout> timeouts() {
    absl::MutexLock lock(&mu_);
    return timeouts_;
  }

 private:
  prometheus::Registry registry_;
  memory::AllocationTable memory_{*memory::CreateHostMemoryBackend(), nullptr,
                                  config::DefaultConfig(), &registry_};
  std::unique_ptr<server::TimerQueue> timers_ = std::make_unique<server::TimerQueue>();
  std::unique_ptr<GroupRegistry> groups_;
  absl::Mutex mu_;
  std::vector<RankDeath> deaths_ ABSL_GUARDED_BY(mu_);
  std::vector<Timeout> timeouts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace commd::groups::testing

#endif  // COMMD_DAEMON_GROUPS_GROUP_TEST_UTIL_H_
