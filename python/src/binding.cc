// commd._commd: the module's entry point and the parts every binding file shares.
#include "binding.h"

#include <pthread.h>
#include <semaphore.h>
#include <signal.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace commd::python {
namespace {

ElementType Row(const char* name, size_t itemsize, const char* format, uint8_t dl_code) {
  ElementType t{name, itemsize, format, dl_code, std::nullopt, std::nullopt};
  DataType d;
  if (DataTypeFromName(name, &d)) {
    t.recorded = d;
    if (IsCollectiveType(d)) t.commd = d;
  }
  return t;
}

// Python's element-type names with their buffer formats and DLPack codes; which commd type
// each is comes from the vocabulary (binding_test checks the sizes agree).
const std::array<ElementType, 12> kElementTypes = {{
    Row("float32", 4, "f", 2),
    Row("float16", 2, "e", 2),
    Row("bfloat16", 2, nullptr, 4),
    Row("int32", 4, "i", 0),
    Row("int64", 8, "q", 0),
    Row("float64", 8, "d", 2),
    Row("uint8", 1, "B", 1),
    Row("int8", 1, "b", 0),
    Row("int16", 2, "h", 0),
    Row("uint16", 2, "H", 1),
    Row("uint32", 4, "I", 1),
    Row("bool", 1, "?", 6),
}};

unsigned long main_thread_ident = 0;  // threading.main_thread().ident, set at import

// What InterruptScope shares with the SIGINT handler and the helper thread.
sem_t interrupt_sem;
std::mutex interrupt_mu;
std::function<void()> interrupt_target;  // guarded by interrupt_mu; empty: no scope
std::atomic<bool> interrupt_fired{false};
struct sigaction python_sigint;  // Python's own handler, chained to

void OnSigint(int sig, siginfo_t* info, void* context) {
  interrupt_fired.store(true);
  sem_post(&interrupt_sem);  // async-signal-safe; the helper thread does the work
  if (python_sigint.sa_flags & SA_SIGINFO) {
    python_sigint.sa_sigaction(sig, info, context);
  } else {
    python_sigint.sa_handler(sig);
  }
}

void InterruptHelper() {
  for (;;) {
    while (sem_wait(&interrupt_sem) != 0 && errno == EINTR) {
    }
    std::lock_guard<std::mutex> lock(interrupt_mu);
    if (interrupt_target) interrupt_target();
  }
}

}  // namespace

py::object ErrorFor(const absl::Status& status) {
  py::object errors = py::module_::import("commd.errors");
  return errors.attr("_from_code")(absl::StatusCodeToString(status.code()),
                                   std::string(status.message()));
}

void ThrowStatus(const absl::Status& status) {
  py::object error = ErrorFor(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

void ThrowInvalid(const std::string& message) { ThrowStatus(absl::InvalidArgumentError(message)); }

const ElementType& ParseElementType(const py::handle& dtype) {
  std::string name = py::str(dtype);
  if (absl::StartsWith(name, "torch.")) name = name.substr(6);
  for (const ElementType& t : kElementTypes) {
    if (name == t.name) return t;
  }
  std::vector<std::string> names;
  for (const ElementType& t : kElementTypes) names.push_back(t.name);
  ThrowInvalid(
      absl::StrCat("unknown dtype '", name, "' (one of: ", absl::StrJoin(names, ", "), ")"));
}

std::string CollectiveTypeNames() {
  std::string out;
  for (DataType t : kCollectiveTypes)
    absl::StrAppend(&out, out.empty() ? "" : ", ", DataTypeName(t));
  return out;
}

const ElementType* ElementTypeOfFormat(std::string_view format, size_t itemsize) {
  if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<')) {
    format.remove_prefix(1);
  }
  // numpy names int64 'l' (C long) on LP64 and uint64/long long variants by size.
  if ((format == "l" || format == "q") && itemsize == 8) format = "q";
  for (const ElementType& t : kElementTypes) {
    if (t.format != nullptr && format == t.format && itemsize == t.itemsize) return &t;
  }
  return nullptr;
}

ReduceOp ParseReduceOp(const py::handle& op) {
  const std::string name = py::str(op);
  ReduceOp out;
  if (ReduceOpFromName(name, &out)) return out;
  std::string names;
  for (const auto& r : vocabulary::kReduceOps)
    absl::StrAppend(&names, names.empty() ? "" : ", ", r.name);
  ThrowInvalid(absl::StrCat("unknown reduce op '", name, "' (one of: ", names, ")"));
}

absl::Duration Seconds(double seconds, const char* what) {
  if (!(seconds >= 0)) {
    ThrowInvalid(absl::StrCat(what, " ", seconds, " s is negative (must be >= 0)"));
  }
  return absl::Seconds(seconds);
}

void RunInterruptible(std::function<void()> fn) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto state = std::make_shared<Done>();
  std::thread([state, fn = std::move(fn)] {
    fn();
    std::lock_guard<std::mutex> lock(state->mu);
    state->done = true;
    state->cv.notify_all();
  }).detach();
  for (;;) {
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state->mu);
      if (state->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return state->done; })) {
        return;
      }
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

