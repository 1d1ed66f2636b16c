// The symmetric buffers that hold a process group's zero-copy tensors (commd.torch.empty),
// and the one rule for which memory needs no staging: a region that starts one of them and
// fits in it (commd's collectives take a buffer from its start). Both halves of commd.torch
// ask it: the Python backend through commd._commd.SymmetricRegistry.find, the C++ backend
// (commd._c10d) through the registry's internal handle (internal.h), so the two never
// disagree on which tensor is zero-copy. Free of pybind11: the two modules are built against
// two different copies of it.
//
//   SymmetricRegistry registry;
//   registry.Add(buffer, data, size);
//   if (SymmetricBuffer* b = registry.Find(start, nbytes)) ...  // zero copy on b
#ifndef COMMD_PYTHON_SRC_SYMMETRIC_REGISTRY_H_
#define COMMD_PYTHON_SRC_SYMMETRIC_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "commd/commd.h"

namespace commd::python {

// Thread-safe: torch may call the C++ backend from any thread, without the GIL. No call
// blocks on anything but the registry's own short lock.
class SymmetricRegistry {
 public:
  // Registers this rank's `size` bytes at `data` of `buffer`; the registry keeps `buffer`
  // (and so its mapping) alive until it is destroyed. Returns its index (0, 1, ...).
  size_t Add(std::shared_ptr<SymmetricBuffer> buffer, const char* data, size_t size);

  // The buffer that `nbytes` bytes at `start` start and fit in, and its index in `*index`
  // when given; nullptr when none does (the memory must be staged). The caller has checked
  // that its tensor is one region (contiguous).
  SymmetricBuffer* Find(uintptr_t start, size_t nbytes, size_t* index = nullptr) const;

  size_t size() const;

 private:
  struct Entry {
    uintptr_t start = 0;
    uintptr_t end = 0;
    std::shared_ptr<SymmetricBuffer> buffer;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace commd::python

#endif  // COMMD_PYTHON_SRC_SYMMETRIC_REGISTRY_H_
