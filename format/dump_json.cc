#include "format/dump_json.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace commd {

std::string ProfilingName(const std::string& lib, const RecordedEntry& e, int32_t rank) {
  std::string name = absl::StrCat(lib, ":", CollectiveName(e.op));
  if (e.op == CollectiveOp::kSend) absl::StrAppend(&name, " ", rank, "->", e.peer);
  if (e.op == CollectiveOp::kRecv) absl::StrAppend(&name, " ", rank, "<-", e.peer);
  return name;
}

std::string RanksString(const std::vector<int32_t>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) absl::StrAppend(&out, i ? ", " : "", ranks[i]);
  return out + "]";
}

namespace {

// Entries are written through a raw cursor into room reserved up front (one bound check per
// entry, not per byte): std::to_chars for integers, nlohmann's own shortest-double routine
// for the float, literal keys copied with their compile-time length.
template <size_t N>
char* Put(char* p, const char (&literal)[N]) {
  std::memcpy(p, literal, N - 1);
  return p + N - 1;
}
char* Put(char* p, std::string_view s) {
  std::memcpy(p, s.data(), s.size());
  return p + s.size();
}
template <typename Int>
char* PutInt(char* p, Int v) {
  return std::to_chars(p, p + 24, v).ptr;
}
char* PutBool(char* p, bool b) { return b ? Put(p, "true") : Put(p, "false"); }

// Bytes PutJsonString may write for `s`: every byte may become "\u00XX".
size_t JsonStringBound(std::string_view s) { return 6 * s.size() + 2; }

char* PutJsonString(char* p, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  *p++ = '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != '"' && c != '\\') {
      *p++ = ch;
      continue;
    }
    *p++ = '\\';
    switch (c) {
      case '"':
      case '\\':
        *p++ = ch;
        break;
      case '\b':
        *p++ = 'b';
        break;
      case '\f':
        *p++ = 'f';
        break;
      case '\n':
        *p++ = 'n';
        break;
      case '\r':
        *p++ = 'r';
        break;
      case '\t':
        *p++ = 't';
        break;
      default:
        p = Put(p, "u00");
        *p++ = kHex[c >> 4];
        *p++ = kHex[c & 0xf];
    }
  }
  *p++ = '"';
  return p;
}

void AppendJsonString(std::string* out, std::string_view s) {
  const size_t at = out->size();
  out->resize(at + JsonStringBound(s));
  out->resize(PutJsonString(out->data() + at, s) - out->data());
}

char* PutSizes(char* p, const std::vector<std::vector<int64_t>>& sizes) {
  *p++ = '[';
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) *p++ = ',';
    *p++ = '[';
    for (size_t k = 0; k < sizes[i].size(); ++k) {
      if (k) *p++ = ',';
      p = PutInt(p, sizes[i][k]);
    }
    *p++ = ']';
  }
  *p++ = ']';
  return p;
}

size_t SizesBound(const std::vector<std::vector<int64_t>>& sizes) {
  size_t n = 2;
  for (const auto& dims : sizes) n += 3 + 21 * dims.size();
  return n;
}

char* PutDtypes(char* p, const std::vector<DataType>& dtypes) {
  *p++ = '[';
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i) *p++ = ',';
    *p++ = '"';
    p = Put(p, std::string_view(DataTypeInfo(dtypes[i]).scalar));
    *p++ = '"';
  }
  *p++ = ']';
  return p;
}

char* PutOptional(char* p, const std::optional<uint64_t>& v) {
  return v.has_value() ? PutInt(p, *v) : Put(p, "null");
}

// nlohmann's float format (dump_float): null when not finite, else its Grisu2 to_chars.
char* PutDouble(char* p, double v) {
  if (!std::isfinite(v)) return Put(p, "null");
  return nlohmann::detail::to_chars(p, p + 64, v);
}

