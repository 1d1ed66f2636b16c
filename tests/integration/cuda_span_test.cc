// A group spanning nodes on CUDA memory (docs/cluster.md "Collectives across nodes"), on fake
// hardware only: real etcd on loopback, two real daemons as nodes and four real rank processes
// (cuda_span_rank), the CUDA driver being tests/fixtures/fake_libcuda, NCCL being
// tests/fixtures/fake_libnccl (it records each rank's NCCL calls), and the node-local kernel
// launch replaced (each rank prints its launches). The SDK between them is the real one: the
// agreement through host words and gloo, the plan, the NCCL communicators' unique ids through
// the job's store, the abort. What the steps compute is kernels/span_plan_test's.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

#define SPAN_RANK CUDA_SPAN_RANK
#define SPAN_COLLECTIVE_RANK CUDA_SPAN_RANK
#include "tests/integration/span_fixture.h"

namespace commd::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Per call of a rank's log ("<name> <CODE> <message>"): its result line and the node-local
// launches printed before it.
struct Call {
  std::string result;
  std::vector<std::string> launches;
};
std::map<std::string, Call> Calls(const std::string& log) {
  std::map<std::string, Call> calls;
  std::vector<std::string> pending;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StartsWith(line, "launch ")) {
      pending.emplace_back(line);
      continue;
    }
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos) continue;
    calls[std::string(line.substr(0, space))] = {std::string(line.substr(space + 1)),
                                                 std::move(pending)};
    pending.clear();
  }
  return calls;
}

class CudaSpanTest : public SpanFixture {
 protected:
  void SetUp() override {
#ifndef COMMD_FAKE_LIBNCCL
    GTEST_SKIP() << "built without CUDA";
#else
    SpanFixture::SetUp();
    // The daemons and the ranks inherit these: every process's CUDA driver is the fake.
    ::setenv("COMMD_CUDA_DRIVER_LIBRARY", COMMD_FAKE_LIBCUDA, 1);
    ::setenv("COMMD_FAKE_CUDA_DEVICES", "2", 1);
#endif
  }
  void TearDown() override {
    SpanFixture::TearDown();
    ::unsetenv("COMMD_CUDA_DRIVER_LIBRARY");
    ::unsetenv("COMMD_FAKE_CUDA_DEVICES");
  }
  std::string NcclLog(int global_rank) const {
    return tmp_.Join(absl::StrCat("nccl.", global_rank));
  }
  // Global rank g's NCCL calls, without the polls of ncclCommGetAsyncError.
  std::vector<std::string> NcclCalls(int global_rank) const {
    std::ifstream in(NcclLog(global_rank));
    std::vector<std::string> calls;
    for (std::string line; std::getline(in, line);) {
      if (!absl::StartsWith(line, "ncclCommGetAsyncError")) calls.push_back(line);
    }
    return calls;
  }
  // 2 nodes x 2 ranks of cuda_span_rank `mode`, NCCL from `nccl`.
  std::vector<ChildProcess*> Start(const std::vector<DaemonProcess*>& n, const std::string& mode,
                                   const std::string& nccl) {
    std::vector<ChildProcess*> ranks;
    for (int g = 0; g < 4; ++g) {
      ranks.push_back(StartRank(
          {.node = n[g / 2],
           .rank = g % 2,
           .world = 2,
           .global_rank = g,
           .global_world = 4,
           .mode = mode,
           .env = {"COMMD_NCCL_LIBRARY=" + nccl, "COMMD_FAKE_NCCL_CALL_LOG=" + NcclLog(g)}}));
    }
    return ranks;
  }
  // Global ranks by node of the uneven, interleaved layout: node-a {3}, node-b {0, 5},
  // node-c {1, 2, 4}.
  static inline const std::vector<std::vector<int>> kInterleaved = {{3}, {0, 5}, {1, 2, 4}};
  // The 6 ranks of that layout on nodes `n`, cuda_span_rank `mode`, by global rank.
  std::map<int, ChildProcess*> StartInterleaved(const std::vector<DaemonProcess*>& n,
                                                const std::string& mode) {
    std::map<int, ChildProcess*> ranks;
    for (size_t node = 0; node < kInterleaved.size(); ++node) {
      const int world = static_cast<int>(kInterleaved[node].size());
      for (int l = 0; l < world; ++l) {
        const int g = kInterleaved[node][l];
        ranks[g] = StartRank({.node = n[node],
                              .rank = l,
                              .world = world,
                              .global_rank = g,
                              .global_world = 6,
                              .mode = mode,
                              .env = {std::string("COMMD_NCCL_LIBRARY=") + COMMD_FAKE_LIBNCCL,
                                      "COMMD_FAKE_NCCL_CALL_LOG=" + NcclLog(g)}});
      }
    }
    return ranks;
  }
};

