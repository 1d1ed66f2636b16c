#include "daemon/cluster/prefix_watch.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/synchronization/notification.h"
#include "common/log.h"

namespace commd::cluster {

int64_t ResumeRevision(int64_t next, const pb::WatchResponse& r) {
  // What was not delivered is gone: go on from the oldest revision etcd keeps.
  if (r.compact_revision() > 0) return r.compact_revision();
  if (r.events_size() > 0) {
    // Events come in revision order, several of one transaction sharing one revision.
    return std::max(next, r.events(r.events_size() - 1).kv().mod_revision() + 1);
  }
  if (r.canceled()) return next;
  if (r.created()) return next == 0 ? r.header().revision() + 1 : next;
  // A progress notification: everything up to its revision has been delivered.
  return std::max(next, r.header().revision() + 1);
}

PrefixWatch::PrefixWatch(Cluster* cluster, std::string prefix, PrefixWatchCallbacks callbacks,
                         absl::Duration rewatch_interval)
    : cluster_(cluster),
      prefix_(std::move(prefix)),
      callbacks_(std::move(callbacks)),
      rewatch_interval_(rewatch_interval),
      list_due_(callbacks_.on_list != nullptr),
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

absl::Duration PrefixWatch::Jittered() const {
  thread_local std::mt19937_64 random{std::random_device{}()};
  return rewatch_interval_ * std::uniform_real_distribution<double>(0.5, 1.5)(random);
}

void PrefixWatch::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (ended_) {
      watch_.reset();
      ended_ = false;
      // Not reopened at once: a watch ends when etcd goes, and the cluster may not have seen
      // it go yet (it looks at its next beat); retrying at once would spin and flood the log.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), Jittered());
      continue;
    }
    if (watch_ == nullptr && cluster_->connected() && (!list_due_ || List())) {
      if (!callbacks_.on_list || !ResumePointCompacted() || List()) StartWatch();
    }
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || ended_; };
    if (watch_ != nullptr) {
      mu_.Await(absl::Condition(&wake));  // until it ends
    } else {
      mu_.AwaitWithTimeout(absl::Condition(&wake), Jittered());
    }
  }
}

bool PrefixWatch::ResumePointCompacted() {
  if (next_revision_ == 0) return false;
  // A read at the revision before the resume point fails once it is compacted. A watch would
  // be cancelled for a start before the compaction, but not for a start at it, and a deletion
  // at that very revision is gone with the compaction: only this read tells.
  pb::RangeRequest range;
  range.set_key(prefix_);
  range.set_revision(next_revision_ - 1);
  range.set_count_only(true);
  absl::Notification answered;
  absl::Status read;
  mu_.Unlock();  // the read's deadline bounds this wait
  cluster_->etcd().Range(range, [&](absl::StatusOr<pb::RangeResponse> r) {
    read = r.status();
    answered.Notify();
  });
  answered.WaitForNotification();
  mu_.Lock();
  if (!absl::IsOutOfRange(read)) return false;  // other failures: the watch itself will say
  COMMD_LOG(WARNING, "cluster") << "changes under " << prefix_ << " from revision "
                                << next_revision_
                                << " were compacted before this node saw them; reading every "
                                   "key there again";
  list_due_ = true;
  return true;
}

bool PrefixWatch::List() {
  pb::RangeRequest range;
  range.set_key(prefix_);
  range.set_range_end(PrefixEnd(prefix_));
  range.set_limit(callbacks_.list_limit);
  absl::Notification answered;
  absl::StatusOr<pb::RangeResponse> read;
  mu_.Unlock();  // the read's deadline bounds this wait; Stop waits for it
  cluster_->etcd().Range(range, [&](absl::StatusOr<pb::RangeResponse> r) {
    read = std::move(r);
    answered.Notify();
  });
  answered.WaitForNotification();
  if (read.ok()) callbacks_.on_list(*read);
  mu_.Lock();
  if (!read.ok()) {
    COMMD_LOG(WARNING, "cluster") << "reading the keys under " << prefix_ << ": " << read.status();
    return false;
  }
  list_due_ = false;
  next_revision_ = read->header().revision() + 1;
  return true;
}

void PrefixWatch::StartWatch() {
  pb::WatchCreateRequest create;
  create.set_key(prefix_);
  create.set_range_end(PrefixEnd(prefix_));
  create.set_start_revision(next_revision_);
  // etcd's periodic notification of the revision a quiet watch has caught up to: a safe point
  // to resume from, so a reopening after a long quiet spell does not start before a compaction.
  create.set_progress_notify(true);
  // The callbacks take mu_ themselves: start the watch unlocked.
  mu_.Unlock();
  auto watch = cluster_->etcd().Watch(
      create, [this](const pb::WatchResponse& r) { OnResponse(r); },
      [this](absl::Status end) {
        bool log;
        {
          absl::MutexLock lock(&mu_);
          log = !end.ok() && !end_logged_;
          end_logged_ = end_logged_ || log;
        }
        // Once until it opens again: it is retried every rewatch_interval meanwhile.
        if (log) COMMD_LOG(WARNING, "cluster") << "the watch of " << prefix_ << " ended: " << end;
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
    if (open) end_logged_ = false;
    if (open_ == open) return;
    open_ = open;
  }
  if (callbacks_.on_state) callbacks_.on_state(open);
}

void PrefixWatch::OnResponse(const pb::WatchResponse& r) {
  if (r.created() && !r.canceled()) SetOpen(true);
  {
    absl::MutexLock lock(&mu_);
    if (r.compact_revision() > 0) {
      if (callbacks_.on_list) {
        COMMD_LOG(WARNING, "cluster")
            << "changes under " << prefix_ << " up to revision " << r.compact_revision()
            << " were compacted before this node saw them; reading every key there again";
        list_due_ = true;
      } else {
        COMMD_LOG(WARNING, "cluster")
            << "changes under " << prefix_ << " up to revision " << r.compact_revision()
            << " were compacted before this node saw them";
      }
    }
    next_revision_ = ResumeRevision(next_revision_, r);
  }
  for (const auto& e : r.events()) callbacks_.on_event(e);
}

}  // namespace commd::cluster
