// Buffer protocol and DLPack export of commd's buffers and views.
#include "memory.h"

#include <Python.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal.h"

namespace commd::python {
namespace {

// DLPack's C ABI (dlpack.h, version 0.8: the unversioned "dltensor" capsule every consumer
// accepts), declared here rather than vendored: it is these four structs.
struct DLDevice {
  int32_t device_type;  // 1 kDLCPU, 2 kDLCUDA
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// What an exported tensor owns: its shape arrays and a share of the mapping. Freed by the
// consumer through the deleter (without the GIL, from any thread: no Python object here).
struct Exported {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::shared_ptr<Memory> memory;
};

void DeleteExported(DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); }

// A capsule nobody consumed (a consumer renames it "used_dltensor") still owns its tensor.
void DeleteCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

DLDevice DlDevice(const Memory& memory) {
  if (memory.device.is_host()) return {1, 0};
  return {2, memory.device.cuda_index()};
}

py::capsule ExportDlpack(const TensorView& view, const py::kwargs& kwargs) {
  if (kwargs.contains("copy") && !kwargs["copy"].is_none() && kwargs["copy"].cast<bool>()) {
    throw py::buffer_error("commd buffers export zero-copy only (copy=True asked)");
  }
  auto* exported = new Exported;
  exported->shape = view.shape;
  exported->strides.assign(view.shape.size(), 1);
  for (int i = static_cast<int>(view.shape.size()) - 2; i >= 0; --i) {
    exported->strides[i] = exported->strides[i + 1] * view.shape[i + 1];
  }
  exported->memory = view.memory;
  DLTensor& t = exported->managed.dl_tensor;
  t.data = view.data();
  t.device = DlDevice(*view.memory);
  t.ndim = static_cast<int32_t>(view.shape.size());
  t.dtype = {view.type->dl_code, static_cast<uint8_t>(view.type->itemsize * 8), 1};
  t.shape = exported->shape.data();
  t.strides = exported->strides.data();
  t.byte_offset = 0;
  exported->managed.manager_ctx = exported;
  exported->managed.deleter = DeleteExported;
  PyObject* capsule = PyCapsule_New(&exported->managed, "dltensor", DeleteCapsule);
  if (capsule == nullptr) {
    delete exported;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::buffer_info BufferInfo(const TensorView& view) {
  if (!view.memory->device.is_host()) {
    throw py::buffer_error(absl::StrCat("memory on ", view.memory->device.ToString(),
                                        " has no buffer protocol; use __dlpack__"));
  }
  if (view.type->format == nullptr) {
    throw py::buffer_error(absl::StrCat(view.type->name,
                                        " has no buffer-protocol format; use "
                                        "torch.from_dlpack(view), or a uint16 view"));
  }
  std::vector<py::ssize_t> shape(view.shape.begin(), view.shape.end());
  std::vector<py::ssize_t> strides(shape.size(), static_cast<py::ssize_t>(view.type->itemsize));
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return py::buffer_info(view.data(), static_cast<py::ssize_t>(view.type->itemsize),
                         view.type->format, static_cast<py::ssize_t>(shape.size()), shape, strides,
                         /*readonly=*/false);
}

TensorView WholeView(const std::shared_ptr<Memory>& memory, int rank) {
  static const py::str kBytes("uint8");
  return MakeView(memory, kBytes, py::int_(memory->size), 0, rank);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), shape.size() == 1 ? ",)" : ")");
}

// What the buffer protocol and DLPack export of each class: the object itself as a view.
TensorView WholeOf(const TensorView& v) { return v; }
TensorView WholeOf(const SymmetricBufferObject& b) { return WholeView(b.memory, b.memory->self); }
TensorView WholeOf(const PersistentBufferObject& b) { return WholeView(b.memory, 0); }

// bf_getbuffer of the classes below. pybind11's own (def_buffer) cannot refuse a request
// (an exception there terminates the process), and a bfloat16 or CUDA view must be refused
// with a BufferError that says why. Fills the Py_buffer as pybind11 does, with a
// py::buffer_info in `internal`, so pybind11's bf_releasebuffer frees it.
template <typename T>
int GetBuffer(PyObject* obj, Py_buffer* view, int flags) {
  py::buffer_info* info = nullptr;
  try {
    info = new py::buffer_info(BufferInfo(WholeOf(py::handle(obj).cast<const T&>())));
  } catch (py::error_already_set& e) {
    e.restore();
    return -1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
    return -1;
  }
  std::memset(view, 0, sizeof(Py_buffer));
  view->obj = obj;
  view->internal = info;
  view->buf = info->ptr;
  view->itemsize = info->itemsize;
  view->len = info->size * info->itemsize;
  view->readonly = 0;
  view->ndim = 1;
  if ((flags & PyBUF_FORMAT) == PyBUF_FORMAT)
    view->format = const_cast<char*>(info->format.c_str());
  if ((flags & PyBUF_STRIDES) == PyBUF_STRIDES) {
    view->ndim = static_cast<int>(info->ndim);
    view->strides = info->strides.data();
    view->shape = info->shape.data();
  }
  Py_INCREF(obj);
  return 0;
}

// What buffers and views share: the buffer protocol, DLPack, nbytes and len().
template <typename T>
void DefArrayInterface(py::class_<T>& cls) {
  reinterpret_cast<PyTypeObject*>(cls.ptr())->tp_as_buffer->bf_getbuffer = &GetBuffer<T>;
  cls.def(
      "__dlpack__",
      [](const T& self, py::kwargs kwargs) { return ExportDlpack(WholeOf(self), kwargs); },
      "DLPack capsule of this memory (zero-copy; the capsule keeps the buffer mapped). "
      "Keywords stream, max_version, dl_device are accepted; copy=True is refused.");
  cls.def(
      "__dlpack_device__",
      [](const T& self) {
        const DLDevice d = DlDevice(*WholeOf(self).memory);
        return py::make_tuple(d.device_type, d.device_id);
      },
      "(1, 0) for host memory, (2, index) for CUDA memory (DLPack device codes).");
  cls.def_property_readonly(
      "nbytes", [](const T& self) { return WholeOf(self).nbytes(); }, "Bytes this object spans.");
  cls.def("__len__", [](const T& self) {
    const TensorView v = WholeOf(self);
    return v.shape.empty() ? size_t{1} : static_cast<size_t>(v.shape[0]);
  });
}

}  // namespace

size_t TensorView::count() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

TensorView MakeView(std::shared_ptr<Memory> memory, const py::handle& dtype,
                    const py::handle& shape, size_t offset, int rank) {
  const int world = static_cast<int>(memory->ranks.size());
  if (rank < 0 || rank >= world) {
    ThrowInvalid(absl::StrCat("rank ", rank, " is out of range (0..", world - 1, ")"));
  }
  TensorView view;
  view.type = &ParseElementType(dtype);
  if (py::isinstance<py::int_>(shape)) {
    view.shape.push_back(shape.cast<int64_t>());
  } else {
    for (py::handle d : py::iter(shape)) view.shape.push_back(d.cast<int64_t>());
  }
  for (int64_t d : view.shape) {
    if (d < 0) ThrowInvalid(absl::StrCat("shape ", ShapeText(view.shape), " has a negative size"));
  }
  if (offset % view.type->itemsize != 0) {
    ThrowInvalid(absl::StrCat("offset ", offset, " is not a multiple of ", view.type->name, "'s ",
                              view.type->itemsize, " bytes"));
  }
  view.memory = std::move(memory);
  view.rank = rank;
  view.offset = offset;
  const size_t size = view.memory->size;
  if (offset > size || view.nbytes() > size - offset) {
    ThrowInvalid(absl::StrCat("a ", view.type->name, " view of shape ", ShapeText(view.shape), " (",
                              view.nbytes(), " bytes) at offset ", offset,
                              " does not fit the buffer's ", size,
                              " bytes (offset + nbytes must be <= ", size, ")"));
  }
  return view;
}

py::object WrapSymmetric(std::unique_ptr<commd::SymmetricBuffer> buffer, int rank, int world_size) {
  auto memory = std::make_shared<Memory>();
  memory->symmetric = buffer.get();
  for (int r = 0; r < world_size; ++r) {
    memory->ranks.push_back(static_cast<char*>(r == rank ? buffer->data() : buffer->peer(r)));
  }
  memory->size = buffer->size();
  memory->self = rank;
  memory->device = buffer->device();
  memory->owner = std::shared_ptr<commd::SymmetricBuffer>(std::move(buffer));
  return py::cast(SymmetricBufferObject{std::move(memory)});
}

py::object WrapPersistent(std::unique_ptr<commd::PersistentBuffer> buffer) {
  auto memory = std::make_shared<Memory>();
  memory->ranks.push_back(static_cast<char*>(buffer->data()));
  memory->size = buffer->size();
  std::string name = buffer->name();
  memory->owner = std::shared_ptr<commd::PersistentBuffer>(std::move(buffer));
  return py::cast(PersistentBufferObject{std::move(memory), std::move(name)});
}

Operand ToOperand(const py::handle& obj, const char* what) {
  Operand op;
  if (py::isinstance<SymmetricBufferObject>(obj)) {
    const Memory& m = *obj.cast<const SymmetricBufferObject&>().memory;
    op.buffer = m.symmetric;
    op.nbytes = m.size;
    return op;
  }
  if (py::isinstance<TensorView>(obj)) {
    const TensorView& v = obj.cast<const TensorView&>();
    if (v.memory->symmetric == nullptr) {
      ThrowInvalid(absl::StrCat(what,
                                " is a view of a persistent buffer; collectives take "
                                "symmetric buffers (group.allocate_symmetric)"));
    }
    if (v.rank != v.memory->self) {
      ThrowInvalid(absl::StrCat(what, " is a view of rank ", v.rank,
                                "'s memory; collectives take this rank's (rank ", v.memory->self,
                                ")"));
    }
    op.buffer = v.memory->symmetric;
    op.offset = v.offset;
    op.nbytes = v.nbytes();
    op.type = v.type;
    op.count = v.count();
    return op;
  }
  ThrowInvalid(absl::StrCat(what, " must be a commd.SymmetricBuffer or a view of one (got ",
                            std::string(py::str(py::type::of(obj).attr("__name__"))), ")"));
}

HostMemory::HostMemory(const py::handle& obj, const char* what, const py::object& dtype,
                       bool writable) {
  const ElementType* format_type = nullptr;
  if (py::isinstance<TensorView>(obj)) {  // bfloat16 views have no buffer-protocol format
    const TensorView& v = obj.cast<const TensorView&>();
    if (!v.memory->device.is_host()) {
      ThrowInvalid(absl::StrCat(what, " is on ", v.memory->device.ToString(),
                                "; host-memory collectives take host memory"));
    }
    data_ = v.data();
    nbytes_ = v.nbytes();
    format_type = v.type;
  } else {
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
      py::error_already_set e;  // fetches Python's reason
      ThrowInvalid(absl::StrCat(what, " must be ", writable ? "writable " : "",
                                "C-contiguous host memory with the buffer protocol (", e.what(),
                                ")"));
    }
    held_ = true;
    data_ = static_cast<char*>(view_.buf);
    nbytes_ = static_cast<size_t>(view_.len);
    format_type = ElementTypeOfFormat(view_.format == nullptr ? "B" : view_.format,
                                      static_cast<size_t>(view_.itemsize));
  }
  type_ = dtype.is_none() ? format_type : &ParseElementType(dtype);
  if (type_ == nullptr) {
    ThrowInvalid(absl::StrCat(what, "'s buffer format '",
                              view_.format == nullptr ? "" : view_.format,
                              "' is not a known element type; pass dtype"));
  }
  if (!type_->commd) {
    ThrowInvalid(absl::StrCat("dtype ", type_->name, " of ", what, " is not a collective type (",
                              CollectiveTypeNames(), "); pass dtype for raw bytes"));
  }
}

