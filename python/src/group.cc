// commd.Group: join, symmetric buffers, collectives (GIL released, Ctrl-C aborts the group),
// abort notification and the flight recorder.
#include <unistd.h>

#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "binding.h"
#include "internal.h"
#include "memory.h"

namespace commd::python {
namespace {

// What a collective found of NaN/Inf (CollectiveOptions::nonfinite_*).
struct NanFinding {
  uint64_t nonfinite_count = 0;  // in this rank's input; 0 when not checked
  int nonfinite_ranks = 0;       // ranks that found some (the same on every rank)
};

struct GroupObject {
  std::shared_ptr<Client> client;      // for Abort when Ctrl-C ends a collective
  std::shared_ptr<Group> group;        // null once closed
  mutable bool barrier_ready = false;  // the SDK allocates Barrier()'s pads on the first one
  ~GroupObject() {
    py::gil_scoped_release release;  // ~Group waits for the SDK's event thread
    group.reset();
  }
  Group& get() const {
    if (group == nullptr) Check(absl::FailedPreconditionError("the group was closed"));
    return *group;
  }
};

struct RecorderObject {
  std::shared_ptr<Group> group;
};

template <typename Enum>
Enum ParseChoice(const py::object& value, const char* what,
                 std::initializer_list<std::pair<const char*, Enum>> choices, Enum none) {
  if (value.is_none()) return none;
  const std::string name = py::str(value);
  std::string names;
  for (const auto& [n, e] : choices) {
    if (name == n) return e;
    absl::StrAppend(&names, names.empty() ? "" : ", ", n);
  }
  ThrowInvalid(absl::StrCat("unknown ", what, " '", name, "' (one of: ", names, ")"));
}

std::string InterruptReason(const Group& group, const char* call) {
  return absl::StrCat("rank ", group.rank(), " (pid ", getpid(), ") got KeyboardInterrupt in ",
                      call);
}

// Group calls that wait in the daemon's rendezvous of a symmetric allocation, which an abort
// does not end: run on a thread of their own (RunInterruptible). Ctrl-C aborts the group and
// raises KeyboardInterrupt at once; the abandoned call ends with the rendezvous (every rank
// asked, or the group's timeout) and frees what it got.
template <typename T>
T Detached(const GroupObject& g, const char* call, std::function<T(Group&)> fn) {
  g.get();  // raises once closed
  std::shared_ptr<Group> group = g.group;
  auto result = std::make_shared<std::optional<T>>();
  try {
    RunInterruptible([group, fn, result] { *result = fn(*group); });
  } catch (py::error_already_set&) {
    py::gil_scoped_release release;
    (void)g.client->Abort(group->name(), InterruptReason(*group, call));
    throw;
  }
  return std::move(**result);
}

// Runs one blocking group call without the GIL. Ctrl-C on the main thread aborts the group
// (the only way to end a collective the peers are in too), then raises KeyboardInterrupt.
template <typename Fn>
auto Blocking(const GroupObject& g, const char* call, Fn fn) {
  std::shared_ptr<Group> group = g.group;
  if (group == nullptr) g.get();  // raises
  decltype(fn(*group)) result = absl::UnknownError("not called");
  bool interrupted = false;
  {
    py::gil_scoped_release release;
    InterruptScope scope([client = g.client, group, call] {  // the reason built only if used
      (void)client->Abort(group->name(), InterruptReason(*group, call));
    });
    result = fn(*group);
    interrupted = scope.interrupted();
  }
  if (interrupted && PyErr_CheckSignals() != 0) throw py::error_already_set();
  return result;
}

// internal::GroupHandle::run_blocking: Blocking's work for commd._c10d, which calls without
// the GIL (torch released it).
absl::Status RunBlockingForHandle(const internal::GroupHandle& handle, const char* call,
                                  absl::Status (*fn)(Group& group, void* arg), void* arg,
                                  bool* interrupted) {
  InterruptScope scope([client = handle.client, group = handle.group, call] {
    (void)client->Abort(group->name(), InterruptReason(*group, call));
  });
  absl::Status status = fn(*handle.group, arg);
  *interrupted = scope.interrupted();
  return status;
}

// Group._internal_handle(): a capsule of an internal::GroupHandle (internal.h).
py::object InternalGroupHandle(const GroupObject& g) {
  g.get();  // raises once closed
  auto* handle = new internal::GroupHandle;
  handle->client = g.client;
  handle->group = g.group;
  handle->run_blocking = &RunBlockingForHandle;
  return py::capsule(handle, internal::kGroupCapsule, [](PyObject* capsule) {
    delete static_cast<internal::GroupHandle*>(
        PyCapsule_GetPointer(capsule, internal::kGroupCapsule));
  });
}

struct CallOptions {
  CollectiveOptions options;
  NanFinding finding;
};

void ParseCallOptions(CallOptions& c, const py::object& timeout, const py::object& nan_check,
                      uint32_t nan_sample_period, uintptr_t cuda_stream,
                      const py::object& part_of) {
  if (!part_of.is_none()) {
    if (!py::isinstance<RecordId>(part_of)) {
      ThrowInvalid(
          absl::StrCat("part_of must be a commd.RecordId (Recorder.begin, "
                       "Group.record) or None, not ",
                       py::str(py::type::of(part_of).attr("__name__")).cast<std::string>()));
    }
    c.options.part_of = part_of.cast<RecordId>();
  }
  // A cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream); 0 is CUDA's
  // default stream. The SDK ignores it for host buffers.
  c.options.cuda_stream = reinterpret_cast<void*>(cuda_stream);
  using N = CollectiveOptions::NanCheck;
  if (!timeout.is_none()) c.options.timeout = Seconds(timeout.cast<double>(), "timeout");
  c.options.nan_check =
      ParseChoice<N>(nan_check, "nan_check",
                     {{"off", N::kOff}, {"on", N::kOn}, {"sampled", N::kSampled}}, N::kDefault);
  c.options.nan_sample_period = nan_sample_period;
  c.options.nonfinite_count = &c.finding.nonfinite_count;
  c.options.nonfinite_ranks = &c.finding.nonfinite_ranks;
}

// The element type of a call: `dtype`, else the views'; they must agree and be reducible.
const ElementType& CallType(const py::object& dtype, std::initializer_list<const Operand*> ops) {
  const ElementType* type = dtype.is_none() ? nullptr : &ParseElementType(dtype);
  for (const Operand* op : ops) {
    if (op->type == nullptr) continue;
    if (type != nullptr && type != op->type) {
      ThrowInvalid(absl::StrCat("dtype ", type->name, " differs from a view's ", op->type->name));
    }
    type = op->type;
  }
  if (type == nullptr) ThrowInvalid("dtype is required for whole buffers (views carry theirs)");
  if (!type->commd) {
    ThrowInvalid(absl::StrCat("dtype ", type->name,
                              " is not a collective type (float32, float16, bfloat16, int32, "
                              "int64)"));
  }
  return *type;
}

// Elements of `op` (`per` of them make one rank's part), and a check that `count` fits.
size_t Fit(const Operand& op, const ElementType& type, size_t per) {
  return op.type != nullptr ? op.count / per : op.nbytes / type.itemsize / per;
}
void CheckFits(const Operand& op, size_t count, size_t per, const char* what) {
  if (op.type != nullptr && count * per > op.count) {
    ThrowInvalid(absl::StrCat("count ", count, (per > 1 ? absl::StrCat(" x ", per) : ""),
                              " exceeds ", what, "'s ", op.count, " elements (allowed: 0..",
                              op.count / per, ")"));
  }
}
void NeedOffsetZero(const Operand& op, const char* call, const char* what) {
  if (op.offset != 0) {
    ThrowInvalid(
        absl::StrCat(call, " takes views at offset 0 (", what, " is at offset ", op.offset, ")"));
  }
}

// ---- Host memory (the calls given `staging`): the SDK's overloads on ordinary memory. ----

// Elements of a host-memory call whose input holds `in_per` and output `out_per` counts (the
// same buffer for in-place calls): `count`, else as many as both hold.
size_t HostCount(const py::object& count, const HostMemory& in, const HostMemory& out,
                 size_t in_per, size_t out_per) {
  if (&in.type() != &out.type()) {
    ThrowInvalid(
        absl::StrCat("input's dtype ", in.type().name, " differs from output's ", out.type().name));
  }
  const size_t most = std::min(in.count() / in_per, out.count() / out_per);
  const size_t n = count.is_none() ? most : count.cast<size_t>();
  if (n > most) {
    ThrowInvalid(absl::StrCat("count ", n, " exceeds the host memory: input holds ", in.count(),
                              " and output ", out.count(), " elements, ", in_per, " and ", out_per,
                              " x count needed (allowed: 0..", most, ")"));
  }
  return n;
}

// all_reduce and broadcast on host memory, in place on `buf`: `call` runs the SDK's overload.
template <typename Call>
py::object HostInPlaceCall(const GroupObject& g, const char* name, const py::object& buf,
                           const py::object& count, const py::object& dtype,
                           const py::object& staging, CallOptions& c, Call call) {
  const HostMemory b(buf, "buf", dtype, /*writable=*/true);
  SymmetricBuffer& s = ToStaging(staging);
  const size_t n = HostCount(count, b, b, 1, 1);
  Check(Blocking(g, name,
                 [&](Group& group) { return call(group, b.data(), n, *b.type().commd, s); }));
  return py::cast(c.finding);
}

py::object AllReduce(const GroupObject& g, const py::object& buf, const py::object& count,
                     const py::object& dtype, const py::object& op, const py::object& timeout,
                     const py::object& nan_check, uint32_t period, uintptr_t cuda_stream,
                     const py::object& staging, const py::object& part_of) {
  const ReduceOp reduce = ParseReduceOp(op);
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, cuda_stream, part_of);
  if (!staging.is_none()) {
    return HostInPlaceCall(g, "all_reduce", buf, count, dtype, staging, c,
                           [&](Group& group, char* p, size_t n, DataType t, SymmetricBuffer& s) {
                             return group.AllReduce(p, p, n, t, reduce, s, c.options);
                           });
  }
  const Operand b = ToOperand(buf, "buf");
  const ElementType& type = CallType(dtype, {&b});
  const size_t n = count.is_none() ? Fit(b, type, 1) : count.cast<size_t>();
  CheckFits(b, n, 1, "buf");
  Check(Blocking(g, "all_reduce", [&](Group& group) {
    // The SDK's AllReduce starts at the buffer; a view further in is a one-tensor coalesced
    // all-reduce, which takes offsets.
    if (b.offset == 0) return group.AllReduce(*b.buffer, n, *type.commd, reduce, c.options);
    return group.AllReduceCoalesced(*b.buffer, {{b.offset, n, *type.commd}}, reduce, c.options);
  }));
  return py::cast(c.finding);
}

// Group._time_all_reduce: the C++ SDK's own loop, what commd-bench --path sdk times. `buf`:
// a symmetric buffer or a view of one from its start (its bytes: the all-reduce's size).
double TimeAllReduce(const GroupObject& g, const py::object& buf, int64_t iters) {
  const Operand b = ToOperand(buf, "buf");
  if (b.offset != 0 || iters < 1) {
    ThrowInvalid(
        absl::StrCat("_time_all_reduce: needs a whole symmetric buffer and iters >= 1 "
                     "(got offset ",
                     b.offset, ", iters ", iters, ")"));
  }
  const size_t n = b.nbytes / sizeof(float);
  absl::Duration took;
  Check(Blocking(g, "all_reduce", [&](Group& group) {
    const absl::Time start = absl::Now();
    for (int64_t i = 0; i < iters; ++i) {
      const absl::Status st = group.AllReduce(*b.buffer, n, DataType::kFloat32, ReduceOp::kSum);
      if (!st.ok()) return st;
    }
    took = absl::Now() - start;
    return absl::OkStatus();
  }));
  return absl::ToDoubleSeconds(took) / static_cast<double>(iters);
}

// The ranks a call's wide operands hold a part for: the group's size over every node (a group
// spanning nodes takes counts per global rank, its wide buffers one part per global rank).
size_t Parts(const GroupObject& g) { return static_cast<size_t>(g.get().global_world_size()); }

// The operands of all_gather / reduce_scatter: `small` holds count elements per rank, `big`
// Parts() times that; views must start at offset 0 (the SDK's calls take no offsets).
struct PairCall {
  Operand in, out;
  const ElementType* type;
  size_t count;
};
PairCall ResolvePair(const GroupObject& g, const char* call, const py::object& in,
                     const py::object& out, const py::object& count, const py::object& dtype,
                     bool gather) {
  PairCall p{ToOperand(in, "input"), ToOperand(out, "output"), nullptr, 0};
  NeedOffsetZero(p.in, call, "input");
  NeedOffsetZero(p.out, call, "output");
  p.type = &CallType(dtype, {&p.in, &p.out});
  const size_t world = Parts(g);
  const Operand& small = gather ? p.in : p.out;
  const Operand& big = gather ? p.out : p.in;
  p.count = !count.is_none()        ? count.cast<size_t>()
            : small.type != nullptr ? small.count
                                    : std::min(Fit(small, *p.type, 1), Fit(big, *p.type, world));
  CheckFits(small, p.count, 1, gather ? "input" : "output");
  CheckFits(big, p.count, world, gather ? "output" : "input");
  return p;
}

// all_gather, reduce_scatter and all_to_all on host memory: `call` runs the SDK's overload.
template <typename Call>
py::object HostPairCall(const GroupObject& g, const char* name, const py::object& in,
                        const py::object& out, const py::object& count, const py::object& dtype,
                        const py::object& staging, size_t in_per, size_t out_per, CallOptions& c,
                        Call call) {
  const HostMemory i(in, "input", dtype, /*writable=*/false);
  const HostMemory o(out, "output", dtype, /*writable=*/true);
  SymmetricBuffer& s = ToStaging(staging);
  const size_t n = HostCount(count, i, o, in_per, out_per);
  Check(Blocking(g, name, [&](Group& group) {
    return call(group, i.data(), o.data(), n, *i.type().commd, s);
  }));
  return py::cast(c.finding);
}

py::object AllGather(const GroupObject& g, const py::object& in, const py::object& out,
                     const py::object& count, const py::object& dtype, const py::object& timeout,
                     const py::object& nan_check, uint32_t period, uintptr_t cuda_stream,
                     const py::object& staging, const py::object& part_of) {
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, cuda_stream, part_of);
  if (!staging.is_none()) {
    return HostPairCall(
        g, "all_gather", in, out, count, dtype, staging, 1, Parts(g), c,
        [&](Group& group, auto&&... a) { return group.AllGather(a..., c.options); });
  }
  const PairCall p = ResolvePair(g, "all_gather", in, out, count, dtype, /*gather=*/true);
  Check(Blocking(g, "all_gather", [&](Group& group) {
    return group.AllGather(*p.in.buffer, *p.out.buffer, p.count, *p.type->commd, c.options);
  }));
  return py::cast(c.finding);
}

