// commd._c10d: the C++ half of the torch.distributed backend "commd" (commd.torch).
//
// Built against the venv's torch and torch's own pybind11 (never Debian's, which built
// commd._commd): its Backend subclass is what torch's dispatcher calls for every collective
// of a commd process group. Collectives on tensors that live in one of the group's symmetric
// buffers (commd.torch.empty: the zero-copy path) call the SDK's commd::Group here, without
// Python; everything else (staging through chunks, CUDA tensors, coalescing, the ops
// commd does not do, groups spanning nodes, argument errors) goes to the Python
// ProcessGroupCommd, which stays the one implementation of those. The SDK objects come from
// commd._commd through capsules (internal.h).
#include <Python.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "c10d_work.h"
#include "commd/commd.h"
#include "internal.h"

namespace commd::python {
namespace {

namespace py = pybind11;
using c10d::Work;

template <typename T>
const T& FromCapsule(const py::handle& capsule, const char* name) {
  if (PyCapsule_IsValid(capsule.ptr(), name) == 0) {
    throw py::value_error(std::string("commd._c10d: expected a ") + name +
                          " capsule (commd._commd's _internal_handle()), got " +
                          std::string(py::str(py::type::of(capsule).attr("__name__"))));
  }
  void* p = PyCapsule_GetPointer(capsule.ptr(), name);
  if (p == nullptr) throw py::error_already_set();
  const T& handle = *static_cast<const T*>(p);
  if (handle.abi != internal::kAbi) {
    throw std::runtime_error(
        "commd._c10d and commd._commd come from different builds (internal ABI " +
        std::to_string(handle.abi) + ", expected " + std::to_string(internal::kAbi) +
        "); rebuild the package");
  }
  return handle;
}

// Each c10 ScalarType's collective type (nullopt: none), built once from the vocabulary's
// rows, whose `scalar` column holds c10's names ("Float", "Double", ...).
std::optional<DataType> CommdType(const at::Tensor& t) {
  static const auto table = [] {
    std::array<std::optional<DataType>, static_cast<size_t>(at::ScalarType::NumOptions)> m{};
    for (size_t s = 0; s < m.size(); ++s) {
      DataType d;
      const bool named = DataTypeFromName(c10::toString(static_cast<at::ScalarType>(s)), &d);
      if (named && IsCollectiveType(d)) m[s] = d;
    }
    return m;
  }();
  return table[static_cast<size_t>(t.scalar_type())];
}

// The op on t's dtype; nullopt for the ops commd has not (PREMUL_SUM) and those t's dtype has
// not (AVG of bool, the bitwise ops of floats: Python raises TypeError, as torch's NCCL
// backend does).
std::optional<ReduceOp> CommdOp(const c10d::ReduceOp& op, const at::Tensor& t) {
  static constexpr std::pair<c10d::ReduceOp::RedOpType, ReduceOp> kOps[] = {
      {c10d::ReduceOp::SUM, ReduceOp::kSum},         {c10d::ReduceOp::AVG, ReduceOp::kAvg},
      {c10d::ReduceOp::MIN, ReduceOp::kMin},         {c10d::ReduceOp::MAX, ReduceOp::kMax},
      {c10d::ReduceOp::PRODUCT, ReduceOp::kProduct}, {c10d::ReduceOp::BAND, ReduceOp::kBAnd},
      {c10d::ReduceOp::BOR, ReduceOp::kBOr},         {c10d::ReduceOp::BXOR, ReduceOp::kBXor}};
  const auto dtype = CommdType(t);
  for (const auto& [torch_op, commd_op] : kOps) {
    if (op.op_ == torch_op && dtype && ReduceOpApplies(commd_op, *dtype)) return commd_op;
  }
  return std::nullopt;
}

class CommdBackend final : public c10d::Backend {
 public:
  // `python`: the ProcessGroupCommd of this process group; `group`: its commd group's
  // capsule; `registry`: the handle of the registry it adds its zero-copy buffers to.
  CommdBackend(py::object python, const py::handle& group, internal::RegistryHandle registry)
      : Backend(python.attr("rank")().cast<int>(), python.attr("size")().cast<int>()),
        python_object_(std::move(python)),
        python_(python_object_.cast<c10::intrusive_ptr<c10d::Backend>>()),
        handle_(FromCapsule<internal::GroupHandle>(group, internal::kGroupCapsule)),
        registry_(std::move(registry)) {}