HostMemory::~HostMemory() {
  if (held_) PyBuffer_Release(&view_);
}

commd::SymmetricBuffer& ToStaging(const py::handle& obj) {
  if (!py::isinstance<SymmetricBufferObject>(obj)) {
    ThrowInvalid(absl::StrCat("staging must be a commd.SymmetricBuffer of this group (got ",
                              std::string(py::str(py::type::of(obj).attr("__name__"))), ")"));
  }
  return *obj.cast<const SymmetricBufferObject&>().memory->symmetric;
}

void BindMemory(py::module_& m) {
  py::class_<TensorView> view(m, "TensorView", py::buffer_protocol(),
                              "A typed, C-contiguous view of one rank's part of a buffer. "
                              "numpy.asarray(view) and torch.from_dlpack(view) share its "
                              "memory.");
  DefArrayInterface(view);
  view.def_property_readonly("dtype", [](const TensorView& v) { return v.type->name; })
      .def_property_readonly("shape",
                             [](const TensorView& v) {
                               py::tuple t(v.shape.size());
                               for (size_t i = 0; i < v.shape.size(); ++i) t[i] = v.shape[i];
                               return t;
                             })
      .def_property_readonly("offset", [](const TensorView& v) { return v.offset; })
      .def_property_readonly(
          "rank", [](const TensorView& v) { return v.rank; },
          "Whose memory this views (a group rank; 0 for persistent).")
      .def_property_readonly("count", &TensorView::count, "Elements in the view.")
      .def("__repr__", [](const TensorView& v) {
        return absl::StrCat("commd.TensorView(dtype=", v.type->name, ", shape=", ShapeText(v.shape),
                            ", offset=", v.offset, ", rank=", v.rank, ")");
      });

  const char* kViewDoc =
      "view(dtype, shape, offset=0, rank=None) -> TensorView\n\n"
      "A typed view of `shape` elements of `dtype` at byte `offset` of rank `rank`'s memory "
      "(None: this rank's). Raises InvalidArgumentError when it does not fit the buffer or "
      "`offset` is not a multiple of the element size.";
  py::class_<SymmetricBufferObject> sym(
      m, "SymmetricBuffer", py::buffer_protocol(),
      "One symmetric allocation of a group (Group.allocate_symmetric): this rank's bytes "
      "through the buffer protocol and __dlpack__ (uint8), every rank's through peer(r) and "
      "view(..., rank=r). The mapping stays until the buffer and every view and exported "
      "tensor are gone.");
  DefArrayInterface(sym);
  sym.def(
         "view",
         [](const SymmetricBufferObject& b, py::object dtype, py::object shape, size_t offset,
            std::optional<int> rank) {
           return MakeView(b.memory, dtype, shape, offset, rank.value_or(b.memory->self));
         },
         py::arg("dtype"), py::arg("shape"), py::arg("offset") = 0, py::arg("rank") = py::none(),
         kViewDoc)
      .def(
          "peer",
          [](const SymmetricBufferObject& b, int rank) { return WholeView(b.memory, rank); },
          py::arg("rank"), "Rank `rank`'s bytes (uint8 view), mapped in this process.")
      .def_property_readonly(
          "size", [](const SymmetricBufferObject& b) { return b.memory->size; },
          "Data bytes per rank.")
      .def_property_readonly("rank", [](const SymmetricBufferObject& b) { return b.memory->self; })
      .def_property_readonly("world_size",
                             [](const SymmetricBufferObject& b) { return b.memory->ranks.size(); })
      .def_property_readonly(
          "id", [](const SymmetricBufferObject& b) { return b.memory->symmetric->id(); })
      .def_property_readonly(
          "device", [](const SymmetricBufferObject& b) { return b.memory->device.ToString(); })
      .def("__repr__", [](const SymmetricBufferObject& b) {
        return absl::StrCat("commd.SymmetricBuffer(size=", b.memory->size,
                            ", rank=", b.memory->self, ", world_size=", b.memory->ranks.size(),
                            ", device=", b.memory->device.ToString(), ")");
      });

  py::class_<PersistentBufferObject> persistent(
      m, "PersistentBuffer", py::buffer_protocol(),
      "A named buffer of the job that outlives this process (Client.allocate_persistent / "
      "attach_persistent): its bytes through the buffer protocol and __dlpack__ (uint8).");
  DefArrayInterface(persistent);
  persistent
      .def(
          "view",
          [](const PersistentBufferObject& b, py::object dtype, py::object shape, size_t offset) {
            return MakeView(b.memory, dtype, shape, offset, 0);
          },
          py::arg("dtype"), py::arg("shape"), py::arg("offset") = 0,
          "view(dtype, shape, offset=0) -> TensorView: a typed view; InvalidArgumentError "
          "when it does not fit.")
      .def_property_readonly("size", [](const PersistentBufferObject& b) { return b.memory->size; })
      .def_readonly("name", &PersistentBufferObject::name)
      .def("__repr__", [](const PersistentBufferObject& b) {
        return absl::StrCat("commd.PersistentBuffer(name='", b.name, "', size=", b.memory->size,
                            ")");
      });
}

}  // namespace commd::python
