// The spanning group's plans on CUDA memory (kernels/span_plan.h), run on a model of the
// hardware: every rank's region and scratch hold, per element, how many times each global
// rank's input went into it; node-local steps run when every local rank of the node has that
// same step next, NCCL steps when every member of the lane has that same step next (else the
// ranks would hang or mismatch on a real machine: the test fails). Over layouts even and
// uneven, counts around every split, offsets and types, an all-reduce must leave every rank
// with every element holding every global rank's input exactly once, and nothing outside the
// call's range touched.
#include "kernels/span_plan.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

using Contribution = std::vector<int>;  // per global rank: how often its input is in here
constexpr int kUntouched = -7;          // marks elements outside the call's range

// One element in the model: which global ranks' inputs went into it, and at which element of
// their input (a reduction of elements from different places, or a block put at the wrong
// place, shows here even where the contributions are right).
struct Elem {
  Contribution from;
  int64_t index = -1;  // -1: not an input element (untouched, or a sum of misaligned ones)
  bool operator==(const Elem&) const = default;
};

std::string Text(const Elem& e) {
  return absl::StrCat("{[", absl::StrJoin(e.from, ","), "] @", e.index, "}");
}
std::ostream& operator<<(std::ostream& os, const Elem& e) { return os << Text(e); }

struct Rank {
  int node, local, global;
  SpanPlan plan;
  size_t next = 0;                         // the next step to run
  std::vector<Elem> region, out, scratch;  // region: the call's input buffer's data region
  std::vector<int> counted;  // per region element: how often this rank counted its NaN/Inf
};

std::string Layout(const std::vector<int>& sizes) { return absl::StrJoin(sizes, "x"); }

std::string Describe(const SpanStep& s) {
  std::string t;
  for (const SpanTransfer& x : s.transfers) {
    absl::StrAppend(&t, x.send ? " send" : " recv", "(peer ", x.peer, " buf ",
                    static_cast<int>(x.buffer), " owner ", x.owner, " @", x.offset, " n ", x.count,
                    ")");
  }
  return absl::StrCat("kind ", static_cast<int>(s.kind), " offset ", s.offset, " count ", s.count,
                      " lane ", s.lane, " root ", s.root, " dtype ", static_cast<int>(s.dtype),
                      " local_op ", static_cast<int>(s.local_op), " nccl_op ",
                      static_cast<int>(s.nccl_op), " from_scratch ", s.from_scratch, " to_scratch ",
                      s.to_scratch, " buffer ", static_cast<int>(s.buffer), " dst ",
                      static_cast<int>(s.dst), " owners ", s.src_owner, "/", s.dst_owner,
                      " dst_offset ", s.dst_offset, t);
}

// The reduction of `parts`; "" or what is wrong with it.
std::string Sum(const std::vector<const Elem*>& parts, Elem* out) {
  Elem sum{Contribution(parts[0]->from.size(), 0), parts[0]->index};
  for (const Elem* p : parts) {
    if (p->index < 0 || p->index != sum.index) {
      return absl::StrCat("reduces ", Text(*parts[0]), " with ", Text(*p));
    }
    for (size_t g = 0; g < sum.from.size(); ++g) sum.from[g] += p->from[g];
  }
  *out = std::move(sum);
  return "";
}

bool IsNccl(SpanStepKind k) {
  return k == SpanStepKind::kNcclAllReduce || k == SpanStepKind::kNcclBroadcast ||
         k == SpanStepKind::kNcclSendRecv;
}

// Whether `k` is a node-local kernel every local rank meets in (what Launch skips on a node of
// one rank: cuda_span_collectives.cc).
bool IsMeeting(SpanStepKind k) {
  return !IsNccl(k) && k != SpanStepKind::kLocalCopy && k != SpanStepKind::kCountNonFinite;
}
bool Alone(SpanStepKind k) {
  return k == SpanStepKind::kLocalCopy || k == SpanStepKind::kCountNonFinite;
}

class Model {
 public:
  Model(std::vector<Rank>& ranks, const std::vector<int>& sizes, size_t es)
      : ranks_(ranks), sizes_(sizes), es_(es) {}

  // Runs every rank's plan to its end; "" on success, else what went wrong.
  std::string Run() {
    for (;;) {
      bool progressed = false, done = true;
      for (Rank& r : ranks_) {
        if (r.next == r.plan.steps.size()) continue;
        done = false;
        const SpanStep& s = r.plan.steps[r.next];
        if (IsMeeting(s.kind) && sizes_[static_cast<size_t>(r.node)] == 1) {
          ++r.next;  // Launch skips it
          progressed = true;
          continue;
        }
        bool ready = false;
        std::string err = Ready(r, s, &ready);
        if (!err.empty()) return err;
        if (!ready) continue;
        std::vector<Rank*> group = Members(s, r);
        for (Rank* q : group) {
          if (!(err = Count(*q, group.size())).empty()) {
            return absl::StrCat("global rank ", q->global, ": ", err, " in ", Describe(s));
          }
        }
        err = Execute(r, s, group);
        if (!err.empty())
          return absl::StrCat("global rank ", r.global, ": ", err, " in ", Describe(s));
        for (Rank* q : group) ++q->next;
        progressed = true;
      }
      if (done) return "";
      if (!progressed) return "deadlock: no rank's next step can run";
    }
  }

 private:
  std::vector<Rank*> Members(const SpanStep& s, const Rank& r) {
    std::vector<Rank*> out;
    for (Rank& q : ranks_) {
      if (Alone(s.kind) ? &q == &r : IsNccl(s.kind) ? q.local == s.lane : q.node == r.node) {
        out.push_back(&q);
      }
    }
    return out;
  }

  Rank* At(int node, int local) {
    for (Rank& q : ranks_) {
      if (q.node == node && q.local == local) return &q;
    }
    return nullptr;
  }

  std::vector<Elem>* Buf(Rank& r, SpanBuffer b, int owner) {
    Rank* q = owner < 0 ? &r : At(r.node, owner);
    if (q == nullptr) return nullptr;
    return b == SpanBuffer::kIn ? &q->region : b == SpanBuffer::kOut ? &q->out : &q->scratch;
  }