InterruptScope::InterruptScope(std::function<void()> on_interrupt) {
  if (static_cast<unsigned long>(pthread_self()) != main_thread_ident) return;
  // Our handler stays installed between calls (chaining to Python's, a no-op for us while no
  // scope is open), so a call costs one sigaction query, not two changes.
  struct sigaction current;
  if (sigaction(SIGINT, nullptr, &current) != 0) return;
  const bool ours = (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == OnSigint;
  // SIG_DFL / SIG_IGN: Python does not turn Ctrl-C into KeyboardInterrupt, so neither do we.
  if (!ours && !(current.sa_flags & SA_SIGINFO) &&
      (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) {
    return;
  }
  static std::once_flag helper_started;
  std::call_once(helper_started, [] {
    sem_init(&interrupt_sem, 0, 0);
    std::thread(InterruptHelper).detach();
  });
  {
    std::lock_guard<std::mutex> lock(interrupt_mu);
    interrupt_target = std::move(on_interrupt);  // main thread only: one scope at a time
  }
  interrupt_fired.store(false);
  if (!ours) {  // first call, or Python set another handler since (signal.signal)
    python_sigint = current;
    struct sigaction chained = current;
    chained.sa_flags |= SA_SIGINFO;
    chained.sa_sigaction = OnSigint;
    if (sigaction(SIGINT, &chained, nullptr) != 0) return;
  }
  active_ = true;
}

InterruptScope::~InterruptScope() {
  if (!active_) return;
  std::function<void()> done;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(interrupt_mu);
  done.swap(interrupt_target);
}

bool InterruptScope::interrupted() const { return active_ && interrupt_fired.load(); }

}  // namespace commd::python

PYBIND11_MODULE(_commd, m) {
  namespace cp = commd::python;
  m.doc() =
      "Compiled part of the commd package (use `import commd`): the client SDK of the commd "
      "node communication daemon, bound with pybind11.";
  cp::main_thread_ident = cp::py::module_::import("threading")
                              .attr("main_thread")()
                              .attr("ident")
                              .cast<unsigned long>();
  cp::BindMemory(m);
  cp::BindSymmetricRegistry(m);
  cp::BindClient(m);
  cp::BindGroup(m);
  // The limits the daemon puts on a request (commd/limits.h), for Python code that bounds what
  // it sends (commd.torch's group descriptions).
  m.attr("MAX_GROUP_DESCRIPTION_BYTES") = commd::kMaxGroupDescriptionBytes;
  m.attr("MIN_NAN_SAMPLE_PERIOD") = commd::kMinNanSamplePeriod;
  m.attr("MAX_NAN_SAMPLE_PERIOD") = commd::kMaxNanSamplePeriod;
  m.attr("MAX_GLOBAL_WORLD_SIZE") = commd::kMaxGlobalWorldSize;
  m.attr("MAX_POINT_TO_POINT_CHANNELS") = commd::kMaxPointToPointChannels;
  // The vocabulary's rows (commd/vocabulary.h) Python code names: the types the collectives
  // take and the reduce ops, by their names.
  cp::py::list types, ops;
  for (commd::DataType t : commd::kCollectiveTypes) types.append(commd::DataTypeName(t));
  for (const auto& r : commd::vocabulary::kReduceOps) ops.append(r.name);
  m.attr("COLLECTIVE_TYPES") = cp::py::tuple(types);
  m.attr("REDUCE_OPS") = cp::py::tuple(ops);
}
