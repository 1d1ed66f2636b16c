#include "format/dump_json.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/recorder/ring_reader.h"
#include "daemon/recorder/ring_test_util.h"
#include "format/pickle_writer.h"

namespace commd {
namespace {

using json = nlohmann::json;
using testing::RecordMix;
using testing::TestBlock;

// ---- The oracle: the schema encoded independently, as an nlohmann tree (whose dump() sorts
// keys). The product has only the streaming encoder; this keeps it honest byte for byte. ----
namespace oracle {

json Sizes(const std::vector<std::vector<int64_t>>& sizes) {
  json out = json::array();
  for (const auto& dims : sizes) out.push_back(dims);
  return out;
}

json Dtypes(const std::vector<DataType>& dtypes) {
  json out = json::array();
  for (DataType d : dtypes) out.push_back(DataTypeInfo(d).scalar);
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

json EncodeRankDump(const RankDumpInput& in, const DumpOptions& options) {
  const RingSnapshot& s = *in.snapshot;
  json entries = json::array();
  for (const RecordedEntry& e : s.entries) entries.push_back(EncodeEntry(e, options, s.rank));
  return {
      {"version", kFlightRecorderVersion}, {"comm_lib_version", options.comm_lib_version},
      {"pg_config", PgConfig(s, options)}, {"pg_status", PgStatus(s, options)},
      {"entries", std::move(entries)},     {"commd", CommdSection(in, options)},
  };
}

}  // namespace oracle

bool HavePython() { return std::system("command -v python3 >/dev/null 2>&1") == 0; }

struct RankFixture {
  explicit RankFixture(int32_t rank, int entries = 10) : block(16, rank, 2, rank) {
    auto w = block.Writer();
    RecordMix(*w, entries);
    snapshot = *ReadControlBlock(block.base(), block.bytes);
    EXPECT_TRUE(StampDiscoveries(block.base(), block.bytes, 7'000'000, &snapshot).ok());
  }
  RankDumpInput input() const {
    return {.snapshot = &snapshot, .host = "node7", .pid = 4242 + snapshot.rank, .device = "host"};
  }
  TestBlock block;
  RingSnapshot snapshot;
};

DumpOptions Options() {
  return {.comm_lib_version = "commd 0.1.0",
          .trigger = "hang",
          .process_groups = {{.pg_id = 0, .name = "0", .desc = "default_pg", .ranks = {0, 1}}},
          .diagnosis = json{{"kind", "stuck"}, {"ranks", {1}}}};
}

using Check = std::function<bool(const json&)>;
const Check kInt = [](const json& v) { return v.is_number_integer(); };
const Check kBool = [](const json& v) { return v.is_boolean(); };
const Check kString = [](const json& v) { return v.is_string(); };
const Check kIntOrNull = [](const json& v) { return v.is_null() || v.is_number_integer(); };
const Check kSizes = [](const json& v) {
  if (!v.is_array()) return false;
  for (const json& t : v) {
    if (!t.is_array()) return false;
    for (const json& d : t) {
      if (!d.is_number_integer()) return false;
    }
  }
  return true;
};
const Check kStrings = [](const json& v) {
  if (!v.is_array()) return false;
  for (const json& s : v) {
    if (!s.is_string()) return false;
  }
  return true;
};

TEST(DumpJson, EveryRequiredKeyHasItsType) {
  RankFixture r(0);
  const json d = json::parse(EncodeRankDumpJson(r.input(), Options()));
  EXPECT_EQ(d["version"], "2.10");
  EXPECT_EQ(d["comm_lib_version"], "commd 0.1.0");
  EXPECT_EQ(d["pg_config"], json::parse(R"({"0": {"name": "0", "desc": "default_pg",
                                                   "ranks": "[0, 1]"}})"));
  EXPECT_EQ(d["pg_status"], json::parse(R"({"0": {"last_enqueued_collective": 6,
      "last_started_collective": 5, "last_completed_collective": 4}})"));
  ASSERT_TRUE(d["entries"].is_array());
  ASSERT_EQ(d["entries"].size(), 10u);
  const std::vector<std::pair<const char*, Check>> schema = {
      {"record_id", kInt},
      {"pg_id", kInt},
      {"process_group", [](const json& v) { return v.is_array() && v.size() == 2 && kStrings(v); }},
      {"collective_seq_id", kInt},
      {"p2p_seq_id", kInt},
      {"op_id", kInt},
      {"profiling_name", kString},
      {"time_created_ns", kInt},
      {"input_sizes", kSizes},
      {"input_dtypes", kStrings},
      {"output_sizes", kSizes},
      {"output_dtypes", kStrings},
      {"state",
       [](const json& v) { return v == "scheduled" || v == "started" || v == "completed"; }},
      {"time_discovered_started_ns", kIntOrNull},
      {"time_discovered_completed_ns", kIntOrNull},
      {"retired", kBool},
      {"timeout_ms", kInt},
      {"is_p2p", kBool},
      {"duration_ms", [](const json& v) { return v.is_null() || v.is_number_float(); }},
  };
  for (const json& e : d["entries"]) {
    for (const auto& [key, check] : schema) {
      ASSERT_TRUE(e.contains(key)) << key << " missing in " << e.dump();
      EXPECT_TRUE(check(e[key])) << key << " = " << e[key].dump();
    }
  }
  const json& first = d["entries"][0];
  EXPECT_EQ(first["profiling_name"], "nccl:all_reduce");
  EXPECT_EQ(first["input_dtypes"], json::array({"Float"}));
  EXPECT_EQ(first["state"], "completed");
  EXPECT_EQ(first["time_discovered_completed_ns"], 7'000'000);
  EXPECT_EQ(first["duration_ms"], 0.001);
  EXPECT_TRUE(d["entries"][4]["time_discovered_started_ns"].is_null());  // never started
  EXPECT_EQ(d["entries"][2]["profiling_name"], "nccl:send 0->1");
  EXPECT_EQ(d["entries"][3]["profiling_name"], "nccl:recv 0<-1");
  EXPECT_EQ(d["entries"][4]["commd"]["nan_found"], true);

