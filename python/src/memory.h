// Buffers as Python sees them: SymmetricBuffer, PersistentBuffer and typed views of either,
// each with the buffer protocol (numpy.asarray) and DLPack (torch.from_dlpack), zero-copy.
#ifndef COMMD_PYTHON_SRC_MEMORY_H_
#define COMMD_PYTHON_SRC_MEMORY_H_

#include <memory>
#include <string>
#include <vector>

#include "binding.h"

namespace commd::python {

// The memory views look at: every rank's data of a symmetric buffer, or a persistent
// buffer's. Shared by the buffer object, its views and exported DLPack tensors, so the
// mapping lives until the last of them is gone.
struct Memory {
  std::shared_ptr<void> owner;                  // the SDK object that holds the mapping
  commd::SymmetricBuffer* symmetric = nullptr;  // set for symmetric buffers
  std::vector<char*> ranks;                     // each rank's data, mapped here
  size_t size = 0;                              // bytes per rank
  int self = 0;                                 // this process's index in `ranks`
  Device device = Device::Host();
};

// `shape` elements of `type` at byte `offset` of rank `rank`'s data, C-contiguous.
struct TensorView {
  std::shared_ptr<Memory> memory;
  int rank = 0;
  const ElementType* type = nullptr;
  std::vector<int64_t> shape;
  size_t offset = 0;

  size_t count() const;
  size_t nbytes() const { return count() * type->itemsize; }
  char* data() const { return memory->ranks[rank] + offset; }
};

// A view of `memory` after checking rank, alignment and bounds (InvalidArgumentError with
// the offending value and the allowed range).
TensorView MakeView(std::shared_ptr<Memory> memory, const py::handle& dtype,
                    const py::handle& shape, size_t offset, int rank);

// The Python objects that own a Memory.
struct SymmetricBufferObject {
  std::shared_ptr<Memory> memory;
};
struct PersistentBufferObject {
  std::shared_ptr<Memory> memory;
  std::string name;
};
py::object WrapSymmetric(std::unique_ptr<commd::SymmetricBuffer> buffer, int rank, int world_size);
py::object WrapPersistent(std::unique_ptr<commd::PersistentBuffer> buffer);

// A collective's argument: a SymmetricBuffer (raw bytes: the call names dtype) or a view of
// this rank's part of one. `what` names the argument in errors.
struct Operand {
  commd::SymmetricBuffer* buffer = nullptr;
  size_t offset = 0;
  size_t nbytes = 0;
  const ElementType* type = nullptr;  // nullptr for a whole buffer
  size_t count = 0;                   // elements of the view (0 for a whole buffer)
};
Operand ToOperand(const py::handle& obj, const char* what);

// A collective's argument in ordinary host memory (the calls given `staging`): any object with
// the C-contiguous buffer protocol (numpy arrays, bytearray, memoryview) or a TensorView,
// held while the call runs. Its type is `dtype` when given (the buffer's bytes reinterpreted:
// how a bfloat16 tensor's int16 view is passed), else the buffer's format, which must be a
// collective type. `what` names the argument in errors.
class HostMemory {
 public:
  HostMemory(const py::handle& obj, const char* what, const py::object& dtype, bool writable);
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  char* data() const { return data_; }
  const ElementType& type() const { return *type_; }
  size_t count() const { return nbytes_ / type_->itemsize; }  // whole elements it holds

 private:
  Py_buffer view_{};
  bool held_ = false;
  char* data_ = nullptr;
  size_t nbytes_ = 0;
  const ElementType* type_ = nullptr;
};

// The staging buffer of a host-memory call: a whole commd.SymmetricBuffer.
commd::SymmetricBuffer& ToStaging(const py::handle& obj);

}  // namespace commd::python

#endif  // COMMD_PYTHON_SRC_MEMORY_H_