  // Whether every member has `s` next ("" and *ready), or a mismatch that would hang or
  // corrupt a real machine.
  std::string Ready(Rank& r, const SpanStep& s, bool* ready) {
    if (IsNccl(s.kind)) {
      if (s.lane != r.local) {
        return absl::StrCat("global rank ", r.global, " runs NCCL on lane ", s.lane,
                            ", not its own lane ", r.local);
      }
      // Lane l's communicator: rank l of every node (nodes without one have no rank there).
      size_t expected = 0;
      for (int n : sizes_) expected += n > s.lane ? 1 : 0;
      if (s.lane > 0 && expected != sizes_.size()) {
        return absl::StrCat("lane ", s.lane, " used on uneven nodes ", Layout(sizes_));
      }
    }
    *ready = true;
    if (Alone(s.kind)) return "";
    for (Rank* q : Members(s, r)) {
      if (q->next == q->plan.steps.size()) {
        return absl::StrCat("global rank ", q->global, " ended its plan while global rank ",
                            r.global, " waits in ", Describe(s));
      }
      const SpanStep& t = q->plan.steps[q->next];
      if (t.kind != s.kind) {
        if (IsMeeting(s.kind) && IsMeeting(t.kind)) {
          return absl::StrCat("node ", r.node, ": local ranks ", r.local, " and ", q->local,
                              " launch different node-local kernels: ", Describe(s), " vs ",
                              Describe(t));
        }
        *ready = false;
        return "";
      }
      if (s.kind == SpanStepKind::kNcclSendRecv) {
        if (t.lane != s.lane || t.dtype != s.dtype) {
          return absl::StrCat("global ranks ", r.global, " and ", q->global,
                              " group sends and receives on different lanes or types");
        }
        continue;  // matched pairwise when it runs
      }
      // A broadcast's other members (reads_input differs by design only at the root's node).
      SpanStep a = s, b = t;
      a.reads_input = b.reads_input = false;
      if (!(a == b)) {
        return absl::StrCat("global ranks ", r.global, " and ", q->global,
                            " disagree on a step: ", Describe(s), " vs ", Describe(t));
      }
    }
    return "";
  }

  // What `q`'s next step counts NaN/Inf in, as the kernels do (span_plan.h's reads_input): its
  // own input elements, each still holding its input when counted (before anything wrote it).
  std::string Count(Rank& q, size_t members) {
    const SpanStep& s = q.plan.steps[q.next];
    if (!s.reads_input) return "";
    size_t n = s.count;
    switch (s.kind) {
      case SpanStepKind::kLocalReduceScatter:
        n = s.count * members;
        break;
      case SpanStepKind::kLocalBroadcast:
        if (q.local != s.root) return "";  // only the root's kernel reads its input
        break;
      case SpanStepKind::kLocalAllReduce:
      case SpanStepKind::kLocalAllGather:
      case SpanStepKind::kCountNonFinite:
        break;
      default:
        return "a step that reads no input says it counts it";
    }
    const size_t first = s.offset / es_;
    if (std::string err = Range(&q.region, first, n); !err.empty()) return err;
    for (size_t e = first; e < first + n; ++e) {
      const Elem& x = q.region[e];
      int from = 0;
      for (int c : x.from) from += c;
      if (x.index != static_cast<int64_t>(e) || from != 1 ||
          x.from[static_cast<size_t>(q.global)] != 1) {
        return absl::StrCat("counts element ", e, " (", Text(x), ") once it no longer holds ",
                            "the rank's input");
      }
      ++q.counted[e];
    }
    return "";
  }

  static std::string Range(const std::vector<Elem>* v, size_t first, size_t n) {
    if (v == nullptr) return "a buffer of a rank not on this node";
    if (first + n > v->size()) {
      return absl::StrCat("elements [", first, ", ", first + n, ") past the buffer's ", v->size());
    }
    return "";
  }

  std::string Execute(Rank& r, const SpanStep& s, std::vector<Rank*>& group) {
    const size_t first = s.offset / es_;
    if (s.offset % es_ != 0 || s.dst_offset % es_ != 0) return "an unaligned offset";
    const size_t from = s.from_scratch ? 0 : first, to = s.to_scratch ? 0 : first;
    auto src = [&](Rank* q) -> std::vector<Elem>& {
      return s.from_scratch ? q->scratch : q->region;
    };
    auto dst = [&](Rank* q) -> std::vector<Elem>& { return s.to_scratch ? q->scratch : q->region; };
    std::string err;
    switch (s.kind) {
      case SpanStepKind::kLocalBarrier:
        return "";
      case SpanStepKind::kLocalAllReduce:
      case SpanStepKind::kNcclAllReduce:
        for (Rank* q : group) {
          if (!(err = Range(&src(q), from, s.count)).empty()) return err;
          if (!(err = Range(&dst(q), to, s.count)).empty()) return err;
        }
        for (size_t i = 0; i < s.count; ++i) {
          std::vector<const Elem*> parts;
          for (Rank* q : group) parts.push_back(&src(q)[from + i]);
          Elem sum;
          if (!(err = Sum(parts, &sum)).empty()) return err;
          for (Rank* q : group) dst(q)[to + i] = sum;
        }
        return "";
      case SpanStepKind::kLocalReduceScatter:
        for (Rank* q : group) {
          if (!(err = Range(&q->region, first, s.count * group.size())).empty()) return err;
          if (!(err = Range(&q->scratch, 0, s.count)).empty()) return err;
        }
        for (Rank* q : group) {
          for (size_t i = 0; i < s.count; ++i) {
            std::vector<const Elem*> parts;
            for (Rank* p : group) {
              parts.push_back(&p->region[first + static_cast<size_t>(q->local) * s.count + i]);
            }
            if (!(err = Sum(parts, &q->scratch[i])).empty()) return err;
          }
        }
        return "";
      case SpanStepKind::kLocalAllGather:
        for (Rank* q : group) {
          if (!(err = Range(&q->region, first, s.count)).empty()) return err;
          if (!(err = Range(&q->scratch, 0, s.count * group.size())).empty()) return err;
        }
        for (Rank* q : group) {
          for (Rank* p : group) {
            for (size_t i = 0; i < s.count; ++i) {
              q->scratch[static_cast<size_t>(p->local) * s.count + i] = p->region[first + i];
            }
          }
        }
        return "";
      case SpanStepKind::kLocalBroadcast:
      case SpanStepKind::kNcclBroadcast: {
        Rank* root = nullptr;
        for (Rank* q : group) {
          if ((s.kind == SpanStepKind::kLocalBroadcast ? q->local : q->node) == s.root) root = q;
        }
        if (root == nullptr) return "no root among the members";
        auto buf = [&](Rank* q) -> std::vector<Elem>& {
          return s.buffer == SpanBuffer::kOut ? q->out : q->region;
        };
        for (Rank* q : group) {
          if (!(err = Range(&buf(q), first, s.count)).empty()) return err;
        }
        for (Rank* q : group) {
          for (size_t e = first; e < first + s.count; ++e) buf(q)[e] = buf(root)[e];
        }
        return "";
      }
      case SpanStepKind::kLocalCopy: {
        std::vector<Elem>* a = Buf(r, s.buffer, s.src_owner);
        std::vector<Elem>* b = Buf(r, s.dst, s.dst_owner);
        const size_t at = s.dst_offset / es_;
        if (!(err = Range(a, first, s.count)).empty()) return err;
        if (!(err = Range(b, at, s.count)).empty()) return err;
        if (a == b && first < at + s.count && at < first + s.count) return "an overlapping copy";
        for (size_t i = 0; i < s.count; ++i) (*b)[at + i] = (*a)[first + i];
        return "";
      }
      case SpanStepKind::kNcclSendRecv:
        return SendRecv(group);
      case SpanStepKind::kCountNonFinite:
        return Range(&r.region, first, s.count);  // reads it (Count), writes nothing
    }
    return "an unknown step";
  }

