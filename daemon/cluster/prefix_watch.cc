#include "daemon/cluster/prefix_watch.h"

#include <utility>

#include "common/log.h"

namespace commd::cluster {

PrefixWatch::PrefixWatch(Cluster* cluster, std::string prefix,
                         std::function<void(const mvccpb::Event&)> on_event,
                         std::function<void(bool open)> on_state, absl::Duration rewatch_interval)
    : cluster_(cluster),
      prefix_(std::move(prefix)),
      on_event_(std::move(on_event)),
      on_state_(std::move(on_state)),
      rewatch_interval_(rewatch_interval),
      thread_([this] { Run(); }) {}

PrefixWatch::~PrefixWatch() { Stop(); }

bool PrefixWatch::watching() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

void PrefixWatch::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  thread_.join();  // no watch starts after this
  std::shared_ptr<EtcdWatch> watch;
  {
    absl::MutexLock lock(&mu_);
    watch = watch_;
  }
  if (watch == nullptr) return;
  // Its callbacks hold `this`: wait for the last one (on_end comes after every response).
  watch->Cancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&ended_));
  watch_.reset();
}

void PrefixWatch::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (ended_) {
      watch_.reset();
      ended_ = false;
      // Not reopened at once: a watch ends when etcd goes, and the cluster may not have seen
      // it go yet (it looks at its next beat); retrying at once would spin and flood the log.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), rewatch_interval_);
      continue;
    }
    if (watch_ == nullptr && cluster_->connected()) StartWatch();
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || ended_; };
    if (watch_ != nullptr) {
      mu_.Await(absl::Condition(&wake));  // until it ends
    } else {
      mu_.AwaitWithTimeout(absl::Condition(&wake), rewatch_interval_);
    }
  }
}

void PrefixWatch::StartWatch() {
  pb::WatchCreateRequest create;
  create.set_key(prefix_);
  create.set_range_end(PrefixEnd(prefix_));
  create.set_start_revision(next_revision_);
  // The callbacks take mu_ themselves: start the watch unlocked.
  mu_.Unlock();
  auto watch = cluster_->etcd().Watch(
      create, [this](const pb::WatchResponse& r) { OnResponse(r); },
      [this](absl::Status end) {
        if (!end.ok())
          COMMD_LOG(WARNING, "cluster") << "the watch of " << prefix_ << " ended: " << end;
        SetOpen(false);
        absl::MutexLock lock(&mu_);
        ended_ = true;
      });
  mu_.Lock();
  // nullptr: the client is shutting down (on_end has run). Kept even when stopping, so that
  // Stop waits for its callbacks.
  watch_ = std::move(watch);
}

void PrefixWatch::SetOpen(bool open) {
  {
    absl::MutexLock lock(&mu_);
    if (open_ == open) return;
    open_ = open;
  }
  if (on_state_) on_state_(open);
}

void PrefixWatch::OnResponse(const pb::WatchResponse& r) {
  if (r.created()) SetOpen(true);
  {
    absl::MutexLock lock(&mu_);
    if (r.compact_revision() > 0) {
      // What we had not seen is compacted away: go on from the oldest revision etcd keeps.
      COMMD_LOG(WARNING, "cluster")
          << "changes under " << prefix_ << " up to revision " << r.compact_revision()
          << " were compacted before this node saw them";
      next_revision_ = r.compact_revision();
    } else if (r.header().revision() >= next_revision_) {
      next_revision_ = r.header().revision() + 1;
    }
  }
  for (const auto& e : r.events()) on_event_(e);
}

}  // namespace commd::cluster