// The value of `key=` in an NCCL log line.
std::string Field(const std::string& line, const std::string& key) {
  for (absl::string_view f : absl::StrSplit(line, ' ')) {
    if (absl::StartsWith(f, key + "=")) return std::string(f.substr(key.size() + 1));
  }
  return "";
}

TEST_F(CudaSpanTest, TwoByTwoAgreesThenLaunchesTheNodeLocalKernelsAndNcclPerLane) {
#ifdef COMMD_FAKE_LIBNCCL
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = Start(n, "calls", COMMD_FAKE_LIBNCCL);
  for (ChildProcess* r : ranks) ASSERT_TRUE(r->WaitForLog("done", absl::Seconds(90))) << r->Log();

  for (int g = 0; g < 4; ++g) {
    SCOPED_TRACE(absl::StrCat("global rank ", g));
    const bool node0 = g < 2, leader = g % 2 == 0;
    std::map<std::string, Call> calls = Calls(ranks[g]->Log());
    // Small all-reduce: the leaders' path.
    EXPECT_EQ(calls["all_reduce"].result, "OK ");
    EXPECT_THAT(calls["all_reduce"].launches,
                ElementsAre("launch all_reduce count=1000 root=0 offset=0",
                            "launch broadcast count=1000 root=0 offset=0"));
    // All-gather: the node's blocks into each rank's scratch, the leaders' exchange (NCCL,
    // below), the leader's output broadcast over the output buffer's view.
    EXPECT_EQ(calls["all_gather"].result, "OK ");
    EXPECT_THAT(calls["all_gather"].launches,
                ElementsAre("launch all_gather count=10 root=0 offset=0",
                            "launch broadcast count=40 root=0 offset=0"));
    // Reduce-scatter: the all-reduce of all 40 elements, then the driver's copy of this rank's
    // block (at its global rank) into its output: the fakes reduce nothing, so the output is
    // this rank's own input block there.
    EXPECT_EQ(calls["reduce_scatter"].result, "OK ");
    EXPECT_THAT(calls["reduce_scatter"].launches,
                ElementsAre("launch all_reduce count=40 root=0 offset=0",
                            "launch broadcast count=40 root=0 offset=0"));
    std::vector<std::string> block;
    for (int e = 0; e < 10; ++e) block.push_back(absl::StrCat(g * 1010 + e));
    EXPECT_EQ(calls["reduce_scatter_out"].result, absl::StrJoin(block, ","));
    // All-to-all: two barriers around the copies within the node (the driver's, into the peers'
    // outputs through their mappings: real data here) and the leaders' exchange.
    EXPECT_EQ(calls["all_to_all"].result, "OK ");
    EXPECT_THAT(calls["all_to_all"].launches,
                ElementsAre("launch barrier count=0 root=0 offset=0",
                            "launch barrier count=0 root=0 offset=0"));
    std::vector<std::string> firsts;  // block r of this rank's output, element 0
    for (int r = 0; r < 4; ++r) {
      firsts.push_back(r / 2 == g / 2 ? absl::StrCat(r * 1000 + g * 10) : "-1");  // NCCL: fake
    }
    EXPECT_EQ(calls["all_to_all_out"].result, absl::StrJoin(firsts, ","));
    // One rank's other count fails every rank of every node before anything is enqueued.
    EXPECT_THAT(calls["mismatch_gather"].result,
                HasSubstr("INVALID_ARGUMENT all_gather on group g: the ranks' calls differ"));
    EXPECT_THAT(calls["mismatch_gather"].launches, IsEmpty());
    // One rank's other count fails every rank of every node before anything is enqueued.
    EXPECT_THAT(calls["mismatch"].result,
                HasSubstr("INVALID_ARGUMENT all_reduce on group g: the ranks' calls differ"));
    EXPECT_THAT(calls["mismatch"].launches, IsEmpty());
    // From global rank 1 (node-a's local rank 1): node-a spreads it from there first, node-b
    // from its leader after NCCL.
    EXPECT_EQ(calls["broadcast"].result, "OK ");
    EXPECT_THAT(calls["broadcast"].launches,
                ElementsAre(node0 ? "launch broadcast count=10 root=1 offset=0"
                                  : "launch broadcast count=10 root=0 offset=0"));
    EXPECT_EQ(calls["avg"].result, "OK ");
    EXPECT_THAT(calls["avg"].launches, ElementsAre("launch all_reduce count=6 root=0 offset=0",
                                                   "launch broadcast count=6 root=0 offset=0"));
    EXPECT_EQ(calls["barrier"].result, "OK ");
    EXPECT_THAT(calls["barrier"].launches, ElementsAre("launch barrier count=0 root=0 offset=0",
                                                       "launch barrier count=0 root=0 offset=0"));
    // 4 MiB + 4 bytes on even nodes: lanes, and the one element left over through the leaders.
    EXPECT_EQ(calls["lanes"].result, "OK ");
    EXPECT_THAT(calls["lanes"].launches,
                ElementsAre("launch reduce_scatter count=524288 root=0 offset=0",
                            "launch broadcast count=524288 root=0 offset=0",
                            "launch broadcast count=524288 root=1 offset=2097152",
                            "launch all_reduce count=1 root=0 offset=4194304",
                            "launch broadcast count=1 root=0 offset=4194304"));

    // NCCL: the leaders' communicator (lane 0) from the first call, each rank's own lane for
    // the lanes; its NCCL rank is the node's index; node 0's rank makes the unique id.
    const std::vector<std::string> nccl = NcclCalls(g);
    std::vector<std::string> want;
    if (leader) {
      if (node0) want.push_back("ncclGetUniqueId");
      want.push_back(absl::StrCat("ncclCommInitRankConfig nranks=2 rank=", node0 ? 0 : 1,
                                  " blocking=0 id=fake-id-", ranks[node0 ? g : g - 2]->pid()));
      want.push_back("ncclAllReduce count=1000 dtype=7 op=0");
      const std::string peer = node0 ? "1" : "0";
      // All-gather: the node's two blocks (global ranks in a run) each way, in one group.
      want.push_back("ncclGroupStart");
      want.push_back("ncclSend count=20 dtype=7 peer=" + peer);
      want.push_back("ncclRecv count=20 dtype=7 peer=" + peer);
      want.push_back("ncclGroupEnd");
      want.push_back("ncclAllReduce count=40 dtype=7 op=0");  // reduce-scatter
      // All-to-all: each local rank's block for each of the other node's ranks, one group.
      want.push_back("ncclGroupStart");
      for (int i = 0; i < 4; ++i) want.push_back("ncclSend count=10 dtype=7 peer=" + peer);
      for (int i = 0; i < 4; ++i) want.push_back("ncclRecv count=10 dtype=7 peer=" + peer);
      want.push_back("ncclGroupEnd");
      want.push_back("ncclAllReduce count=1 dtype=2 op=0");  // the barrier after it
      want.push_back("ncclBroadcast count=10 dtype=2 root=0");
      want.push_back("ncclRedOpCreatePreMulSum dtype=7 residence=1 scalar_f32=0.25");
      want.push_back("ncclAllReduce count=6 dtype=7 op=5");
      want.push_back("ncclRedOpDestroy op=5");
      want.push_back("ncclAllReduce count=1 dtype=2 op=0");       // the barrier
      want.push_back("ncclAllReduce count=524288 dtype=7 op=0");  // lane 0
      want.push_back("ncclAllReduce count=1 dtype=7 op=0");       // the element left over
    } else {
      if (node0) want.push_back("ncclGetUniqueId");
      want.push_back(absl::StrCat("ncclCommInitRankConfig nranks=2 rank=", node0 ? 0 : 1,
                                  " blocking=0 id=fake-id-", ranks[node0 ? g : g - 2]->pid()));
      want.push_back("ncclAllReduce count=524288 dtype=7 op=0");  // lane 1
    }
    ASSERT_EQ(nccl.size(), want.size()) << ::testing::PrintToString(nccl);
    for (size_t i = 0; i < want.size(); ++i) {
      // Each line as the fake logs it, without its pointers.
      std::string line = nccl[i];
      for (const char* key : {" send=", " recv=", " stream="}) {
        const size_t at = line.find(key);
        if (at != std::string::npos) line.erase(at, line.find(' ', at + 1) - at);
      }
      const size_t rank_at = line.find(" rank=", line.find("ncclComm") == 0 ? line.size() : 0);
      if (rank_at != std::string::npos) line.erase(rank_at, line.find(' ', rank_at + 1) - rank_at);
      EXPECT_EQ(line, want[i]) << nccl[i];
    }
    // The all-to-all's sends read both local ranks' inputs (the peer's through its mapping):
    // blocks 2 and 3 of each, 40 bytes apart within one region.
    if (leader) {
      std::vector<uint64_t> from;
      for (const std::string& line : nccl) {
        if (absl::StartsWith(line, "ncclSend") && absl::StrContains(line, "count=10 ")) {
          from.push_back(std::stoull(Field(line, "send"), nullptr, 16));
        }
      }
      ASSERT_EQ(from.size(), 4u);
      EXPECT_EQ(from[1] - from[0], 40u);
      EXPECT_EQ(from[3] - from[2], 40u);
      EXPECT_NE(from[0], from[2]);
    }
    // The leaders' path reduces in place; a lane goes from the scratch into the region.
    for (const std::string& line : nccl) {
      if (!absl::StartsWith(line, "ncclAllReduce")) continue;
      if (absl::StrContains(line, "count=524288")) {
        EXPECT_NE(Field(line, "send"), Field(line, "recv")) << line;
      } else if (!absl::StrContains(line, "dtype=2")) {
        EXPECT_EQ(Field(line, "send"), Field(line, "recv")) << line;
      }
    }
  }

  // An abort ends every rank's communicator with ncclCommAbort (the hook's Close).
  auto client = Client::Connect({.runtime_dir = n[0]->runtime_dir(), .job_id = "job"});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Abort("g", "operator stop").ok());
  for (int g = 0; g < 4; ++g) {
    ASSERT_TRUE(ranks[g]->WaitForLog("left", absl::Seconds(20))) << ranks[g]->Log();
    const std::vector<std::string> nccl = NcclCalls(g);
    ASSERT_FALSE(nccl.empty());
    EXPECT_THAT(nccl.back(), HasSubstr("ncclCommAbort rank=")) << "global rank " << g;
  }