// Upper bound of AppendEntry's bytes: keys and punctuation (< 700), 17 numbers of at most
// 24 characters, the double (< 64), dtype names (< 16 each) and the variable parts.
size_t EntryBound(const RecordedEntry& e, const std::string& profiling_name) {
  return 1200 + SizesBound(e.input_sizes) + SizesBound(e.output_sizes) +
         20 * (e.input_dtypes.size() + e.output_dtypes.size()) + JsonStringBound(e.pg_name) +
         JsonStringBound(e.pg_desc) + JsonStringBound(profiling_name);
}

// Keys in nlohmann's (sorted) order.
char* PutEntry(char* p, const RecordedEntry& e, const std::string& profiling_name) {
  p = Put(p, "{\"collective_seq_id\":");
  p = PutInt(p, e.collective_seq_id);
  p = Put(p, ",\"commd\":{\"bytes\":");
  p = PutInt(p, e.bytes);
  p = Put(p, ",\"nan_found\":");
  p = PutBool(p, e.nan_found);
  p = Put(p, ",\"peer\":");
  p = PutInt(p, e.peer);
  p = Put(p, ",\"time_completed_ns\":");
  p = PutInt(p, e.time_completed_ns);
  p = Put(p, ",\"time_started_ns\":");
  p = PutInt(p, e.time_started_ns);
  p = Put(p, ",\"total_inputs\":");
  p = PutInt(p, e.total_inputs);
  p = Put(p, ",\"total_outputs\":");
  p = PutInt(p, e.total_outputs);
  p = Put(p, ",\"truncated\":");
  p = PutBool(p, e.truncated);
  p = Put(p, "},\"duration_ms\":");
  p = e.duration_ms.has_value() ? PutDouble(p, *e.duration_ms) : Put(p, "null");
  p = Put(p, ",\"frames\":[],\"input_dtypes\":");
  p = PutDtypes(p, e.input_dtypes);
  p = Put(p, ",\"input_sizes\":");
  p = PutSizes(p, e.input_sizes);
  p = Put(p, ",\"is_p2p\":");
  p = PutBool(p, e.is_p2p);
  p = Put(p, ",\"op_id\":");
  p = PutInt(p, e.op_id);
  p = Put(p, ",\"output_dtypes\":");
  p = PutDtypes(p, e.output_dtypes);
  p = Put(p, ",\"output_sizes\":");
  p = PutSizes(p, e.output_sizes);
  p = Put(p, ",\"p2p_seq_id\":");
  p = PutInt(p, e.p2p_seq_id);
  p = Put(p, ",\"pg_id\":");
  p = PutInt(p, e.pg_id);
  p = Put(p, ",\"process_group\":[");
  p = PutJsonString(p, e.pg_name);
  *p++ = ',';
  p = PutJsonString(p, e.pg_desc);
  p = Put(p, "],\"profiling_name\":");
  p = PutJsonString(p, profiling_name);
  p = Put(p, ",\"record_id\":");
  p = PutInt(p, e.record_id);
  p = Put(p, ",\"retired\":");
  p = PutBool(p, e.retired);
  p = Put(p, ",\"state\":\"");
  p = Put(p, std::string_view(RecordStateName(static_cast<uint32_t>(e.state))));
  p = Put(p, "\",\"time_created_ns\":");
  p = PutInt(p, e.time_created_ns);
  p = Put(p, ",\"time_discovered_completed_ns\":");
  p = PutOptional(p, e.time_discovered_completed_ns);
  p = Put(p, ",\"time_discovered_started_ns\":");
  p = PutOptional(p, e.time_discovered_started_ns);
  p = Put(p, ",\"timeout_ms\":");
  p = PutInt(p, e.timeout_ms);
  *p++ = '}';
  return p;
}

