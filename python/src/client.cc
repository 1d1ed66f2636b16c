// commd.Client and commd.Store: the daemon's state as dicts, the job's key-value store and
// persistent buffers.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "binding.h"
#include "memory.h"

namespace commd::python {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

py::object MessageToDict(const Message& message);

// One value of `field` (element `index` of a repeated field, -1 for a singular one).
py::object FieldValue(const Message& m, const FieldDescriptor* f, int index) {
  const auto* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return py::int_(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return py::int_(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return py::int_(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return py::int_(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return py::float_(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return py::float_(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return py::bool_(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
    case FieldDescriptor::CPPTYPE_ENUM:
      return py::str((rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name());
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      if (f->type() == FieldDescriptor::TYPE_BYTES) return py::bytes(s);
      return py::str(s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToDict(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return py::none();
}

// Every field by its proto name (unset scalars at their defaults, unset messages None,
// maps as dicts, enums by name), so callers can index without checking presence.
py::object MessageToDict(const Message& message) {
  py::dict out;
  const auto* d = message.GetDescriptor();
  const auto* r = message.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      py::dict map;
      for (int j = 0; j < r->FieldSize(message, f); ++j) {
        const Message& entry = r->GetRepeatedMessage(message, f, j);
        const auto* ed = entry.GetDescriptor();
        map[FieldValue(entry, ed->field(0), -1)] = FieldValue(entry, ed->field(1), -1);
      }
      out[py::str(f->name())] = map;
    } else if (f->is_repeated()) {
      py::list list;
      for (int j = 0; j < r->FieldSize(message, f); ++j) list.append(FieldValue(message, f, j));
      out[py::str(f->name())] = list;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !r->HasField(message, f)) {
      out[py::str(f->name())] = py::none();
    } else {
      out[py::str(f->name())] = FieldValue(message, f, -1);
    }
  }
  return out;
}

// Runs one round trip without the GIL and returns its message as a dict.
template <typename Fn>
py::object CallToDict(Fn fn) {
  decltype(fn()) result = absl::UnknownError("not called");
  {
    py::gil_scoped_release release;
    result = fn();
  }
  return MessageToDict(Check(std::move(result)));
}

template <typename Fn>
auto NoGil(Fn fn) {
  py::gil_scoped_release release;
  return fn();
}

struct StoreObject {
  std::shared_ptr<Client> client;  // the Store lives as long as its Client
  Store& store() const { return client->store(); }
};

std::vector<std::string> Keys(const py::handle& keys) {
  if (py::isinstance<py::str>(keys)) return {keys.cast<std::string>()};
  return keys.cast<std::vector<std::string>>();
}

void BindStore(py::module_& m) {
  py::class_<StoreObject>(m, "Store",
                          "The job's key-value store (Client.store), kept by the daemon. Keys "
                          "are str, values bytes (str values are stored UTF-8 encoded). Another "
                          "job's keys are invisible (NotFoundError).")
      .def(
          "set",
          [](const StoreObject& s, const std::string& key, const std::string& value) {
            Check(NoGil([&] { return s.store().Set(key, value); }));
          },
          py::arg("key"), py::arg("value"), "Stores `value` under `key`, replacing any value.")
      .def(
          "get",
          [](const StoreObject& s, const std::string& key) {
            return py::bytes(Check(NoGil([&] { return s.store().Get(key); })));
          },
          py::arg("key"), "The value under `key` (bytes); NotFoundError when absent.")
      .def(
          "wait",
          [](const StoreObject& s, const py::object& keys, double timeout) {
            auto status = std::make_shared<absl::Status>();
            RunInterruptible([client = s.client, k = Keys(keys), t = Seconds(timeout, "timeout"),
                              status] { *status = client->store().Wait(k, t); });
            Check(*status);
          },
          py::arg("keys"), py::arg("timeout") = 300.0,
          "Blocks until every key exists (a str is one key); DeadlineExceededError naming the "
          "keys still missing after `timeout` seconds (at most the daemon's "
          "groups.max_timeout_ms). Ctrl-C raises KeyboardInterrupt at once.")
      .def(
          "add",
          [](const StoreObject& s, const std::string& key, int64_t delta) {
            return Check(NoGil([&] { return s.store().Add(key, delta); }));
          },
          py::arg("key"), py::arg("delta") = 1,
          "Adds `delta` to the decimal integer under `key` (absent: 0) and returns the sum.")
      .def(
          "compare_set",
          [](const StoreObject& s, const std::string& key, const std::string& expected,
             const std::string& desired) {
            return py::bytes(
                Check(NoGil([&] { return s.store().CompareSet(key, expected, desired); })));
          },
          py::arg("key"), py::arg("expected"), py::arg("desired"),
          "Sets `desired` if the value is `expected` (b'' matches an absent key); returns the "
          "value stored afterwards either way.")
      .def(
          "delete",
          [](const StoreObject& s, const std::string& key) {
            return Check(NoGil([&] { return s.store().Delete(key); }));
          },
          py::arg("key"), "Removes `key`; returns whether it existed.");
}

std::shared_ptr<Client> Connect(std::optional<std::string> runtime_dir,
                                std::optional<std::string> job_id, double connect_timeout,
                                double call_timeout) {
  ClientOptions options;
  options.runtime_dir = runtime_dir.value_or("");
  options.job_id = job_id.value_or("");
  options.connect_timeout = Seconds(connect_timeout, "connect_timeout");
  options.call_timeout = Seconds(call_timeout, "call_timeout");
  auto result = std::make_shared<absl::StatusOr<std::unique_ptr<Client>>>(
      absl::UnknownError("not connected"));
  RunInterruptible([options, result] { *result = Client::Connect(options); });
  return std::shared_ptr<Client>(Check(std::move(*result)));
}

}  // namespace

ClientObject::~ClientObject() {
  py::gil_scoped_release release;  // closing the session is a round trip
  client.reset();
}

void BindClient(py::module_& m) {
  // Names the limits as the daemon states them (commd/limits.h); pybind11 keeps the pointer.
  static const std::string join_doc = absl::StrCat(
      "Joins (or forms) group `name` of this job and blocks until `world_size` ranks joined "
      "(DeadlineExceededError naming the ranks that never came after `timeout` seconds). "
      "watchdog_policy: 'report' | 'notify' | 'terminate'; nan_check: 'off' | 'on' | "
      "'sampled' (with nan_sample_period, ",
      kMinNanSamplePeriod, " to ", kMaxNanSamplePeriod,
      "; 0: the daemon's); nan_policy: 'report' | 'fail'; None: the daemon's config. The first "
      "rank to join decides them. description: the process group's desc in flight-recorder "
      "dumps and `commctl groups` (at most ",
      kMaxGroupDescriptionBytes,
      " printable ASCII bytes; every rank the same; '': 'undefined'). device: 'host' or "
      "'cuda:N' (the group's buffers on that GPU; its collectives run on a cuda_stream). "
      "global_world_size > world_size (at most ",
      kMaxGlobalWorldSize,
      "): the group spans nodes (the daemon's cluster; global_rank then required), and the "
      "call returns once every node's ranks joined (Group.layout). Ctrl-C raises "
      "KeyboardInterrupt at once; the abandoned join leaves the group when it forms.");
  BindStore(m);
  py::class_<ClientObject>(m, "Client",
                           "A session with the node's commd daemon. Thread-safe. Create with "
                           "Client.connect(); closed when the last reference (including its "
                           "groups and buffers) is gone.")
      .def_static(
          "connect",
          [](std::optional<std::string> runtime_dir, std::optional<std::string> job_id,
             double connect_timeout, double call_timeout) {
            return ClientObject{Connect(runtime_dir, job_id, connect_timeout, call_timeout)};
          },
          py::arg("runtime_dir") = py::none(), py::arg("job_id") = py::none(),
          py::arg("connect_timeout") = 10.0, py::arg("call_timeout") = 30.0,
          "Opens a session. runtime_dir None: $COMMD_RUNTIME_DIR, then the daemon's default; "
          "job_id None: $COMMD_JOB_ID, then 'default'. Keeps trying for connect_timeout "
          "seconds while the daemon is not listening (then UnavailableError naming the "
          "socket). call_timeout: deadline of each call to the daemon.")
      .def_property_readonly("runtime_dir",
                             [](const ClientObject& c) { return c.client->runtime_dir(); })
      .def_property_readonly("job_id", [](const ClientObject& c) { return c.client->job_id(); })
      .def_property_readonly(
          "store", [](const ClientObject& c) { return StoreObject{c.client}; },
          "This job's key-value store (commd.Store).")
      .def(
          "status",
          [](ClientObject& c) { return CallToDict([&] { return c.client->GetStatus(); }); },
          "The daemon's version, uptime, sessions and memory in use (commd.v1.NodeStatus as "
          "a dict).")
      .def(
          "topology",
          [](ClientObject& c) { return CallToDict([&] { return c.client->GetTopology(); }); },
          "The node's GPUs, NICs and link matrix (commd.v1.Topology as a dict).")
      .def(
          "groups",
          [](ClientObject& c) {
            return py::object(CallToDict([&] { return c.client->ListGroups(); })["groups"]);
          },
          "This job's groups, forming or formed (a list of commd.v1 group dicts).")
      .def(
          "health",
          [](ClientObject& c, const std::string& group, const std::string& job, bool all_jobs) {
            return CallToDict([&] { return c.client->GetHealth(group, job, all_jobs); });
          },
          py::arg("group") = "", py::arg("job") = "", py::arg("all_jobs") = false,
          "The watchdog's view of this job's groups (commd.v1.GetHealthResponse as a dict).")
      .def(
          "dump",
          [](ClientObject& c, const std::string& group, const std::string& job, bool all_jobs) {
            return CallToDict([&] { return c.client->Dump(group, job, all_jobs); });
          },
          py::arg("group") = "", py::arg("job") = "", py::arg("all_jobs") = false,
          "Writes a flight-recorder dump of this job's groups into the daemon's dump "
          "directory (commd.v1.DumpResponse as a dict).")
      .def(
          "abort",
          [](ClientObject& c, const std::string& group, const std::string& reason,
             const std::string& job) {
            return Check(NoGil([&] { return c.client->Abort(group, reason, job); }));
          },
          py::arg("group"), py::arg("reason"), py::arg("job") = "",
          "Aborts `group`: every rank's collectives raise AbortedError with `reason`. Returns "
          "the number of ranks notified.")
      .def(
          "allocate_persistent",
          [](ClientObject& c, const std::string& name, size_t nbytes, double ttl) {
            auto ttl_d = Seconds(ttl, "ttl");
            return WrapPersistent(
                Check(NoGil([&] { return c.client->AllocatePersistent(name, nbytes, ttl_d); })));
          },
          py::arg("name"), py::arg("nbytes"), py::arg("ttl") = 0.0,
          "A named host buffer of this job that outlives this process; freed `ttl` seconds "
          "after its last user left (0: the daemon's default). AlreadyExistsError if taken.")
      .def(
          "attach_persistent",
          [](ClientObject& c, const std::string& name) {
            return WrapPersistent(Check(NoGil([&] { return c.client->AttachPersistent(name); })));
          },
          py::arg("name"), "Maps the persistent buffer `name`; NotFoundError if absent.")
      .def(
          "delete_persistent",
          [](ClientObject& c, const std::string& name) {
            Check(NoGil([&] { return c.client->DeletePersistent(name); }));
          },
          py::arg("name"), "Frees the persistent buffer `name` once no process maps it.")
      .def(
          "join_group",
          [](ClientObject& c, const std::string& name, int rank, int world_size,
             std::optional<int> global_rank, int global_world_size, double timeout,
             const py::object& watchdog_policy, const py::object& nan_check,
             uint32_t nan_sample_period, const py::object& nan_policy,
             const std::string& description, const std::string& device) {
            return JoinGroup(c.client,
                             {.name = name,
                              .rank = rank,
                              .world_size = world_size,
                              .global_rank = global_rank.value_or(-1),
                              .global_world_size = global_world_size,
                              .description = description,
                              .device = ParseDevice(device)},
                             timeout, watchdog_policy, nan_check, nan_sample_period, nan_policy);
          },
          py::arg("name"), py::arg("rank"), py::arg("world_size"), py::kw_only(),
          py::arg("global_rank") = py::none(), py::arg("global_world_size") = 0,
          py::arg("timeout") = 600.0, py::arg("watchdog_policy") = py::none(),
          py::arg("nan_check") = py::none(), py::arg("nan_sample_period") = 0,
          py::arg("nan_policy") = py::none(), py::arg("description") = "",
          py::arg("device") = "host", join_doc.c_str());
}

}  // namespace commd::python
