#include "tests/integration/etcd_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace commd::testing {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

Etcd::Etcd(std::string dir)
    : dir_(std::move(dir)), client_port_(FreePort()), peer_port_(FreePort()) {}

std::string Etcd::endpoint() const {
  endpoint_given_ = true;
  return absl::StrCat("127.0.0.1:", client_port_);
}

absl::StatusOr<TlsFiles> MakeTlsFiles(const std::string& dir) {
  const TlsFiles f{.ca = dir + "/ca.pem",
                   .server_cert = dir + "/server.pem",
                   .server_key = dir + "/server.key",
                   .client_cert = dir + "/client.pem",
                   .client_key = dir + "/client.key"};
  const std::string ca_key = dir + "/ca.key", ext = dir + "/server.ext";
  std::ofstream(ext) << "subjectAltName=IP:127.0.0.1\n";
  const std::vector<std::vector<std::string>> steps = {
      {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
       "-nodes", "-keyout", ca_key, "-out", f.ca, "-days", "2", "-subj", "/CN=commd-test-ca"},
      {"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", f.server_key, "-out", dir + "/server.csr", "-subj", "/CN=etcd"},
      {"openssl", "x509", "-req", "-in", dir + "/server.csr", "-CA", f.ca, "-CAkey", ca_key,
       "-CAcreateserial", "-out", f.server_cert, "-days", "2", "-extfile", ext},
      {"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", f.client_key, "-out", dir + "/client.csr", "-subj", "/CN=commd"},
      {"openssl", "x509", "-req", "-in", dir + "/client.csr", "-CA", f.ca, "-CAkey", ca_key,
       "-CAcreateserial", "-out", f.client_cert, "-days", "2"},
  };
  for (const auto& argv : steps) {
    const ProcessResult r = RunProcess(argv);
    if (r.exit_code != 0) {
      return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), ": ", r.output));
    }
  }
  return f;
}

absl::Status Etcd::Start() {
  absl::Status s = StartOnce();
  for (int attempt = 0; !s.ok() && !started_ && !endpoint_given_ && attempt < 3 &&
                        absl::StrContains(s.message(), "address already in use");
       ++attempt) {
    client_port_ = FreePort();
    peer_port_ = FreePort();
    s = StartOnce();
  }
  started_ = started_ || s.ok();
  return s;
}

absl::StatusOr<std::vector<std::unique_ptr<Etcd>>> Etcd::StartCluster(const std::string& dir,
                                                                      int members) {
  std::vector<std::unique_ptr<Etcd>> out;
  std::vector<std::string> peers;
  for (int m = 0; m < members; ++m) {
    out.push_back(std::make_unique<Etcd>(absl::StrCat(dir, "/m", m)));
    out.back()->name_ = absl::StrCat("m", m);
    out.back()->endpoint_given_ = true;  // the peers' addresses are in every member's flags
    peers.push_back(absl::StrCat("m", m, "=http://127.0.0.1:", out.back()->peer_port_));
  }
  for (auto& e : out) {
    e->initial_cluster_ = absl::StrJoin(peers, ",");
    RETURN_IF_ERROR(e->Launch());
  }
  for (auto& e : out) RETURN_IF_ERROR(e->WaitReady());
  for (auto& e : out) e->started_ = true;
  return out;
}

absl::Status Etcd::StartOnce() {
  RETURN_IF_ERROR(Launch());
  return WaitReady();
}

absl::Status Etcd::Launch() {
  const std::string scheme = tls_.has_value() ? "https://" : "http://";
  const std::string client = scheme + absl::StrCat("127.0.0.1:", client_port_);
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  std::vector<std::string> argv = {
      kEtcd,
      "--name",
      name_,
      "--data-dir",
      dir_,
      "--listen-client-urls",
      client,
      "--advertise-client-urls",
      client,
      "--listen-peer-urls",
      peer,
      "--initial-advertise-peer-urls",
      peer,
      "--initial-cluster",
      initial_cluster_.empty() ? name_ + "=" + peer : initial_cluster_};
  if (tls_.has_value()) {
    argv.insert(argv.end(), {"--cert-file", tls_->server_cert, "--key-file", tls_->server_key,
                             "--trusted-ca-file", tls_->ca, "--client-cert-auth"});
  }
  ASSIGN_OR_RETURN(process_, ChildProcess::Start(argv));
  return absl::OkStatus();
}

absl::Status Etcd::WaitReady() {
  if (!process_->WaitForLog("ready to serve client requests", absl::Seconds(60))) {
    return absl::UnavailableError("etcd did not start: " + process_->Log());
  }
  return absl::OkStatus();
}

bool Etcd::IsLeader() const {
  // [{"Endpoint":"...","Status":{"header":{"member_id":N,...},"leader":N,...}}]
  const ProcessResult r = RunProcess(Etcdctl({"endpoint", "status", "-w", "json"}),
                                     absl::Seconds(30), {"ETCDCTL_API=3"});
  const nlohmann::json status = nlohmann::json::parse(r.output, nullptr, false);
  if (r.exit_code != 0 || !status.is_array() || status.empty()) return false;
  const nlohmann::json& s = status[0]["Status"];
  return s.is_object() && s.contains("leader") && s["header"].is_object() &&
         s["leader"] == s["header"]["member_id"];
}