  // Every member's group of sends and receives: each pair's sends and receives match in order
  // and size; every send is read before any receive is written (NCCL runs them at once, so a
  // receive must not overlap a send or another receive of its rank).
  std::string SendRecv(std::vector<Rank*>& group) {
    struct Pending {
      std::vector<Elem>* to;
      size_t at;
      std::vector<Elem> data;
    };
    std::vector<Pending> writes;
    std::map<std::pair<int, int>, std::vector<const SpanTransfer*>> sends, recvs;  // (from, to)
    std::map<Rank*, std::vector<std::tuple<std::vector<Elem>*, size_t, size_t, bool>>> touched;
    for (Rank* q : group) {
      const SpanStep& s = q->plan.steps[q->next];
      for (const SpanTransfer& x : s.transfers) {
        if (x.peer < 0 || x.peer >= static_cast<int>(sizes_.size()) || x.peer == q->node) {
          return absl::StrCat("a transfer with node ", x.peer);
        }
        if (x.offset % es_ != 0) return "an unaligned transfer";
        std::vector<Elem>* v = Buf(*q, x.buffer, x.owner);
        if (std::string err = Range(v, x.offset / es_, x.count); !err.empty()) return err;
        touched[q].push_back({v, x.offset / es_, x.count, x.send});
        (x.send ? sends[{q->node, x.peer}] : recvs[{x.peer, q->node}]).push_back(&x);
      }
    }
    for (Rank* q : group) {  // overlaps within one rank's group
      auto& t = touched[q];
      for (size_t i = 0; i < t.size(); ++i) {
        for (size_t j = i + 1; j < t.size(); ++j) {
          const auto& [va, a, na, sa] = t[i];
          const auto& [vb, b, nb, sb] = t[j];
          if (va == vb && a < b + nb && b < a + na && !(sa && sb)) {
            return absl::StrCat("global rank ", q->global, "'s transfers overlap at ", a, " and ",
                                b);
          }
        }
      }
    }
    for (const auto& [pair, list] : sends) {
      const auto it = recvs.find(pair);
      if (it == recvs.end() || it->second.size() != list.size()) {
        return absl::StrCat("node ", pair.first, " sends ", list.size(), " blocks to node ",
                            pair.second, ", which receives ",
                            it == recvs.end() ? 0 : it->second.size());
      }
      Rank* from = At(pair.first, 0);
      Rank* to = At(pair.second, 0);
      for (size_t i = 0; i < list.size(); ++i) {
        const SpanTransfer& x = *list[i];
        const SpanTransfer& y = *it->second[i];
        if (x.count != y.count) {
          return absl::StrCat("send ", i, " from node ", pair.first, " to node ", pair.second,
                              " has ", x.count, " elements, its receive ", y.count);
        }
        const std::vector<Elem>& sv = *Buf(*from, x.buffer, x.owner);
        writes.push_back(
            {Buf(*to, y.buffer, y.owner), y.offset / es_,
             std::vector<Elem>(sv.begin() + static_cast<ptrdiff_t>(x.offset / es_),
                               sv.begin() + static_cast<ptrdiff_t>(x.offset / es_ + x.count))});
      }
    }
    for (const auto& [pair, list] : recvs) {
      if (!sends.contains(pair)) {
        return absl::StrCat("node ", pair.second, " receives from node ", pair.first,
                            ", which sends nothing");
      }
    }
    for (Pending& w : writes)
      std::copy(w.data.begin(), w.data.end(), w.to->begin() + static_cast<ptrdiff_t>(w.at));
    return "";
  }

  std::vector<Rank>& ranks_;
  const std::vector<int>& sizes_;
  size_t es_;
};

std::string Simulate(std::vector<Rank>& ranks, const std::vector<int>& sizes, size_t es) {
  return Model(ranks, sizes, es).Run();
}

