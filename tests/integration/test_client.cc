// A client process for tests: connects to the daemon at $COMMD_RUNTIME_DIR and then does what
// its first argument says, so tests can watch the daemon react to real processes.
//   exit    connect, print "connected <job>", exit 0 without closing anything
//   wait    connect, print "connected <job>", sleep until killed
//   peek NAME      connect, then print "persistent <code>" for AttachPersistent(NAME) and
//                  "groups <n>" for the groups ListGroups shows
//   store-set KEY VALUE   connect, set KEY in the job's store, print "set"
//   store-wait KEY        connect, wait (up to 60 s) for KEY, print "waited <code>"
//   store-get KEY         connect, print "got <code> <value>" (value empty unless OK)
//   import TOKEN   open a session and try to redeem TOKEN on the fd channel; prints
//                  "imported" or "refused <status>"
// Commands that fill a limit do N steps, stop at the first refusal, and print "ok <steps
// done>" and, if one failed, "failed <step> <CODE> <message>"; with a last argument "hold"
// they then print "holding" and sleep until killed (keeping what the session holds):
//   persistent N BYTES    AllocatePersistent p0..p{N-1} of BYTES each
//   store-fill N BYTES    store keys k0..k{N-1} with values of BYTES each
//   join N                join groups g0..g{N-1} of world size 1 (a control block each)
//   alloc N BYTES         join group a, then N symmetric allocations of BYTES
//   dump N                join group d, then N Dump requests of it
//   forming N MS          N threads join groups f0..f{N-1} of world size 2 as rank 0 with
//                         MS of rendezvous timeout (they stay forming); each prints
//                         "join <i> <CODE> <message>" when its call returns
//   close-token TOKEN   ask handles.sock to close someone else's session TOKEN on a new
//                  connection; prints "close <code> <message>"
//   use-token TOKEN   call Node.GetStatus on commd.sock with someone else's session TOKEN;
//                  prints "status <code> <message>"
//   hold N         open N raw connections to handles.sock (no session); prints "refused
//                  <code> <message>" for each the daemon refused, then "held <n>", then
//                  sleeps until killed
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "commd/commd.h"
#include "commd/group.h"
#include "commd/v1/handles.pb.h"
#include "commd/v1/node.grpc.pb.h"
#include "common/runtime_dir.h"
#include "common/unix_socket.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace {

int UseToken(const std::string& token) {
  const std::string path = commd::ClientRuntimeDir("") + "/" + commd::kGrpcSocketName;
  auto stub = commd::v1::Node::NewStub(
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata(commd::kSessionMetadataKey, token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  commd::v1::NodeStatus out;
  const grpc::Status s = stub->GetStatus(&ctx, {}, &out);
  std::printf("status %d %s\n", static_cast<int>(s.error_code()), s.error_message().c_str());
  return 0;
}

int Hold(int n) {
  const std::string path = commd::ClientRuntimeDir("") + "/" + commd::kHandleSocketName;
  std::vector<commd::UniqueFd> held;
  for (int i = 0; i < n; ++i) {
    auto conn = commd::ConnectUnix(path, SOCK_SEQPACKET);
    if (!conn.ok()) {
      std::printf("connect failed: %s\n", conn.status().ToString().c_str());
      continue;
    }
    held.push_back(*std::move(conn));
  }
  // A refused connection carries the daemon's answer and then its end; a held one is silent.
  int kept = 0;
  for (commd::UniqueFd& fd : held) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 500) == 0) {
      ++kept;
      continue;
    }
    auto received = commd::ReceiveMessage(fd.get(), 65536);
    commd::v1::HandleResponse response;
    if (received.ok() && received->has_value()) response.ParseFromString((*received)->bytes);
    std::printf("refused %d %s\n", response.code(), response.message().c_str());
  }
  std::printf("held %d\n", kept);
  std::fflush(stdout);
  for (;;) ::pause();
}

}  // namespace

