// Internal to the SDK: the data of a host group's collective between nodes, over the gloo mesh
// of the group's agreement (span_agreement.h), once the leaders agreed on the call
// (span_collectives.h has the protocol around it).
//
//   the leader   Run: the node's regions (each local rank's part of the call's buffer) with
//                the other nodes' leaders (gloo all-reduce, broadcast, all-gatherv or
//                all-to-allv), every local rank's result written to its output; or, for a small
//                all-reduce, FillInline / FinishInline around the agreement's own gather;
//   every rank   Lane: its slice of a large all-reduce with the same local rank of the other
//                nodes, on its own connections.
//
// Usage (the leader, after SpanAgreement::Gather agreed):
//   SpanExchange exchange(agreement);
//   RETURN_IF_ERROR(exchange.Run(c, view, in_bytes, out_bytes, element_bytes));
//
// Gloo's failures are thrown: callers run these inside SpanAgreement::Guarded. Not
// thread-safe: the group's calling thread only.
#ifndef COMMD_CLIENT_SRC_SPAN_EXCHANGE_H_
#define COMMD_CLIENT_SRC_SPAN_EXCHANGE_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "client/src/collective_call.h"
#include "client/src/span_agreement.h"
#include "kernels/host/comm_view.h"
#include "kernels/types.h"

namespace commd {

class SpanExchange {
 public:
  // `agreement` (its mesh, its setup, its timer) is borrowed for the exchange's life.
  explicit SpanExchange(SpanAgreement& agreement);

  // The leader's: the node's data with the other nodes', every local rank's result written to
  // its output. `in_bytes` and `out_bytes` are one rank's input and output, `es` the element's
  // size. UNIMPLEMENTED for a collective with no implementation across nodes.
  absl::Status Run(const CheckedCall& c, const kernels::HostCommView& v, size_t in_bytes,
                   size_t out_bytes, size_t es);

  // A small all-reduce in the agreement's gather (SpanAgreement::InlineBytes): the node's
  // reduction written into its `slot`, then every node's `parts` reduced in node order (so
  // every node computes the same bits) into every local rank's output.
  static void FillInline(const CheckedCall& c, const kernels::HostCommView& v, std::byte* slot);
  void FinishInline(const CheckedCall& c, const kernels::HostCommView& v,
                    const SpanAgreement::Parts& parts);

  // This rank's lane of a large all-reduce: elements [begin, begin + n) reduced in place in its
  // own region, all-reduced with the other nodes' same lane and, unless the call is staged,
  // pushed into every local rank's output.
  void Lane(const CheckedCall& c, const kernels::HostCommView& v, size_t begin, size_t n);

  // Where rank `l`'s output goes: its staging region (host-memory overloads), its region of the
  // call's buffer (in place), or of the output buffer.
  static std::byte* Dest(const CheckedCall& c, int l);

 private:
  void AllReduce(const CheckedCall& c, std::byte* const* regions, int local, size_t offset,
                 size_t count, DataType dtype);
  void Broadcast(const CheckedCall& c, std::byte* const* regions, int local, size_t bytes);
  void AllGather(const CheckedCall& c, std::byte* const* regions, int local, size_t block);
  void ReduceScatter(const CheckedCall& c, std::byte* const* regions, int local, size_t in_bytes,
                     size_t block, size_t es);
  void AllToAll(const CheckedCall& c, std::byte* const* regions, int local, size_t in_bytes);
  void AcrossNodes(std::byte* data, size_t count, DataType dtype, ReduceOp op);
  std::vector<std::byte>& Scratch(int which, size_t bytes);

  SpanAgreement& agreement_;
  const SpanSetup& s_;              // the agreement's
  std::vector<size_t> node_elems_;  // ranks per node, in layout order
  std::vector<size_t> node_first_;  // the first rank of each node in layout order
  size_t node_ranks_total_ = 0;
  std::vector<std::byte> scratch_[2];
};

}  // namespace commd

#endif  // COMMD_CLIENT_SRC_SPAN_EXCHANGE_H_