// "" when every rank (or only global rank `only`) counted the NaN/Inf of each of its input
// elements [first, first + n) exactly once and nothing else; else the first that was not: a NaN
// in any global rank's input, on any node, is found by that rank (the CUDA path's finding is
// per rank, as the host path's recorder flag: client/src/cuda_collectives.cc).
std::string CountedOnce(const std::vector<Rank>& ranks, size_t first, size_t n, int only = -1) {
  for (const Rank& r : ranks) {
    for (size_t e = 0; e < r.counted.size(); ++e) {
      const int want = (only < 0 || r.global == only) && e >= first && e < first + n ? 1 : 0;
      if (r.counted[e] != want) {
        return absl::StrCat("global rank ", r.global, " (node ", r.node, ", local rank ", r.local,
                            ") counted input element ", e, " ", r.counted[e], " times, want ",
                            want);
      }
    }
  }
  return "";
}

Elem Untouched(size_t g) { return {Contribution(g, kUntouched), -1}; }
Elem Input(size_t g, int global, size_t index) {
  Elem e{Contribution(g, 0), static_cast<int64_t>(index)};
  e.from[static_cast<size_t>(global)] = 1;
  return e;
}

// Every rank of `sizes` (global ranks from `globals`, or in layout order), its region of
// `elems` elements holding its own input on [first, first + count) and untouched elsewhere;
// `out_elems` untouched output elements.
std::vector<Rank> MakeRanks(const std::vector<int>& sizes, size_t elems, size_t first, size_t count,
                            const std::vector<std::vector<int>>& globals = {},
                            size_t out_elems = 0) {
  int g = 0;
  for (int n : sizes) g += n;
  const auto gs = static_cast<size_t>(g);
  std::vector<Rank> ranks;
  int global = 0;
  for (size_t node = 0; node < sizes.size(); ++node) {
    for (int l = 0; l < sizes[node]; ++l, ++global) {
      const int gr = globals.empty() ? global : globals[node][static_cast<size_t>(l)];
      Rank r{static_cast<int>(node), l, gr, {}, 0, {}, {}, {}, std::vector<int>(elems, 0)};
      r.region.assign(elems, Untouched(gs));
      for (size_t e = first; e < first + count; ++e) r.region[e] = Input(gs, gr, e);
      r.out.assign(out_elems, Untouched(gs));
      ranks.push_back(std::move(r));
    }
  }
  return ranks;
}

const std::vector<std::vector<int>> kLayouts = {
    {1, 1}, {2, 2},    {3, 3}, {4, 4}, {2, 2, 2}, {3, 3, 3}, {1, 1, 1, 1},
    {8, 8}, {1, 2, 3}, {3, 1}, {2, 4}, {4, 1, 4}, {16, 16}};

struct Case {
  size_t count;
  size_t lane_min_bytes;
};

