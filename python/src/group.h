// The parts of commd.Group's binding that its files share (group.cc: the object, joining,
// its state, abort and the recorder; group_collectives.cc: the collectives;
// group_matmul.cc: the fused matmuls). Internal to commd._commd.
#ifndef COMMD_PYTHON_SRC_GROUP_H_
#define COMMD_PYTHON_SRC_GROUP_H_

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "memory.h"

namespace commd::python {

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

// Why this rank aborts its group when Ctrl-C ends `call`.
std::string InterruptReason(const Group& group, const char* call);

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

// A collective's options, and what its NaN check found (the call's result).
struct CallOptions {
  CollectiveOptions options;
  NanFinding finding;
};

void ParseCallOptions(CallOptions& c, const py::object& timeout, const py::object& nan_check,
                      uint32_t nan_sample_period, uintptr_t cuda_stream, const py::object& part_of);

// The element type of a call: `dtype`, else the views'; they must agree and be reducible.
const ElementType& CallType(const py::object& dtype, std::initializer_list<const Operand*> ops);
// InvalidArgumentError unless `op` starts at offset 0 (the SDK's calls that take no offsets).
void NeedOffsetZero(const Operand& op, const char* call, const char* what);

// `head` (a call's signature and what it does) and what every collective's doc says of its
// common arguments, errors and Ctrl-C.
std::string CallDoc(const char* head);

// commd.Group's methods, by concern: the collectives (and barrier, NanFinding), the fused
// matmuls, point-to-point.
void BindNanFinding(py::module_& m);
void DefCollectives(py::class_<GroupObject>& cls);
void DefFusedMatmuls(py::class_<GroupObject>& cls);
// Group.send, recv, isend, irecv, batch_isend_irecv and commd.PointToPointRequest.
void DefPointToPoint(py::module_& m, py::class_<GroupObject>& cls);

}  // namespace commd::python

#endif  // COMMD_PYTHON_SRC_GROUP_H_