#endif
}

// Nodes of 1 and 2 ranks: no lanes (node-a has no local rank 1), so even a large all-reduce goes
// through the leaders; node-a's lone rank has nothing to meet within and, with the NaN/Inf
// check off (the daemon's default here), launches nothing (with it on, its own count: see
// ANanInOneGlobalRanksInputIsFoundForAllToAllAndOnALoneRank).
TEST_F(CudaSpanTest, UnevenNodesGoThroughTheLeadersAndALoneRankLaunchesNothing) {
#ifdef COMMD_FAKE_LIBNCCL
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  std::vector<ChildProcess*> ranks;
  const int nodes[] = {0, 1, 1}, locals[] = {0, 0, 1}, worlds[] = {1, 2, 2};
  for (int g = 0; g < 3; ++g) {
    ranks.push_back(StartRank({.node = n[nodes[g]],
                               .rank = locals[g],
                               .world = worlds[g],
                               .global_rank = g,
                               .global_world = 3,
                               .mode = "uneven",
                               .env = {std::string("COMMD_NCCL_LIBRARY=") + COMMD_FAKE_LIBNCCL,
                                       "COMMD_FAKE_NCCL_CALL_LOG=" + NcclLog(g)}}));
  }
  for (ChildProcess* r : ranks) ASSERT_TRUE(r->WaitForLog("done", absl::Seconds(90))) << r->Log();
  for (int g = 0; g < 3; ++g) {
    SCOPED_TRACE(absl::StrCat("global rank ", g));
    std::map<std::string, Call> calls = Calls(ranks[g]->Log());
    EXPECT_EQ(calls["all_reduce"].result, "OK ");
    EXPECT_EQ(calls["broadcast"].result, "OK ");
    if (g == 0) {
      EXPECT_THAT(calls["all_reduce"].launches, IsEmpty());
      EXPECT_THAT(calls["broadcast"].launches, IsEmpty());
    } else {
      EXPECT_THAT(calls["all_reduce"].launches,
                  ElementsAre("launch all_reduce count=1048577 root=0 offset=0",
                              "launch broadcast count=1048577 root=0 offset=0"));
      // The root (global rank 2) is node-b's local rank 1: node-b spreads it before NCCL.
      EXPECT_THAT(calls["broadcast"].launches,
                  ElementsAre("launch broadcast count=10 root=1 offset=0"));
    }
    std::vector<std::string> nccl;
    for (std::string line : NcclCalls(g)) {
      for (const char* key : {" send=", " recv=", " stream="}) {
        const size_t at = line.find(key);
        if (at != std::string::npos) line.erase(at, line.find(' ', at + 1) - at);
      }
      nccl.push_back(line);
    }
    if (g == 2) {
      EXPECT_THAT(nccl, IsEmpty());  // not a leader
    } else {
      const std::string node = g == 0 ? "0" : "1";
      std::vector<std::string> want;
      if (g == 0) want.push_back("ncclGetUniqueId");
      want.push_back(absl::StrCat("ncclCommInitRankConfig nranks=2 rank=", node,
                                  " blocking=0 id=fake-id-", ranks[0]->pid()));
      want.push_back(absl::StrCat("ncclAllReduce count=1048577 dtype=7 op=0 rank=", node));
      want.push_back(absl::StrCat("ncclBroadcast count=10 dtype=2 root=1 rank=", node));
      EXPECT_EQ(nccl, want);
    }
  }
#endif
}

