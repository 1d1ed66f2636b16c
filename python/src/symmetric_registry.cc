// commd._commd.SymmetricRegistry: the registry of symmetric_registry.h as Python sees it,
// and its internal handle for commd._c10d (internal.h).
#include "symmetric_registry.h"

#include <utility>

#include "binding.h"
#include "internal.h"
#include "memory.h"

namespace commd::python {

size_t SymmetricRegistry::Add(std::shared_ptr<SymmetricBuffer> buffer, const char* data,
                              size_t size) {
  const auto start = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back({start, start + size, std::move(buffer)});
  return entries_.size() - 1;
}

SymmetricBuffer* SymmetricRegistry::Find(uintptr_t start, size_t nbytes, size_t* index) const {
  const uintptr_t end = start + nbytes;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (start == e.start && end <= e.end) {
      if (index != nullptr) *index = i;
      return e.buffer.get();
    }
  }
  return nullptr;
}

size_t SymmetricRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

namespace {

// The Python object: the registry and the SymmetricBuffer objects in its order, so that
// find() answers with the buffer Python registered (its views, its lifetime).
struct SymmetricRegistryObject {
  std::shared_ptr<SymmetricRegistry> registry = std::make_shared<SymmetricRegistry>();
  py::list buffers;
};

SymmetricBuffer* FindInHandle(const internal::RegistryHandle& handle, uintptr_t start,
                              size_t nbytes) {
  return handle.registry->Find(start, nbytes);
}

}  // namespace

void BindSymmetricRegistry(py::module_& m) {
  py::class_<SymmetricRegistryObject>(
      m, "SymmetricRegistry",
      "Internal (commd.torch): the symmetric buffers of a process group's zero-copy tensors, "
      "and the one place that decides which tensor needs no staging, for commd.torch's "
      "Python backend and its C++ one (commd._c10d).")
      .def(py::init<>())
      .def(
          "add",
          [](SymmetricRegistryObject& r, py::object buffer) {
            if (!py::isinstance<SymmetricBufferObject>(buffer)) {
              throw py::type_error("SymmetricRegistry.add: expected a commd.SymmetricBuffer, got " +
                                   std::string(py::str(py::type::of(buffer).attr("__name__"))));
            }
            const auto& b = buffer.cast<const SymmetricBufferObject&>();
            // Aliasing: the registry keeps the whole Memory (and so the SDK buffer) alive.
            r.registry->Add(std::shared_ptr<SymmetricBuffer>(b.memory, b.memory->symmetric),
                            b.memory->ranks[b.memory->self], b.memory->size);
            r.buffers.append(buffer);
          },
          py::arg("buffer"), "Registers a buffer whose tensors are zero-copy.")
      .def(
          "find",
          [](const SymmetricRegistryObject& r, uintptr_t address, size_t nbytes) -> py::object {
            size_t index = 0;
            if (r.registry->Find(address, nbytes, &index) == nullptr) return py::none();
            return r.buffers[index];
          },
          py::arg("address"), py::arg("nbytes"),
          "The registered buffer that `nbytes` bytes at `address` (a contiguous tensor's "
          "data_ptr) start and fit in, else None: the memory must then be staged.")
      .def("__len__", [](const SymmetricRegistryObject& r) { return r.registry->size(); })
      .def(
          "_internal_handle",
          [](const SymmetricRegistryObject& r) {
            auto* handle = new internal::RegistryHandle;
            handle->registry = r.registry;
            handle->find = &FindInHandle;
            return py::capsule(handle, internal::kRegistryCapsule, [](PyObject* capsule) {
              delete static_cast<internal::RegistryHandle*>(
                  PyCapsule_GetPointer(capsule, internal::kRegistryCapsule));
            });
          },
          "Internal (commd.torch's C++ backend): a capsule holding the registry.");
}

}  // namespace commd::python
