#include "daemon/recorder/dump_json.h"

#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace commd {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxGuessedGroups = 16;

json Sizes(const std::vector<std::vector<int64_t>>& sizes) {
  json out = json::array();
  for (const auto& dims : sizes) out.push_back(dims);
  return out;
}

json Dtypes(const std::vector<RecordDtype>& dtypes) {
  json out = json::array();
  for (RecordDtype d : dtypes) out.push_back(RecordDtypeTorchName(static_cast<uint32_t>(d)));
  return out;
}

template <typename T>
json OptionalNumber(const std::optional<T>& v) {
  return v.has_value() ? json(*v) : json(nullptr);
}

json EncodeEntry(const RecordedEntry& e, const DumpOptions& options, int32_t rank) {
  json j = json::object();
  j["record_id"] = e.record_id;
  j["pg_id"] = e.pg_id;
  j["process_group"] = json::array({e.pg_name, e.pg_desc});
  j["collective_seq_id"] = e.collective_seq_id;
  j["p2p_seq_id"] = e.p2p_seq_id;
  j["op_id"] = e.op_id;
  j["profiling_name"] = ProfilingName(options.profiling_lib, e, rank);
  j["time_created_ns"] = e.time_created_ns;
  j["input_sizes"] = Sizes(e.input_sizes);
  j["input_dtypes"] = Dtypes(e.input_dtypes);
  j["output_sizes"] = Sizes(e.output_sizes);
  j["output_dtypes"] = Dtypes(e.output_dtypes);
  j["state"] = RecordStateName(static_cast<uint32_t>(e.state));
  j["time_discovered_started_ns"] = OptionalNumber(e.time_discovered_started_ns);
  j["time_discovered_completed_ns"] = OptionalNumber(e.time_discovered_completed_ns);
  j["retired"] = e.retired;
  j["timeout_ms"] = e.timeout_ms;
  j["is_p2p"] = e.is_p2p;
  j["duration_ms"] = OptionalNumber(e.duration_ms);
  j["frames"] = json::array();  // no stack traces: the analyzer reads it with a default
  j["commd"] = {
      {"time_started_ns", e.time_started_ns},
      {"time_completed_ns", e.time_completed_ns},
      {"bytes", e.bytes},
      {"nan_found", e.nan_found},
      {"truncated", e.truncated},
      {"total_inputs", e.total_inputs},
      {"total_outputs", e.total_outputs},
      {"peer", e.peer},
  };
  return j;
}

json PgConfig(const RingSnapshot& s, const DumpOptions& options) {
  json out = json::object();
  for (const ProcessGroupConfig& pg : options.process_groups) {
    out[pg.name] = {{"name", pg.name}, {"desc", pg.desc}, {"ranks", RanksString(pg.ranks)}};
  }
  // Groups only the entries name. An honest writer has at most RingWriter::kMaxProcessGroups;
  // a hostile one could name one per entry, so the guesses stop there.
  std::string fallback;
  size_t guessed = 0;
  for (const RecordedEntry& e : s.entries) {
    if (out.contains(e.pg_name) || guessed >= kMaxGuessedGroups) continue;
    if (fallback.empty()) {
      std::vector<int32_t> ranks;
      for (int32_t r = 0; r < s.world_size; ++r) ranks.push_back(r);
      fallback = RanksString(ranks);
    }
    out[e.pg_name] = {{"name", e.pg_name}, {"desc", e.pg_desc}, {"ranks", fallback}};
    ++guessed;
  }
  return out;
}

json PgStatus(const RingSnapshot& s, const DumpOptions& options) {
  uint64_t pg_id = 0;
  if (!options.process_groups.empty()) {
    pg_id = options.process_groups.front().pg_id;
  } else if (!s.entries.empty()) {
    pg_id = s.entries.front().pg_id;
  }
  return {{std::to_string(pg_id),
           {{"last_enqueued_collective", s.last_enqueued_seq},
            {"last_started_collective", s.last_started_seq},
            {"last_completed_collective", s.last_completed_seq}}}};
}