  const json& c = d["commd"];
  EXPECT_EQ(c["host"], "node7");
  EXPECT_EQ(c["pid"], 4242);
  EXPECT_EQ(c["device"], "host");
  EXPECT_EQ(c["trigger"], "hang");
  EXPECT_EQ(c["dropped"], 0);
  EXPECT_EQ(c["invalid_entries"], 0);
  EXPECT_EQ(c["diagnosis"]["kind"], "stuck");
  EXPECT_EQ(c["counters"]["per_op"]["all_reduce"], 2);
}

TEST(DumpJson, EmptyRingStillHasEntries) {
  RankFixture r(1, 0);
  const json d = json::parse(EncodeRankDumpJson(r.input(), {}));
  ASSERT_TRUE(d.contains("entries"));
  EXPECT_EQ(d["entries"], json::array());
  EXPECT_EQ(d["pg_status"]["0"]["last_completed_collective"], 0);
}

TEST(DumpJson, PgConfigCoversEveryEntryGroup) {
  RankFixture r(0, 3);
  const json d = json::parse(EncodeRankDumpJson(r.input(), {.profiling_lib = "xccl"}));
  EXPECT_EQ(d["pg_config"]["0"]["ranks"], "[0, 1]");
  EXPECT_EQ(d["pg_config"]["0"]["desc"], "default_pg");
  EXPECT_EQ(d["entries"][0]["profiling_name"], "xccl:all_reduce");
}

// The encoder writes exactly the oracle's bytes, also for odd strings (quotes, backslashes,
// control bytes), durations, every section's optional parts and every corpus seed.
TEST(DumpJson, EncoderMatchesTheTreeOracle) {
  RankFixture r(1, 40);
  const DumpOptions opts = Options();
  EXPECT_EQ(EncodeRankDumpJson(r.input(), opts), oracle::EncodeRankDump(r.input(), opts).dump());
  RingSnapshot odd = r.snapshot;
  ASSERT_FALSE(odd.entries.empty());
  odd.entries[0].pg_name = std::string("a\"b\\c\n\t\x01\x1f\x7f", 10) + "\xc3\xa9";
  odd.entries[0].pg_desc = "\b\f\r";
  odd.entries[0].duration_ms = 0.1;
  odd.entries[1].duration_ms = 2.0;
  odd.entries[2].duration_ms = std::nullopt;
  odd.entries[3].time_discovered_started_ns = std::nullopt;
  // Doubles in every shape nlohmann's to_chars takes, and names at the escaping worst case
  // (the encoder writes into room sized by an upper bound).
  const double durations[] = {1e-7, 123456789.125, 1.5e300, 0.0, 5e-324, 1e21, 1e-5, 42.0};
  for (size_t i = 0; i < std::size(durations); ++i) odd.entries[4 + i].duration_ms = durations[i];
  odd.entries[12].pg_name = std::string(63, '\x01');
  odd.entries[12].pg_desc = std::string(63, '"');
  // Groups only entries name, in an order their names do not sort in; more than the 16
  // guesses; the small sections' optional parts.
  for (size_t i = 13; i < odd.entries.size(); ++i) {
    odd.entries[i].pg_name = absl::StrCat("g", 40 - i, i % 3 == 0 ? "\x7f" : "");
  }
  odd.invalid_by_reason = {0, 2, 0, 0, 5, 0, 0, 0, 0, 1};
  odd.invalid_entries = 8;
  odd.per_op = {};
  odd.per_op[1] = 3;
  odd.per_op[kRecordOpCount - 1] = 7;
  odd.abort_reason = 99;  // no name: "unknown"
  odd.abort_text = "stop \"now\"\n";
  odd.rank = -1;
  RankDumpInput in = r.input();
  in.snapshot = &odd;
  in.host = "h\"ost";
  EXPECT_EQ(EncodeRankDumpJson(in, opts), oracle::EncodeRankDump(in, opts).dump());
  DumpOptions long_lib = opts;
  long_lib.profiling_lib = std::string(500, '\x02');
  long_lib.diagnosis.reset();
  long_lib.process_groups.push_back({.pg_id = 9, .name = "z", .desc = "second", .ranks = {}});
  long_lib.process_groups.push_back({.pg_id = 3, .name = "0", .desc = "again", .ranks = {1}});
  EXPECT_EQ(EncodeRankDumpJson(in, long_lib), oracle::EncodeRankDump(in, long_lib).dump());
  int seeds = 0;
  for (const auto& f : std::filesystem::directory_iterator(COMMD_RING_CORPUS)) {
    std::ifstream file(f.path(), std::ios::binary);
    std::string raw((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    std::vector<uint64_t> buf(raw.size() / 8 + 1);
    std::memcpy(buf.data(), raw.data(), raw.size());
    auto snap = ReadControlBlock(buf.data(), raw.size());
    if (!snap.ok()) continue;
    ++seeds;
    EXPECT_EQ(EncodeRankDumpJson({.snapshot = &*snap}, {}),
              oracle::EncodeRankDump({.snapshot = &*snap}, {}).dump())
        << f.path();
  }
  EXPECT_GE(seeds, 4);
}

TEST(DumpJson, RanksStringIsPythonListSyntax) {
  EXPECT_EQ(RanksString({}), "[]");
  EXPECT_EQ(RanksString({3}), "[3]");
  EXPECT_EQ(RanksString({0, 1, 2}), "[0, 1, 2]");
}

TEST(DumpJson, EachRankNamesItselfInItsDump) {
  RankFixture r0(0), r1(1);
  for (const RankFixture* r : {&r0, &r1}) {
    const json d = json::parse(EncodeRankDumpJson(r->input(), Options()));
    const int rank = r->snapshot.global_rank;
    EXPECT_EQ(d["commd"]["global_rank"], rank);
    EXPECT_EQ(d["entries"][2]["profiling_name"], absl::StrCat("nccl:send ", rank, "->1"));
  }
}

// Runs `script` with the directory of the written rank files as argv[1].
int RunPython(const std::string& script, const std::string& dir) {
  const std::string path = dir + "/check.py";
  std::ofstream(path) << script;
  return std::system(("python3 " + path + " " + dir).c_str());
}

// What torchfrtrace's loader, builder and Op parser need from each rank file; mirrors the
// checks of torch/distributed/flight_recorder/components/{loader,builder,types}.py.
constexpr char kAnalyzerChecks[] = R"PY(
import ast, json, os, pickle, sys
COLLECTIVES = {"broadcast", "_broadcast_oop", "reduce", "_reduce_oop", "all_gather",
  "all_gather_single", "all_gather_v", "all_reduce", "_all_gather_base",
  "all_gather_into_tensor_coalesced", "reduce_scatter", "reduce_scatter_single",
  "reduce_scatter_v", "reduce_scatter_tensor_coalesced", "_reduce_scatter_base", "gather",
  "scatter", "all_to_all", "all_to_all_single", "all_to_all_v_single", "all_reduce_barrier",
  "barrier", "split", "new_window", "allreduce_coalesced", "ALLGATHER_coalesced",
  "REDUCE_SCATTER_coalesced"}
d = sys.argv[1]
prefix = "commd_fr_"
versions = set()
for f in sorted(os.listdir(d)):
    if not f.startswith(prefix) or f.endswith(".json"):
        continue
    rank = int(f[len(prefix):])
    dump = pickle.load(open(os.path.join(d, f), "rb"))
    assert json.load(open(os.path.join(d, f + ".json"))) == dump, "pickle != json for " + f
    versions.add(dump["version"])
    major, minor = map(int, dump["version"].split("."))
    for name, pg in dump["pg_config"].items():
        ranks = ast.literal_eval(pg["ranks"])
        assert all(isinstance(r, int) for r in ranks) and pg["name"] == name
    for e in dump["entries"]:
        assert e["process_group"][0] in dump["pg_config"]
        lib, name = e["profiling_name"].split(":")
        assert lib in ("nccl", "xccl"), lib
        parts = name.split(" ")
        assert parts[0] in COLLECTIVES | {"send", "recv", "coalesced"}, parts[0]
        if parts[0] == "send":
            s, t = map(int, parts[1].split("->"))
            assert s == dump["commd"]["rank"]
        if parts[0] == "recv":
            t, s = map(int, parts[1].split("<-"))
        for k in ("collective_seq_id", "p2p_seq_id", "record_id", "time_created_ns"):
            assert isinstance(e[k], int), k
        assert isinstance(e["is_p2p"], bool) and e["state"] in ("scheduled", "started", "completed")
        assert e.get("frames", []) == []
assert len(versions) == 1, versions
print("analyzer checks passed")
)PY";

TEST(DumpPickle, TorchfrtraceCanLoadTheRankFiles) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not on PATH";
  const std::string dir = ::testing::TempDir() + "/fr_dump_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  RankFixture r0(0), r1(1);
  const RankDumpInput in[] = {r0.input(), r1.input()};
  for (const RankDumpInput& rank : in) {
    // As the dumper writes them: the JSON, and the pickle made from it.
    const std::string dump = EncodeRankDumpJson(rank, Options());
    auto bytes = EncodePickleFromJson(dump);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const std::string file = dir + "/commd_fr_" + std::to_string(rank.snapshot->global_rank);
    std::ofstream(file, std::ios::binary) << *bytes;
    std::ofstream(file + ".json") << dump;
  }
  EXPECT_EQ(RunPython(kAnalyzerChecks, dir), 0);
  std::filesystem::remove_all(dir);
}

// Every seed of the fuzz corpus that reads as a block encodes to JSON and to a pickle that
// Python loads back to the same value.
TEST(DumpPickle, CorpusSeedsRoundTripThroughPython) {
  if (!HavePython()) GTEST_SKIP() << "python3 is not on PATH";
  const std::string dir = ::testing::TempDir() + "/fr_corpus_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  int encoded = 0;
  for (const auto& f : std::filesystem::directory_iterator(COMMD_RING_CORPUS)) {
    std::ifstream in(f.path(), std::ios::binary);
    std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<uint64_t> buf(raw.size() / 8 + 1);
    std::memcpy(buf.data(), raw.data(), raw.size());
    auto snap = ReadControlBlock(buf.data(), raw.size());
    if (!snap.ok()) continue;
    const std::string dump = EncodeRankDumpJson({.snapshot = &*snap}, {});
    auto bytes = EncodePickleFromJson(dump);
    ASSERT_TRUE(bytes.ok()) << f.path() << ": " << bytes.status();
    const std::string name = dir + "/commd_fr_" + std::to_string(encoded++);
    std::ofstream(name, std::ios::binary) << *bytes;
    std::ofstream(name + ".json") << dump;
  }
  EXPECT_GE(encoded, 4);  // the valid_* seeds at least
  constexpr char kSame[] = R"PY(
import json, os, pickle, sys
d = sys.argv[1]
for f in os.listdir(d):
    if f.startswith("commd_fr_") and not f.endswith(".json"):
        assert pickle.load(open(os.path.join(d, f), "rb")) == json.load(open(os.path.join(d, f + ".json"))), f
)PY";
  EXPECT_EQ(RunPython(kSame, dir), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace commd
