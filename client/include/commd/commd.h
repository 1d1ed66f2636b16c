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
#include "commd/v1/node.pb.h"
#include "commd/v1/topology.pb.h"

// Marks what the shared library exports; everything else stays hidden.
#define COMMD_API __attribute__((visibility("default")))

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

  const std::string& runtime_dir() const;
  const std::string& job_id() const;

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace commd

#endif  // COMMD_CLIENT_INCLUDE_COMMD_COMMD_H_
