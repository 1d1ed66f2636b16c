// commd.Group: joining, the group's state and lifetime, symmetric allocation, abort
// notification and the flight recorder. Its collectives are in group_collectives.cc, its
// fused matmuls in group_matmul.cc (the shared parts in group.h).
#include "group.h"

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

std::string InterruptReason(const Group& group, const char* call) {
  return absl::StrCat("rank ", group.rank(), " (pid ", getpid(), ") got KeyboardInterrupt in ",
                      call);
}

namespace {

struct RecorderObject {
  std::shared_ptr<Group> group;
};

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

// A recorded op by PyTorch's name (the vocabulary's rows with a ring code).
CollectiveOp ParseRecordedOp(const py::object& op) {
  const std::string name = py::str(op);
  CollectiveOp o;
  if (CollectiveFromTorchName(name, &o)) return o;
  std::string names;
  for (const vocabulary::CollectiveRow& r : vocabulary::kCollectives) {
    if (r.ring()) absl::StrAppend(&names, names.empty() ? "" : ", ", r.torch);
  }
  ThrowInvalid(absl::StrCat("unknown op '", name, "' (one of: ", names, ")"));
}

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
    if (!type.recorded) ThrowInvalid(absl::StrCat("dtype ", type.name, " cannot be recorded"));
    d.dims.push_back(py::isinstance<py::int_>(shape) ? std::vector<int64_t>{shape.cast<int64_t>()}
                                                     : shape.cast<std::vector<int64_t>>());
    types.push_back(&type);
  }
  for (size_t i = 0; i < d.dims.size(); ++i) {
    d.descs.push_back(
        {d.dims[i].data(), static_cast<uint32_t>(d.dims[i].size()), *types[i]->recorded});
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
            const CollectiveOp o = ParseRecordedOp(op);
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

// commd.Group's state: who the ranks are, where, and whether the daemon aborted it.
void DefGroupState(py::class_<GroupObject>& cls) {
  cls.def_property_readonly("name", [](const GroupObject& g) { return g.get().name(); })
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
          "This rank's flight recorder (commd.Recorder).");
}

// Symmetric allocation, leaving the group, and the internal handle of commd._c10d.
void DefGroupLifetime(py::class_<GroupObject>& cls) {
  cls.def(
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
          "close",
          [](GroupObject& g) {
            py::gil_scoped_release release;
            g.group.reset();
          },
          "Leaves the group (the other ranks' collectives then fail naming this rank). "
          "Buffers stay mapped until they are gone.")
      .def("_internal_handle", &InternalGroupHandle,
           "Internal (commd.torch's C++ backend): a capsule holding the SDK group.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](GroupObject& g, py::args) {
        py::gil_scoped_release release;
        g.group.reset();
      });
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
  BindNanFinding(m);
  BindRecorder(m);
  py::class_<GroupObject> cls(m, "Group",
                              "Ranks of this job on this node that run collectives together "
                              "(Client.join_group). Calls may come from several threads; every "
                              "rank calls the collectives in the same order with the same "
                              "arguments. close() (or leaving a `with` block) leaves the group.");
  DefGroupState(cls);
  DefGroupLifetime(cls);
  DefCollectives(cls);
  DefFusedMatmuls(cls);
  DefPointToPoint(m, cls);
}

}  // namespace commd::python