py::object ReduceScatter(const GroupObject& g, const py::object& in, const py::object& out,
                         const py::object& count, const py::object& dtype, const py::object& op,
                         const py::object& timeout, const py::object& nan_check, uint32_t period,
                         uintptr_t cuda_stream, const py::object& staging,
                         const py::object& part_of) {
  const ReduceOp reduce = ParseReduceOp(op);
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, cuda_stream, part_of);
  if (!staging.is_none()) {
    return HostPairCall(
        g, "reduce_scatter", in, out, count, dtype, staging, Parts(g), 1, c,
        [&](Group& group, const void* i, void* o, size_t n, DataType t, SymmetricBuffer& s) {
          return group.ReduceScatter(i, o, n, t, reduce, s, c.options);
        });
  }
  const PairCall p = ResolvePair(g, "reduce_scatter", in, out, count, dtype, /*gather=*/false);
  Check(Blocking(g, "reduce_scatter", [&](Group& group) {
    return group.ReduceScatter(*p.in.buffer, *p.out.buffer, p.count, *p.type->commd, reduce,
                               c.options);
  }));
  return py::cast(c.finding);
}

py::object Broadcast(const GroupObject& g, const py::object& buf, int root, const py::object& count,
                     const py::object& dtype, const py::object& timeout,
                     const py::object& nan_check, uint32_t period, uintptr_t cuda_stream,
                     const py::object& staging, const py::object& part_of) {
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, cuda_stream, part_of);
  if (!staging.is_none()) {
    return HostInPlaceCall(g, "broadcast", buf, count, dtype, staging, c,
                           [&](Group& group, char* p, size_t n, DataType t, SymmetricBuffer& s) {
                             return group.Broadcast(p, n, t, root, s, c.options);
                           });
  }
  const Operand b = ToOperand(buf, "buf");
  NeedOffsetZero(b, "broadcast", "buf");
  const ElementType& type = CallType(dtype, {&b});
  const size_t n = count.is_none() ? Fit(b, type, 1) : count.cast<size_t>();
  CheckFits(b, n, 1, "buf");
  Check(Blocking(g, "broadcast", [&](Group& group) {
    return group.Broadcast(*b.buffer, n, *type.commd, root, c.options);
  }));
  return py::cast(c.finding);
}