// Three nodes of 1, 2 and 3 ranks whose global ranks interleave (node-a {3}, node-b {0, 5},
// node-c {1, 2, 4}): all-gather, reduce-scatter and all-to-all through the leaders, every block
// at its global rank (the copies' data are real here; NCCL's sends and receives are counted).
TEST_F(CudaSpanTest, UnevenInterleavedNodesPlaceEveryBlockByGlobalRank) {
#ifdef COMMD_FAKE_LIBNCCL
  ::setenv("COMMD_FAKE_CUDA_DEVICES", "3", 1);
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b", "node-c"}, &n);
  if (HasFatalFailure()) return;
  std::map<int, ChildProcess*> ranks = StartInterleaved(n, "blocks");
  std::map<int, int> node_of;
  for (int node = 0; node < 3; ++node) {
    for (int g : kInterleaved[node]) node_of[g] = node;
  }
  for (auto& [g, r] : ranks) ASSERT_TRUE(r->WaitForLog("done", absl::Seconds(120))) << r->Log();
  for (auto& [g, r] : ranks) {
    SCOPED_TRACE(absl::StrCat("global rank ", g));
    const int node = node_of[g];
    const int local = static_cast<int>(kInterleaved[node].size());
    const bool leader = kInterleaved[node][0] == g;
    std::map<std::string, Call> calls = Calls(r->Log());
    EXPECT_EQ(calls["all_gather"].result, "OK ");
    EXPECT_EQ(calls["reduce_scatter"].result, "OK ");
    EXPECT_EQ(calls["all_to_all"].result, "OK ");
    if (local == 1) {  // nothing to meet within: no node-local kernel
      EXPECT_THAT(calls["all_gather"].launches, IsEmpty());
      EXPECT_THAT(calls["all_to_all"].launches, IsEmpty());
    } else {
      EXPECT_THAT(calls["all_gather"].launches,
                  ElementsAre("launch all_gather count=10 root=0 offset=0",
                              "launch broadcast count=60 root=0 offset=0"));
    }
    // This rank's block is the one at its global rank.
    std::vector<std::string> block;
    for (int e = 0; e < 10; ++e) block.push_back(absl::StrCat(g * 1010 + e));
    EXPECT_EQ(calls["reduce_scatter_out"].result, absl::StrJoin(block, ","));
    std::vector<std::string> firsts;
    for (int i = 0; i < 6; ++i) {
      firsts.push_back(node_of[i] == node ? absl::StrCat(i * 1000 + g * 10) : "-1");
    }
    EXPECT_EQ(calls["all_to_all_out"].result, absl::StrJoin(firsts, ","));
    // NCCL: the leaders only; per group, what this node sends and receives.
    size_t sent = 0, received = 0, groups = 0;
    for (const std::string& line : NcclCalls(g)) {
      if (absl::StartsWith(line, "ncclGroupStart")) ++groups;
      size_t count = 0;
      if (absl::StartsWith(line, "ncclSend") || absl::StartsWith(line, "ncclRecv")) {
        count = std::stoul(Field(line, "count"));
        EXPECT_NE(Field(line, "peer"), "") << line;
      }
      (absl::StartsWith(line, "ncclSend") ? sent : received) += count;
    }
    if (!leader) {
      EXPECT_THAT(NcclCalls(g), IsEmpty());
      continue;
    }
    EXPECT_EQ(groups, 2u);
    const size_t others = 6 - static_cast<size_t>(local);
    // All-gather: this node's blocks to each of 2 other nodes, every other node's blocks in;
    // all-to-all: each local rank's block for each rank elsewhere, and back.
    EXPECT_EQ(sent, 10 * (2 * static_cast<size_t>(local) + local * others));
    EXPECT_EQ(received, 10 * (others + others * local));
  }
  ::setenv("COMMD_FAKE_CUDA_DEVICES", "2", 1);
#endif
}

