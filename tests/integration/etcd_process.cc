#include "tests/integration/etcd_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

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

std::string Etcd::endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }

absl::Status Etcd::Start() {
  const std::string client = "http://" + endpoint();
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  ASSIGN_OR_RETURN(process_,
                   ChildProcess::Start(
                       {kEtcd, "--name", "t", "--data-dir", dir_, "--listen-client-urls", client,
                        "--advertise-client-urls", client, "--listen-peer-urls", peer,
                        "--initial-advertise-peer-urls", peer, "--initial-cluster", "t=" + peer}));
  if (!process_->WaitForLog("ready to serve client requests", absl::Seconds(60))) {
    return absl::UnavailableError("etcd did not start: " + process_->Log());
  }
  return absl::OkStatus();
}

void Etcd::Pause(bool paused) {
  if (process_ != nullptr) ::kill(process_->pid(), paused ? SIGSTOP : SIGCONT);
}

void Etcd::Kill() {
  if (process_ != nullptr) (void)process_->Stop(SIGKILL);
  process_.reset();
}

std::vector<std::string> Etcd::Keys(const std::string& prefix) const {
  ProcessResult r =
      RunProcess({kEtcdctl, "--endpoints", endpoint(), "get", "--prefix", "--keys-only", prefix},
                 absl::Seconds(30), {"ETCDCTL_API=3"});
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(r.output, '\n', absl::SkipEmpty())) {
    keys.emplace_back(line);
  }
  return keys;
}

std::string Etcd::Get(const std::string& key) const {
  ProcessResult r =
      RunProcess({kEtcdctl, "--endpoints", endpoint(), "get", "--print-value-only", key},
                 absl::Seconds(30), {"ETCDCTL_API=3"});
  return r.output;
}

void Etcd::Delete(const std::string& key) const {
  (void)RunProcess({kEtcdctl, "--endpoints", endpoint(), "del", key}, absl::Seconds(30),
                   {"ETCDCTL_API=3"});
}

}  // namespace commd::testing