// Equal splits: input and output each hold world_size * count elements.
py::object AllToAll(const GroupObject& g, const py::object& in, const py::object& out,
                    const py::object& count, const py::object& dtype, const py::object& timeout,
                    const py::object& nan_check, uint32_t period, uintptr_t cuda_stream,
                    const py::object& staging, const py::object& part_of) {
  if (!staging.is_none()) {
    CallOptions c;
    ParseCallOptions(c, timeout, nan_check, period, cuda_stream, part_of);
    const size_t world = Parts(g);
    return HostPairCall(g, "all_to_all", in, out, count, dtype, staging, world, world, c,
                        [&](Group& group, auto&&... a) { return group.AllToAll(a..., c.options); });
  }
  const Operand i = ToOperand(in, "input"), o = ToOperand(out, "output");
  NeedOffsetZero(i, "all_to_all", "input");
  NeedOffsetZero(o, "all_to_all", "output");
  const ElementType& type = CallType(dtype, {&i, &o});
  const size_t world = Parts(g);
  const size_t n =
      count.is_none() ? std::min(Fit(i, type, world), Fit(o, type, world)) : count.cast<size_t>();
  CheckFits(i, n, world, "input");
  CheckFits(o, n, world, "output");
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, cuda_stream, part_of);
  Check(Blocking(g, "all_to_all", [&](Group& group) {
    return group.AllToAll(*i.buffer, *o.buffer, n, *type.commd, c.options);
  }));
  return py::cast(c.finding);
}

