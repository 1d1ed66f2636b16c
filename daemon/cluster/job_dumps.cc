#include "daemon/cluster/job_dumps.h"

#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/names.h"

namespace commd::cluster {

std::string DumpKey(const std::string& prefix, uid_t uid, const std::string& job,
                    const std::string& dump_id) {
  return absl::StrCat(prefix, "/dumps/", uid, "/", job, "/", dump_id);
}

std::optional<RemoteDump> ParseDumpKey(const std::string& prefix, const std::string& key) {
  const std::string root = prefix + "/dumps/";
  if (key.rfind(root, 0) != 0) return std::nullopt;
  const std::vector<std::string> parts = absl::StrSplit(key.substr(root.size()), '/');
  RemoteDump d;
  uint32_t uid = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &uid) || !ValidateJobId(parts[1]).ok() ||
      !ValidateJobId(parts[2]).ok()) {
    return std::nullopt;
  }
  d.uid = uid;
  d.job_id = parts[1];
  d.dump_id = parts[2];
  return d;
}

namespace {

prometheus::Family<prometheus::Counter>& DumpCounters(prometheus::Registry* registry) {
  return prometheus::BuildCounter()
      .Name("commd_cluster_job_dumps_total")
      .Help(
          "Dumps of jobs that span nodes: announced by this node (published), announcements "
          "that failed (publish_failed), and announcements of other nodes this node saw "
          "(received)")
      .Register(*registry);
}

}  // namespace

JobDumps::JobDumps(Cluster* cluster, JobDumpsOptions options,
                   std::function<void(const RemoteDump&)> on_remote, prometheus::Registry* registry)
    : cluster_(cluster),
      options_(options),
      on_remote_(std::move(on_remote)),
      counters_(DumpCounters(registry)),
      published_(&counters_.Add({{"event", "published"}})),
      publish_failures_(&counters_.Add({{"event", "publish_failed"}})),
      received_(&counters_.Add({{"event", "received"}})),
      watching_(&prometheus::BuildGauge()
                     .Name("commd_cluster_job_dumps_watching")
                     .Help("1 while this node watches etcd for the job dumps other nodes announce")
                     .Register(*registry)
                     .Add({})),
      watch_(cluster, cluster->options().prefix + "/dumps/",
             {.on_event = [this](const mvccpb::Event& e) { OnEvent(e); },
              .on_state = [this](bool open) { watching_->Set(open ? 1 : 0); }}) {}

JobDumps::~JobDumps() { Stop(); }

void JobDumps::Stop() {
  stopping_ = true;
  watch_.Stop();
}

std::string JobDumps::EncodeValue(const recorder::JobDumpNotice& notice) const {
  nlohmann::json value{{"node", node_name()}, {"trigger", notice.trigger}, {"group", notice.group}};
  if (notice.diagnosis) value["diagnosis"] = *notice.diagnosis;
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > options_.max_value_bytes) {
    // A diagnosis is bounded where it is made; this keeps the key small whatever it says.
    value.erase("diagnosis");
    text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return text;
}

void JobDumps::Publish(recorder::JobDumpNotice notice, std::function<void(absl::Status)> done) {
  if (stopping_) return done(absl::UnavailableError("the daemon is stopping"));
  auto finish = [this, done = std::move(done)](absl::Status s) {
    (s.ok() ? published_ : publish_failures_)->Increment();
    done(std::move(s));
  };
  if (!cluster_->connected()) return finish(cluster_->Unavailable());
  const std::string key =
      DumpKey(cluster_->options().prefix, notice.uid, notice.job_id, notice.dump_id);
  cluster_->etcd().LeaseGrant(LeaseSeconds(options_.key_ttl),
                              [this, key, value = EncodeValue(notice), finish = std::move(finish)](
                                  absl::StatusOr<pb::LeaseGrantResponse> granted) mutable {
                                if (!granted.ok()) return finish(granted.status());
                                // Only if absent: the nodes that find one hang derive one id,
                                // and the first announcement is the one every node acts on,
                                // so the others add no write and no event per daemon.
                                pb::TxnRequest txn;
                                pb::Compare* absent = txn.add_compare();
                                absent->set_key(key);
                                absent->set_target(pb::Compare::VERSION);
                                absent->set_result(pb::Compare::EQUAL);
                                absent->set_version(0);
                                pb::PutRequest* put = txn.add_success()->mutable_request_put();
                                put->set_key(key);
                                put->set_value(value);
                                put->set_lease(granted->id());
                                cluster_->etcd().Txn(txn, [this, lease = granted->id(),
                                                           finish = std::move(finish)](auto r) {
                                  if (!r.ok() || !r->succeeded()) {
                                    cluster_->etcd().LeaseRevoke(lease, [](auto) {});
                                  }
                                  finish(r.ok() ? absl::OkStatus() : r.status());
                                });
                              });
}

void JobDumps::OnEvent(const mvccpb::Event& e) {
  if (e.type() != mvccpb::Event::PUT) return;
  std::optional<RemoteDump> d = ParseDumpKey(cluster_->options().prefix, e.kv().key());
  if (!d) return;
  const nlohmann::json value = nlohmann::json::parse(e.kv().value(), nullptr, false);
  if (!value.is_object() || !value.contains("node") || !value["node"].is_string()) return;
  d->node = value["node"].get<std::string>();
  if (d->node == node_name()) return;  // this node dumped it when it announced it
  if (value.contains("trigger") && value["trigger"].is_string()) {
    d->trigger = value["trigger"].get<std::string>();
  }
  if (!ValidateJobId(d->trigger).ok()) d->trigger = "remote";
  if (value.contains("group") && value["group"].is_string()) {
    d->group = value["group"].get<std::string>();
    if (!d->group.empty() && !ValidateName("group", d->group).ok()) return;
  }
  if (value.contains("diagnosis")) d->diagnosis = value["diagnosis"];
  received_->Increment();
  on_remote_(*d);
}

}  // namespace commd::cluster
