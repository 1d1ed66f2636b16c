#include "daemon/cluster/span_aborts.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "commd/v1/groups.pb.h"
#include "common/log.h"
#include "common/names.h"
#include "common/status_macros.h"

namespace commd::cluster {

namespace {

std::string EscapeGroup(const std::string& group) {
  return absl::StrReplaceAll(group, {{"/", "%2F"}});
}

// `text` cut at `max` bytes, its non-printable bytes as '?': it ends up in logs and in the
// ranks' abort text.
std::string Printable(std::string text, size_t max) {
  if (text.size() > max) text.resize(max);
  for (char& c : text) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return text;
}

// A decimal number written as we write one: digits only, no sign, no leading zero.
template <typename T>
bool Canonical(const std::string& text, T* out) {
  return !text.empty() && text.size() <= 20 &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         absl::SimpleAtoi(text, out) && absl::StrCat(*out) == text;
}

absl::Status BadKey(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("abort announcement key ", QuoteForError(key), ": ", what));
}

}  // namespace

std::string SpanAbortKey(const std::string& prefix, uid_t uid, const std::string& job,
                         const std::string& group, uint64_t formation) {
  return absl::StrCat(prefix, "/aborts/", uid, "/", job, "/", EscapeGroup(group), "/", formation);
}

absl::StatusOr<watchdog::SpanAbortNotice> ParseSpanAbortKey(const std::string& prefix,
                                                            const std::string& key) {
  const std::string root = prefix + "/aborts/";
  if (key.rfind(root, 0) != 0) return BadKey(key, absl::StrCat("not under ", root));
  const std::vector<std::string> parts = absl::StrSplit(key.substr(root.size()), '/');
  if (parts.size() != 4) {
    return BadKey(key, absl::StrCat(parts.size(), " part(s) after ", root,
                                    "; allowed 4: <uid>/<job>/<group>/<formation>"));
  }
  watchdog::SpanAbortNotice n;
  uint32_t uid = 0;
  if (!Canonical(parts[0], &uid)) {
    return BadKey(key, absl::StrCat("uid ", QuoteForError(parts[0]),
                                    " is not a decimal number from 0 to 4294967295"));
  }
  n.uid = uid;
  if (absl::Status s = ValidateJobId(parts[1]); !s.ok())
    return BadKey(key, std::string(s.message()));
  n.job_id = parts[1];
  n.group = absl::StrReplaceAll(parts[2], {{"%2F", "/"}});
  if (absl::Status s = ValidateName("group name", n.group); !s.ok()) {
    return BadKey(key, std::string(s.message()));
  }
  if (EscapeGroup(n.group) != parts[2]) {
    return BadKey(key, absl::StrCat("group ", QuoteForError(parts[2]),
                                    " is not written as commd writes it ('/' as %2F)"));
  }
  if (!Canonical(parts[3], &n.formation) || n.formation == 0) {
    return BadKey(key, absl::StrCat("formation ", QuoteForError(parts[3]),
                                    " is not a decimal number from 1 to 18446744073709551615"));
  }
  return n;
}

std::string SpanAbortValue(const watchdog::SpanAbortNotice& notice) {
  v1::SpanAbort value;
  value.set_node(notice.node);
  const char* reason = AbortReasonName(static_cast<uint32_t>(notice.reason));
  value.set_reason(reason != nullptr ? reason : "admin");
  value.set_text(Printable(notice.text, kMaxSpanAbortTextBytes));
  return value.SerializeAsString();
}