py::object AllReduceCoalesced(const GroupObject& g, const py::sequence& tensors,
                              const py::object& op, const py::object& timeout,
                              const py::object& nan_check, uint32_t period, uintptr_t cuda_stream,
                              const py::object& part_of) {
  std::vector<CoalescedTensor> parts;
  SymmetricBuffer* buffer = nullptr;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const std::string what = absl::StrCat("tensors[", k, "]");
    if (!py::isinstance<TensorView>(tensors[k])) {
      ThrowInvalid(absl::StrCat(what, " must be a TensorView of a symmetric buffer"));
    }
    const Operand t = ToOperand(tensors[k], what.c_str());
    const ElementType& type = CallType(py::none(), {&t});
    if (buffer != nullptr && t.buffer != buffer) {
      ThrowInvalid(absl::StrCat(what,
                                " views another buffer than tensors[0]; coalesced "
                                "tensors share one buffer"));
    }
    buffer = t.buffer;
    parts.push_back({t.offset, t.count, *type.commd});
  }
  if (buffer == nullptr) ThrowInvalid("all_reduce_coalesced needs at least one tensor");
  const ReduceOp reduce = ParseReduceOp(op);
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, cuda_stream, part_of);
  Check(Blocking(g, "all_reduce_coalesced", [&](Group& group) {
    return group.AllReduceCoalesced(*buffer, parts, reduce, c.options);
  }));
  return py::cast(c.finding);
}

// ---- The fused matmuls: A's operand a symmetric buffer (all-gather + matmul) or host
// memory, every B, output and scale host memory (held while the call runs). ----

// Host memory of `dtype` holding at least `need` elements (None: a null pointer).
const void* Held(std::vector<std::unique_ptr<HostMemory>>& held, const py::handle& obj,
                 const std::string& what, const char* dtype, size_t need, bool writable) {
  if (obj.is_none()) return nullptr;
  auto m = std::make_unique<HostMemory>(obj, what.c_str(), py::str(dtype), writable);
  if (m->count() < need) {
    ThrowInvalid(
        absl::StrCat(what, " holds ", m->count(), " ", dtype, " elements; ", need, " needed"));
  }
  held.push_back(std::move(m));
  return held.back()->data();
}

// The Bs of a fused matmul: each k x n (n from its size), its output (`out_rows` x n) and
// optional column scales.
std::vector<MatmulB> MatmulBs(std::vector<std::unique_ptr<HostMemory>>& held,
                              const py::sequence& bs, const py::sequence& outs,
                              const py::object& col_scales, const ElementType& type, size_t k,
                              size_t out_rows) {
  if (bs.size() != outs.size() || (!col_scales.is_none() && py::len(col_scales) != bs.size())) {
    ThrowInvalid(absl::StrCat(
        bs.size(), " Bs, ", outs.size(), " outputs",
        col_scales.is_none() ? "" : absl::StrCat(" and ", py::len(col_scales), " col_scales"),
        ": one of each per B"));
  }
  std::vector<MatmulB> out;
  for (size_t i = 0; i < bs.size(); ++i) {
    const std::string b = absl::StrCat("bs[", i, "]");
    const void* data = Held(held, bs[i], b, type.name, 1, false);
    const size_t elems = held.back()->count();
    if (k == 0 || elems % k != 0) {
      ThrowInvalid(absl::StrCat(b, " holds ", elems, " elements, not a multiple of k ", k));
    }
    const size_t n = elems / k;
    py::object scale = py::none();
    if (!col_scales.is_none()) scale = col_scales[py::int_(i)];
    out.push_back({data, n,
                   const_cast<void*>(Held(held, outs[i], absl::StrCat("outs[", i, "]"), type.name,
                                          out_rows * n, true)),
                   static_cast<const float*>(Held(held, scale, absl::StrCat("col_scales[", i, "]"),
                                                  "float32", n, false))});
  }
  return out;
}

py::object AllGatherMatmul(const GroupObject& g, const py::object& shard, size_t rows, size_t k,
                           const py::sequence& bs, const py::sequence& outs,
                           const py::object& dtype, const py::object& row_scale,
                           const py::object& col_scales, const py::object& gathered,
                           const py::object& timeout, const py::object& nan_check,
                           uint32_t period) {
  const Operand a = ToOperand(shard, "shard");
  NeedOffsetZero(a, "all_gather_matmul", "shard");
  const ElementType& type = CallType(dtype, {&a});
  const size_t world = g.get().world_size();
  std::vector<std::unique_ptr<HostMemory>> held;
  const std::vector<MatmulB> mbs = MatmulBs(held, bs, outs, col_scales, type, k, world * rows);
  const auto* rs =
      static_cast<const float*>(Held(held, row_scale, "row_scale", "float32", rows, false));
  void* all =
      const_cast<void*>(Held(held, gathered, "gathered", type.name, world * rows * k, true));
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, 0, py::none());
  Check(Blocking(g, "all_gather_matmul", [&](Group& group) {
    return group.AllGatherMatmul(*a.buffer, rows, k, *type.commd, mbs, rs, all, c.options);
  }));
  return py::cast(c.finding);
}