json CommdSection(const RankDumpInput& in, const DumpOptions& options) {
  const RingSnapshot& s = *in.snapshot;
  json invalid = json::object();
  for (size_t i = 0; i < kInvalidReasonCount; ++i) {
    if (s.invalid_by_reason[i] != 0) {
      invalid[InvalidReasonName(static_cast<InvalidReason>(i))] = s.invalid_by_reason[i];
    }
  }
  json per_op = json::object();
  for (uint32_t op = 0; op < kRecordOpCount; ++op) {
    if (s.per_op[op] != 0) per_op[RecordOpTorchName(op)] = s.per_op[op];
  }
  const char* abort_name = AbortReasonName(s.abort_reason);
  json c = {
      {"host", in.host},
      {"pid", in.pid},
      {"device", in.device},
      {"rank", s.rank},
      {"world_size", s.world_size},
      {"global_rank", s.global_rank},
      {"trigger", options.trigger},
      {"abi_version", s.abi_version},
      {"ring_capacity", s.ring_capacity},
      {"next_record_id", s.next_record_id},
      {"dropped", s.dropped},
      {"invalid_entries", s.invalid_entries},
      {"invalid_by_reason", invalid},
      {"heartbeat_ns", s.heartbeat_ns},
      {"counters",
       {{"collectives", s.collectives},
        {"bytes", s.bytes},
        {"nan_checks", s.nan_checks},
        {"nans_found", s.nans_found},
        {"abandoned", s.abandoned},
        {"per_op", per_op}}},
      {"abort",
       {{"reason", abort_name != nullptr ? abort_name : "unknown"},
        {"text", s.abort_text},
        {"time_ns", s.abort_time_ns}}},
  };
  if (options.diagnosis.has_value()) c["diagnosis"] = *options.diagnosis;
  return c;
}

}  // namespace

std::string ProfilingName(const std::string& lib, const RecordedEntry& e, int32_t rank) {
  std::string name = absl::StrCat(lib, ":", RecordOpTorchName(static_cast<uint32_t>(e.op)));
  if (e.op == RecordOp::kSend) absl::StrAppend(&name, " ", rank, "->", e.peer);
  if (e.op == RecordOp::kRecv) absl::StrAppend(&name, " ", rank, "<-", e.peer);
  return name;
}

std::string RanksString(const std::vector<int32_t>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) absl::StrAppend(&out, i ? ", " : "", ranks[i]);
  return out + "]";
}

nlohmann::json EncodeRankDump(const RankDumpInput& in, const DumpOptions& options) {
  const RingSnapshot& s = *in.snapshot;
  json entries = json::array();
  for (const RecordedEntry& e : s.entries) entries.push_back(EncodeEntry(e, options, s.rank));
  return {
      {"version", kFlightRecorderVersion}, {"comm_lib_version", options.comm_lib_version},
      {"pg_config", PgConfig(s, options)}, {"pg_status", PgStatus(s, options)},
      {"entries", std::move(entries)},     {"commd", CommdSection(in, options)},
  };
}

std::map<int32_t, nlohmann::json> EncodeRankDumps(std::span<const RankDumpInput> ranks,
                                                  const DumpOptions& options) {
  std::map<int32_t, nlohmann::json> out;
  for (const RankDumpInput& r : ranks) out[r.snapshot->global_rank] = EncodeRankDump(r, options);
  return out;
}

// ---- Streaming encoder: the same bytes as EncodeRankDump(...).dump(), without the tree ----

namespace {

void AppendJsonString(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

void AppendSizes(std::string* out, const std::vector<std::vector<int64_t>>& sizes) {
  out->push_back('[');
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out->push_back(',');
    out->push_back('[');
    for (size_t k = 0; k < sizes[i].size(); ++k) {
      if (k) out->push_back(',');
      absl::StrAppend(out, sizes[i][k]);
    }
    out->push_back(']');
  }
  out->push_back(']');
}

void AppendDtypes(std::string* out, const std::vector<RecordDtype>& dtypes) {
  out->push_back('[');
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i) out->push_back(',');
    AppendJsonString(out, RecordDtypeTorchName(static_cast<uint32_t>(dtypes[i])));
  }
  out->push_back(']');
}