  ~CommdBackend() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      python_.reset();
      python_object_ = py::object();
      py::gil_scoped_release release;  // ~Group waits for the SDK's event thread
      registry_ = {};
      handle_ = {};
    } else {  // the interpreter is gone: nothing to decref
      (void)python_.release();
      python_object_.release();
    }
  }

  const std::string getBackendName() const override { return "commd"; }

  py::object python() const { return python_object_; }
  uint64_t zero_copy_calls() const { return zero_copy_calls_.load(); }
  uint64_t forwarded_calls() const { return forwarded_calls_.load(); }

  // ---- the zero-copy path ----------------------------------------------------------

  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors,
                                     const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1) {
      const at::Tensor& t = tensors[0];
      const auto dtype = CommdType(t);
      const auto op = CommdOp(opts.reduceOp, t);
      SymmetricBuffer* buf = dtype && op ? Find(t) : nullptr;
      if (buf != nullptr) {
        struct Args {
          SymmetricBuffer* buf;
          size_t count;
          DataType dtype;
          ReduceOp op;
        } args{buf, static_cast<size_t>(t.numel()), *dtype, *op};
        Run("allreduce", "all_reduce", &args, [](Group& g, void* p) {
          const auto& a = *static_cast<Args*>(p);
          return g.AllReduce(*a.buf, a.count, a.dtype, a.op);
        });
        return Completed(tensors);
      }
    }
    ++forwarded_calls_;
    return Forwarded(python_->allreduce(tensors, opts));
  }

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors,
                                     const c10d::BroadcastOptions& opts) override {
    if (tensors.size() == 1) {
      const at::Tensor& t = tensors[0];
      const auto dtype = CommdType(t);
      SymmetricBuffer* buf = dtype ? Find(t) : nullptr;
      if (buf != nullptr) {
        struct Args {
          SymmetricBuffer* buf;
          size_t count;
          DataType dtype;
          int root;
        } args{buf, static_cast<size_t>(t.numel()), *dtype, static_cast<int>(opts.rootRank)};
        Run("broadcast", "broadcast", &args, [](Group& g, void* p) {
          const auto& a = *static_cast<Args*>(p);
          return g.Broadcast(*a.buf, a.count, a.dtype, a.root);
        });
        return Completed(tensors);
      }
    }
    ++forwarded_calls_;
    return Forwarded(python_->broadcast(tensors, opts));
  }

  // all_gather_into_tensor (torch calls one of the two names).
  c10::intrusive_ptr<Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                             const c10d::AllgatherOptions& opts) override {
    if (auto pair = Pair(input, output, input.numel(), output.numel())) {
      Run("all_gather_into_tensor", "all_gather", &*pair, [](Group& g, void* p) {
        const auto& a = *static_cast<PairArgs*>(p);
        return g.AllGather(*a.in, *a.out, a.count, a.dtype);
      });
      return Completed(output);
    }
    ++forwarded_calls_;
    return Forwarded(python_->all_gather_single(output, input, opts));
  }
  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                           const c10d::AllgatherOptions& opts) override {
    return all_gather_single(output, input, opts);
  }

  // reduce_scatter_tensor (torch calls one of the two names).
  c10::intrusive_ptr<Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                 const c10d::ReduceScatterOptions& opts) override {
    const auto op = CommdOp(opts.reduceOp, input);
    if (auto pair = op ? Pair(input, output, output.numel(), input.numel()) : std::nullopt) {
      pair->op = *op;
      Run("reduce_scatter_tensor", "reduce_scatter", &*pair, [](Group& g, void* p) {
        const auto& a = *static_cast<PairArgs*>(p);
        return g.ReduceScatter(*a.in, *a.out, a.count, a.dtype, a.op);
      });
      return Completed(output);
    }
    ++forwarded_calls_;
    return Forwarded(python_->reduce_scatter_single(output, input, opts));
  }
  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const c10d::ReduceScatterOptions& opts) override {
    return reduce_scatter_single(output, input, opts);
  }

  // ---- the rest: ProcessGroupCommd (Python) ---------------------------------------

  c10::intrusive_ptr<Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                            const c10d::AllreduceOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->allreduce_sparse(tensors, opts));
  }
  c10::intrusive_ptr<Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->allreduce_coalesced(tensors, opts));
  }
  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors,
                                  const c10d::ReduceOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->reduce(tensors, opts));
  }
  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                     std::vector<at::Tensor>& inputs,
                                     const c10d::AllgatherOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->allgather(outputs, inputs, opts));
  }
  c10::intrusive_ptr<Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                               std::vector<at::Tensor>& inputs,
                                               const c10d::AllgatherOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->allgather_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->all_gather_single_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return all_gather_single_coalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                  std::vector<at::Tensor>& inputs,
                                  const c10d::GatherOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->gather(outputs, inputs, opts));
  }
  c10::intrusive_ptr<Work> scatter(std::vector<at::Tensor>& outputs,
                                   std::vector<std::vector<at::Tensor>>& inputs,
                                   const c10d::ScatterOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->scatter(outputs, inputs, opts));
  }
  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->reduce_scatter(outputs, inputs, opts));
  }
  c10::intrusive_ptr<Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->reduce_scatter_single_coalesced(outputs, inputs, opts));
  }
  c10::intrusive_ptr<Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return reduce_scatter_single_coalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                             std::vector<int64_t>& output_splits,
                                             std::vector<int64_t>& input_splits,
                                             const c10d::AllToAllOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->all_to_all_single(output, input, output_splits, input_splits, opts));
  }
  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                         std::vector<int64_t>& output_splits,
                                         std::vector<int64_t>& input_splits,
                                         const c10d::AllToAllOptions& opts) override {
    return all_to_all_single(output, input, output_splits, input_splits, opts);
  }
  c10::intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& outputs,
                                    std::vector<at::Tensor>& inputs,
                                    const c10d::AllToAllOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->alltoall(outputs, inputs, opts));
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    python_->monitoredBarrier(opts, wait_all_ranks);
  }
  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return Forwarded(python_->send(tensors, dst, tag));
  }
  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return Forwarded(python_->recv(tensors, src, tag));
  }
  // Called on the Python backend's own method (not through torch's holder, which would hide
  // the Work's _source_rank), kept with the Work to answer sourceRank().
  c10::intrusive_ptr<Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    py::gil_scoped_acquire gil;
    py::object work = python_object_.attr("_recv_anysource")(tensors, tag);
    auto held = work.cast<c10::intrusive_ptr<Work>>();
    return Forwarded(std::move(held), std::move(work));
  }
  c10::intrusive_ptr<Work> barrier(const c10d::BarrierOptions& opts) override {
    ++forwarded_calls_;
    return Forwarded(python_->barrier(opts));
  }
  void startCoalescing() override { python_->startCoalescing(); }
  c10::intrusive_ptr<Work> endCoalescing() override { return Forwarded(python_->endCoalescing()); }

 private:
  struct PairArgs {
    SymmetricBuffer* in;
    SymmetricBuffer* out;
    size_t count;
    DataType dtype;
    ReduceOp op = ReduceOp::kSum;
  };

  // all_gather / reduce_scatter on two zero-copy tensors of one dtype whose sizes match
  // (`small` elements per rank, `big` = world x small); nullopt sends the call to Python,
  // which also raises for what does not match.
  std::optional<PairArgs> Pair(const at::Tensor& in, const at::Tensor& out, int64_t small,
                               int64_t big) const {
    const auto dtype = CommdType(in);
    if (!dtype || out.scalar_type() != in.scalar_type() || big != small * size_) {
      return std::nullopt;
    }
    SymmetricBuffer* i = Find(in);
    SymmetricBuffer* o = i != nullptr ? Find(out) : nullptr;
    if (o == nullptr) return std::nullopt;
    return PairArgs{i, o, static_cast<size_t>(small), *dtype};
  }

  // One blocking collective through the binding (Ctrl-C aborts the group, as there). A
  // failure raises what ProcessGroupCommd raises: DistBackendError naming the op, the process
  // group and the rank, the commd.Error subclass of the status chained as its cause.
  // `op` is torch's name of the call (in errors, as ProcessGroupCommd names it), `call` the
  // binding's (in the abort reason of a Ctrl-C, as the binding names it).
  void Run(const char* op, const char* call, void* args, absl::Status (*fn)(Group&, void*)) {
    ++zero_copy_calls_;
    bool interrupted = false;
    absl::Status status;
    if (PyGILState_Check() != 0) {  // torch's Python entry points release it; in case one does not
      py::gil_scoped_release release;
      status = handle_.run_blocking(handle_, call, fn, args, &interrupted);
    } else {
      status = handle_.run_blocking(handle_, call, fn, args, &interrupted);
    }
    if (status.ok() && !interrupted) return;
    py::gil_scoped_acquire gil;
    if (interrupted && PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (status.ok()) return;
    py::object error = py::module_::import("commd.errors")
                           .attr("_from_code")(absl::StatusCodeToString(status.code()),
                                               std::string(status.message()));
    py::object raised = python_object_.attr("_backend_error")(op, error);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised.ptr())), raised.ptr());
    throw py::error_already_set();
  }

  // The buffer a tensor of this backend's (CPU; CUDA tensors go to the Python backend's CUDA
  // group) lives in with no staging needed, else nullptr. Whether it needs staging is the
  // registry's to say (commd._commd, the lookup ProcessGroupCommd._in_place_view makes too);
  // a tensor is one region of memory only when contiguous.
  SymmetricBuffer* Find(const at::Tensor& t) const {
    if (!t.device().is_cpu() || !t.is_contiguous()) return nullptr;
    return registry_.find(registry_, reinterpret_cast<uintptr_t>(t.data_ptr()),
                          static_cast<size_t>(t.numel()) * t.element_size());
  }

  py::object python_object_;
  c10::intrusive_ptr<c10d::Backend> python_;
  internal::GroupHandle handle_;
  internal::RegistryHandle registry_;
  std::atomic<uint64_t> zero_copy_calls_{0};
  std::atomic<uint64_t> forwarded_calls_{0};
};

}  // namespace
}  // namespace commd::python