py::object MatmulReduceScatter(const GroupObject& g, const py::object& a, size_t rows, size_t k,
                               const py::object& b, const py::object& out,
                               const py::object& workspace, const py::object& op,
                               const py::object& dtype, const py::object& row_scale,
                               const py::object& col_scale, const py::object& timeout,
                               const py::object& nan_check, uint32_t period) {
  const ReduceOp reduce = ParseReduceOp(op);
  SymmetricBuffer& ws = ToStaging(workspace);
  std::vector<std::unique_ptr<HostMemory>> held;
  const ElementType& type =
      dtype.is_none() ? HostMemory(a, "a", dtype, false).type() : ParseElementType(dtype);
  const void* a_data = Held(held, a, "a", type.name, rows * k, false);
  const size_t world = g.get().world_size();
  const std::vector<MatmulB> mbs =
      MatmulBs(held, py::make_tuple(b), py::make_tuple(out),
               col_scale.is_none() ? py::object(py::none()) : py::make_tuple(col_scale), type, k,
               rows / world);
  const auto* rs =
      static_cast<const float*>(Held(held, row_scale, "row_scale", "float32", rows, false));
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, 0, py::none());
  Check(Blocking(g, "matmul_reduce_scatter", [&](Group& group) {
    return group.MatmulReduceScatter(a_data, rows, k, *type.commd, mbs[0], reduce, ws, rs,
                                     c.options);
  }));
  return py::cast(c.finding);
}

bool PythonAlive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// on_abort: the callback runs on the SDK's event thread, so it holds the GIL only while it
// runs, and the Python callable is released under the GIL wherever the SDK drops it.
void OnAbort(const GroupObject& g, py::function callback) {
  std::shared_ptr<py::object> held(new py::object(std::move(callback)), [](py::object* o) {
    if (!PythonAlive()) return;  // at exit: leak rather than touch a dying interpreter
    py::gil_scoped_acquire gil;
    delete o;
  });
  Group& group = g.get();
  py::gil_scoped_release release;
  group.SetAbortCallback([held](const absl::Status& status) {
    if (!PythonAlive()) return;
    py::gil_scoped_acquire gil;
    try {
      (*held)(ErrorFor(status));
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("commd.Group.on_abort callback");
    }
  });
}

const std::initializer_list<std::pair<const char*, CollectiveOp>> kOps = {
    {"all_reduce", CollectiveOp::kAllReduce},
    {"all_gather", CollectiveOp::kAllGather},
    {"reduce_scatter", CollectiveOp::kReduceScatter},
    {"broadcast", CollectiveOp::kBroadcast},
    {"reduce", CollectiveOp::kReduce},
    {"barrier", CollectiveOp::kBarrier},
    {"all_to_all", CollectiveOp::kAllToAll},
    {"gather", CollectiveOp::kGather},
    {"scatter", CollectiveOp::kScatter},
    {"send", CollectiveOp::kSend},
    {"recv", CollectiveOp::kRecv},
};

// Tensor arguments of a recorded collective: TensorViews, (shape, dtype) pairs, or anything
// with .shape and .dtype (numpy arrays, torch tensors).
struct Descs {
  std::vector<std::vector<int64_t>> dims;
  std::vector<TensorDesc> descs;
};
Descs ToDescs(const py::iterable& tensors) {
  Descs d;
  std::vector<const ElementType*> types;
  for (py::handle t : tensors) {
    py::object shape, dtype;
    if (py::isinstance<py::tuple>(t) && py::len(t) == 2) {
      shape = t.cast<py::tuple>()[0];
      dtype = t.cast<py::tuple>()[1];
    } else {
      shape = t.attr("shape");
      dtype = t.attr("dtype");
    }
    const ElementType& type = ParseElementType(dtype);
    if (!type.commd) ThrowInvalid(absl::StrCat("dtype ", type.name, " cannot be recorded"));
    d.dims.push_back(py::isinstance<py::int_>(shape) ? std::vector<int64_t>{shape.cast<int64_t>()}
                                                     : shape.cast<std::vector<int64_t>>());
    types.push_back(&type);
  }
  for (size_t i = 0; i < d.dims.size(); ++i) {
    d.descs.push_back({d.dims[i].data(), static_cast<int>(d.dims[i].size()), *types[i]->commd});
  }
  return d;
}

// A Recorder call's cuda_stream: a cudaStream_t as a non-negative int.
void* StreamOf(const py::object& cuda_stream) {
  if (!py::isinstance<py::int_>(cuda_stream) || cuda_stream.cast<py::int_>() < py::int_(0)) {
    ThrowInvalid(absl::StrCat("cuda_stream must be None or a cudaStream_t as an int >= 0, not ",
                              py::str(py::repr(cuda_stream)).cast<std::string>()));
  }
  return reinterpret_cast<void*>(cuda_stream.cast<uintptr_t>());
}

// Recorder.started / completed: now (cuda_stream None) or in the stream's order.
void Mark(RecorderObject& r, const RecordId& id, const py::object& cuda_stream, bool completed) {
  Recorder& rec = r.group->recorder();
  if (cuda_stream.is_none()) {
    completed ? rec.Completed(id) : rec.Started(id);
    return;
  }
  void* stream = StreamOf(cuda_stream);
  Check(completed ? rec.Completed(id, stream) : rec.Started(id, stream));
}