// NaN/Inf on the 3-node layout of 1, 2 and 3 ranks with interleaved global ranks: a NaN in one
// global rank's input is found by that rank, for an all-to-all (which no node-local kernel
// reads: its own count) and on the node of one rank (no node-local kernel runs there: its own
// count) for every collective. The launches show each count; the flight recorder's entries of
// the NaN's rank, and only those, are flagged (the finding is per rank, as on host memory); the
// policy fail is refused alike on every rank (a call on CUDA buffers returns before its count
// exists).
TEST_F(CudaSpanTest, ANanInOneGlobalRanksInputIsFoundForAllToAllAndOnALoneRank) {
#ifdef COMMD_FAKE_LIBNCCL
  ::setenv("COMMD_FAKE_CUDA_DEVICES", "3", 1);
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b", "node-c"}, &n);
  if (HasFatalFailure()) return;
  std::map<int, ChildProcess*> ranks = StartInterleaved(n, "nan");
  for (auto& [g, r] : ranks) ASSERT_TRUE(r->WaitForLog("done", absl::Seconds(120))) << r->Log();
  std::string fail;
  for (auto& [g, r] : ranks) {
    SCOPED_TRACE(absl::StrCat("global rank ", g));
    std::map<std::string, Call> calls = Calls(r->Log());
    for (const char* name : {"a2a_far", "a2a_alone", "a2a_clean", "ar_alone", "ag_alone",
                             "rs_alone", "bcast_alone", "sync"}) {
      EXPECT_EQ(calls[name].result, "OK ") << name;
    }
    // Every rank counts its whole input (6 blocks of 10) before an all-to-all.
    for (const char* name : {"a2a_far", "a2a_alone", "a2a_clean"}) {
      ASSERT_FALSE(calls[name].launches.empty()) << name;
      EXPECT_EQ(calls[name].launches[0], "launch count_nonfinite count=60 root=0 offset=0");
    }
    if (g == 3) {  // alone on node-a: its counts are its only launches
      EXPECT_THAT(calls["a2a_far"].launches,
                  ElementsAre("launch count_nonfinite count=60 root=0 offset=0"));
      EXPECT_THAT(calls["ar_alone"].launches,
                  ElementsAre("launch count_nonfinite count=1000 root=0 offset=0"));
      EXPECT_THAT(calls["ag_alone"].launches,
                  ElementsAre("launch count_nonfinite count=10 root=0 offset=0"));
      EXPECT_THAT(calls["rs_alone"].launches,
                  ElementsAre("launch count_nonfinite count=60 root=0 offset=0"));
      EXPECT_THAT(calls["bcast_alone"].launches,
                  ElementsAre("launch count_nonfinite count=10 root=0 offset=0"));
    } else {  // the node-local kernels count as they read (no count of their own)
      EXPECT_THAT(calls["a2a_far"].launches,
                  ElementsAre("launch count_nonfinite count=60 root=0 offset=0",
                              "launch barrier count=0 root=0 offset=0",
                              "launch barrier count=0 root=0 offset=0"));
      EXPECT_THAT(calls["ar_alone"].launches,
                  ElementsAre("launch all_reduce count=1000 root=0 offset=0",
                              "launch broadcast count=1000 root=0 offset=0"));
    }
    // Policy fail on CUDA buffers: refused before anything is enqueued, the same on every rank.
    EXPECT_THAT(calls["fail"].result,
                HasSubstr("INVALID_ARGUMENT group f: nan_policy fail needs host buffers"));
    EXPECT_THAT(calls["fail"].launches, IsEmpty());
    if (fail.empty()) fail = calls["fail"].result;
    EXPECT_EQ(calls["fail"].result, fail);
  }
  // The flight recorder, dumped on every node: only the NaN's rank flags the call's entry.
  std::map<int, std::vector<uint64_t>> flagged;  // by global rank: the flagged seqs
  std::map<int, uint64_t> checks, found;
  for (DaemonProcess* d : n) {
    auto client = Client::Connect({.runtime_dir = d->runtime_dir(), .job_id = "job"});
    ASSERT_TRUE(client.ok()) << client.status();
    auto dump = (*client)->Dump("g");
    ASSERT_TRUE(dump.ok()) << dump.status();
    for (const std::string& file : dump->files()) {
      const std::string base = file.substr(file.rfind('/') + 1);
      int g = -1;
      if (!absl::StartsWith(base, "rank") || !absl::EndsWith(base, ".json") ||
          !absl::SimpleAtoi(base.substr(4, base.size() - 9), &g)) {
        continue;
      }
      std::ifstream in(file);
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << file;
      checks[g] = j["commd"]["counters"]["nan_checks"].get<uint64_t>();
      found[g] = j["commd"]["counters"]["nans_found"].get<uint64_t>();
      flagged[g];
      for (const nlohmann::json& e : j["entries"]) {
        if (e["commd"]["nan_found"].get<bool>()) {
          flagged[g].push_back(e["collective_seq_id"].get<uint64_t>());
        }
      }
    }
  }
  ASSERT_EQ(flagged.size(), 6u);
  for (int g = 0; g < 6; ++g) {
    SCOPED_TRACE(absl::StrCat("global rank ", g));
    EXPECT_EQ(checks[g], 7u);  // the seven checked calls; the barrier has no data
    if (g == 5) {
      EXPECT_THAT(flagged[g], ElementsAre(1));  // a2a_far
    } else if (g == 3) {
      EXPECT_THAT(flagged[g], ElementsAre(2, 4, 5, 6, 7));  // a2a_alone, ar, ag, rs, bcast
    } else {
      EXPECT_THAT(flagged[g], IsEmpty());
    }
    EXPECT_EQ(found[g], flagged[g].size());
  }
  ::setenv("COMMD_FAKE_CUDA_DEVICES", "2", 1);
#endif
}