PYBIND11_MODULE(_c10d, m) {
  using commd::python::CommdBackend;
  namespace py = pybind11;
  m.doc() =
      "Internal: the C++ part of commd.torch's backend (the zero-copy path), built against "
      "torch. commd.torch uses it when present; COMMD_TORCH_CPP=0 turns it off.";
  py::module_::import("torch.distributed");  // registers c10d.Backend, the base below

  py::class_<CommdBackend, c10d::Backend, c10::intrusive_ptr<CommdBackend>>(
      m, "Backend",
      "commd's torch.distributed backend in C++: zero-copy collectives here, the rest by the "
      "ProcessGroupCommd it wraps (`python`).")
      .def(py::init([](py::object python, py::object group, py::object registry) {
             const auto& reg = commd::python::FromCapsule<commd::python::internal::RegistryHandle>(
                 registry, commd::python::internal::kRegistryCapsule);
             if (!py::isinstance<c10d::Backend>(python) || !py::hasattr(python, "_backend_error")) {
               throw py::type_error(
                   "commd._c10d.Backend(python, group, registry): python must be a "
                   "commd.torch.ProcessGroupCommd, registry its SymmetricRegistry's "
                   "_internal_handle()");
             }
             return c10::make_intrusive<CommdBackend>(std::move(python), group, reg);
           }),
           py::arg("python"), py::arg("group"), py::arg("registry"))
      .def_property_readonly("python", &CommdBackend::python,
                             "The ProcessGroupCommd this backend wraps.")
      .def_property_readonly("zero_copy_calls", &CommdBackend::zero_copy_calls,
                             "Collectives run here on zero-copy tensors.")
      .def_property_readonly("forwarded_calls", &CommdBackend::forwarded_calls,
                             "Collectives handed to the Python backend.");
}
