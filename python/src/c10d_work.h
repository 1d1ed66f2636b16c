// commd._c10d's Works (c10d.cc): what its zero-copy calls return, and the wrapper of what the
// Python backend returns through torch's holder. Built into the commd._c10d module only.
#ifndef COMMD_PYTHON_SRC_C10D_WORK_H_
#define COMMD_PYTHON_SRC_C10D_WORK_H_

#include <Python.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace commd::python {

// A Work complete at return, its future holding `tensors` (the list: all_reduce, broadcast)
// or `tensor` itself (all_gather_into_tensor, reduce_scatter_tensor), as torch's own
// backends' futures do.
c10::intrusive_ptr<c10d::Work> Completed(const std::vector<at::Tensor>& tensors);
c10::intrusive_ptr<c10d::Work> Completed(const at::Tensor& tensor);

// `work`, a Work of the Python backend as torch hands it back, answering what torch's holder
// does not (see c10d_work.cc); `source`: for a receive from any source, the Python Work,
// whose _source_rank() answers sourceRank(). Call with the GIL held.
c10::intrusive_ptr<c10d::Work> Forwarded(c10::intrusive_ptr<c10d::Work> work,
                                         pybind11::object source = pybind11::object());

}  // namespace commd::python

#endif  // COMMD_PYTHON_SRC_C10D_WORK_H_