// Appends the entries, comma-separated. The string grows geometrically; each entry is
// written into room already there and the size is trimmed once at the end.
void AppendEntries(std::string* out, const RingSnapshot& s, const DumpOptions& options) {
  size_t len = out->size();
  // Only send / recv names depend on more than the op.
  std::array<std::string, kRecordOpCount> op_names;
  std::string p2p_name;
  for (size_t i = 0; i < s.entries.size(); ++i) {
    const RecordedEntry& e = s.entries[i];
    std::string* name = &op_names[static_cast<size_t>(e.op)];
    if (e.op == CollectiveOp::kSend || e.op == CollectiveOp::kRecv) {
      p2p_name = ProfilingName(options.profiling_lib, e, s.rank);
      name = &p2p_name;
    } else if (name->empty()) {
      *name = ProfilingName(options.profiling_lib, e, s.rank);
    }
    const std::string& profiling_name = *name;
    const size_t need = len + 1 + EntryBound(e, profiling_name);
    // Growing to the reserved capacity first never reallocates.
    if (need > out->size()) out->resize(std::max({need, out->size() * 2, out->capacity()}));
    char* p = out->data() + len;
    if (i) *p++ = ',';
    len = PutEntry(p, e, profiling_name) - out->data();
  }
  out->resize(len);
}

// ---- The small sections: appended key by key, in nlohmann's sorted key order (the schema
// the readers know, and byte-stable output) ----

// `"key":` (a literal key: no escaping needed).
void AppendKey(std::string* out, std::string_view key, bool first = false) {
  if (!first) out->push_back(',');
  out->push_back('"');
  out->append(key);
  out->append("\":");
}

template <typename Int>
void AppendInt(std::string* out, std::string_view key, Int v, bool first = false) {
  AppendKey(out, key, first);
  absl::StrAppend(out, v);
}

void AppendString(std::string* out, std::string_view key, std::string_view v, bool first = false) {
  AppendKey(out, key, first);
  AppendJsonString(out, v);
}

// {"name": count, ...} for the nonzero counts, names sorted.
void AppendCounts(std::string* out, const std::map<std::string, uint64_t>& counts) {
  out->push_back('{');
  bool first = true;
  for (const auto& [name, n] : counts) {
    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(out, name);
    out->push_back(':');
    absl::StrAppend(out, n);
  }
  out->push_back('}');
}

void AppendCounters(std::string* out, const RingSnapshot& s) {
  std::map<std::string, uint64_t> per_op;
  for (uint32_t op = 0; op < kRecordOpCount; ++op) {
    if (s.per_op[op] != 0) per_op[RecordOpTorchName(op)] = s.per_op[op];
  }
  out->push_back('{');
  AppendInt(out, "abandoned", s.abandoned, /*first=*/true);
  AppendInt(out, "bytes", s.bytes);
  AppendInt(out, "collectives", s.collectives);
  AppendInt(out, "nan_checks", s.nan_checks);
  AppendInt(out, "nans_found", s.nans_found);
  AppendKey(out, "per_op");
  AppendCounts(out, per_op);
  out->push_back('}');
}

// The "commd" object: the rank's identity, ring state, counters, abort and the diagnosis.
void AppendCommdSection(std::string* out, const RankDumpInput& in, const DumpOptions& options) {
  const RingSnapshot& s = *in.snapshot;
  std::map<std::string, uint64_t> invalid;
  for (size_t i = 0; i < kInvalidReasonCount; ++i) {
    if (s.invalid_by_reason[i] != 0) {
      invalid[InvalidReasonName(static_cast<InvalidReason>(i))] = s.invalid_by_reason[i];
    }
  }
  const char* abort_name = AbortReasonName(s.abort_reason);
  out->push_back('{');
  AppendInt(out, "abi_version", s.abi_version, /*first=*/true);
  AppendKey(out, "abort");
  out->push_back('{');
  AppendString(out, "reason", abort_name != nullptr ? abort_name : "unknown", /*first=*/true);
  AppendString(out, "text", s.abort_text);
  AppendInt(out, "time_ns", s.abort_time_ns);
  out->append("},\"counters\":");
  AppendCounters(out, s);
  AppendString(out, "device", in.device);
  if (options.diagnosis.has_value()) {
    AppendKey(out, "diagnosis");
    out->append(options.diagnosis->dump());
  }
  AppendInt(out, "dropped", s.dropped);
  AppendInt(out, "global_rank", s.global_rank);
  AppendInt(out, "heartbeat_ns", s.heartbeat_ns);
  AppendString(out, "host", in.host);
  AppendKey(out, "invalid_by_reason");
  AppendCounts(out, invalid);
  AppendInt(out, "invalid_entries", s.invalid_entries);
  AppendInt(out, "next_record_id", s.next_record_id);
  AppendInt(out, "pid", in.pid);
  AppendInt(out, "rank", s.rank);
  AppendInt(out, "ring_capacity", s.ring_capacity);
  AppendString(out, "trigger", options.trigger);
  AppendInt(out, "world_size", s.world_size);
  out->push_back('}');
}