TEST(SpanPlanTest, AllReduceSumsEveryGlobalRankOnceIntoEveryRank) {
  int cases = 0;
  for (const std::vector<int>& sizes : kLayouts) {
    for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
      const size_t es = DataTypeSize(dtype);
      for (size_t count = 0; count <= 70; ++count) {
        for (size_t lane_min : {size_t{0}, kSpanLaneMinBytes}) {
          for (size_t lead : {size_t{0}, size_t{3}}) {  // elements before the call's range
            const size_t elems = lead + count + 2;
            std::vector<Rank> ranks = MakeRanks(sizes, elems, lead, count);
            size_t scratch = 0;
            for (Rank& r : ranks) {
              const SpanShape shape{.node_sizes = sizes, .node = r.node, .local_rank = r.local};
              auto plan =
                  PlanSpanAllReduce(shape, lead * es, count, dtype, ReduceOp::kSum, lane_min);
              ASSERT_TRUE(plan.ok()) << plan.status();
              r.plan = *plan;
              scratch = std::max(scratch, plan->scratch_bytes);
              ASSERT_EQ(plan->scratch_bytes % es, 0u);
            }
            for (Rank& r : ranks) {
              r.scratch.assign(scratch / es + 1, Untouched(r.region[0].from.size()));
            }
            const std::string what =
                absl::StrCat("layout ", Layout(sizes), " count ", count, " lane_min ", lane_min,
                             " lead ", lead, " dtype ", DataTypeName(dtype));
            ASSERT_EQ(Simulate(ranks, sizes, es), "") << what;
            ASSERT_EQ(CountedOnce(ranks, lead, count), "") << what;
            const size_t g = ranks[0].region[0].from.size();
            for (const Rank& r : ranks) {
              for (size_t e = 0; e < elems; ++e) {
                const bool in = e >= lead && e < lead + count;
                const Elem want =
                    in ? Elem{Contribution(g, 1), static_cast<int64_t>(e)} : Untouched(g);
                ASSERT_EQ(r.region[e], want)
                    << what << ": global rank " << r.global << " element " << e;
              }
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 5000);
}

// Lanes really are taken where they fit (else the test above would pass on the leaders' path
// alone): each rank of an even layout all-reduces 1/local of the body on its own lane.
TEST(SpanPlanTest, LargeAllReducesOnEvenNodesUseEveryLane) {
  const SpanShape shape{.node_sizes = {4, 4, 4}, .node = 2, .local_rank = 3};
  const size_t count = (kSpanLaneMinBytes / 4) + 3;  // fp32, 3 left over
  auto plan =
      PlanSpanAllReduce(shape, 0, count, DataType::kFloat32, ReduceOp::kSum, kSpanLaneMinBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<SpanStep> nccl;
  for (const SpanStep& s : plan->steps) {
    if (IsNccl(s.kind)) nccl.push_back(s);
  }
  ASSERT_EQ(nccl.size(), 1u);  // local rank 3 is not a leader: no tail on lane 0
  EXPECT_EQ(nccl[0].lane, 3);
  EXPECT_TRUE(nccl[0].from_scratch);
  EXPECT_FALSE(nccl[0].to_scratch);
  EXPECT_EQ(nccl[0].offset, 3 * (count / 4) * 4);  // into its own chunk of the region
  EXPECT_EQ(nccl[0].count, count / 4);
  EXPECT_EQ(nccl[0].dtype, DataType::kFloat32);
  EXPECT_EQ(nccl[0].nccl_op, SpanNcclOp::kSum);
  EXPECT_EQ(plan->scratch_bytes, count / 4 * 4);
  // Uneven nodes: the leaders only, and only lane 0.
  const SpanShape uneven{.node_sizes = {4, 3}, .node = 0, .local_rank = 3};
  plan = PlanSpanAllReduce(uneven, 0, count, DataType::kFloat32, ReduceOp::kSum, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const SpanStep& s : plan->steps) EXPECT_FALSE(IsNccl(s.kind)) << Describe(s);
  EXPECT_FALSE(plan->uses_lane);
}

// The ops: node-local steps reduce with the op (avg: sum), NCCL with its op (avg: the sum
// premultiplied by 1/global size, so uneven nodes weigh every rank alike); integers' avg and
// int16's reductions (NCCL has no int16, which is said first) and the bitwise ops (NCCL has
// none) are refused, bool's
// sum is NCCL's max; every step carries the call's type.
TEST(SpanPlanTest, OpsAndTypesReachEveryStep) {
  for (const std::vector<int>& sizes : {std::vector<int>{2, 2}, std::vector<int>{1, 3}}) {
    for (int local = 0; local < sizes[1]; ++local) {
      const SpanShape shape{.node_sizes = sizes, .node = 1, .local_rank = local};
      for (int o = 0; o < kReduceOpCount; ++o) {
        const ReduceOp op = static_cast<ReduceOp>(o);
        for (DataType dtype : kCollectiveTypes) {
          if (!ReduceOpApplies(op, dtype)) continue;  // the SDK's checks refuse it first
          auto plan = PlanSpanAllReduce(shape, 0, 1001, dtype, op, 0);
          if (dtype == DataType::kInt16) {  // NCCL has no int16
            ASSERT_FALSE(plan.ok());
            EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
            EXPECT_NE(plan.status().message().find("NCCL has no 16-bit integer"), std::string::npos)
                << plan.status();
            continue;
          }
          if (op == ReduceOp::kBAnd || op == ReduceOp::kBOr || op == ReduceOp::kBXor) {
            ASSERT_FALSE(plan.ok());
            EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
            EXPECT_NE(plan.status().message().find("NCCL has no bitwise"), std::string::npos)
                << plan.status();
            continue;
          }
          if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
            ASSERT_FALSE(plan.ok());
            EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
            EXPECT_NE(plan.status().message().find("scalar 1/4"), std::string::npos)
                << plan.status();
            continue;
          }
          ASSERT_TRUE(plan.ok()) << plan.status();
          const ReduceOp local_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
          // bool's sum (a logical or) is NCCL's max.
          const bool bool_sum = dtype == DataType::kBool && op == ReduceOp::kSum;
          const SpanNcclOp nccl_op = op == ReduceOp::kAvg               ? SpanNcclOp::kPreMulSumAvg
                                     : op == ReduceOp::kMin             ? SpanNcclOp::kMin
                                     : op == ReduceOp::kMax || bool_sum ? SpanNcclOp::kMax
                                     : op == ReduceOp::kProduct         ? SpanNcclOp::kProduct
                                                                        : SpanNcclOp::kSum;
          for (const SpanStep& s : plan->steps) {
            EXPECT_EQ(s.dtype, dtype) << Describe(s);
            if (s.kind == SpanStepKind::kLocalAllReduce ||
                s.kind == SpanStepKind::kLocalReduceScatter) {
              EXPECT_EQ(s.local_op, local_op) << Describe(s);
            }
            if (s.kind == SpanStepKind::kNcclAllReduce) {
              EXPECT_EQ(s.nccl_op, nccl_op);
            }
          }
        }
      }
    }
  }
}

// Every element of the input is read by a step that checks it for NaN/Inf.
TEST(SpanPlanTest, EveryInputElementIsCheckedOnce) {
  for (const std::vector<int>& sizes : kLayouts) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{17}, size_t{64}}) {
      const SpanShape shape{.node_sizes = sizes, .node = 0, .local_rank = 0};
      auto plan = PlanSpanAllReduce(shape, 0, count, DataType::kFloat32, ReduceOp::kSum, 0);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<int> checked(count, 0);
      const size_t local = static_cast<size_t>(sizes[0]);
      for (const SpanStep& s : plan->steps) {
        if (!s.reads_input) continue;
        const size_t n = s.kind == SpanStepKind::kLocalReduceScatter ? s.count * local : s.count;
        for (size_t e = s.offset / 4; e < s.offset / 4 + n; ++e) ++checked[e];
      }
      for (size_t e = 0; e < count; ++e) {
        EXPECT_EQ(checked[e], 1) << "layout " << Layout(sizes) << " count " << count << " e " << e;
      }
    }
  }
}

TEST(SpanPlanTest, BroadcastGivesEveryRankTheRootsData) {
  for (const std::vector<int>& sizes : kLayouts) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{9}}) {
      int global_root = 0;
      for (size_t root_node = 0; root_node < sizes.size(); ++root_node) {
        for (int root_local = 0; root_local < sizes[root_node]; ++root_local, ++global_root) {
          std::vector<Rank> ranks = MakeRanks(sizes, count + 1, 0, count);
          for (Rank& r : ranks) {
            const SpanShape shape{.node_sizes = sizes, .node = r.node, .local_rank = r.local};
            auto plan = PlanSpanBroadcast(shape, count, DataType::kInt32,
                                          static_cast<int>(root_node), root_local);
            ASSERT_TRUE(plan.ok()) << plan.status();
            r.plan = *plan;
          }
          const std::string what =
              absl::StrCat("layout ", Layout(sizes), " count ", count, " root ", global_root);
          ASSERT_EQ(Simulate(ranks, sizes, 4), "") << what;
          // Only the root's input is read: counted there alone, on a node of one rank too.
          ASSERT_EQ(CountedOnce(ranks, 0, count, global_root), "") << what;
          const size_t g = ranks[0].region[0].from.size();
          for (const Rank& r : ranks) {
            for (size_t e = 0; e < count; ++e) {
              ASSERT_EQ(r.region[e], Input(g, global_root, e))
                  << what << " rank " << r.global << " e " << e;
            }
            EXPECT_EQ(r.region[count], Untouched(g)) << what;
          }
        }
      }
    }
  }
}

