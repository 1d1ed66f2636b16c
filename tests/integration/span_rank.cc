// One rank of a group that spans nodes: connects to the daemon at $COMMD_RUNTIME_DIR (job
// $COMMD_JOB_ID), joins, and prints what it learned, then what a collective on the group does.
//
//   span_rank GROUP RANK WORLD GLOBAL_RANK GLOBAL_WORLD TIMEOUT_MS [LEAVE_FILE]
//
// Prints "join <CODE> <message>" and exits 1 when the join fails. Else prints
//   "layout <global world size> <node index> <node>:<r>,<r>;<node>:<r>..."
//   "allreduce <CODE> <message>"  (an all-reduce on a symmetric host buffer)
//   "barrier <CODE> <message>"
//   "joined"
// then, with LEAVE_FILE, stays in the group until that file exists, printing
//   "aborted <reason>"  (once, if the daemon aborts the group meanwhile)
//   "abort_seen_unix_us <when>"  (the wall-clock time it saw the abort word, polled every ms)
// and exits 0.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "commd/commd.h"

namespace {

void Print(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string Said(absl::string_view what, const absl::Status& s) {
  return absl::StrCat(what, " ", absl::StatusCodeToString(s.code()), " ", s.message());
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0, world = 0, global_rank = 0, global_world = 0;
  int64_t timeout_ms = 0;
  if (argc < 7 || !absl::SimpleAtoi(argv[2], &rank) || !absl::SimpleAtoi(argv[3], &world) ||
      !absl::SimpleAtoi(argv[4], &global_rank) || !absl::SimpleAtoi(argv[5], &global_world) ||
      !absl::SimpleAtoi(argv[6], &timeout_ms)) {
    std::fprintf(stderr,
                 "usage: span_rank GROUP RANK WORLD GLOBAL_RANK GLOBAL_WORLD TIMEOUT_MS "
                 "[LEAVE_FILE]\n");
    return 2;
  }
  const char* job = std::getenv("COMMD_JOB_ID");
  auto client = commd::Client::Connect({.job_id = job == nullptr ? "job" : job});
  if (!client.ok()) {
    Print(Said("connect", client.status()));
    return 1;
  }
  auto group = (*client)->JoinGroup({.name = argv[1],
                                     .rank = rank,
                                     .world_size = world,
                                     .global_rank = global_rank,
                                     .global_world_size = global_world,
                                     .timeout = absl::Milliseconds(timeout_ms)});
  if (!group.ok()) {
    Print(Said("join", group.status()));
    return 1;
  }
  std::vector<std::string> nodes;
  for (const commd::NodeRanks& n : (*group)->layout()) {
    nodes.push_back(absl::StrCat(n.node, ":", absl::StrJoin(n.global_ranks, ",")));
  }
  Print(absl::StrCat("layout ", (*group)->global_world_size(), " ", (*group)->node_index(), " ",
                     absl::StrJoin(nodes, ";")));
  auto buffer = (*group)->AllocateSymmetric(64);
  if (!buffer.ok()) {
    Print(Said("allocate", buffer.status()));
    return 1;
  }
  Print(Said("allreduce",
             (*group)->AllReduce(**buffer, 4, commd::DataType::kFloat32, commd::ReduceOp::kSum)));
  Print(Said("barrier", (*group)->Barrier()));
  Print("joined");
  if (argc > 7) {
    bool said = false;
    while (::access(argv[7], F_OK) != 0) {
      if (!said && (*group)->abort_requested()) {
        const int64_t seen = absl::ToUnixMicros(absl::Now());
        Print(absl::StrCat("aborted ", (*group)->abort_reason()));
        Print(absl::StrCat("abort_seen_unix_us ", seen));
        said = true;
      }
      // Often enough for the abort's latency across nodes to be measured to the millisecond.
      absl::SleepFor(absl::Milliseconds(said ? 50 : 1));
    }
  }
  return 0;
}