absl::Status ParseSpanAbortValue(const std::string& bytes, watchdog::SpanAbortNotice* notice) {
  if (bytes.size() > kMaxSpanAbortValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("abort announcement of ", bytes.size(),
                                                   " bytes; allowed at most ",
                                                   kMaxSpanAbortValueBytes));
  }
  v1::SpanAbort value;
  if (!value.ParseFromString(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("abort announcement ", QuoteForError(bytes), " is not a commd.v1.SpanAbort"));
  }
  if (!ValidateJobId(value.node()).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "abort announcement names node ", QuoteForError(value.node()), "; allowed ", JobIdRule()));
  }
  const uint32_t reason = AbortReasonFromName(value.reason());
  if (reason == 0 || reason >= kAbortReasonCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("abort announcement gives reason ", QuoteForError(value.reason()),
                     "; allowed one of admin, stuck, lagging, mismatch, peer_dead, "
                     "unresponsive, nan, daemon_shutdown"));
  }
  notice->node = value.node();
  notice->reason = static_cast<AbortReason>(reason);
  notice->text = Printable(value.text(), kMaxSpanAbortTextBytes);
  return absl::OkStatus();
}

SpanAborts::SpanAborts(Cluster* cluster, SpanAbortsOptions options, prometheus::Registry* registry)
    : cluster_(cluster),
      options_(options),
      counters_(prometheus::BuildCounter()
                    .Name("commd_cluster_span_aborts_total")
                    .Help("Aborts of groups spanning nodes: announced by this node (sent), "
                          "announcements that failed (send_failed), other nodes' announcements "
                          "seen (received), those that aborted ranks here (applied), and keys "
                          "or values refused (rejected)")
                    .Register(*registry)),
      sent_(&counters_.Add({{"event", "sent"}})),
      send_failures_(&counters_.Add({{"event", "send_failed"}})),
      received_(&counters_.Add({{"event", "received"}})),
      applied_(&counters_.Add({{"event", "applied"}})),
      rejected_(&counters_.Add({{"event", "rejected"}})),
      watching_(&prometheus::BuildGauge()
                     .Name("commd_cluster_span_aborts_watching")
                     .Help("1 while this node watches etcd for the aborts of spanning groups "
                           "that other nodes announce")
                     .Register(*registry)
                     .Add({})),
      pending_gauge_(&prometheus::BuildGauge()
                          .Name("commd_cluster_span_aborts_pending")
                          .Help("Aborts of groups spanning nodes that this node could not "
                                "announce yet (etcd away); sent when it is connected again")
                          .Register(*registry)
                          .Add({})) {
  cluster_->AddOnConnected([this] { ResendPending(); });
}

SpanAborts::~SpanAborts() { Stop(); }

void SpanAborts::Watch(std::function<int(const watchdog::SpanAbortNotice&)> on_remote) {
  if (watch_ != nullptr || stopping_) return;
  on_remote_ = std::move(on_remote);
  watch_ = std::make_unique<PrefixWatch>(
      cluster_, cluster_->options().prefix + "/aborts/",
      PrefixWatchCallbacks{
          .on_event =
              [this](const mvccpb::Event& e) {
                // A DELETE is a key whose lease ended: nothing to do.
                if (e.type() == mvccpb::Event::PUT) OnAnnounced(e.kv());
              },
          .on_state = [this](bool open) { watching_->Set(open ? 1 : 0); },
          // The announcements made before this node watched (at its start, or while it was
          // cut off beyond etcd's compaction): their keys live as long as their announcer's
          // lease, so what is listed still stands. At most kMaxPendingSpanAborts.
          .on_list =
              [this](const pb::RangeResponse& r) {
                for (const mvccpb::KeyValue& kv : r.kvs()) OnAnnounced(kv);
                if (r.more()) {
                  COMMD_LOG(WARNING, "cluster")
                      << "more than " << kMaxPendingSpanAborts
                      << " abort announcements stand in etcd; only the first were applied";
                }
              },
          .list_limit = static_cast<int64_t>(kMaxPendingSpanAborts)});
}

void SpanAborts::Stop() {
  stopping_ = true;
  if (watch_ != nullptr) watch_->Stop();
}