TEST(SpanPlanTest, BarrierMeetsOnEveryRankWithoutDeadlock) {
  for (const std::vector<int>& sizes : kLayouts) {
    std::vector<Rank> ranks = MakeRanks(sizes, 1, 0, 0);
    for (Rank& r : ranks) {
      auto plan = PlanSpanBarrier({.node_sizes = sizes, .node = r.node, .local_rank = r.local});
      ASSERT_TRUE(plan.ok()) << plan.status();
      r.plan = *plan;
      r.scratch.assign(1, Elem{Contribution(r.region[0].from.size(), 0), 0});
      EXPECT_GE(plan->scratch_bytes, 4u);
      EXPECT_EQ(plan->uses_lane, r.local == 0);
    }
    EXPECT_EQ(Simulate(ranks, sizes, 4), "") << Layout(sizes);
  }
}

// How a layout's nodes hold global ranks: in layout order, round-robin over the nodes (every
// node's ranks interleave with the others'), and reversed.
std::vector<std::vector<std::vector<int>>> Mappings(const std::vector<int>& sizes) {
  std::vector<std::vector<std::vector<int>>> all(3);
  int g = 0;
  for (int n : sizes) g += n;
  for (auto& m : all) m.resize(sizes.size());
  int next = 0;
  for (size_t n = 0; n < sizes.size(); ++n) {
    for (int l = 0; l < sizes[n]; ++l, ++next) {
      all[0][n].push_back(next);
      all[2][n].push_back(g - 1 - next);
    }
  }
  next = 0;
  for (int round = 0; next < g; ++round) {
    for (size_t n = 0; n < sizes.size(); ++n) {
      if (round < sizes[n]) all[1][n].push_back(next++);
    }
  }
  return all;
}

// Runs `plan_of` for every rank of every layout and mapping on the model; `check` then looks at
// the ranks. Returns the number of cases.
template <typename PlanOf, typename Check>
int ForEveryLayout(const std::vector<size_t>& counts, size_t in_blocks, size_t out_blocks,
                   PlanOf plan_of, Check check) {
  int cases = 0;
  for (const std::vector<int>& sizes : kLayouts) {
    size_t g = 0;
    for (int n : sizes) g += static_cast<size_t>(n);
    for (const auto& globals : Mappings(sizes)) {
      for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
        const size_t es = DataTypeSize(dtype);
        for (size_t count : counts) {
          const size_t in = count * (in_blocks == 0 ? 1 : in_blocks * g);
          const size_t out = count * (out_blocks == 0 ? 1 : out_blocks * g);
          std::vector<Rank> ranks = MakeRanks(sizes, in + 2, 0, in, globals, out + 2);
          for (Rank& r : ranks) {
            const SpanShape shape{.node_sizes = sizes,
                                  .node = r.node,
                                  .local_rank = r.local,
                                  .global_ranks = globals};
            absl::StatusOr<SpanPlan> plan = plan_of(shape, count, dtype);
            if (!plan.ok()) {
              ADD_FAILURE() << plan.status();
              return cases;
            }
            r.plan = *plan;
            r.scratch.assign(plan->scratch_bytes / es + 1, Untouched(g));
            EXPECT_EQ(plan->scratch_bytes % es, 0u);
          }
          const std::string what = absl::StrCat(
              "layout ", Layout(sizes), " globals ",
              absl::StrJoin(
                  globals, " ",
                  [](std::string* o, const auto& v) { absl::StrAppend(o, absl::StrJoin(v, ",")); }),
              " count ", count, " dtype ", DataTypeName(dtype));
          const std::string ran = Simulate(ranks, sizes, es);
          if (!ran.empty()) {
            ADD_FAILURE() << what << ": " << ran;
            return cases;
          }
          // Every global rank's whole input is counted once, by that rank.
          if (const std::string counted = CountedOnce(ranks, 0, in); !counted.empty()) {
            ADD_FAILURE() << what << ": " << counted;
            return cases;
          }
          if (!check(ranks, count, g, in, out, what)) return cases;
          ++cases;
        }
      }
    }
  }
  return cases;
}

const std::vector<size_t> kBlockCounts = {0, 1, 2, 3, 7};

TEST(SpanPlanTest, AllGatherPutsEveryGlobalRanksBlockAtItsPlaceOnEveryRank) {
  const int cases = ForEveryLayout(
      kBlockCounts, 0, 1,
      [](const SpanShape& s, size_t count, DataType dtype) {
        return PlanSpanAllGather(s, count, dtype);
      },
      [](const std::vector<Rank>& ranks, size_t count, size_t g, size_t in, size_t out,
         const std::string& what) {
        for (const Rank& r : ranks) {
          for (size_t e = 0; e < out + 2; ++e) {
            const Elem want =
                e < out ? Input(g, static_cast<int>(e / count), e % count) : Untouched(g);
            if (r.out[e] != want) {
              ADD_FAILURE() << what << ": global rank " << r.global << " output element " << e
                            << " is " << r.out[e] << ", want " << want;
              return false;
            }
          }
          for (size_t e = 0; e < in + 2; ++e) {
            const Elem want = e < in ? Input(g, r.global, e) : Untouched(g);
            if (r.region[e] != want) {
              ADD_FAILURE() << what << ": global rank " << r.global << " input element " << e;
              return false;
            }
          }
        }
        return true;
      });
  EXPECT_GT(cases, 500);
}

