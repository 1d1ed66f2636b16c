// INTERNAL, not a public API: how commd._commd (this binding, built with Debian's pybind11)
// hands the SDK objects behind a Group and a SymmetricRegistry to commd._c10d, the C++
// torch.distributed backend (built with torch's own pybind11, so no pybind11 type can cross
// between the two modules). They meet through PyCapsules of the structs below, made by
// Group._internal_handle() and SymmetricRegistry._internal_handle(). Both modules come from one
// build of one tree (one compiler, one libstdc++, one SDK); `abi` guards against a mix of
// builds. Whoever reads a capsule copies the shared_ptrs out: the SDK objects then live as
// long as the copy, whatever Python does with its Group (close) or buffer.
#ifndef COMMD_PYTHON_SRC_INTERNAL_H_
#define COMMD_PYTHON_SRC_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "commd/commd.h"

namespace commd::python {
class SymmetricRegistry;  // symmetric_registry.h; opaque to commd._c10d
}  // namespace commd::python

namespace commd::python::internal {

// Bumped whenever a struct below changes.
inline constexpr uint32_t kAbi = 2;
inline constexpr char kGroupCapsule[] = "commd._commd.GroupHandle";
inline constexpr char kRegistryCapsule[] = "commd._commd.SymmetricRegistryHandle";

struct GroupHandle {
  uint32_t abi = kAbi;
  std::shared_ptr<Client> client;
  std::shared_ptr<Group> group;
  // Runs fn(group, arg), a blocking collective, as the binding runs its own: the caller does
  // not hold the GIL; Ctrl-C on the main thread meanwhile aborts the group (the only way to
  // end a collective the peers are in too). Returns fn's status; `*interrupted` tells whether
  // SIGINT fired, after which the caller raises KeyboardInterrupt (PyErr_CheckSignals).
  absl::Status (*run_blocking)(const GroupHandle& handle, const char* call,
                               absl::Status (*fn)(Group& group, void* arg), void* arg,
                               bool* interrupted) = nullptr;
};

// The registry of a process group's zero-copy tensors (symmetric_registry.h). commd._c10d
// asks it through `find`, commd._commd's own code, so that the one rule of which memory
// needs no staging is compiled once.
struct RegistryHandle {
  uint32_t abi = kAbi;
  std::shared_ptr<SymmetricRegistry> registry;
  // The buffer that `nbytes` bytes at `start` start and fit in, else nullptr. Thread-safe,
  // no GIL needed.
  SymmetricBuffer* (*find)(const RegistryHandle& handle, uintptr_t start, size_t nbytes) = nullptr;
};

}  // namespace commd::python::internal

#endif  // COMMD_PYTHON_SRC_INTERNAL_H_
