// commd._c10d's Works: see c10d_work.h.
#include "c10d_work.h"

#include <mutex>
#include <utility>

namespace commd::python {
namespace {

namespace py = pybind11;
using c10d::Work;

// What the Python backend's Works are: complete at return (host collectives run
// synchronously; a failure raised from the call), their future holding the result as
// ProcessGroupCommd._completed's does, result() the tensors. The future is made on the
// first getFuture() only: torch's dist.all_reduce waits on the Work and drops it, and a
// future (its type, a list IValue, markCompleted's walk over the storages) is a good part of
// what this backend adds per call (docs/PERFORMANCE.md, "The C++ backend's cost per call").
class CompletedWork final : public Work {
 public:
  // `single`: the future holds tensors[0] itself (all_gather_into_tensor,
  // reduce_scatter_tensor), else the list (all_reduce, broadcast), as torch's own backends.
  CompletedWork(std::vector<at::Tensor> tensors, bool single)
      : tensors_(std::move(tensors)), single_(single) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return tensors_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mu_);  // no Python under it
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          single_ ? c10::TensorType::get() : c10::TypePtr(c10::ListType::ofTensors()));
      future_->markCompleted(single_ ? c10::IValue(tensors_[0]) : c10::IValue(tensors_));
    }
    return future_;
  }

 private:
  const std::vector<at::Tensor> tensors_;
  const bool single_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made by the first getFuture()
};

// A Work of the Python backend as torch hands it back: torch wraps what a Python backend
// returns in a holder (PyProcessGroup::PyWorkHolder) that forwards only wait() and
// getFuture(), so its isCompleted() is false and its result() raises however the call went.
// This answers them from the future, which ProcessGroupCommd completes before it returns
// (host collectives run synchronously; a CUDA one is then queued on torch's stream, which is
// what torch's Work calls complete for CUDA). A failure raises from the call itself, as on
// the zero-copy path, so the future never holds an error; it is still read, should one come.
//
// The holder forwards no sourceRank() either, which torch's recv without src reads: for a
// receive from any source `source` is the Python Work itself, whose _source_rank() answers.
class ForwardedWork final : public Work {
 public:
  ForwardedWork(c10::intrusive_ptr<Work> work, c10::intrusive_ptr<c10::ivalue::Future> future,
                py::object source = py::object())
      : work_(std::move(work)), future_(std::move(future)), source_(std::move(source)) {}
  ~ForwardedWork() override {
    if (source_ && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      source_ = py::object();
    } else {
      (void)source_.release();  // none, or the interpreter is gone: nothing to decref
    }
  }
  int sourceRank() const override {
    if (!source_) return Work::sourceRank();  // raises, as for any Work but a receive's
    py::gil_scoped_acquire gil;
    return source_.attr("_source_rank")().cast<int>();
  }
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
  void synchronize() override { work_->synchronize(); }
  std::vector<at::Tensor> result() override {
    if (!isSuccess()) return {};
    const c10::IValue& value = future_->constValue();
    if (value.isTensor()) return {value.toTensor()};
    if (value.isTensorList()) return value.toTensorVector();
    if (value.isPyObject()) return value.toPyObjectHolder()->extractTensors();
    return {};
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<Work> work_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  py::object source_;
};

}  // namespace

c10::intrusive_ptr<Work> Completed(const std::vector<at::Tensor>& tensors) {
  return c10::make_intrusive<CompletedWork>(tensors, /*single=*/false);
}
c10::intrusive_ptr<Work> Completed(const at::Tensor& tensor) {
  return c10::make_intrusive<CompletedWork>(std::vector<at::Tensor>{tensor}, /*single=*/true);
}

// The future is taken at once (one Python call, the holder's getFuture()), not lazily under
// a lock that a caller holding the GIL could then wait on while the taker waits for the GIL.
c10::intrusive_ptr<Work> Forwarded(c10::intrusive_ptr<Work> work, py::object source) {
  if (!work) return work;  // a Python backend's None
  auto future = work->getFuture();
  if (!future) return work;
  return c10::make_intrusive<ForwardedWork>(std::move(work), std::move(future), std::move(source));
}

}  // namespace commd::python