TEST(SpanPlanTest, ReduceScatterLeavesEachRankItsBlockSummedOverEveryGlobalRank) {
  int cases = 0;
  for (size_t lane_min : {size_t{0}, kSpanLaneMinBytes}) {
    cases += ForEveryLayout(
        kBlockCounts, 1, 0,
        [&](const SpanShape& s, size_t count, DataType dtype) {
          return PlanSpanReduceScatter(s, count, dtype, ReduceOp::kSum, lane_min);
        },
        [](const std::vector<Rank>& ranks, size_t count, size_t g, size_t in, size_t out,
           const std::string& what) {
          for (const Rank& r : ranks) {
            for (size_t e = 0; e < out + 2; ++e) {
              const Elem want =
                  e < out ? Elem{Contribution(g, 1),
                                 static_cast<int64_t>(static_cast<size_t>(r.global) * count + e)}
                          : Untouched(g);
              if (r.out[e] != want) {
                ADD_FAILURE() << what << ": global rank " << r.global << " output element " << e
                              << " is " << r.out[e] << ", want " << want;
                return false;
              }
            }
            // The input region is the call's to use; past the input nothing is written.
            if (r.region[in] != Untouched(g) || r.region[in + 1] != Untouched(g)) {
              ADD_FAILURE() << what << ": global rank " << r.global << " wrote past its input";
              return false;
            }
          }
          return true;
        });
  }
  EXPECT_GT(cases, 1000);
}

TEST(SpanPlanTest, AllToAllDeliversEveryBlockFromEveryGlobalRankToItsPlace) {
  const int cases = ForEveryLayout(
      kBlockCounts, 1, 1,
      [](const SpanShape& s, size_t count, DataType dtype) {
        return PlanSpanAllToAll(s, count, dtype);
      },
      [](const std::vector<Rank>& ranks, size_t count, size_t g, size_t in, size_t out,
         const std::string& what) {
        for (const Rank& r : ranks) {
          for (size_t e = 0; e < out + 2; ++e) {
            // Block i of rank j's output: block j of global rank i's input.
            const Elem want = e < out ? Input(g, static_cast<int>(e / count),
                                              static_cast<size_t>(r.global) * count + e % count)
                                      : Untouched(g);
            if (r.out[e] != want) {
              ADD_FAILURE() << what << ": global rank " << r.global << " output element " << e
                            << " is " << r.out[e] << ", want " << want;
              return false;
            }
          }
          for (size_t e = 0; e < in + 2; ++e) {
            if (r.region[e] != (e < in ? Input(g, r.global, e) : Untouched(g))) {
              ADD_FAILURE() << what << ": global rank " << r.global << " input element " << e;
              return false;
            }
          }
        }
        return true;
      });
  EXPECT_GT(cases, 500);
}

// The exchange really is one block per run of consecutive global ranks on the usual layout, NCCL
// only on lane 0 (the leaders), and the reduce-scatter carries the all-reduce's ops and refusals.
TEST(SpanPlanTest, BlockCollectivesUseTheLeadersAndTheAllReducesOps) {
  const SpanShape s{.node_sizes = {4, 4}, .node = 1, .local_rank = 0};
  auto plan = PlanSpanAllGather(s, 10, DataType::kFloat32);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int nccl = 0;
  for (const SpanStep& st : plan->steps) {
    if (st.kind != SpanStepKind::kNcclSendRecv) continue;
    ++nccl;
    EXPECT_EQ(st.lane, 0);
    ASSERT_EQ(st.transfers.size(), 2u) << Describe(st);
    EXPECT_EQ(
        st.transfers[0],
        (SpanTransfer{
            .send = true, .peer = 0, .buffer = SpanBuffer::kScratch, .offset = 0, .count = 40}));
    EXPECT_EQ(st.transfers[1],
              (SpanTransfer{
                  .send = false, .peer = 0, .buffer = SpanBuffer::kOut, .offset = 0, .count = 40}));
  }
  EXPECT_EQ(nccl, 1);
  EXPECT_EQ(plan->scratch_bytes, 4u * 10 * 4);
  for (int local = 1; local < 4; ++local) {
    const SpanShape other{.node_sizes = {4, 4}, .node = 1, .local_rank = local};
    for (auto p : {PlanSpanAllGather(other, 10, DataType::kFloat32),
                   PlanSpanAllToAll(other, 10, DataType::kFloat32)}) {
      ASSERT_TRUE(p.ok());
      EXPECT_FALSE(p->uses_lane);
      for (const SpanStep& st : p->steps) EXPECT_FALSE(IsNccl(st.kind)) << Describe(st);
    }
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    plan = PlanSpanReduceScatter(s, 10, DataType::kBFloat16, op, 0);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto ar = PlanSpanAllReduce(s, 0, 80, DataType::kBFloat16, op, 0);
    ASSERT_TRUE(ar.ok());
    ASSERT_EQ(plan->steps.size(), ar->steps.size() + 1);
    for (size_t i = 0; i < ar->steps.size(); ++i) EXPECT_EQ(plan->steps[i], ar->steps[i]);
    EXPECT_EQ(plan->steps.back().kind, SpanStepKind::kLocalCopy);
    EXPECT_EQ(plan->steps.back().offset, 4u * 10 * 2);  // global rank 4's block
  }
  plan = PlanSpanReduceScatter(s, 10, DataType::kInt32, ReduceOp::kAvg, 0);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnimplemented);
}

