// commd.Group's fused matmuls (all-gather + matmul, matmul + reduce-scatter): A's operand a
// symmetric buffer or host memory, every B, output and scale host memory.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "group.h"
#include "memory.h"

namespace commd::python {
namespace {

// Every host memory argument is held while the call runs.

// Host memory of `dtype` holding at least `need` elements (None: a null pointer).
const void* Held(std::vector<std::unique_ptr<HostMemory>>& held, const py::handle& obj,
                 const std::string& what, const char* dtype, size_t need, bool writable) {
  if (obj.is_none()) return nullptr;
  auto m = std::make_unique<HostMemory>(obj, what.c_str(), py::str(dtype), writable);
  if (m->count() < need) {
    ThrowInvalid(
        absl::StrCat(what, " holds ", m->count(), " ", dtype, " elements; ", need, " needed"));
  }
  held.push_back(std::move(m));
  return held.back()->data();
}

// The Bs of a fused matmul: each k x n (n from its size), its output (`out_rows` x n) and
// optional column scales.
std::vector<MatmulB> MatmulBs(std::vector<std::unique_ptr<HostMemory>>& held,
                              const py::sequence& bs, const py::sequence& outs,
                              const py::object& col_scales, const ElementType& type, size_t k,
                              size_t out_rows) {
  if (bs.size() != outs.size() || (!col_scales.is_none() && py::len(col_scales) != bs.size())) {
    ThrowInvalid(absl::StrCat(
        bs.size(), " Bs, ", outs.size(), " outputs",
        col_scales.is_none() ? "" : absl::StrCat(" and ", py::len(col_scales), " col_scales"),
        ": one of each per B"));
  }
  std::vector<MatmulB> out;
  for (size_t i = 0; i < bs.size(); ++i) {
    const std::string b = absl::StrCat("bs[", i, "]");
    const void* data = Held(held, bs[i], b, type.name, 1, false);
    const size_t elems = held.back()->count();
    if (k == 0 || elems % k != 0) {
      ThrowInvalid(absl::StrCat(b, " holds ", elems, " elements, not a multiple of k ", k));
    }
    const size_t n = elems / k;
    py::object scale = py::none();
    if (!col_scales.is_none()) scale = col_scales[py::int_(i)];
    out.push_back({data, n,
                   const_cast<void*>(Held(held, outs[i], absl::StrCat("outs[", i, "]"), type.name,
                                          out_rows * n, true)),
                   static_cast<const float*>(Held(held, scale, absl::StrCat("col_scales[", i, "]"),
                                                  "float32", n, false))});
  }
  return out;
}

py::object AllGatherMatmul(const GroupObject& g, const py::object& shard, size_t rows, size_t k,
                           const py::sequence& bs, const py::sequence& outs,
                           const py::object& dtype, const py::object& row_scale,
                           const py::object& col_scales, const py::object& gathered,
                           const py::object& timeout, const py::object& nan_check,
                           uint32_t period) {
  const Operand a = ToOperand(shard, "shard");
  NeedOffsetZero(a, "all_gather_matmul", "shard");
  const ElementType& type = CallType(dtype, {&a});
  const size_t world = g.get().world_size();
  std::vector<std::unique_ptr<HostMemory>> held;
  const std::vector<MatmulB> mbs = MatmulBs(held, bs, outs, col_scales, type, k, world * rows);
  const auto* rs =
      static_cast<const float*>(Held(held, row_scale, "row_scale", "float32", rows, false));
  void* all =
      const_cast<void*>(Held(held, gathered, "gathered", type.name, world * rows * k, true));
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, 0, py::none());
  Check(Blocking(g, "all_gather_matmul", [&](Group& group) {
    return group.AllGatherMatmul(*a.buffer, rows, k, *type.commd, mbs, rs, all, c.options);
  }));
  return py::cast(c.finding);
}

py::object MatmulReduceScatter(const GroupObject& g, const py::object& a, size_t rows, size_t k,
                               const py::object& b, const py::object& out,
                               const py::object& workspace, const py::object& op,
                               const py::object& dtype, const py::object& row_scale,
                               const py::object& col_scale, const py::object& timeout,
                               const py::object& nan_check, uint32_t period) {
  const ReduceOp reduce = ParseReduceOp(op);
  SymmetricBuffer& ws = ToStaging(workspace);
  std::vector<std::unique_ptr<HostMemory>> held;
  const ElementType& type =
      dtype.is_none() ? HostMemory(a, "a", dtype, false).type() : ParseElementType(dtype);
  const void* a_data = Held(held, a, "a", type.name, rows * k, false);
  const size_t world = g.get().world_size();
  const std::vector<MatmulB> mbs =
      MatmulBs(held, py::make_tuple(b), py::make_tuple(out),
               col_scale.is_none() ? py::object(py::none()) : py::make_tuple(col_scale), type, k,
               rows / world);
  const auto* rs =
      static_cast<const float*>(Held(held, row_scale, "row_scale", "float32", rows, false));
  CallOptions c;
  ParseCallOptions(c, timeout, nan_check, period, 0, py::none());
  Check(Blocking(g, "matmul_reduce_scatter", [&](Group& group) {
    return group.MatmulReduceScatter(a_data, rows, k, *type.commd, mbs[0], reduce, ws, rs,
                                     c.options);
  }));
  return py::cast(c.finding);
}

}  // namespace