namespace {

// Runs step(0..n-1) until one fails; prints the "ok"/"failed" lines. Holds if asked.
int Fill(int n, bool hold, const std::function<absl::Status(int)>& step) {
  int done = 0;
  for (; done < n; ++done) {
    const absl::Status s = step(done);
    if (!s.ok()) {
      std::printf("ok %d\nfailed %d %s %s\n", done, done,
                  absl::StatusCodeToString(s.code()).c_str(), std::string(s.message()).c_str());
      break;
    }
  }
  if (done == n) std::printf("ok %d\n", done);
  std::fflush(stdout);
  if (hold) {
    std::printf("holding\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<commd::Group>> JoinAlone(commd::Client& client,
                                                        const std::string& name) {
  return client.JoinGroup({.name = name, .rank = 0, .world_size = 1});
}

// The commands that fill a limit (see the top of the file); -1 when `cmd` is none of them.
int FillCommand(commd::Client& client, const std::string& cmd, int n, const char* arg, bool hold) {
  std::vector<std::unique_ptr<commd::Group>> groups;
  std::vector<std::unique_ptr<commd::SymmetricBuffer>> buffers;
  if (cmd == "persistent") {
    return Fill(n, hold, [&](int i) {
      return client.AllocatePersistent("p" + std::to_string(i), std::strtoull(arg, nullptr, 10))
          .status();
    });
  }
  if (cmd == "store-fill") {
    const std::string value(std::strtoull(arg, nullptr, 10), 'v');
    return Fill(n, hold, [&](int i) { return client.store().Set("k" + std::to_string(i), value); });
  }
  if (cmd == "join") {
    return Fill(n, hold, [&](int i) -> absl::Status {
      auto g = JoinAlone(client, "g" + std::to_string(i));
      if (g.ok()) groups.push_back(*std::move(g));
      return g.status();
    });
  }
  if (cmd == "alloc" || cmd == "dump") {
    auto g = JoinAlone(client, cmd == "alloc" ? "a" : "d");
    if (!g.ok()) {
      std::printf("join %s\n", g.status().ToString().c_str());
      return 1;
    }
    return Fill(n, hold, [&](int i) -> absl::Status {
      if (cmd == "dump") {
        auto r = client.Dump("d");
        if (r.ok()) std::printf("dumped %s\n", r->directories(0).c_str());
        return r.status();
      }
      auto b = (*g)->AllocateSymmetric(std::strtoull(arg, nullptr, 10));
      if (b.ok()) buffers.push_back(*std::move(b));
      return b.status();
    });
  }
  return -1;
}

// N threads in rendezvous at once, each printing how its join ended.
int Forming(commd::Client& client, int n, int timeout_ms) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&client, i, timeout_ms] {
      auto g = client.JoinGroup({.name = "f" + std::to_string(i),
                                 .rank = 0,
                                 .world_size = 2,
                                 .timeout = absl::Milliseconds(timeout_ms)});
      std::printf("join %d %s %s\n", i, absl::StatusCodeToString(g.status().code()).c_str(),
                  std::string(g.status().message()).c_str());
      std::fflush(stdout);
    });
  }
  for (std::thread& t : threads) t.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_client exit|wait\n");
    return 2;
  }
  if (std::strcmp(argv[1], "use-token") == 0 && argc == 3) return UseToken(argv[2]);
  if (std::strcmp(argv[1], "hold") == 0 && argc == 3) return Hold(std::atoi(argv[2]));
  if (std::strcmp(argv[1], "close-token") == 0 && argc == 3) {
    const std::string path = commd::ClientRuntimeDir("") + "/" + commd::kHandleSocketName;
    auto conn = commd::ConnectUnix(path, SOCK_SEQPACKET);
    if (!conn.ok()) return 1;
    commd::v1::HandleRequest request;
    request.mutable_close_session()->set_session_token(argv[2]);
    if (!commd::SendMessage(conn->get(), request.SerializeAsString()).ok()) return 1;
    auto received = commd::ReceiveMessage(conn->get(), 65536);
    if (!received.ok() || !received->has_value()) return 1;
    commd::v1::HandleResponse response;
    response.ParseFromString((*received)->bytes);
    std::printf("close %d %s\n", response.code(), response.message().c_str());
    return 0;
  }
  if (std::strcmp(argv[1], "import") == 0 && argc == 3) {
    // A raw fd-channel peer: its own session, then someone else's token.
    const std::string path = commd::ClientRuntimeDir("") + "/" + commd::kHandleSocketName;
    auto conn = commd::ConnectUnix(path, SOCK_SEQPACKET);
    if (!conn.ok()) return 1;
    commd::v1::HandleRequest request;
    request.mutable_import()->add_tokens(argv[2]);
    if (!commd::SendMessage(conn->get(), request.SerializeAsString()).ok()) return 1;
    auto received = commd::ReceiveMessage(conn->get(), 65536);
    if (!received.ok() || !received->has_value()) return 1;
    commd::v1::HandleResponse response;
    response.ParseFromString((*received)->bytes);
    if (response.code() == 0 && !(*received)->fds.empty()) {
      std::printf("imported\n");
    } else {
      std::printf("refused %d %s (%zu fds)\n", response.code(), response.message().c_str(),
                  (*received)->fds.size());
    }
    return 0;
  }
  auto client = commd::Client::Connect();
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::printf("connected %s\n", (*client)->job_id().c_str());
  if (std::strcmp(argv[1], "store-set") == 0 && argc == 4) {
    const absl::Status s = (*client)->store().Set(argv[2], argv[3]);
    std::printf("%s\n", s.ok() ? "set" : s.ToString().c_str());
    return s.ok() ? 0 : 1;
  }
  if (std::strcmp(argv[1], "store-wait") == 0 && argc == 3) {
    const absl::Status s = (*client)->store().Wait({argv[2]}, absl::Seconds(60));
    std::printf("waited %s\n", absl::StatusCodeToString(s.code()).c_str());
    return 0;
  }
  if (std::strcmp(argv[1], "store-get") == 0 && argc == 3) {
    auto value = (*client)->store().Get(argv[2]);
    std::printf("got %s %s\n", absl::StatusCodeToString(value.status().code()).c_str(),
                value.ok() ? value->c_str() : "");
    return 0;
  }
  if (argc >= 3) {
    const bool hold = std::strcmp(argv[argc - 1], "hold") == 0;
    const int n = std::atoi(argv[2]);
    if (std::strcmp(argv[1], "forming") == 0 && argc == 4) {
      return Forming(**client, n, std::atoi(argv[3]));
    }
    const int r = FillCommand(**client, argv[1], n, argc > 3 ? argv[3] : "0", hold);
    if (r >= 0) return r;
  }
  if (std::strcmp(argv[1], "peek") == 0 && argc == 3) {
    auto buffer = (*client)->AttachPersistent(argv[2]);
    std::printf("persistent %s\n", absl::StatusCodeToString(buffer.status().code()).c_str());
    auto groups = (*client)->ListGroups();
    std::printf("groups %d\n", groups.ok() ? groups->groups_size() : -1);
    return 0;
  }
  std::fflush(stdout);
  if (std::strcmp(argv[1], "wait") == 0) {
    for (;;) ::pause();
  }
  // Leave without destructors, as a crashing trainer would.
  ::_exit(0);
}