// pg_config: the options' groups (a repeated name: the last wins), then the groups only the
// entries name. An honest writer has at most RingWriter::kMaxProcessGroups; a hostile one
// could name one per entry, so the guesses stop at kMaxGuessedGroups.
void AppendPgConfig(std::string* out, const RingSnapshot& s, const DumpOptions& options) {
  struct Group {
    std::string desc;
    std::string ranks;
  };
  std::map<std::string, Group> groups;
  for (const ProcessGroupConfig& pg : options.process_groups) {
    groups[pg.name] = {pg.desc, RanksString(pg.ranks)};
  }
  std::string fallback;
  size_t guessed = 0;
  for (const RecordedEntry& e : s.entries) {
    if (groups.count(e.pg_name) != 0 || guessed >= kMaxGuessedGroups) continue;
    if (fallback.empty()) {
      std::vector<int32_t> ranks;
      for (int32_t r = 0; r < s.world_size; ++r) ranks.push_back(r);
      fallback = RanksString(ranks);
    }
    groups[e.pg_name] = {e.pg_desc, fallback};
    ++guessed;
  }
  out->push_back('{');
  bool first = true;
  for (const auto& [name, g] : groups) {
    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(out, name);
    out->append(":{");
    AppendString(out, "desc", g.desc, /*first=*/true);
    AppendString(out, "name", name);
    AppendString(out, "ranks", g.ranks);
    out->push_back('}');
  }
  out->push_back('}');
}

// pg_status: the progress of the block's own group (the first of the options', else the
// first entry's).
void AppendPgStatus(std::string* out, const RingSnapshot& s, const DumpOptions& options) {
  uint64_t pg_id = 0;
  if (!options.process_groups.empty()) {
    pg_id = options.process_groups.front().pg_id;
  } else if (!s.entries.empty()) {
    pg_id = s.entries.front().pg_id;
  }
  absl::StrAppend(out, "{\"", pg_id, "\":{");
  AppendInt(out, "last_completed_collective", s.last_completed_seq, /*first=*/true);
  AppendInt(out, "last_enqueued_collective", s.last_enqueued_seq);
  AppendInt(out, "last_started_collective", s.last_started_seq);
  out->append("}}");
}

}  // namespace

std::string EncodeRankDumpJson(const RankDumpInput& in, const DumpOptions& options) {
  const RingSnapshot& s = *in.snapshot;
  std::string out;
  out.reserve(1024 + s.entries.size() * 640);
  out.append("{\"comm_lib_version\":");
  AppendJsonString(&out, options.comm_lib_version);
  out.append(",\"commd\":");
  AppendCommdSection(&out, in, options);
  out.append(",\"entries\":[");
  AppendEntries(&out, s, options);
  out.append("],\"pg_config\":");
  AppendPgConfig(&out, s, options);
  out.append(",\"pg_status\":");
  AppendPgStatus(&out, s, options);
  out.append(",\"version\":");
  AppendJsonString(&out, kFlightRecorderVersion);
  out.push_back('}');
  return out;
}

}  // namespace commd