void DefFusedMatmuls(py::class_<GroupObject>& cls) {
  auto doc = [](const char* head) { return CallDoc(head); };
  static const std::string all_gather_matmul_doc =
      doc("all_gather_matmul(shard, rows, k, bs, outs, dtype=None, *, row_scale=None, "
          "col_scales=None, gathered=None, ...) -> NanFinding\n\nFused all-gather + matmul (host "
          "groups): `shard` is a symmetric buffer (or its view at offset 0) holding this rank's "
          "rows x k shard of A; for every B (host memory, k x n, row-major) outs[i] = "
          "allgather(A) @ bs[i], (world_size * rows) x n. Each shard is multiplied where it lies "
          "as soon as its owner has entered; `gathered` (world_size * rows x k) receives A only "
          "when given. row_scale (rows float32) and col_scales[i] (n float32 or None) scale the "
          "output. float32, float16, bfloat16 (bfloat16 host memory as its int16/uint16 bits).");
  static const std::string matmul_reduce_scatter_doc =
      doc("matmul_reduce_scatter(a, rows, k, b, out, workspace, op='sum', dtype=None, *, "
          "row_scale=None, col_scale=None, ...) -> NanFinding\n\nFused matmul + reduce-scatter "
          "(host groups): `out` ((rows / world_size) x n) receives this rank's rows of the sum (or "
          "'avg') over ranks of a @ b (a: rows x k, b: k x n, host memory). The float32 partial "
          "products go straight into the destinations' parts of `workspace`, a symmetric buffer "
          "of at least rows x n x 4 bytes.");
  cls.def("all_gather_matmul", &AllGatherMatmul, py::arg("shard"), py::arg("rows"), py::arg("k"),
          py::arg("bs"), py::arg("outs"), py::arg("dtype") = py::none(), py::kw_only(),
          py::arg("row_scale") = py::none(), py::arg("col_scales") = py::none(),
          py::arg("gathered") = py::none(), py::arg("timeout") = py::none(),
          py::arg("nan_check") = py::none(), py::arg("nan_sample_period") = 100,
          all_gather_matmul_doc.c_str())
      .def("matmul_reduce_scatter", &MatmulReduceScatter, py::arg("a"), py::arg("rows"),
           py::arg("k"), py::arg("b"), py::arg("out"), py::arg("workspace"), py::arg("op") = "sum",
           py::arg("dtype") = py::none(), py::kw_only(), py::arg("row_scale") = py::none(),
           py::arg("col_scale") = py::none(), py::arg("timeout") = py::none(),
           py::arg("nan_check") = py::none(), py::arg("nan_sample_period") = 100,
           matmul_reduce_scatter_doc.c_str());
}

}  // namespace commd::python
