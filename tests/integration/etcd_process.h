// A real etcd member (Debian's etcd-server, /usr/bin/etcd) on loopback for the cluster's
// tests, and the small tools they share: a free port, a poll with a generous limit.
//
//   Etcd etcd(tmp.Join("etcd"));
//   ASSERT_TRUE(etcd.Start().ok());         // waits for "ready to serve client requests"
//   ... daemons with cluster { etcd_endpoints: etcd.endpoint() } ...
//   EXPECT_TRUE(etcd.Keys("/commd-test/jobs/").empty());
//   etcd.Kill();                            // Start again keeps the data dir and ports
//
// Not thread-safe: one test drives it.
#ifndef COMMD_TESTS_INTEGRATION_ETCD_PROCESS_H_
#define COMMD_TESTS_INTEGRATION_ETCD_PROCESS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/child_process.h"

namespace commd::testing {

inline constexpr char kEtcd[] = "/usr/bin/etcd";
inline constexpr char kEtcdctl[] = "/usr/bin/etcdctl";

// A loopback port nobody listens on now (the kernel's pick; it is not reused at once).
int FreePort();

// A test CA and the certificates it signs (PEM files in one dir), made with openssl: etcd's
// server certificate for 127.0.0.1, and a client certificate whose common name is the etcd
// user.
struct TlsFiles {
  std::string ca;
  std::string server_cert, server_key;
  std::string client_cert, client_key;
};
absl::StatusOr<TlsFiles> MakeTlsFiles(const std::string& dir);

// One etcd member on loopback with its data in `dir`; Start again after Kill keeps the data.
class Etcd {
 public:
  explicit Etcd(std::string dir);
  // `members` members of one etcd cluster, their data in dir/m0, dir/m1, ..., started together
  // (a member serves clients only once a quorum of them is up). Start a killed one again alone.
  static absl::StatusOr<std::vector<std::unique_ptr<Etcd>>> StartCluster(const std::string& dir,
                                                                         int members);
  std::string endpoint() const;
  // Before Start: serve clients over TLS with `files`' server certificate, and ask every
  // client for a certificate signed by its CA (--client-cert-auth).
  void UseTls(TlsFiles files) { tls_ = std::move(files); }
  // A first start whose ports another process took meanwhile (FreePort's pick is not held)
  // tries new ones, unless the endpoint was already handed out; a start again keeps them.
  absl::Status Start();
  void Kill();
  // SIGSTOP / SIGCONT: etcd stops answering (calls wait for their deadline) and then goes on.
  void Pause(bool paused);
  // This member leads its cluster now (`etcdctl endpoint status`).
  bool IsLeader() const;
  // The keys under `prefix`, as etcdctl lists them.
  std::vector<std::string> Keys(const std::string& prefix) const;
  // The value of `key` ("" when absent).
  std::string Get(const std::string& key) const;
  // Deletes `key`, as an operator (or an expired lease) would.
  void Delete(const std::string& key) const;
  // Writes `value` (any bytes but NUL) at `key`, as another writer of etcd would.
  absl::Status Put(const std::string& key, const std::string& value) const;
  // How many times `key` was written since it was created (etcd's version): 0 when absent,
  // -1 when etcdctl's answer does not say.
  int64_t Version(const std::string& key) const;
  // Compacts etcd's history up to its current revision, as an operator or
  // --auto-compaction-retention does: a watch that would resume from before it is cancelled.
  // Returns the revision.
  absl::StatusOr<int64_t> Compact() const;
  // The TTL the lease `key` hangs on was granted with, in seconds: 0 when the key has no lease,
  // -1 when it is absent or etcdctl's answer does not say.
  int64_t LeaseTtl(const std::string& key) const;

 private:
  // etcdctl and its flags (TLS: the CA and the client certificate).
  std::vector<std::string> Etcdctl(std::vector<std::string> args) const;

  std::string dir_;
  std::optional<TlsFiles> tls_;
  std::string name_ = "t";
  std::string initial_cluster_;  // --initial-cluster; "" for a cluster of this member alone
  // Starts etcd once on the current ports: Launch, then WaitReady.
  absl::Status StartOnce();
  absl::Status Launch();
  absl::Status WaitReady();

  int client_port_;
  int peer_port_;
  mutable bool endpoint_given_ = false;  // endpoint() was called
  bool started_ = false;                 // a start succeeded
  std::unique_ptr<ChildProcess> process_;
};

// Polls `done` every 50 ms for up to `limit` (generous: the machine is shared).
template <typename F>
bool Eventually(F done, absl::Duration limit = absl::Seconds(30)) {
  for (absl::Time end = absl::Now() + limit; absl::Now() < end;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return done();
}

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_ETCD_PROCESS_H_
