// Flight-recorder dumps in PyTorch's schema (version "2.10"), one JSON object per rank.
//
//   DumpOptions opts{.comm_lib_version = "commd 0.1.0", .trigger = "hang",
//                    .process_groups = {{.pg_id = 0, .name = "0", .desc = "default_pg",
//                                        .ranks = {0, 1}}}};
//   std::string json = EncodeRankDumpJson({.snapshot = &snap, .host = "node7", .pid = 4242,
//                                          .device = "cuda:0"}, opts);
//   // write json to "<dir>/<prefix><global_rank>.json", or EncodePickleFromJson(json)
//   // (pickle_writer.h) to "<dir>/<prefix><global_rank>" for torchfrtrace.
//
// The one encoder of the schema: written straight into a string (no JSON tree; the tree cost
// most of a big dump's time), objects' keys sorted as nlohmann's dump() sorts them.
// dump_json_test holds it byte for byte to an independent nlohmann-tree encoding.
//
// What PyTorch's analyzer (torch/distributed/flight_recorder, "torchfrtrace") relies on:
// - `version` is "<major>.<minor>" and equal across the rank files;
// - `pg_config` maps each group name to {name, desc, ranks}, `ranks` a Python list literal
//   of global ranks ("[0, 1]"); every entry's process_group[0] must be a key of it;
// - `profiling_name` is "<lib>:<op>" with lib "nccl" or "xccl" only, and op one of its
//   collective names (RecordOpTorchName) or "send a->b" / "recv b<-a" (group ranks);
// - entries are in record order; `is_p2p`, the seq ids, sizes, dtypes and `state` are read.
// commd's own fields go under a "commd" key (top level and per entry); the analyzer ignores
// unknown keys.
//
// Thread-safety: pure functions of their arguments.
#ifndef COMMD_FORMAT_DUMP_JSON_H_
#define COMMD_FORMAT_DUMP_JSON_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/ring_snapshot.h"
#include "nlohmann/json.hpp"

namespace commd {

inline constexpr char kFlightRecorderVersion[] = "2.10";

struct ProcessGroupConfig {
  uint64_t pg_id = 0;
  std::string name;  // the entries' process_group[0]
  std::string desc;
  std::vector<int32_t> ranks;  // global ranks, in group-rank order
};

struct RankDumpInput {
  const RingSnapshot* snapshot = nullptr;  // required, borrowed
  std::string host;
  int64_t pid = 0;
  std::string device;  // "host", "cuda:0", ...
};

// The most groups pg_config adds for the entries that name a group the options do not (an
// honest writer names at most RingWriter::kMaxProcessGroups; a hostile one, one per entry).
inline constexpr size_t kMaxGuessedGroups = 16;

struct DumpOptions {
  std::string comm_lib_version;  // e.g. "commd 0.1.0"
  std::string trigger;           // request | signal | hang | rank_death | abort
  // Prefix of profiling_name. torchfrtrace accepts only "nccl" and "xccl".
  std::string profiling_lib = "nccl";
  // pg_config. The first group is the block's own: pg_status reports its progress under its
  // pg_id. Groups named by entries but missing here are added (kMaxGuessedGroups at most) with
  // ranks [0, world_size) (right when global ranks equal group ranks).
  std::vector<ProcessGroupConfig> process_groups;
  std::optional<nlohmann::json> diagnosis;  // the watchdog's finding, if any
};

// "<lib>:<op>", with " <rank>-><peer>" / " <rank><-<peer>" for send / recv.
std::string ProfilingName(const std::string& lib, const RecordedEntry& e, int32_t rank);

// Python's str() of a list of ints: "[0, 1, 2]".
std::string RanksString(const std::vector<int32_t>& ranks);

// One rank's dump as JSON text. Allocates; never fails (the snapshot was validated when
// read). Strings are copied as they are (the ring reader made names valid UTF-8).
std::string EncodeRankDumpJson(const RankDumpInput& rank, const DumpOptions& options);

}  // namespace commd

#endif  // COMMD_FORMAT_DUMP_JSON_H_