// NCCL failing on one node's leader (a remote error as its communicator forms): that leader's
// call fails naming NCCL's error, and the group is aborted on every node.
TEST_F(CudaSpanTest, AnNcclErrorOnOneNodeAbortsTheGroupOnEveryNode) {
#ifdef COMMD_FAKE_LIBNCCL
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  std::vector<ChildProcess*> ranks;
  for (int g = 0; g < 4; ++g) {
    std::vector<std::string> env = {std::string("COMMD_NCCL_LIBRARY=") + COMMD_FAKE_LIBNCCL,
                                    "COMMD_FAKE_NCCL_CALL_LOG=" + NcclLog(g)};
    if (g == 2) env.push_back("COMMD_FAKE_NCCL_RESULT=6");  // ncclRemoteError
    ranks.push_back(StartRank({.node = n[g / 2],
                               .rank = g % 2,
                               .world = 2,
                               .global_rank = g,
                               .global_world = 4,
                               .mode = "no-nccl",
                               .env = env}));
  }
  for (ChildProcess* r : ranks) ASSERT_TRUE(r->WaitForLog("done", absl::Seconds(90))) << r->Log();
  EXPECT_THAT(
      Line(ranks[2]->Log(), "all_reduce "),
      HasSubstr("(group g (lane 0, node node-b): ncclCommInitRankConfig: remote process "
                "exited or there was a network error (ncclResult_t 6); NCCL's last error: "))
      << ranks[2]->Log();
  for (ChildProcess* r : ranks) {
    EXPECT_TRUE(r->WaitForLog("left", absl::Seconds(20))) << r->Log();
  }
  // The failed communicator was aborted where it failed.
  EXPECT_THAT(NcclCalls(2), ::testing::Contains("ncclCommAbort rank=1"));
#endif
}

