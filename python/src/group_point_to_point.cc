// commd.Group's point-to-point calls on host memory (the SDK's Group::Send and friends) and the
// commd.PointToPointRequest they return. A request keeps the memory it moves (and its Python
// objects) alive until it is done.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "group.h"
#include "memory.h"

namespace commd::python {

namespace {

// Runs `fn` without the GIL. Not with pybind11's gil_scoped_release: Python 3.11 ends a daemon
// thread that takes the GIL back during interpreter exit with pthread_exit, whose unwinding
// must meet no noexcept frame (that guard's destructor is one) or the process aborts; a
// request is often waited for on such a thread (commd.torch's Works).
template <typename Fn>
void WithoutGil(Fn fn) {
  PyThreadState* state = PyEval_SaveThread();
  fn();
  PyEval_RestoreThread(state);
}

struct RequestObject {
  explicit RequestObject(const GroupObject& g) : client(g.client), group(g.group) {}
  std::shared_ptr<Client> client;  // Ctrl-C in wait() aborts the group through it
  // Not owned: closing the group ends its messages in flight (CANCELLED), so a request never
  // keeps a group open.
  std::weak_ptr<Group> group;
  std::unique_ptr<PointToPointRequest> request;
  std::vector<std::unique_ptr<HostMemory>> memory;  // released (with the GIL) once done
  std::vector<py::object> objects;                  // what `memory` views
  ~RequestObject() {
    // Waits: the memory is in use until every message is done.
    if (request != nullptr && !request->Done()) WithoutGil([&] { request.reset(); });
    memory.clear();
  }
};

// One op of a batch as the SDK takes it, viewing `buf` (kept in `r`).
PointToPoint Op(RequestObject& r, PointToPoint::Kind kind, const py::object& buf, int peer, int tag,
                const py::object& count, const py::object& dtype) {
  const bool send = kind == PointToPoint::Kind::kSend;
  auto& mem =
      r.memory.emplace_back(std::make_unique<HostMemory>(buf, "buf", dtype, /*writable=*/!send));
  r.objects.push_back(buf);
  size_t n = mem->count();
  if (!count.is_none()) {
    n = count.cast<size_t>();
    if (n > mem->count()) {
      ThrowInvalid(absl::StrCat("count ", n, " exceeds buf's ", mem->count(),
                                " elements (allowed: 0..", mem->count(), ")"));
    }
  }
  if (!mem->type().commd) {
    ThrowInvalid(absl::StrCat("dtype ", mem->type().name, " is not a collective type (",
                              CollectiveTypeNames(), ")"));
  }
  return PointToPoint{.kind = kind,
                      .data = mem->data(),
                      .count = n,
                      .dtype = *mem->type().commd,
                      .peer = peer,
                      .tag = tag};
}

// `peer` as the SDK takes it: None for a receive from any source (kAnySource).
int ParsePeer(const py::object& peer, PointToPoint::Kind kind) {
  const bool send = kind == PointToPoint::Kind::kSend;
  if (peer.is_none()) {
    if (send) ThrowInvalid("send: peer None names no rank (allowed: a rank of the group)");
    return kAnySource;
  }
  const int p = peer.cast<int>();
  if (p < 0) {  // not the SDK's kAnySource: Python says None
    ThrowInvalid(absl::StrCat(send ? "send" : "receive", ": peer ", p,
                              " is out of range (allowed: a rank of the group",
                              send ? ")" : ", or None for any source)"));
  }
  return p;
}

PointToPoint::Kind ParseKind(const py::object& kind) {
  using K = PointToPoint::Kind;
  return ParseChoice<K>(kind, "point-to-point kind", {{"send", K::kSend}, {"recv", K::kRecv}},
                        K::kSend);
}

// Posts `ops` (already in `r`) and returns the request object.
std::unique_ptr<RequestObject> Post(std::unique_ptr<RequestObject> r,
                                    const std::vector<PointToPoint>& ops) {
  // Posting never waits (the channels' threads do), so it keeps the GIL.
  std::shared_ptr<Group> group = r->group.lock();
  r->request = Check(group != nullptr ? group->StartPointToPoint(ops)
                                      : absl::FailedPreconditionError("the group was closed"));
  return r;
}

std::unique_ptr<RequestObject> Start(const GroupObject& g, PointToPoint::Kind kind,
                                     const py::object& buf, int peer, int tag,
                                     const py::object& count, const py::object& dtype) {
  g.get();  // raises once closed
  auto r = std::make_unique<RequestObject>(g);
  const PointToPoint op = Op(*r, kind, buf, peer, tag, count, dtype);
  return Post(std::move(r), {op});
}

// As Blocking (group.h), holding no reference to the group while it waits, and safe on a
// daemon thread at interpreter exit (WithoutGil).
void Wait(RequestObject& r) {
  absl::Status status;
  bool interrupted = false;
  WithoutGil([&] {
    InterruptScope scope([client = r.client, weak = r.group] {
      if (std::shared_ptr<Group> g = weak.lock()) {
        (void)client->Abort(g->name(), InterruptReason(*g, "wait"));
      }
    });
    status = r.request->Wait();
    interrupted = scope.interrupted();
  });
  if (interrupted && PyErr_CheckSignals() != 0) throw py::error_already_set();
  Check(status);
}

constexpr const char* kArgsDoc =
    "`buf`: host memory (a numpy array, a CPU tensor's .numpy(), anything with the buffer "
    "protocol; writable for a receive); `count` elements of it (default: all) of `dtype` "
    "(default: buf's). `peer`: the other rank (a rank of the group over every node for a "
    "spanning group); `tag`: 0 to 2**31-1. Messages of one sender, receiver and tag arrive in "
    "the order they were sent; different peers and tags are independent, so a ring of isends "
    "posted before their irecvs completes. The receiver names the sender's count and dtype "
    "(else ValueError on both). Errors: ValueError (bad peer, tag, dtype, count: nothing "
    "sent), commd.AbortedError once the group is aborted, NotImplementedError on a CUDA "
    "group. Each (sender, receiver, tag) is a two-rank group '<group>/p2p/<from>-<to>/<tag>' "
    "formed by its first message (docs/python.md).";

}  // namespace

void DefPointToPoint(py::module_& m, py::class_<GroupObject>& cls) {
  py::class_<RequestObject>(m, "PointToPointRequest",
                            "Sends and receives in flight (Group.isend, irecv, "
                            "batch_isend_irecv). Their memory is in use until done.")
      .def("wait", &Wait,
           "Blocks until every message is done; raises the first failure. Ctrl-C aborts the "
           "group.")
      .def(
          "done", [](const RequestObject& r) { return r.request->Done(); },
          "Whether every message is done (wait() would not block).")
      .def(
          "source", [](const RequestObject& r, size_t i) { return r.request->source(i); },
          py::arg("i") = 0,
          "The peer of op `i` (0 for isend/irecv); for a receive from any source (peer None), "
          "the rank whose message it took once done (-1 before, or after a failure).");
  using K = PointToPoint::Kind;
  // isend / irecv return the request; send / recv wait for it.
  const auto def = [&cls](const char* name, K kind, bool wait, const std::string& doc) {
    cls.def(
        name,
        [kind, wait](const GroupObject& g, const py::object& buf, const py::object& peer, int tag,
                     const py::object& count, const py::object& dtype) -> py::object {
          std::unique_ptr<RequestObject> r =
              Start(g, kind, buf, ParsePeer(peer, kind), tag, count, dtype);
          if (!wait) return py::cast(std::move(r));
          Wait(*r);
          return kind == K::kRecv ? py::cast(r->request->source()) : py::none();
        },
        py::arg("buf"), py::arg("peer"), py::arg("tag") = 0, py::kw_only(),
        py::arg("count") = py::none(), py::arg("dtype") = py::none(), doc.c_str());
  };
  def("isend", K::kSend, false,
      std::string("isend(buf, peer, tag=0, *, count=None, dtype=None) -> PointToPointRequest: "
                  "sends to `peer` without waiting. ") +
          kArgsDoc);
  def("irecv", K::kRecv, false,
      "irecv(buf, peer, tag=0, *, count=None, dtype=None) -> PointToPointRequest: receives "
      "from `peer` into `buf` without waiting (see isend). peer None: from any source, the "
      "first message any rank sends this one with `tag` (source() names the sender; on one "
      "node only; DeadlineExceededError after the group's timeout with none).");
  def("send", K::kSend, true, "send(...): isend(...).wait().");
  def("recv", K::kRecv, true, "recv(...) -> int: irecv(...).wait(), then the sender's rank.");
  cls.def(
      "batch_isend_irecv",
      [](const GroupObject& g, const py::list& ops) {
        auto r = std::make_unique<RequestObject>(g);
        std::vector<PointToPoint> posted;
        for (const py::handle& item : ops) {
          const py::tuple t = py::reinterpret_borrow<py::object>(item).cast<py::tuple>();
          if (t.size() < 3 || t.size() > 4) {
            ThrowInvalid(
                absl::StrCat("batch_isend_irecv takes (kind, buf, peer[, tag]) "
                             "tuples; got one of ",
                             t.size(), " items"));
          }
          const int tag = t.size() == 4 ? t[3].cast<int>() : 0;
          const K kind = ParseKind(t[0]);
          posted.push_back(Op(*r, kind, t[1], ParsePeer(t[2], kind), tag, py::none(), py::none()));
        }
        return Post(std::move(r), posted);
      },
      py::arg("ops"),
      "batch_isend_irecv(ops) -> PointToPointRequest: posts every (kind, buf, peer[, tag]) "
      "of `ops` (kind 'send' or 'recv'; all checked before any is posted) and returns one "
      "request for them all, as torch.distributed.batch_isend_irecv.");
}

}  // namespace commd::python
