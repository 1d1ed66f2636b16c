// Shared parts of the commd._commd module: status -> commd.Error mapping, element types,
// and how blocking SDK calls run without the GIL while Ctrl-C still works.
#ifndef COMMD_PYTHON_SRC_BINDING_H_
#define COMMD_PYTHON_SRC_BINDING_H_

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "commd/commd.h"

namespace commd::python {

namespace py = pybind11;

// Raises the commd.Error subclass of `status`'s code with its message unchanged.
[[noreturn]] void ThrowStatus(const absl::Status& status);
// The commd.Error instance (not raised) for `status`: what on_abort callbacks receive.
py::object ErrorFor(const absl::Status& status);
// Raises commd.InvalidArgumentError(message): argument errors the binding finds itself.
[[noreturn]] void ThrowInvalid(const std::string& message);

inline void Check(const absl::Status& status) {
  if (!status.ok()) ThrowStatus(status);
}
template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) ThrowStatus(value.status());
  return *std::move(value);
}

// An element type as Python names it. Types of the vocabulary (commd/vocabulary.h) can be
// recorded; those the collectives take (IsCollectiveType) take part in collectives; the
// others (uint16, uint32) only describe views.
struct ElementType {
  const char* name;
  size_t itemsize;
  const char* format;                // buffer-protocol format; nullptr: none (bfloat16)
  uint8_t dl_code;                   // DLPack type code: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
  std::optional<DataType> recorded;  // the vocabulary's type of this name
  std::optional<DataType> commd;     // the same, when the collectives take it
};
// "float32, float16, bfloat16, int32, int64, float64": the collective types, for messages.
std::string CollectiveTypeNames();
// "float32", "torch.float32", numpy.dtype("float32"), ...: anything whose str() ends in a
// known name. InvalidArgumentError listing the names otherwise.
const ElementType& ParseElementType(const py::handle& dtype);
// The type of a buffer-protocol format ("f", "<e", "l" of 8 bytes, ...); nullptr if none.
const ElementType* ElementTypeOfFormat(std::string_view format, size_t itemsize);
ReduceOp ParseReduceOp(const py::handle& op);

// Seconds (float) -> Duration; InvalidArgumentError naming `what` for a negative value.
absl::Duration Seconds(double seconds, const char* what);

// Runs `fn` on its own thread with the GIL released and waits for it in slices, checking
// for signals between them: Ctrl-C raises KeyboardInterrupt within ~0.1 s and leaves `fn`
// to finish on its own (it must own, by value, everything it touches). For calls the SDK
// cannot cancel: Connect, JoinGroup, Store::Wait.
void RunInterruptible(std::function<void()> fn);

// While alive on the main thread, SIGINT also calls `on_interrupt` (on a helper thread):
// how a collective blocked in the SDK is ended (by aborting its group). interrupted() says
// whether that happened; off the main thread it does nothing, as Python delivers signals
// to the main thread only.
class InterruptScope {
 public:
  explicit InterruptScope(std::function<void()> on_interrupt);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
  bool interrupted() const;

 private:
  bool active_ = false;
};

// Python's Client: shared with every Group and call in flight (the SDK Client is
// thread-safe), released without the GIL.
struct ClientObject {
  std::shared_ptr<Client> client;
  ~ClientObject();
};

// "host" (or "cpu") or "cuda:N"; InvalidArgumentError otherwise.
Device ParseDevice(const std::string& device);

// Client.join_group (group.cc): `options` has the name, ranks, description and device; the
// rest is parsed here. Blocks until the group formed; Ctrl-C abandons the join.
py::object JoinGroup(const std::shared_ptr<Client>& client, GroupOptions options, double timeout,
                     const py::object& watchdog_policy, const py::object& nan_check,
                     uint32_t nan_sample_period, const py::object& nan_policy);

void BindClient(py::module_& m);
void BindGroup(py::module_& m);
void BindMemory(py::module_& m);
void BindSymmetricRegistry(py::module_& m);

}  // namespace commd::python

#endif  // COMMD_PYTHON_SRC_BINDING_H_