void BindRecorder(py::module_& m) {
  py::class_<RecordId>(m, "RecordId", "One recorded collective (Recorder.begin).")
      .def_readonly("record_id", &RecordId::record_id)
      .def_readonly("collective_seq_id", &RecordId::collective_seq_id)
      .def_readonly("bytes", &RecordId::bytes);
  py::class_<RecorderObject>(
      m, "Recorder",
      "Records collectives that run outside commd (NCCL, gloo, torch) into this rank's "
      "flight recorder, which the daemon reads even when this process is stuck or dead. "
      "One thread at a time per group. Group.record(...) is the context-manager form.")
      .def(
          "begin",
          [](RecorderObject& r, const py::object& op, const py::iterable& inputs,
             const py::iterable& outputs, int peer, uint64_t timeout_ms) {
            const auto o = ParseChoice<CollectiveOp>(op, "op", kOps, CollectiveOp::kAllReduce);
            Descs in = ToDescs(inputs), out = ToDescs(outputs);
            return r.group->recorder().Begin(o, in.descs, out.descs, peer, timeout_ms);
          },
          py::arg("op"), py::arg("inputs") = py::tuple(), py::arg("outputs") = py::tuple(),
          py::arg("peer") = -1, py::arg("timeout_ms") = 0,
          "Records a collective's entry: op ('all_reduce', 'broadcast', 'all_to_all', "
          "'send', ...), its input and output tensors (TensorView, (shape, dtype), or objects "
          "with .shape and .dtype). Returns its RecordId.")
      .def(
          "started",
          [](RecorderObject& r, const RecordId& id, const py::object& cuda_stream) {
            Mark(r, id, cuda_stream, /*completed=*/false);
          },
          py::arg("id"), py::arg("cuda_stream") = py::none(),
          "Marks the entry started. cuda_stream None: now, by this thread. Else a cudaStream_t "
          "(an int, e.g. torch.cuda.current_stream().cuda_stream; 0 is the legacy default "
          "stream, as for the collective calls): in stream order, before the work queued on it "
          "next, so the progress the watchdog reads follows the device; the collective calls "
          "given the entry as part_of go on the same stream. Use one kind per group. Raises "
          "FailedPreconditionError for a stream without a usable CUDA driver, InternalError for "
          "a CUDA error (nothing recorded then).")
      .def(
          "completed",
          [](RecorderObject& r, const RecordId& id, const py::object& cuda_stream) {
            Mark(r, id, cuda_stream, /*completed=*/true);
          },
          py::arg("id"), py::arg("cuda_stream") = py::none(),
          "Marks the entry completed. cuda_stream as for started: None now, else in stream "
          "order after the work queued on that stream before it.")
      .def(
          "abandoned",
          [](RecorderObject& r, const RecordId& id) { r.group->recorder().Abandoned(id); },
          "Marks the entry failed.")
      .def(
          "heartbeat", [](RecorderObject& r) { r.group->recorder().Heartbeat(); },
          "Marks this rank alive while it holds no collective.");
}

}  // namespace

Device ParseDevice(const std::string& device) {
  if (device == "host" || device == "cpu") return Device::Host();
  int index = -1;
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &index) &&
      index >= 0) {
    return Device::Cuda(index);
  }
  ThrowInvalid(absl::StrCat("device '", device.substr(0, 64), device.size() > 64 ? "...'" : "'",
                            "; allowed 'host' or 'cuda:N'"));
}

py::object JoinGroup(const std::shared_ptr<Client>& client, GroupOptions o, double timeout,
                     const py::object& watchdog_policy, const py::object& nan_check,
                     uint32_t nan_sample_period, const py::object& nan_policy) {
  o.timeout = Seconds(timeout, "timeout");
  using W = GroupOptions::WatchdogPolicy;
  o.watchdog_policy = ParseChoice<W>(watchdog_policy, "watchdog_policy",
                                     {{"default", W::kDefault},
                                      {"report", W::kReport},
                                      {"notify", W::kNotify},
                                      {"terminate", W::kTerminate}},
                                     W::kDefault);
  using C = GroupOptions::NanCheck;
  o.nan_check = ParseChoice<C>(
      nan_check, "nan_check",
      {{"default", C::kDefault}, {"off", C::kOff}, {"on", C::kOn}, {"sampled", C::kSampled}},
      C::kDefault);
  o.nan_sample_period = nan_sample_period;
  using P = GroupOptions::NanPolicy;
  o.nan_policy = ParseChoice<P>(
      nan_policy, "nan_policy",
      {{"default", P::kDefault}, {"report", P::kReport}, {"fail", P::kFail}}, P::kDefault);
  // The worker thread owns the result: after Ctrl-C it outlives this call, and a group it
  // formed then is destroyed there (this rank leaves it).
  auto result =
      std::make_shared<absl::StatusOr<std::unique_ptr<Group>>>(absl::UnknownError("not joined"));
  RunInterruptible([client, o, result] { *result = client->JoinGroup(o); });
  std::shared_ptr<Group> group = Check(std::move(*result));
  return py::cast(GroupObject{client, std::move(group)});
}

