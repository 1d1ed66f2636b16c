// commd.Group's collectives: on symmetric buffers and views of them, or on host memory
// staged through a symmetric buffer (`staging`); each blocking call runs without the GIL and
// Ctrl-C aborts the group.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "group.h"
#include "memory.h"

namespace commd::python {

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
    ThrowInvalid(absl::StrCat("dtype ", type->name, " is not a collective type (",
                              CollectiveTypeNames(), ")"));
  }
  return *type;
}

void NeedOffsetZero(const Operand& op, const char* call, const char* what) {
  if (op.offset != 0) {
    ThrowInvalid(
        absl::StrCat(call, " takes views at offset 0 (", what, " is at offset ", op.offset, ")"));
  }
}

namespace {

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

}  // namespace

std::string CallDoc(const char* head) {
  static constexpr char kCallDoc[] =
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
  return absl::StrCat(head, kCallDoc);
}

void BindNanFinding(py::module_& m) {
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
}

void DefCollectives(py::class_<GroupObject>& cls) {
  auto doc = [](const char* head) { return CallDoc(head); };
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
  cls.def(
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
      .def("all_to_all", &AllToAll, py::arg("input"), py::arg("output"),
           py::arg("count") = py::none(), py::arg("dtype") = py::none(), py::kw_only(),
           py::arg("timeout") = py::none(), py::arg("nan_check") = py::none(),
           py::arg("nan_sample_period") = 100, py::arg("cuda_stream") = 0,
           py::arg("staging") = py::none(), py::arg("part_of") = py::none(), all_to_all_doc.c_str())
      .def("_time_all_reduce", &TimeAllReduce, py::arg("buf"), py::arg("iters"),
           "Internal (bench/torch_allreduce.py): seconds per call of `iters` float32 sum "
           "all-reduces of the whole `buf` (a symmetric buffer of this group) run back to back "
           "from C++ (Group::AllReduce, without the GIL): the C++ SDK's figure beside torch's "
           "in one interleaved run.");
}

}  // namespace commd::python
