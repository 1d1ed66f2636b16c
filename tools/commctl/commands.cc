#include "tools/commctl/commands.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/control_block.h"
#include "common/status_macros.h"
#include "format/job_diagnosis.h"
#include "format/pickle_writer.h"
#include "format/topology_text.h"
#include "google/protobuf/util/json_util.h"
#include "tools/commctl/fr_collect.h"

namespace commd::ctl {
namespace {

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  std::string out;
  auto s = google::protobuf::util::MessageToJsonString(message, &out, opts);
  if (!s.ok()) return absl::InternalError(std::string(s.message()));
  return out;
}

absl::StatusOr<std::unique_ptr<Client>> ConnectFor(const GlobalOptions& options) {
  ClientOptions copts;
  copts.runtime_dir = options.runtime_dir;
  copts.connect_timeout = options.timeout;
  copts.call_timeout = options.timeout;
  copts.job_id = options.job.empty() ? "commctl" : options.job;
  return Client::Connect(copts);
}

absl::Status Print(const GlobalOptions& options, const google::protobuf::Message& message,
                   const std::string& text, std::ostream& out) {
  if (options.json) {
    ASSIGN_OR_RETURN(std::string json, ToJson(message));
    out << json;
  } else {
    out << text;
  }
  return absl::OkStatus();
}

absl::Status Status(const GlobalOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(auto client, ConnectFor(options));
  ASSIGN_OR_RETURN(v1::NodeStatus status, client->GetStatus());
  return Print(options, status, FormatStatus(status), out);
}

absl::Status Topo(const GlobalOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(auto client, ConnectFor(options));
  ASSIGN_OR_RETURN(v1::Topology topology, client->GetTopology());
  return Print(options, topology, topology::RenderTopologyText(topology), out);
}

namespace {

// A spanning group's shape: "4 over 2 nodes (this is node 1)", "4 (nodes meeting)" while the
// nodes rendezvous, "-" for a group on this node only.
std::string GlobalShape(const v1::GroupInfo& g) {
  if (g.global_world_size() <= g.world_size()) return "-";
  if (g.node_count() == 0) return absl::StrCat(g.global_world_size(), " (nodes meeting)");
  return absl::StrCat(g.global_world_size(), " over ", g.node_count(), " nodes (this is node ",
                      g.node_index(), ")");
}

// Which ranks are on which device, in order of first appearance: "cuda:0=0,1,2 cuda:1=3";
// ranks sharing a GPU are one entry. "-" for a group whose ranks are all on the host.
std::string DeviceRanks(const v1::GroupInfo& g) {
  std::vector<std::pair<std::string, std::vector<int>>> by_device;
  bool any_gpu = false;
  for (const v1::Member& m : g.members()) {
    const std::string device = m.device().empty() ? "host" : m.device();
    any_gpu = any_gpu || device != "host";
    auto it = std::find_if(by_device.begin(), by_device.end(),
                           [&](const auto& d) { return d.first == device; });
    if (it == by_device.end()) it = by_device.insert(it, {device, {}});
    it->second.push_back(m.rank());
  }
  if (!any_gpu) return "-";
  std::vector<std::string> parts;
  for (const auto& [device, ranks] : by_device) {
    parts.push_back(absl::StrCat(device, "=", absl::StrJoin(ranks, ",")));
  }
  return absl::StrJoin(parts, " ");
}

}  // namespace

std::string GroupsText(const v1::ListGroupsResponse& groups) {
  if (groups.groups().empty()) return "no groups\n";
  // The GLOBAL column only when a group spans nodes: a node-local listing reads as it always did.
  bool spanning = false, gpus = false;
  for (const v1::GroupInfo& g : groups.groups()) {
    spanning = spanning || g.global_world_size() > g.world_size();
    gpus = gpus || DeviceRanks(g) != "-";
  }
  std::string out = absl::StrFormat("%-24s %-16s %-16s %-10s %-7s %-12s ", "JOB", "GROUP", "DESC",
                                    "STATE", "RANKS", "MEMORY");
  if (spanning) absl::StrAppendFormat(&out, "%-32s ", "GLOBAL");
  if (gpus) absl::StrAppendFormat(&out, "%-24s ", "DEVICES");
  absl::StrAppend(&out, "PIDS\n");
  for (const v1::GroupInfo& g : groups.groups()) {
    std::vector<std::string> pids;
    for (const v1::Member& m : g.members()) pids.push_back(absl::StrCat(m.rank(), ":", m.pid()));
    absl::StrAppendFormat(&out, "%-24s %-16s %-16s %-10s %-7s %-12d ", g.job_id(), g.name(),
                          g.description(), g.state(), absl::StrCat(g.joined(), "/", g.world_size()),
                          g.memory_bytes());
    if (spanning) absl::StrAppendFormat(&out, "%-32s ", GlobalShape(g));
    if (gpus) absl::StrAppendFormat(&out, "%-24s ", DeviceRanks(g));
    absl::StrAppend(&out, absl::StrJoin(pids, " "), "\n");
  }
  return out;
}

absl::Status Groups(const GlobalOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(auto client, ConnectFor(options));
  ASSIGN_OR_RETURN(v1::ListGroupsResponse groups, client->ListGroups());
  return Print(options, groups, GroupsText(groups), out);
}

namespace {

std::string StateWord(v1::GroupHealthState s) {
  std::string state = v1::GroupHealthState_Name(s);
  absl::AsciiStrToLower(&state);
  return state == "healthy" ? "ok" : state;
}

// "lagging: <summary> [aborted <reason in words>]", or "-".
std::string DiagnosisText(const v1::GroupHealth& g) {
  std::string diagnosis = "-";
  if (g.has_last_diagnosis()) {
    const v1::Diagnosis& d = g.last_diagnosis();
    std::string kind = v1::DiagnosisKind_Name(d.kind());
    absl::AsciiStrToLower(&kind);
    diagnosis = absl::StrCat(kind, ": ", d.summary());
    // A spanning group's finding: who holds the group back over every node's view.
    if (!d.job_summary().empty()) absl::StrAppend(&diagnosis, "; job-wide: ", d.job_summary());
  }
  if (!g.abort_reason().empty()) {
    // The daemon sends the reason's name (it is a metric label too); people read words.
    const uint32_t reason = AbortReasonFromName(g.abort_reason());
    absl::StrAppend(&diagnosis, " [aborted ",
                    reason < kAbortReasonCount ? AbortReasonWords(reason) : g.abort_reason(),
                    g.aborted_on_node().empty() ? "" : ", on node " + g.aborted_on_node(), "]");
  }
  return diagnosis;
}

}  // namespace

std::string FormatHealth(const v1::GetHealthResponse& health) {
  if (health.groups().empty()) return "no groups\n";
  std::string out = absl::StrFormat("%-24s %-16s %-16s %-8s %-10s %s\n", "JOB", "GROUP", "DESC",
                                    "STATE", "POLICY", "DIAGNOSIS");
  for (const v1::GroupHealth& g : health.groups()) {
    std::string policy = v1::WatchdogPolicy_Name(g.policy());
    absl::AsciiStrToLower(&policy);
    absl::StrAppendFormat(&out, "%-24s %-16s %-16s %-8s %-10s %s\n", g.job_id(), g.group(),
                          g.description(), StateWord(g.state()), policy, DiagnosisText(g));
  }
  return out;
}

// One line per (group, node): each rank as <global rank>:<last completed>/<last enqueued>,
// with "!<liveness>" when it is not alive.
std::string FormatClusterHealth(const v1::GetHealthResponse& health) {
  if (health.cluster().empty()) return "no node has published a view of this job\n";
  std::string out = absl::StrFormat("%-16s %-16s %-8s %-28s %s\n", "GROUP", "NODE", "STATE",
                                    "RANKS (GLOBAL:DONE/ENTERED)", "DIAGNOSIS");
  for (const v1::NodeGroupView& v : health.cluster()) {
    std::vector<std::string> ranks;
    for (const v1::RankView& r : v.ranks()) {
      ranks.push_back(absl::StrCat(r.global_rank(), ":", r.last_completed_seq(), "/",
                                   r.last_enqueued_seq(),
                                   r.liveness() == "alive" ? "" : "!" + r.liveness()));
    }
    absl::StrAppendFormat(&out, "%-16s %-16s %-8s %-28s %s\n", v.health().group(), v.node(),
                          StateWord(v.health().state()), absl::StrJoin(ranks, " "),
                          DiagnosisText(v.health()));
  }
  for (const std::string& line : diagnosis::JobDiagnosis(health.cluster()))
    absl::StrAppend(&out, line, "\n");
  return out;
}

absl::Status Health(const GlobalOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(auto client, ConnectFor(options));
  // As root, no --job means every job (as for dump).
  if (options.cluster && options.job.empty()) {
    return absl::InvalidArgumentError("health --cluster shows one job: name it with --job J");
  }
  v1::GetHealthRequest request;
  request.set_group(options.group);
  request.set_job_id(options.job);
  request.set_all_jobs(options.job.empty() && ::geteuid() == 0 && !options.cluster);
  request.set_cluster(options.cluster);
  ASSIGN_OR_RETURN(v1::GetHealthResponse health, client->GetHealth(request));
  return Print(options, health,
               options.cluster ? FormatClusterHealth(health) : FormatHealth(health), out);
}

absl::Status Abort(const GlobalOptions& options, std::ostream& out) {
  if (options.group.empty()) return absl::InvalidArgumentError("abort needs --group G");
  if (options.reason.empty()) return absl::InvalidArgumentError("abort needs --reason TEXT");
  ASSIGN_OR_RETURN(auto client, ConnectFor(options));
  ASSIGN_OR_RETURN(int notified, client->Abort(options.group, options.reason, options.job));
  v1::AbortResponse response;
  response.set_ranks_notified(notified);
  return Print(options, response,
               absl::StrCat("aborted group ", options.group, ": ", notified, " rank(s) notified\n"),
               out);
}

absl::Status Dump(const GlobalOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(auto client, ConnectFor(options));
  // As root, no --job means every job; a user dumps the job it names (its own namespace).
  v1::DumpRequest request;
  request.set_group(options.group);
  request.set_job_id(options.job);
  request.set_all_jobs(options.job.empty() && ::geteuid() == 0);
  request.set_local_only(options.local);
  ASSIGN_OR_RETURN(v1::DumpResponse dump, client->Dump(request));
  std::string text = absl::StrCat("dumped ", dump.entries(), " entries (", dump.invalid_entries(),
                                  " invalid) into ", dump.files_size(), " file(s):\n");
  for (const std::string& f : dump.files()) absl::StrAppend(&text, "  ", f, "\n");
  if (dump.announced()) {
    absl::StrAppend(&text, "dump id ", dump.dump_id(),
                    ": every node with ranks of the job dumps them under it; gather them with\n"
                    "  commctl fr collect --dump-id ",
                    dump.dump_id(), " --out DIR DUMP_DIR...\n");
  }
  RETURN_IF_ERROR(Print(options, dump, text, out));
  if (!dump.announce_error().empty()) {
    return absl::UnavailableError(absl::StrCat("dump ", dump.dump_id(),
                                               " was written on this node only: the job's other "
                                               "nodes were not asked to dump: ",
                                               dump.announce_error()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string FormatGroups(const v1::ListGroupsResponse& groups) { return GroupsText(groups); }

std::string FormatClusterNodes(const v1::ListClusterNodesResponse& r, int64_t now_ms) {
  std::string out =
      absl::StrFormat("%d live node(s), %d gone (listed for an hour); etcd revision %d\n",
                      r.live_nodes(), r.gone_nodes(), r.revision());
  if (!r.watching()) {
    absl::StrAppend(
        &out, "not watching etcd (out of reach): the view as of ",
        r.view_unix_ms() == 0 ? "never" : FormatDuration(now_ms - r.view_unix_ms()) + " ago", "\n");
  }
  if (r.nodes().empty()) return out + "no nodes\n";
  absl::StrAppendFormat(&out, "%-24s %-5s %-14s %-18s %-5s %-7s %-22s %s\n", "NODE", "STATE",
                        "SINCE", "LEASE", "TTL", "LEFT", "METRICS", "VERSION");
  for (const v1::ClusterNode& n : r.nodes()) {
    absl::StrAppendFormat(
        &out, "%-24s %-5s %-14s %-18s %-5s %-7s %-22s %s\n",
        n.this_node() ? n.name() + " (this)" : n.name(), n.live() ? "live" : "gone",
        n.since_unix_ms() == 0 ? "-" : FormatDuration(now_ms - n.since_unix_ms()) + " ago",
        n.live() ? absl::StrFormat("%x", n.lease_id()) : "-",
        n.lease_ttl_seconds() > 0 ? absl::StrCat(n.lease_ttl_seconds(), "s") : "-",
        n.lease_remaining_seconds() >= 0 ? absl::StrFormat("%.1fs", n.lease_remaining_seconds())
                                         : "-",
        n.metrics_address().empty() ? "-" : n.metrics_address(),
        n.version().empty() ? "-" : n.version());
  }
  if (r.truncated()) {
    absl::StrAppend(&out, "showing ", r.nodes_size(), " of ", r.live_nodes() + r.gone_nodes(),
                    " node(s); the next ones: commctl cluster nodes --after ",
                    r.nodes(r.nodes_size() - 1).name(), "\n");
  }
  if (r.incomplete()) {
    absl::StrAppend(
        &out, "the daemon's view keeps at most 16384 live nodes: etcd holds more, left out\n");
  }
  if (r.rejected_keys() > 0) {
    absl::StrAppend(&out, r.rejected_keys(),
                    " key(s) under the cluster's nodes/ name no node (not written by commd): left "
                    "out\n");
  }
  return out;
}

namespace {

absl::Status ClusterNodes(const GlobalOptions& options, std::ostream& out) {
  ASSIGN_OR_RETURN(auto client, ConnectFor(options));
  v1::ListClusterNodesRequest request;
  request.set_limit(options.limit);
  request.set_start_after(options.after);
  ASSIGN_OR_RETURN(v1::ListClusterNodesResponse nodes, client->ListClusterNodes(request));
  return Print(options, nodes, FormatClusterNodes(nodes, absl::ToUnixMillis(absl::Now())), out);
}

absl::Status FrCollect(const GlobalOptions& options, const std::vector<std::string>& sources,
                       std::ostream& out) {
  if (options.dump_id.empty() || options.out_dir.empty() || sources.empty()) {
    return absl::InvalidArgumentError(
        "fr collect needs --dump-id ID, --out DIR and at least one source directory");
  }
  ASSIGN_OR_RETURN(CollectResult result, CollectDump(sources, options.dump_id, options.out_dir));
  out << FormatCollect(result, options.dump_id, options.out_dir);
  return absl::OkStatus();
}

// Converts a dump directory's JSON files (rank<N>.json, any depth) into the pickles
// torchfrtrace reads (nccl_trace_rank_<N>), one directory per group.
absl::Status FrExport(const GlobalOptions& options, std::ostream& out) {
  if (options.in_dir.empty() || options.out_dir.empty()) {
    return absl::InvalidArgumentError("fr export needs --in DIR and --out DIR");
  }
  if (!options.format.empty() && options.format != "torch") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format '", options.format, "'; allowed: torch"));
  }
  int written = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(options.in_dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!it->is_regular_file() || name.rfind("rank", 0) != 0 || it->path().extension() != ".json") {
      continue;
    }
    std::ifstream in(it->path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<std::string> pickle = EncodePickleFromJson(text);
    if (!pickle.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(it->path().string(), ": ", pickle.status().message()));
    }
    const auto rel = std::filesystem::relative(it->path().parent_path(), options.in_dir);
    const auto dir = std::filesystem::path(options.out_dir) / rel;
    std::filesystem::create_directories(dir, ec);
    const std::string rank = name.substr(4, name.size() - 4 - 5);
    std::ofstream(dir / absl::StrCat(kTorchTracePrefix, rank), std::ios::binary) << *pickle;
    ++written;
  }
  if (ec)
    return absl::NotFoundError(absl::StrCat("cannot read ", options.in_dir, ": ", ec.message()));
  if (written == 0) {
    return absl::NotFoundError(absl::StrCat("no rank<N>.json files under ", options.in_dir));
  }
  out << "wrote " << written << " torchfrtrace file(s) under " << options.out_dir << "\n";
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCommand(const GlobalOptions& options, const std::vector<std::string>& args,
                        std::ostream& out) {
  if (args.empty()) return absl::InvalidArgumentError("no command given");
  const std::string& command = args[0];
  if (command == "fr" && args.size() == 2 && args[1] == "export") return FrExport(options, out);
  if (command == "fr" && args.size() >= 2 && args[1] == "collect") {
    return FrCollect(options, std::vector<std::string>(args.begin() + 2, args.end()), out);
  }
  if (command == "cluster") {
    if (args.size() != 2 || args[1] != "nodes") {
      return absl::InvalidArgumentError("cluster takes one subcommand: nodes");
    }
    return ClusterNodes(options, out);
  }
  if (args.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", command, "' takes no arguments, got '", args[1], "'"));
  }
  if (command == "status") return Status(options, out);
  if (command == "topo") return Topo(options, out);
  if (command == "groups") return Groups(options, out);
  if (command == "dump") return Dump(options, out);
  if (command == "health") return Health(options, out);
  if (command == "abort") return Abort(options, out);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown command '", command,
      "'; commands: status, topo, groups, health, abort, dump, cluster nodes, fr export, "
      "fr collect"));
}

std::string FormatDuration(int64_t ms) {
  int64_t s = ms / 1000;
  const int64_t d = s / 86400, h = (s / 3600) % 24, m = (s / 60) % 60;
  s %= 60;
  if (d > 0) return absl::StrFormat("%dd %dh %dm %ds", d, h, m, s);
  if (h > 0) return absl::StrFormat("%dh %dm %ds", h, m, s);
  if (m > 0) return absl::StrFormat("%dm %ds", m, s);
  return absl::StrFormat("%d.%03ds", s, ms % 1000);
}

std::string FormatStatus(const v1::NodeStatus& s) {
  std::string out = absl::StrFormat(
      "commd %s on %s (pid %d)\n"
      "  uptime       %s\n"
      "  runtime dir  %s\n"
      "  metrics      http://%s/metrics\n"
      "  sessions     %u\n"
      "  groups       %u\n"
      "  memory       %u bytes\n"
      "  cuda         %s\n",
      s.version(), s.hostname(), s.pid(), FormatDuration(s.uptime_ms()), s.runtime_dir(),
      s.metrics_address(), s.sessions(), s.groups(), s.memory_allocated_bytes(), s.cuda_status());
  if (s.has_cluster()) {
    const v1::ClusterStatus& c = s.cluster();
    absl::StrAppendFormat(&out, "  cluster      %s as node %s (etcd %s)%s\n", c.state(),
                          c.node_name(), c.endpoint(),
                          c.last_error().empty() ? "" : ": " + c.last_error());
  }
  return out;
}

}  // namespace commd::ctl