void AppendOptional(std::string* out, const std::optional<uint64_t>& v) {
  if (v.has_value()) {
    absl::StrAppend(out, *v);
  } else {
    out->append("null");
  }
}

const char* Bool(bool b) { return b ? "true" : "false"; }

// Keys in nlohmann's (sorted) order.
void AppendEntry(std::string* out, const RecordedEntry& e, const DumpOptions& options,
                 int32_t rank) {
  absl::StrAppend(out, "{\"collective_seq_id\":", e.collective_seq_id,
                  ",\"commd\":{\"bytes\":", e.bytes, ",\"nan_found\":", Bool(e.nan_found),
                  ",\"peer\":", e.peer, ",\"time_completed_ns\":", e.time_completed_ns,
                  ",\"time_started_ns\":", e.time_started_ns, ",\"total_inputs\":", e.total_inputs,
                  ",\"total_outputs\":", e.total_outputs, ",\"truncated\":", Bool(e.truncated),
                  "},\"duration_ms\":");
  if (e.duration_ms.has_value()) {
    out->append(json(*e.duration_ms).dump());  // nlohmann's own float format
  } else {
    out->append("null");
  }
  out->append(",\"frames\":[],\"input_dtypes\":");
  AppendDtypes(out, e.input_dtypes);
  out->append(",\"input_sizes\":");
  AppendSizes(out, e.input_sizes);
  absl::StrAppend(out, ",\"is_p2p\":", Bool(e.is_p2p), ",\"op_id\":", e.op_id,
                  ",\"output_dtypes\":");
  AppendDtypes(out, e.output_dtypes);
  out->append(",\"output_sizes\":");
  AppendSizes(out, e.output_sizes);
  absl::StrAppend(out, ",\"p2p_seq_id\":", e.p2p_seq_id, ",\"pg_id\":", e.pg_id,
                  ",\"process_group\":[");
  AppendJsonString(out, e.pg_name);
  out->push_back(',');
  AppendJsonString(out, e.pg_desc);
  out->append("],\"profiling_name\":");
  AppendJsonString(out, ProfilingName(options.profiling_lib, e, rank));
  absl::StrAppend(out, ",\"record_id\":", e.record_id, ",\"retired\":", Bool(e.retired),
                  ",\"state\":");
  AppendJsonString(out, RecordStateName(static_cast<uint32_t>(e.state)));
  absl::StrAppend(out, ",\"time_created_ns\":", e.time_created_ns,
                  ",\"time_discovered_completed_ns\":");
  AppendOptional(out, e.time_discovered_completed_ns);
  out->append(",\"time_discovered_started_ns\":");
  AppendOptional(out, e.time_discovered_started_ns);
  absl::StrAppend(out, ",\"timeout_ms\":", e.timeout_ms, "}");
}

}  // namespace

std::string EncodeRankDumpJson(const RankDumpInput& in, const DumpOptions& options) {
  const RingSnapshot& s = *in.snapshot;
  std::string out;
  out.reserve(1024 + s.entries.size() * 640);
  out.append("{\"comm_lib_version\":");
  AppendJsonString(&out, options.comm_lib_version);
  out.append(",\"commd\":");
  out.append(CommdSection(in, options).dump());
  out.append(",\"entries\":[");
  for (size_t i = 0; i < s.entries.size(); ++i) {
    if (i) out.push_back(',');
    AppendEntry(&out, s.entries[i], options, s.rank);
  }
  out.append("],\"pg_config\":");
  out.append(PgConfig(s, options).dump());
  out.append(",\"pg_status\":");
  out.append(PgStatus(s, options).dump());
  out.append(",\"version\":");
  AppendJsonString(&out, kFlightRecorderVersion);
  out.push_back('}');
  return out;
}

}  // namespace commd