void BindGroup(py::module_& m) {
  py::class_<NanFinding>(m, "NanFinding",
                         "What a collective's NaN/Inf check found: nonfinite_count in this "
                         "rank's input (0 when not checked), nonfinite_ranks that found some.")
      .def_readonly("nonfinite_count", &NanFinding::nonfinite_count)
      .def_readonly("nonfinite_ranks", &NanFinding::nonfinite_ranks)
      .def("__bool__", [](const NanFinding& f) { return f.nonfinite_ranks > 0; })
      .def("__repr__", [](const NanFinding& f) {
        return absl::StrCat("commd.NanFinding(nonfinite_count=", f.nonfinite_count,
                            ", nonfinite_ranks=", f.nonfinite_ranks, ")");
      });
  BindRecorder(m);
  const char* kCallDoc =
      "\n\ntimeout: seconds this rank waits for its peers (None: twice the group's timeout). "
      "nan_check: None (the group's setting), 'off', 'on' or 'sampled' (every "
      "nan_sample_period-th collective). Returns a NanFinding. Raises AbortedError once the "
      "group is aborted, DataLossError under NaN policy 'fail', InvalidArgumentError for bad "
      "or mismatched arguments, DeadlineExceededError after `timeout`. Ctrl-C aborts the "
      "group (every rank gets AbortedError) and raises KeyboardInterrupt. cuda_stream: for a "
      "group on a CUDA device, the cudaStream_t (an int, e.g. "
      "torch.cuda.current_stream().cuda_stream) the collective is queued on; the call returns "
      "once it is queued and a failure surfaces on the group's next call (0: the default "
      "stream; ignored for host memory). staging: a "
      "SymmetricBuffer of this group; when given, the data arguments are ordinary host "
      "memory instead (C-contiguous buffer-protocol objects such as numpy arrays, or "
      "TensorViews; dtype, when given, reinterprets their bytes), which the call stages "
      "through `staging` and writes results to directly (Group::AllReduce(input, output, "
      "..., staging) and friends). A group spanning nodes (global_world_size > world_size) "
      "runs with the whole group's meaning: world_size below is global_world_size, ranks and "
      "`root` are global ranks, and `staging` must hold the call's output too. part_of (not the "
      "fused matmuls): a "
      "RecordId of this group's recorder (Recorder.begin, Group.record) whose collective this "
      "call is a part of: the call writes no flight-recorder entry of its own (its NaN check is "
      "sampled by, and a finding flags, that entry; the caller completes or abandons it), "
      "InvalidArgumentError when the id is not a pending entry of this group; on a CUDA group, "
      "mark the entry started and completed on the parts' cuda_stream (Recorder.started / "
      "completed, Group.record(cuda_stream=...)).";
  auto doc = [&](const char* head) { return absl::StrCat(head, kCallDoc); };
  static const std::string all_reduce_doc =
      doc("all_reduce(buf, count=None, dtype=None, op='sum', *, timeout=None, nan_check=None, "
          "nan_sample_period=100) -> NanFinding\n\nReduces `count` elements in place across the "
          "group (op: 'sum', 'avg', 'min', 'max'). buf: a SymmetricBuffer (dtype required) or a "
          "TensorView of this rank's memory (count defaults to the view's size).");
  static const std::string all_gather_doc =
      doc("all_gather(input, output, count=None, dtype=None, *, ...) -> NanFinding\n\nWrites "
          "world_size * count elements to `output`, rank-major. Views must start at offset 0.");
  static const std::string reduce_scatter_doc =
      doc("reduce_scatter(input, output, count=None, dtype=None, op='sum', *, ...) -> "
          "NanFinding\n\nReduces world_size * count elements of `input` and writes this rank's "
          "chunk of `count` to `output`. Views must start at offset 0.");
  static const std::string broadcast_doc =
      doc("broadcast(buf, root, count=None, dtype=None, *, ...) -> NanFinding\n\nCopies rank "
          "`root`'s first `count` elements of `buf` into every rank's `buf` (the NaN check "
          "looks at root's data). Views must start at offset 0.");
  static const std::string all_to_all_doc =
      doc("all_to_all(input, output, count=None, dtype=None, *, ...) -> NanFinding\n\nEqual "
          "splits: chunk p (`count` elements) of this rank's `output` is chunk `rank` of rank "
          "p's `input`; both hold world_size * count elements. Views must start at offset 0.");
  static const std::string coalesced_doc =
      doc("all_reduce_coalesced(tensors, op='sum', *, ...) -> NanFinding\n\nReduces many "
          "TensorViews of one symmetric buffer in place as one collective (one flight-recorder "
          "entry).");
  static const std::string all_gather_matmul_doc =
      doc("all_gather_matmul(shard, rows, k, bs, outs, dtype=None, *, row_scale=None, "
          "col_scales=None, gathered=None, ...) -> NanFinding\n\nFused all-gather + matmul (host "
          "groups): `shard` is a symmetric buffer (or its view at offset 0) holding this rank's "
          "rows x k shard of A; for every B (host memory, k x n, row-major) outs[i] = "
          "allgather(A) @ bs[i], (world_size * rows) x n. Each shard is multiplied where it lies "
          "as soon as its owner has entered; `gathered` (world_size * rows x k) receives A only "
          "when given. row_scale (rows float32) and col_scales[i] (n float32 or None) scale the "
          "output. float32, float16, bfloat16 (bfloat16 host memory as its int16/uint16 bits).");
  static const std::string matmul_reduce_scatter_doc =
      doc("matmul_reduce_scatter(a, rows, k, b, out, workspace, op='sum', dtype=None, *, "
          "row_scale=None, col_scale=None, ...) -> NanFinding\n\nFused matmul + reduce-scatter "
          "(host groups): `out` ((rows / world_size) x n) receives this rank's rows of the sum (or "
          "'avg') over ranks of a @ b (a: rows x k, b: k x n, host memory). The float32 partial "
          "products go straight into the destinations' parts of `workspace`, a symmetric buffer "
          "of at least rows x n x 4 bytes.");
  py::class_<GroupObject>(m, "Group",
                          "Ranks of this job on this node that run collectives together "
                          "(Client.join_group). Calls may come from several threads; every "
                          "rank calls the collectives in the same order with the same "
                          "arguments. close() (or leaving a `with` block) leaves the group.")
      .def_property_readonly("name", [](const GroupObject& g) { return g.get().name(); })
      .def_property_readonly("rank", [](const GroupObject& g) { return g.get().rank(); })
      .def_property_readonly("world_size",
                             [](const GroupObject& g) { return g.get().world_size(); })
      .def_property_readonly("global_rank",
                             [](const GroupObject& g) { return g.get().global_rank(); })
      .def_property_readonly(
          "global_world_size", [](const GroupObject& g) { return g.get().global_world_size(); },
          "The group's size over every node; world_size for a group on this node only.")
      .def_property_readonly(
          "layout",
          [](const GroupObject& g) {
            py::list nodes;
            for (const commd::NodeRanks& n : g.get().layout()) {
              nodes.append(py::make_tuple(n.node, n.global_ranks));
            }
            return nodes;
          },
          "A group spanning nodes: [(node name, [global rank of each local rank]), ...] "
          "sorted by node name, the same on every rank; [] for a group on this node only.")
      .def_property_readonly(
          "node_index", [](const GroupObject& g) { return g.get().node_index(); },
          "This node's index in layout; -1 for a group on this node only.")
      .def_property_readonly("device",
                             [](const GroupObject& g) { return g.get().device().ToString(); })
      .def_property_readonly(
          "member_pids", [](const GroupObject& g) { return g.get().member_pids(); },
          "Each rank's process id, by rank.")
      .def_property_readonly(
          "abort_requested", [](const GroupObject& g) { return g.get().abort_requested(); },
          "True once the daemon aborted the group (watchdog or Client.abort).")
      .def_property_readonly(
          "abort_reason", [](const GroupObject& g) { return g.get().abort_reason(); },
          "Who aborted the group and why; '' while not aborted.")
      .def("on_abort", &OnAbort, py::arg("callback"),
           "Calls callback(AbortedError) once when the daemon aborts the group: on the SDK's "
           "event thread (keep it short, do not call into this group), or at once when the "
           "abort came already. Replaces an earlier callback.")
      .def_property_readonly(
          "recorder",
          [](const GroupObject& g) {
            g.get();  // raises once closed
            return RecorderObject{g.group};
          },
          "This rank's flight recorder (commd.Recorder).")
      .def(
          "allocate_symmetric",
          [](const GroupObject& g, size_t nbytes) {
            using Result = absl::StatusOr<std::unique_ptr<SymmetricBuffer>>;
            auto buf = Check(Detached<Result>(g, "allocate_symmetric", [nbytes](Group& group) {
              return group.AllocateSymmetric(nbytes);
            }));
            return WrapSymmetric(std::move(buf), g.get().rank(), g.get().world_size());
          },
          py::arg("nbytes"),
          "Collective: every rank asks for the same `nbytes`; returns a SymmetricBuffer "
          "mapping every rank's memory. Ctrl-C aborts the group and raises KeyboardInterrupt "
          "at once; the other ranks' pending allocations end only at the group's timeout "
          "(the daemon's rendezvous does not heed aborts).")
      .def(
          "barrier",
          [](const GroupObject& g) {
            auto barrier = [](Group& group) { return group.Barrier(); };
            Check(g.barrier_ready ? Blocking(g, "barrier", barrier)
                                  : Detached<absl::Status>(g, "barrier", barrier));
            g.barrier_ready = true;
          },
          "Blocks until every rank called barrier(). Ctrl-C aborts the group and raises "
          "KeyboardInterrupt (the first barrier allocates its pads: see allocate_symmetric).")
      .def("all_reduce", &AllReduce, py::arg("buf"), py::arg("count") = py::none(),
           py::arg("dtype") = py::none(), py::arg("op") = "sum", py::kw_only(),
           py::arg("timeout") = py::none(), py::arg("nan_check") = py::none(),
           py::arg("nan_sample_period") = 100, py::arg("cuda_stream") = 0,
           py::arg("staging") = py::none(), py::arg("part_of") = py::none(), all_reduce_doc.c_str())
      .def("all_gather", &AllGather, py::arg("input"), py::arg("output"),
           py::arg("count") = py::none(), py::arg("dtype") = py::none(), py::kw_only(),
           py::arg("timeout") = py::none(), py::arg("nan_check") = py::none(),
           py::arg("nan_sample_period") = 100, py::arg("cuda_stream") = 0,
           py::arg("staging") = py::none(), py::arg("part_of") = py::none(), all_gather_doc.c_str())
      .def("reduce_scatter", &ReduceScatter, py::arg("input"), py::arg("output"),
           py::arg("count") = py::none(), py::arg("dtype") = py::none(), py::arg("op") = "sum",
           py::kw_only(), py::arg("timeout") = py::none(), py::arg("nan_check") = py::none(),
           py::arg("nan_sample_period") = 100, py::arg("cuda_stream") = 0,
           py::arg("staging") = py::none(), py::arg("part_of") = py::none(),
           reduce_scatter_doc.c_str())
      .def("all_reduce_coalesced", &AllReduceCoalesced, py::arg("tensors"), py::arg("op") = "sum",
           py::kw_only(), py::arg("timeout") = py::none(), py::arg("nan_check") = py::none(),
           py::arg("nan_sample_period") = 100, py::arg("cuda_stream") = 0,
           py::arg("part_of") = py::none(), coalesced_doc.c_str())
      .def("broadcast", &Broadcast, py::arg("buf"), py::arg("root"), py::arg("count") = py::none(),
           py::arg("dtype") = py::none(), py::kw_only(), py::arg("timeout") = py::none(),
           py::arg("nan_check") = py::none(), py::arg("nan_sample_period") = 100,
           py::arg("cuda_stream") = 0, py::arg("staging") = py::none(),
           py::arg("part_of") = py::none(), broadcast_doc.c_str())
      .def("all_gather_matmul", &AllGatherMatmul, py::arg("shard"), py::arg("rows"), py::arg("k"),
           py::arg("bs"), py::arg("outs"), py::arg("dtype") = py::none(), py::kw_only(),
           py::arg("row_scale") = py::none(), py::arg("col_scales") = py::none(),
           py::arg("gathered") = py::none(), py::arg("timeout") = py::none(),
           py::arg("nan_check") = py::none(), py::arg("nan_sample_period") = 100,
           all_gather_matmul_doc.c_str())
      .def("matmul_reduce_scatter", &MatmulReduceScatter, py::arg("a"), py::arg("rows"),
           py::arg("k"), py::arg("b"), py::arg("out"), py::arg("workspace"), py::arg("op") = "sum",
           py::arg("dtype") = py::none(), py::kw_only(), py::arg("row_scale") = py::none(),
           py::arg("col_scale") = py::none(), py::arg("timeout") = py::none(),
           py::arg("nan_check") = py::none(), py::arg("nan_sample_period") = 100,
           matmul_reduce_scatter_doc.c_str())
      .def("all_to_all", &AllToAll, py::arg("input"), py::arg("output"),
           py::arg("count") = py::none(), py::arg("dtype") = py::none(), py::kw_only(),
           py::arg("timeout") = py::none(), py::arg("nan_check") = py::none(),
           py::arg("nan_sample_period") = 100, py::arg("cuda_stream") = 0,
           py::arg("staging") = py::none(), py::arg("part_of") = py::none(), all_to_all_doc.c_str())
      .def(
          "close",
          [](GroupObject& g) {
            py::gil_scoped_release release;
            g.group.reset();
          },
          "Leaves the group (the other ranks' collectives then fail naming this rank). "
          "Buffers stay mapped until they are gone.")
      .def("_internal_handle", &InternalGroupHandle,
           "Internal (commd.torch's C++ backend): a capsule holding the SDK group.")
      .def("_time_all_reduce", &TimeAllReduce, py::arg("buf"), py::arg("iters"),
           "Internal (bench/torch_allreduce.py): seconds per call of `iters` float32 sum "
           "all-reduces of the whole `buf` (a symmetric buffer of this group) run back to back "
           "from C++ (Group::AllReduce, without the GIL): the C++ SDK's figure beside torch's "
           "in one interleaved run.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](GroupObject& g, py::args) {
        py::gil_scoped_release release;
        g.group.reset();
      });
}

}  // namespace commd::python
