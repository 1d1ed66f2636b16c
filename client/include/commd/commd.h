// commd client SDK: connect a trainer process to the node's commd daemon.
//
//   #include <commd/commd.h>
//
//   auto client = commd::Client::Connect();          // $COMMD_RUNTIME_DIR or the default
//   if (!client.ok()) return client.status();        // UNAVAILABLE names the socket path
//   auto topo = (*client)->GetTopology();            // GPUs, NICs, link matrix
//
// Errors are absl::Status values with gRPC's code set; no exception leaves the SDK. A Client
// is thread-safe: its calls may be made from several threads at once.
#ifndef COMMD_CLIENT_INCLUDE_COMMD_COMMD_H_
#define COMMD_CLIENT_INCLUDE_COMMD_COMMD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "commd/device.h"
#include "commd/group.h"
#include "commd/store.h"
#include "commd/v1/groups.pb.h"
#include "commd/v1/health.pb.h"
#include "commd/v1/node.pb.h"
#include "commd/v1/recorder.pb.h"
#include "commd/v1/topology.pb.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace commd {

struct ClientOptions {
  // Empty: $COMMD_RUNTIME_DIR, then the daemon's default (/run/commd as root, else
  // $XDG_RUNTIME_DIR/commd, else /tmp/commd-$UID).
  std::string runtime_dir;
  // Namespace for everything this client creates. Empty: $COMMD_JOB_ID, then "default".
  std::string job_id;
  // How long Connect keeps trying while the daemon is not (yet) listening.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Deadline of each call to the daemon.
  absl::Duration call_timeout = absl::Seconds(30);
};

class COMMD_API Client {
 public:
  // Opens a session with the daemon: blocks until it is open, the daemon refuses it, or
  // options.connect_timeout passes (then UNAVAILABLE naming the socket path).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options = {});
  // Closes the session; the daemon releases what it owned.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The daemon's version, uptime, sessions and memory in use. Blocks for one round trip.
  absl::StatusOr<v1::NodeStatus> GetStatus();
  // The node's topology as the daemon discovered it at start. Blocks for one round trip.
  absl::StatusOr<v1::Topology> GetTopology();
  // The cluster's nodes as the daemon follows them in etcd (live, and gone within the hour),
  // at most request.limit (1000) per answer by name; page with request.start_after while the
  // answer is truncated. Answered from the daemon's view: costs etcd nothing. Without a
  // cluster FAILED_PRECONDITION. Blocks for one round trip.
  absl::StatusOr<v1::ListClusterNodesResponse> ListClusterNodes(
      const v1::ListClusterNodesRequest& request = {});

  // This job's key-value store; lives as long as the Client.
  Store& store();

  // Writes a flight-recorder dump of this job's formed groups (`group` empty: all of them)
  // into the daemon's dump directory; uid 0 and the admin group may name another `job` or
  // all jobs. Reads shared memory only: works while ranks are stuck or dead.
  absl::StatusOr<v1::DumpResponse> Dump(const std::string& group = "", const std::string& job = "",
                                        bool all_jobs = false);
  // The same with every field of the request. With a cluster, a dump of one job is announced
  // to the job's other nodes, which dump their ranks under the response's dump_id (unless
  // local_only); the call returns once this node's files are written and the announcement is
  // made or failed (announce_error). Blocks.
  absl::StatusOr<v1::DumpResponse> Dump(const v1::DumpRequest& request);

  // Groups of this job (of every job for uid 0 and the admin group), forming or formed.
  absl::StatusOr<v1::ListGroupsResponse> ListGroups();

  // The watchdog's view of this job's groups (`group` empty: all): state and last diagnosis.
  // uid 0 and the admin group may name another `job` or all jobs. Blocks for one round trip.
  absl::StatusOr<v1::GetHealthResponse> GetHealth(const std::string& group = "",
                                                  const std::string& job = "",
                                                  bool all_jobs = false);
  // The same with every field of the request; with `cluster`, also every node's published view
  // of the job's groups (GetHealthResponse.cluster). Blocks for one round trip (and, with
  // `cluster`, one etcd read).
  absl::StatusOr<v1::GetHealthResponse> GetHealth(const v1::GetHealthRequest& request);
  // Aborts `group` of this job (another `job` for uid 0 and the admin group): every rank's
  // collectives fail with ABORTED and `reason`. Returns the ranks notified.
  absl::StatusOr<int> Abort(const std::string& group, const std::string& reason,
                            const std::string& job = "");

  // Joins (or forms) a group of this job: blocks until options.world_size ranks joined, or
  // fails every waiting rank with DEADLINE_EXCEEDED naming the ranks that never came. A rank
  // out of range or a world size that disagrees fails this caller only (INVALID_ARGUMENT);
  // a rank already taken is ALREADY_EXISTS.
  absl::StatusOr<std::unique_ptr<Group>> JoinGroup(const GroupOptions& options);

  // A named buffer of this job that survives this process: a later process of the same job
  // and uid re-attaches by name and sees the same bytes. Freed `ttl` after its last user
  // left (zero: the daemon's default), or by DeletePersistent. ALREADY_EXISTS if the name is
  // taken.
  absl::StatusOr<std::unique_ptr<PersistentBuffer>> AllocatePersistent(
      const std::string& name, size_t bytes, absl::Duration ttl = absl::ZeroDuration(),
      Device device = Device::Host());
  absl::StatusOr<std::unique_ptr<PersistentBuffer>> AttachPersistent(const std::string& name);
  absl::Status DeletePersistent(const std::string& name);

  const std::string& runtime_dir() const;
  const std::string& job_id() const;

  class Impl;  // opaque: internal to the SDK

 private:
  friend class PointToPointChannels;  // joins its channels' groups on the session
  explicit Client(std::shared_ptr<Impl> impl);
  // JoinGroup on `impl`'s session, waiting in `context` (which its owner may cancel).
  static absl::StatusOr<std::unique_ptr<Group>> Join(const std::shared_ptr<Impl>& impl,
                                                     const GroupOptions& options,
                                                     grpc::ClientContext& context);
  // Shared with every Group and buffer, so the session outlives whichever is destroyed last.
  std::shared_ptr<Impl> impl_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_COMMD_H_