// Every input element of an all-gather or reduce-scatter is checked for NaN/Inf once on nodes
// of more than one rank by the node-local kernels; on a node of one rank (no node-local kernel
// runs) by a count of its own, before anything else; an all-to-all counts on every rank.
TEST(SpanPlanTest, BlockCollectivesCheckEveryInputElementOnce) {
  const SpanShape alone{.node_sizes = {1, 2, 3}, .node = 0, .local_rank = 0};
  for (auto p : {PlanSpanAllGather(alone, 7, DataType::kFloat32),
                 PlanSpanReduceScatter(alone, 7, DataType::kFloat32, ReduceOp::kSum, 0),
                 PlanSpanAllReduce(alone, 0, 7, DataType::kFloat32, ReduceOp::kSum, 0),
                 PlanSpanBroadcast(alone, 7, DataType::kFloat32, 0, 0)}) {
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_FALSE(p->steps.empty());
    EXPECT_EQ(p->steps[0].kind, SpanStepKind::kCountNonFinite) << Describe(p->steps[0]);
    size_t counted = 0;
    for (const SpanStep& st : p->steps) counted += st.reads_input ? st.count : 0;
    EXPECT_EQ(counted, p->steps[0].count);
  }
  for (int node : {0, 2}) {
    auto a2a = PlanSpanAllToAll({.node_sizes = {1, 2, 3}, .node = node, .local_rank = 0}, 7,
                                DataType::kBFloat16);
    ASSERT_TRUE(a2a.ok());
    EXPECT_EQ(a2a->steps[0], (SpanStep{.kind = SpanStepKind::kCountNonFinite,
                                       .count = 6 * 7,
                                       .dtype = DataType::kBFloat16,
                                       .reads_input = true}));
  }
  const SpanShape s{.node_sizes = {3, 3}, .node = 0, .local_rank = 1};
  auto gather = PlanSpanAllGather(s, 7, DataType::kFloat32);
  ASSERT_TRUE(gather.ok());
  size_t checked = 0;
  for (const SpanStep& st : gather->steps) checked += st.reads_input ? st.count : 0;
  EXPECT_EQ(checked, 7u);
  auto scatter = PlanSpanReduceScatter(s, 7, DataType::kFloat32, ReduceOp::kSum, 0);
  ASSERT_TRUE(scatter.ok());
  checked = 0;
  for (const SpanStep& st : scatter->steps) {
    if (!st.reads_input) continue;
    checked += st.kind == SpanStepKind::kLocalReduceScatter ? st.count * 3 : st.count;
  }
  EXPECT_EQ(checked, 6u * 7);
}

// 3 nodes of (1, 2, 3) ranks with interleaved global ranks (node-a {3}, node-b {0, 5},
// node-c {1, 2, 4}, as cuda_span_test): a NaN at any element of any global rank's input is
// counted by that rank, once, whichever collective reads it (the broadcast: its root's input).
TEST(SpanPlanTest, ANanInAnyGlobalRanksInputIsFoundOnUnevenNodes) {
  const std::vector<int> sizes = {1, 2, 3};
  const std::vector<std::vector<int>> globals = {{3}, {0, 5}, {1, 2, 4}};
  const size_t count = 5, g = 6;
  using Planner = std::function<absl::StatusOr<SpanPlan>(const SpanShape&)>;
  const std::vector<std::tuple<std::string, size_t, Planner>> collectives = {
      {"all_reduce", count,
       [&](const SpanShape& s) {
         return PlanSpanAllReduce(s, 0, count, DataType::kFloat32, ReduceOp::kSum, 0);
       }},
      {"all_gather", count,
       [&](const SpanShape& s) { return PlanSpanAllGather(s, count, DataType::kFloat32); }},
      {"reduce_scatter", count * g,
       [&](const SpanShape& s) {
         return PlanSpanReduceScatter(s, count, DataType::kFloat32, ReduceOp::kSum, 0);
       }},
      {"all_to_all", count * g,
       [&](const SpanShape& s) { return PlanSpanAllToAll(s, count, DataType::kFloat32); }},
  };
  for (const auto& [name, in, plan_of] : collectives) {
    std::vector<Rank> ranks = MakeRanks(sizes, in + 1, 0, in, globals, count * g + 1);
    for (Rank& r : ranks) {
      auto plan = plan_of(
          {.node_sizes = sizes, .node = r.node, .local_rank = r.local, .global_ranks = globals});
      ASSERT_TRUE(plan.ok()) << plan.status();
      r.plan = *plan;
      r.scratch.assign(plan->scratch_bytes / 4 + 1, Untouched(g));
    }
    ASSERT_EQ(Simulate(ranks, sizes, 4), "") << name;
    EXPECT_EQ(CountedOnce(ranks, 0, in), "") << name;
  }
  for (int root = 0; root < 6; ++root) {  // node and local rank of global rank `root`
    int root_node = 0, root_local = 0;
    for (size_t n = 0; n < globals.size(); ++n) {
      for (size_t l = 0; l < globals[n].size(); ++l) {
        if (globals[n][l] == root)
          root_node = static_cast<int>(n), root_local = static_cast<int>(l);
      }
    }
    std::vector<Rank> ranks = MakeRanks(sizes, count + 1, 0, count, globals);
    for (Rank& r : ranks) {
      auto plan = PlanSpanBroadcast({.node_sizes = sizes, .node = r.node, .local_rank = r.local},
                                    count, DataType::kFloat32, root_node, root_local);
      ASSERT_TRUE(plan.ok()) << plan.status();
      r.plan = *plan;
    }
    ASSERT_EQ(Simulate(ranks, sizes, 4), "") << "broadcast from " << root;
    EXPECT_EQ(CountedOnce(ranks, 0, count, root), "") << "broadcast from " << root;
  }
}

TEST(SpanPlanTest, ALayoutWhoseGlobalRanksDoNotAddUpIsRefused) {
  SpanShape s{.node_sizes = {2, 2}, .node = 0, .local_rank = 0, .global_ranks = {{0, 1}, {1, 3}}};
  auto plan = PlanSpanAllGather(s, 4, DataType::kFloat32);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "global rank 1 on node 1 is out of range [0, 3] or named twice");
  s.global_ranks = {{0, 1}};
  plan = PlanSpanAllToAll(s, 4, DataType::kFloat32);
  EXPECT_EQ(plan.status().message(), "the layout's global ranks do not name node 1's 2 ranks");
}

TEST(SpanPlanTest, ShapesThatDoNotHoldTheRankAreRefused) {
  auto plan = PlanSpanAllReduce({.node_sizes = {2, 2}, .node = 2, .local_rank = 0}, 0, 8,
                                DataType::kFloat32, ReduceOp::kSum, 0);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(), "node 2 is out of range [0, 1] of the layout");
  plan = PlanSpanBarrier({.node_sizes = {2, 3}, .node = 0, .local_rank = 2});
  EXPECT_EQ(plan.status().message(), "local rank 2 is out of range [0, 1] on node 0");
  plan = PlanSpanBroadcast({.node_sizes = {2, 3}, .node = 0, .local_rank = 0}, 4,
                           DataType::kFloat32, 0, 2);
  EXPECT_EQ(plan.status().message(),
            "broadcast root (node 0, local rank 2) is not in the layout of 2 nodes");
}

}  // namespace
}  // namespace commd::kernels