void Etcd::Pause(bool paused) {
  if (process_ != nullptr) ::kill(process_->pid(), paused ? SIGSTOP : SIGCONT);
}

void Etcd::Kill() {
  if (process_ != nullptr) (void)process_->Stop(SIGKILL);
  process_.reset();
}

std::vector<std::string> Etcd::Etcdctl(std::vector<std::string> args) const {
  std::vector<std::string> argv = {kEtcdctl, "--endpoints", endpoint()};
  if (tls_.has_value()) {
    argv.insert(argv.end(),
                {"--cacert", tls_->ca, "--cert", tls_->client_cert, "--key", tls_->client_key});
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<std::string> Etcd::Keys(const std::string& prefix) const {
  ProcessResult r = RunProcess(Etcdctl({"get", "--prefix", "--keys-only", prefix}),
                               absl::Seconds(30), {"ETCDCTL_API=3"});
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(r.output, '\n', absl::SkipEmpty())) {
    keys.emplace_back(line);
  }
  return keys;
}

std::string Etcd::Get(const std::string& key) const {
  ProcessResult r =
      RunProcess(Etcdctl({"get", "--print-value-only", key}), absl::Seconds(30), {"ETCDCTL_API=3"});
  return r.output;
}

void Etcd::Delete(const std::string& key) const {
  (void)RunProcess(Etcdctl({"del", key}), absl::Seconds(30), {"ETCDCTL_API=3"});
}

absl::Status Etcd::Put(const std::string& key, const std::string& value) const {
  ProcessResult r = RunProcess({kEtcdctl, "--endpoints", endpoint(), "put", key, value},
                               absl::Seconds(30), {"ETCDCTL_API=3"});
  if (r.exit_code != 0) return absl::InternalError("etcdctl put " + key + ": " + r.output);
  return absl::OkStatus();
}

int64_t Etcd::Version(const std::string& key) const {
  // {"header":{...},"kvs":[{"key":"...",...,"version":1,...}],"count":1}
  const ProcessResult r =
      RunProcess(Etcdctl({"get", "-w", "json", key}), absl::Seconds(30), {"ETCDCTL_API=3"});
  if (r.exit_code != 0) return -1;
  const size_t kvs = r.output.find("\"kvs\"");
  if (kvs == std::string::npos) return 0;
  const size_t at = r.output.find("\"version\":", kvs);
  int64_t version = -1;
  if (at == std::string::npos ||
      !absl::SimpleAtoi(r.output.substr(at + 10, r.output.find_first_of(",}", at) - at - 10),
                        &version)) {
    return -1;
  }
  return version;
}

absl::StatusOr<int64_t> Etcd::Compact() const {
  // {"header":{"cluster_id":...,"revision":42,...},...}
  ProcessResult r =
      RunProcess(Etcdctl({"get", "-w", "json", "/"}), absl::Seconds(30), {"ETCDCTL_API=3"});
  const size_t at = r.output.find("\"revision\":");
  int64_t revision = 0;
  if (r.exit_code != 0 || at == std::string::npos ||
      !absl::SimpleAtoi(r.output.substr(at + 11, r.output.find_first_of(",}", at) - at - 11),
                        &revision)) {
    return absl::InternalError("etcdctl get -w json: " + r.output);
  }
  r = RunProcess(Etcdctl({"compact", absl::StrCat(revision)}), absl::Seconds(30),
                 {"ETCDCTL_API=3"});
  if (r.exit_code != 0) return absl::InternalError("etcdctl compact: " + r.output);
  return revision;
}

int64_t Etcd::LeaseTtl(const std::string& key) const {
  // {"header":{...},"kvs":[{"key":"...",...,"lease":7587869191435616267}],"count":1}
  ProcessResult r = RunProcess({kEtcdctl, "--endpoints", endpoint(), "get", "-w", "json", key},
                               absl::Seconds(30), {"ETCDCTL_API=3"});
  const size_t kvs = r.output.find("\"kvs\"");
  if (r.exit_code != 0 || kvs == std::string::npos) return -1;
  const size_t at = r.output.find("\"lease\":", kvs);
  if (at == std::string::npos) return 0;
  int64_t lease = 0;
  const size_t start = at + 8;
  const size_t end = r.output.find_first_not_of("0123456789", start);
  if (!absl::SimpleAtoi(r.output.substr(start, end - start), &lease)) return -1;
  // "lease 694d7bb1e6d8bc0b granted with TTL(60s), remaining(58s)"
  r = RunProcess(
      {kEtcdctl, "--endpoints", endpoint(), "lease", "timetolive", absl::StrFormat("%x", lease)},
      absl::Seconds(30), {"ETCDCTL_API=3"});
  const size_t ttl = r.output.find("TTL(");
  int64_t seconds = -1;
  if (ttl == std::string::npos ||
      !absl::SimpleAtoi(r.output.substr(ttl + 4, r.output.find('s', ttl + 4) - ttl - 4),
                        &seconds)) {
    return -1;
  }
  return seconds;
}

}  // namespace commd::testing
