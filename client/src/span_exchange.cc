// The data of a host group's collective between nodes: see span_exchange.h.
#include "client/src/span_exchange.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "client/src/span_profile.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/broadcast.h"
#include "kernels/host/element_loops.h"

namespace commd {
namespace {

using Bytes = std::byte;

// kAvg is summed, then divided once by the global world size.
ReduceOp SumForAvg(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

// dst = the node's ranks' elements at `offset` reduced in local-rank order (kAvg: summed;
// the caller divides).
void Reduce(Bytes* const* regions, int local, size_t offset, size_t count, DataType dtype,
            Bytes* dst, ReduceOp op) {
  absl::InlinedVector<const Bytes*, 16> srcs;
  for (int l = 0; l < local; ++l) srcs.push_back(regions[l] + offset);
  kernels::ReduceInto(dtype, SumForAvg(op), srcs.data(), local, 0, count, dst, 1);
}

// `count` elements at `data` divided in place by `world` (kAvg's last step).
void Average(Bytes* data, size_t count, DataType dtype, int world) {
  const Bytes* src = data;
  kernels::ReduceInto(dtype, ReduceOp::kAvg, &src, 1, 0, count, data, world);
}

}  // namespace

SpanExchange::SpanExchange(SpanAgreement& agreement)
    : agreement_(agreement), s_(agreement.setup()) {
  for (const NodeRanks& n : s_.layout) {
    node_elems_.push_back(n.global_ranks.size());
    node_first_.push_back(node_ranks_total_);
    node_ranks_total_ += n.global_ranks.size();
  }
}

Bytes* SpanExchange::Dest(const CheckedCall& c, int l) {
  const CollectiveCall& call = c.call;
  if (call.host_memory || call.in == call.out) return c.views.data[l];
  return c.out_views->data[l];
}

absl::Status SpanExchange::Run(const CheckedCall& c, const kernels::HostCommView& v,
                               size_t in_bytes, size_t out_bytes, size_t es) {
  const CollectiveCall& call = c.call;
  const int local = v.world_size;
  Bytes* const* regions = v.data;
  switch (call.kind) {
    case CollectiveOp::kAllReduce:
      AllReduce(c, regions, local, 0, call.count, call.dtype);
      return absl::OkStatus();
    case CollectiveOp::kAllReduceCoalesced:
      for (const CoalescedTensor& t : call.tensors) {
        AllReduce(c, regions, local, t.offset, t.count, t.dtype);
      }
      return absl::OkStatus();
    case CollectiveOp::kBroadcast:
      Broadcast(c, regions, local, in_bytes);
      return absl::OkStatus();
    case CollectiveOp::kAllGather:
      AllGather(c, regions, local, in_bytes);
      return absl::OkStatus();
    case CollectiveOp::kReduceScatter:
      ReduceScatter(c, regions, local, in_bytes, out_bytes, es);
      return absl::OkStatus();
    case CollectiveOp::kAllToAll:
      AllToAll(c, regions, local, in_bytes);
      return absl::OkStatus();
    default:
      return absl::UnimplementedError(absl::StrCat(
          CollectiveName(call.kind), " has no implementation across nodes in this SDK"));
  }
}

// In place at `offset` of every region: the node's reduction into the leader's region, the
// nodes' over gloo, then copied to every local rank's output.
void SpanExchange::AllReduce(const CheckedCall& c, Bytes* const* regions, int local, size_t offset,
                             size_t count, DataType dtype) {
  if (count == 0) return;
  const size_t bytes = count * DataTypeSize(dtype);
  Bytes* mine = regions[0] + offset;
  Reduce(regions, local, offset, count, dtype, mine, c.call.op);
  AcrossNodes(mine, count, dtype, c.call.op);
  for (int l = 1; l < local; ++l) std::memcpy(Dest(c, l) + offset, mine, bytes);
}

// The root's `bytes` from its region, through the leaders' region, to every local output.
void SpanExchange::Broadcast(const CheckedCall& c, Bytes* const* regions, int local, size_t bytes) {
  const auto [root_node, root_local] = agreement_.Locate(c.call.root);
  if (root_node == s_.node_index && root_local != 0) {
    std::memcpy(regions[0], regions[root_local], bytes);
  }
  gloo::BroadcastOptions opts(agreement_.context());
  opts.setOutput(reinterpret_cast<uint8_t*>(regions[0]), bytes);
  opts.setRoot(root_node);
  {
    const SpanProfile::Timer timer(agreement_.timer());
    gloo::broadcast(opts);
  }
  for (int l = 1; l < local; ++l) std::memcpy(Dest(c, l), regions[0], bytes);
}

void SpanExchange::AllGather(const CheckedCall& c, Bytes* const* regions, int local, size_t block) {
  // This node's blocks in local order, then every node's in layout order.
  std::vector<Bytes>& mine = Scratch(0, block * static_cast<size_t>(local));
  for (int l = 0; l < local; ++l) std::memcpy(mine.data() + l * block, regions[l], block);
  std::vector<Bytes>& all = Scratch(1, block * node_ranks_total_);
  std::vector<size_t> counts;
  for (size_t n : node_elems_) counts.push_back(n * block);
  gloo::AllgathervOptions opts(agreement_.context());
  opts.setInput(reinterpret_cast<uint8_t*>(mine.data()), block * static_cast<size_t>(local));
  opts.setOutput(reinterpret_cast<uint8_t*>(all.data()), counts);
  {
    const SpanProfile::Timer timer(agreement_.timer());
    gloo::allgatherv(opts);
  }
  for (int l = 0; l < local; ++l) {
    Bytes* dst = Dest(c, l);
    for (size_t node = 0; node < s_.layout.size(); ++node) {
      for (size_t p = 0; p < node_elems_[node]; ++p) {
        const auto gr = static_cast<size_t>(s_.layout[node].global_ranks[p]);
        std::memcpy(dst + gr * block, all.data() + (node_first_[node] + p) * block, block);
      }
    }
  }
}

void SpanExchange::ReduceScatter(const CheckedCall& c, Bytes* const* regions, int local,
                                 size_t in_bytes, size_t block, size_t es) {
  const size_t elems = in_bytes / es;
  const auto dtype = c.call.dtype;
  std::vector<Bytes>& sum = Scratch(0, in_bytes);
  Reduce(regions, local, 0, elems, dtype, sum.data(), c.call.op);
  AcrossNodes(sum.data(), elems, dtype, c.call.op);
  for (int l = 0; l < local; ++l) {
    const auto gr = static_cast<size_t>(agreement_.GlobalRank(s_.node_index, l));
    std::memcpy(Dest(c, l), sum.data() + gr * block, block);
  }
}

void SpanExchange::AllToAll(const CheckedCall& c, Bytes* const* regions, int local,
                            size_t in_bytes) {
  // To node k: for each of its ranks m, for each local rank l, l's block for m.
  const size_t block = in_bytes / static_cast<size_t>(s_.global_world_size);
  const auto l_here = static_cast<size_t>(local);
  std::vector<Bytes>& send = Scratch(0, in_bytes * l_here);
  std::vector<Bytes>& recv = Scratch(1, block * l_here * node_ranks_total_);
  std::vector<int64_t> send_counts, recv_counts;
  Bytes* p = send.data();
  for (size_t node = 0; node < s_.layout.size(); ++node) {
    for (int gr : s_.layout[node].global_ranks) {
      for (int l = 0; l < local; ++l) {
        std::memcpy(p, regions[l] + static_cast<size_t>(gr) * block, block);
        p += block;
      }
    }
    send_counts.push_back(static_cast<int64_t>(node_elems_[node] * l_here * block));
    recv_counts.push_back(static_cast<int64_t>(l_here * node_elems_[node] * block));
  }
  gloo::AlltoallvOptions opts(agreement_.context());
  opts.setInput(reinterpret_cast<uint8_t*>(send.data()), send_counts);
  opts.setOutput(reinterpret_cast<uint8_t*>(recv.data()), recv_counts);
  {
    const SpanProfile::Timer timer(agreement_.timer());
    gloo::alltoallv(opts);
  }
  // From node k: for each local rank m, for each of k's ranks, its block for m.
  const Bytes* q = recv.data();
  for (size_t node = 0; node < s_.layout.size(); ++node) {
    for (int m = 0; m < local; ++m) {
      for (int gr : s_.layout[node].global_ranks) {
        std::memcpy(Dest(c, m) + static_cast<size_t>(gr) * block, q, block);
        q += block;
      }
    }
  }
}

void SpanExchange::FillInline(const CheckedCall& c, const kernels::HostCommView& v, Bytes* slot) {
  Reduce(v.data, v.world_size, 0, c.call.count, c.call.dtype, slot, c.call.op);
}

void SpanExchange::FinishInline(const CheckedCall& c, const kernels::HostCommView& v,
                                const SpanAgreement::Parts& parts) {
  const CollectiveCall& call = c.call;
  const auto dtype = call.dtype;
  Bytes* result = v.data[0];
  kernels::ReduceInto(dtype, SumForAvg(call.op), parts.data(), static_cast<int>(parts.size()), 0,
                      call.count, result, 1);
  if (call.op == ReduceOp::kAvg) Average(result, call.count, dtype, s_.global_world_size);
  const size_t bytes = call.count * DataTypeSize(dtype);
  for (int l = 1; l < v.world_size; ++l) std::memcpy(Dest(c, l), result, bytes);
}

void SpanExchange::Lane(const CheckedCall& c, const kernels::HostCommView& v, size_t begin,
                        size_t n) {
  const CollectiveCall& call = c.call;
  const auto dtype = call.dtype;
  const size_t es = DataTypeSize(dtype);
  Bytes* slice = v.data[v.rank] + begin * es;
  Reduce(v.data, v.world_size, begin * es, n, dtype, slice, call.op);
  AcrossNodes(slice, n, dtype, call.op);
  // Into every local rank's symmetric output while the slice is in this core's cache:
  // only this rank reads or writes these bytes of the peers' regions in this call.
  if (!call.host_memory) {
    for (int l = 0; l < v.world_size; ++l) {
      Bytes* dst = Dest(c, l) + begin * es;
      if (dst != slice) std::memcpy(dst, slice, n * es);
    }
  }
}

// The nodes' reduction of `count` elements at `data` (in place), divided for kAvg by the
// global world size. Gloo splits the data at element boundaries of the type it is given, so
// it is given an unsigned type of the element's size, and our reduction.
void SpanExchange::AcrossNodes(Bytes* data, size_t count, DataType dtype, ReduceOp op) {
  const ReduceOp k = SumForAvg(op);
  gloo::AllreduceOptions opts(agreement_.context());
  switch (DataTypeSize(dtype)) {
    case 1:
      opts.setOutput(reinterpret_cast<uint8_t*>(data), count);
      break;
    case 2:
      opts.setOutput(reinterpret_cast<uint16_t*>(data), count);
      break;
    case 4:
      opts.setOutput(reinterpret_cast<uint32_t*>(data), count);
      break;
    default:
      opts.setOutput(reinterpret_cast<uint64_t*>(data), count);
      break;
  }
  opts.setReduceFunction([dtype, k](void* out, const void* a, const void* b, size_t n) {
    const Bytes* srcs[2] = {static_cast<const Bytes*>(a), static_cast<const Bytes*>(b)};
    kernels::ReduceInto(dtype, k, srcs, 2, 0, n, static_cast<Bytes*>(out), 1);
  });
  {
    const SpanProfile::Timer timer(agreement_.timer());
    gloo::allreduce(opts);
  }
  if (op == ReduceOp::kAvg) Average(data, count, dtype, s_.global_world_size);
}

// Scratch `which`, at least `bytes` (kept: the next call of the size reuses it).
std::vector<Bytes>& SpanExchange::Scratch(int which, size_t bytes) {
  std::vector<Bytes>& s = scratch_[which];
  if (s.size() < bytes) s.resize(bytes);
  return s;
}

}  // namespace commd