// A unique id in the store that no NCCL root answers (forged or stale, of the right size):
// both leaders' communicators stay in progress, and at the group's timeout (3 s) their call
// fails DEADLINE_EXCEEDED naming ncclCommInitRankConfig, NCCL's state and the deadline, and
// the group is aborted on every node; the next call fails at once naming that first failure
// (FAILED_PRECONDITION, or ABORTED once the abort arrived); nothing hangs.
TEST_F(CudaSpanTest, AnIdNoRootAnswersEndsAtTheGroupsTimeoutAndAbortsTheGroup) {
#ifdef COMMD_FAKE_LIBNCCL
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  std::vector<ChildProcess*> ranks;
  const absl::Time start = absl::Now();
  for (int g = 0; g < 4; ++g) {
    std::vector<std::string> env = {std::string("COMMD_NCCL_LIBRARY=") + COMMD_FAKE_LIBNCCL,
                                    "COMMD_FAKE_NCCL_CALL_LOG=" + NcclLog(g)};
    if (g == 0) env.push_back("COMMD_FAKE_NCCL_UNIQUE_ID=unreachable-forged-id");
    ranks.push_back(StartRank({.node = n[g / 2],
                               .rank = g % 2,
                               .world = 2,
                               .global_rank = g,
                               .global_world = 4,
                               .timeout_ms = 3000,
                               .mode = "twice",
                               .env = env}));
  }
  for (ChildProcess* r : ranks) ASSERT_TRUE(r->WaitForLog("done", absl::Seconds(60))) << r->Log();
  for (int g : {0, 2}) {
    const std::string first = Line(ranks[g]->Log(), "all_reduce ");
    EXPECT_THAT(first, ::testing::StartsWith("all_reduce DEADLINE_EXCEEDED group g: collective "
                                             "seq 1 on CUDA buffers enqueued 1 of its 3 kernels "
                                             "before failing ("))
        << ranks[g]->Log();
    EXPECT_THAT(first,
                HasSubstr(absl::StrCat("(group g (lane 0, node ", g == 0 ? "node-a" : "node-b",
                                       "): ncclCommInitRankConfig: NCCL still in progress "
                                       "(ncclInProgress) at the deadline (the deadline: the "
                                       "group's timeout, 3s, from the start of this rank's NCCL "
                                       "step; the other nodes' rank 0 never took part, or the "
                                       "unique id the lane formed on is no live root's))")))
        << ranks[g]->Log();
    // The next call: at once, naming the first failure (the abort may have come first).
    const std::string again = Line(ranks[g]->Log(), "again ");
    if (absl::StartsWith(again, "again FAILED_PRECONDITION")) {
      EXPECT_THAT(again, ::testing::StartsWith("again FAILED_PRECONDITION the group failed for "
                                               "good earlier: group g (lane 0"));
      EXPECT_THAT(again, HasSubstr("ncclCommInitRankConfig: NCCL still in progress")) << again;
    } else {  // the abort's reason (cut to what the daemon keeps) says where it began
      EXPECT_THAT(again, ::testing::StartsWith("again ABORTED group g aborted on request: "))
          << ranks[g]->Log();
      EXPECT_THAT(again, HasSubstr("a collective across nodes on CUDA memory failed on node "
                                   "node-"));
    }
    // node-b read the id node-a published.
    EXPECT_THAT(NcclCalls(g), ::testing::Contains(HasSubstr("id=unreachable-forged-id")));
  }
  for (ChildProcess* r : ranks) EXPECT_TRUE(r->WaitForLog("left", absl::Seconds(20))) << r->Log();
  EXPECT_LT(absl::Now() - start, absl::Seconds(40));  // the 3 s timeout, not a hang
  for (int g : {0, 2}) {
    EXPECT_THAT(NcclCalls(g), ::testing::Contains(HasSubstr("ncclCommAbort"))) << g;
  }
#endif
}