void SpanAborts::Failed(const watchdog::SpanAbortNotice& n, const absl::Status& why) {
  send_failures_->Increment();
  bool kept = false;
  if (!stopping_) {
    absl::MutexLock lock(&mu_);
    const std::string key =
        SpanAbortKey(cluster_->options().prefix, n.uid, n.job_id, n.group, n.formation);
    kept = pending_.size() < kMaxPendingSpanAborts || pending_.contains(key);
    if (kept) pending_.insert_or_assign(key, n);
    pending_gauge_->Set(static_cast<double>(pending_.size()));
  }
  COMMD_LOG(WARNING, "cluster")
      << "the abort of group " << n.group << " (job " << n.job_id << ", formation " << n.formation
      << ") was not announced to its other nodes: " << why.message()
      << (kept ? "; it is sent again when etcd answers. Until then they"
               : absl::StrCat("; not kept to send again (", kMaxPendingSpanAborts,
                              " announcements wait already). They"))
      << " abort their part only when they see this node go or find the hang themselves";
}

void SpanAborts::ResendPending() {
  std::map<std::string, watchdog::SpanAbortNotice> pending;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_);
    pending_gauge_->Set(0);
  }
  for (auto& [key, notice] : pending) {
    COMMD_LOG(INFO, "cluster") << "announcing the abort of group " << notice.group << " (job "
                               << notice.job_id << ", formation " << notice.formation
                               << ") again, now that etcd answers";
    Announce(std::move(notice));
  }
}

void SpanAborts::Announce(watchdog::SpanAbortNotice notice) {
  notice.node = cluster_->options().node_name;
  if (stopping_) return Failed(notice, absl::UnavailableError("the daemon is stopping"));
  if (!cluster_->connected()) return Failed(notice, cluster_->Unavailable());
  const std::string key = SpanAbortKey(cluster_->options().prefix, notice.uid, notice.job_id,
                                       notice.group, notice.formation);
  cluster_->etcd().LeaseGrant(
      LeaseSeconds(options_.key_ttl), [this, key, value = SpanAbortValue(notice),
                                       notice](absl::StatusOr<pb::LeaseGrantResponse> granted) {
        if (!granted.ok()) return Failed(notice, granted.status());
        pb::TxnRequest txn;
        pb::PutRequest* put = txn.add_success()->mutable_request_put();
        put->set_key(key);
        put->set_value(value);
        put->set_lease(granted->id());
        cluster_->etcd().Txn(txn, [this, notice](absl::StatusOr<pb::TxnResponse> r) {
          if (!r.ok()) return Failed(notice, r.status());
          sent_->Increment();
          COMMD_LOG(INFO, "cluster")
              << "announced the abort of group " << notice.group << " (job " << notice.job_id
              << ", formation " << notice.formation << ") to its other nodes";
        });
      });
}

void SpanAborts::OnAnnounced(const mvccpb::KeyValue& kv) {
  absl::StatusOr<watchdog::SpanAbortNotice> n =
      ParseSpanAbortKey(cluster_->options().prefix, kv.key());
  absl::Status value = n.ok() ? ParseSpanAbortValue(kv.value(), &*n) : n.status();
  if (!value.ok()) {
    rejected_->Increment();
    COMMD_LOG(WARNING, "cluster") << "skipped an abort announcement: " << value.message();
    return;
  }
  if (n->node == cluster_->options().node_name) return;  // this node's own
  received_->Increment();
  if (on_remote_(*n) > 0) {
    applied_->Increment();
    COMMD_LOG(WARNING, "cluster") << "node " << n->node << " aborted group " << n->group << " (job "
                                  << n->job_id << ", uid " << n->uid << ", formation "
                                  << n->formation << "): its ranks here are aborted too";
  } else {
    // Most announcements are of groups this node holds no part of.
    COMMD_LOG(DEBUG, "cluster") << "node " << n->node << " aborted group " << n->group << " (job "
                                << n->job_id << ", uid " << n->uid << ", formation " << n->formation
                                << "): not formed here, or aborted already";
  }
}

}  // namespace commd::cluster