// A CUDA group that spans nodes on a daemon without a cluster is refused at the join, as a host
// group is.
TEST_F(CudaSpanTest, WithoutAClusterACudaSpanningJoinIsRefused) {
#ifdef COMMD_FAKE_LIBNCCL
  DaemonProcess* node = StartNode("solo", "", "", /*clustered=*/false);
  ASSERT_NE(node, nullptr);
  const std::vector<std::string> logs =
      Run({{.node = node,
            .rank = 0,
            .world = 1,
            .global_rank = 0,
            .global_world = 2,
            .mode = "calls",
            .env = {std::string("COMMD_NCCL_LIBRARY=") + COMMD_FAKE_LIBNCCL}}});
  EXPECT_EQ(Line(logs[0], "join "),
            "join FAILED_PRECONDITION group g spans nodes (global world size 2 > its world size 1 "
            "on this node), which needs a cluster; this daemon has none (add a cluster section "
            "naming etcd: docs/cluster.md)")
      << logs[0];
#endif
}

TEST_F(CudaSpanTest, WithoutNcclEveryLeaderFailsPreconditionNamingTheVariable) {
#ifdef COMMD_FAKE_LIBNCCL
  std::vector<DaemonProcess*> n;
  StartNodes({"node-a", "node-b"}, &n);
  if (HasFatalFailure()) return;
  const std::vector<ChildProcess*> ranks = Start(n, "no-nccl", "/nonexistent/libnccl.so.2");
  for (ChildProcess* r : ranks) ASSERT_TRUE(r->WaitForLog("done", absl::Seconds(90))) << r->Log();
  for (int g : {0, 2}) {
    EXPECT_THAT(
        Line(ranks[g]->Log(), "all_reduce "),
        HasSubstr(absl::StrCat("all_reduce FAILED_PRECONDITION group g: collective seq 1 on CUDA "
                               "buffers enqueued 1 of its 3 kernels before failing (group g (lane "
                               "0, node ",
                               g == 0 ? "node-a" : "node-b",
                               "): collectives across nodes on "
                               "CUDA memory need NCCL 2.14 or later (libnccl.so.2 from the CUDA "
                               "toolkit, the nvidia-nccl wheel or the libnccl2 package; "
                               "COMMD_NCCL_LIBRARY names another library): cannot load "
                               "/nonexistent/libnccl.so.2")))
        << ranks[g]->Log();
  }
  // The leaders' failure left the node's ranks out of step: the group is aborted on every node
  // (the ranks wait for the abort, not for the leave file).
  for (ChildProcess* r : ranks) {
    EXPECT_TRUE(r->WaitForLog("left", absl::Seconds(20))) << r->Log();
  }
#endif
}

}  // namespace
}  // namespace commd::testing
