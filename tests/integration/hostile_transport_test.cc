// The daemon's two sockets against clients that mean harm, before and around sessions: a
// PING flood that never reads, connections that never open a session, a full fd table, one
// uid taking every connection or session, and a session token copied into another process.
// Each attack is bounded (fixed counts and durations, unix sockets only) and stops by itself;
// each test asserts both that the attack was contained and that an honest client is served.
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "commd/commd.h"
#include "commd/v1/handles.pb.h"
#include "commd/v1/node.grpc.pb.h"
#include "common/status_macros.h"
#include "common/unix_socket.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

// Clock ticks of CPU the process has used (utime + stime, /proc/<pid>/stat fields 14, 15).
long CpuTicks(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name may hold spaces; fields are counted after its closing parenthesis.
  const std::vector<std::string> fields = absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
  if (fields.size() < 13) return -1;
  return std::stol(fields[11]) + std::stol(fields[12]);
}

int CountLines(const std::string& text, const std::string& needle) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, needle)) ++n;
  }
  return n;
}

class HostileTransportTest : public ::testing::Test {
 protected:
  void Start(const std::string& config) {
    // Other uids must reach the sockets: they may search the test's dir (0755), and the
    // daemon gives its runtime dir and sockets to group nogroup.
    ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
    auto d = StartDaemonWithConfig(tmp_, absl::StrCat("socket_group: \"nogroup\"\n", config));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  std::unique_ptr<Client> Connect() {
    auto c = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = "honest"});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // A test client run as `uid` (group nogroup, which may use the sockets).
  std::vector<std::string> As(int uid, std::vector<std::string> args) {
    args.insert(args.begin(), {"/usr/bin/setpriv", absl::StrCat("--reuid=", uid), "--regid=65534",
                               "--clear-groups", COMMD_TEST_CLIENT});
    return args;
  }
  std::vector<std::string> Env() { return {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir()}; }
  double Metric(const std::string& key) { return MetricValue(*daemon_, key); }
  std::string Socket(const std::string& name) { return daemon_->runtime_dir() + "/" + name; }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// 8 connections that send PINGs and never read: the daemon's RSS stays within 64 MiB of its
// baseline, it cuts the flooders off, and an honest client is served throughout.
TEST_F(HostileTransportTest, PingFloodIsBoundedAndOthersAreServed) {
  Start("");
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->store().Set("k", "v").ok());
  const long baseline = daemon_->RssKib();
  auto flooder =
      ChildProcess::Start({COMMD_HTTP2_FLOODER, Socket("commd.sock"), "8", "20000", "4000"});
  ASSERT_TRUE(flooder.ok()) << flooder.status();
  long peak = baseline;
  int calls = 0;
  while (!(*flooder)->WaitForLog("closed_by_server", absl::Milliseconds(50))) {
    peak = std::max(peak, daemon_->RssKib());
    auto status = client->GetStatus();
    ASSERT_TRUE(status.ok()) << "during the flood: " << status.status();
    ASSERT_TRUE(client->store().Set("k", absl::StrCat(calls)).ok());
    auto value = client->store().Get("k");
    ASSERT_TRUE(value.ok()) << value.status();
    EXPECT_EQ(*value, absl::StrCat(calls));
    ++calls;
  }
  const std::string report = (*flooder)->Log();
  long after = daemon_->RssKib();
  for (int i = 0; i < 50 && after > baseline + 16 * 1024; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    after = daemon_->RssKib();
  }
  std::cout << "ping flood: " << report << "daemon RSS baseline " << baseline << " KiB, peak "
            << peak << " KiB, after " << after << " KiB; " << calls << " honest rounds served\n";
  EXPECT_THAT(report, HasSubstr("closed_by_server 8 of 8"));
  EXPECT_GT(calls, 0);
  EXPECT_LT(peak - baseline, 64 * 1024) << report;
  EXPECT_LT(after - baseline, 16 * 1024) << report;
  EXPECT_TRUE(client->GetStatus().ok());
}

// Connections that open no session are closed after transport.session_timeout_ms, on both
// sockets; a session's connections stay.
TEST_F(HostileTransportTest, ConnectionsWithoutASessionAreClosed) {
  Start("transport { session_timeout_ms: 300 }");
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto handles = ConnectUnix(Socket("handles.sock"), SOCK_SEQPACKET);
  auto grpc_conn = ConnectUnix(Socket("commd.sock"), SOCK_STREAM);
  ASSERT_TRUE(handles.ok() && grpc_conn.ok());
  const timeval tv{10, 0};
  for (const UniqueFd* fd : {&*handles, &*grpc_conn}) {
    ASSERT_EQ(::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    char buf[4096];
    ssize_t n;
    // gRPC greets with its SETTINGS first; then the daemon closes the connection.
    while ((n = ::recv(fd->get(), buf, sizeof(buf), 0)) > 0) {
    }
    EXPECT_EQ(n, 0) << "expected the daemon to close the connection: " << std::strerror(errno);
  }
  EXPECT_EQ(Metric(R"(commd_connections_dropped_total{reason="no_session",socket="handles.sock"})"),
            1);
  EXPECT_EQ(Metric(R"(commd_connections_dropped_total{reason="no_session",socket="commd.sock"})"),
            1);
  // The honest client's connections carry its session: still served.
  EXPECT_TRUE(client->GetStatus().ok());
  EXPECT_TRUE(client->store().Set("a", "b").ok());
}

// Under an fd limit of 64, 200 connections fill the daemon's fd table. It neither spins
// (CPU over a 2 s window stays small) nor floods the log, counts what it refused, and serves
// a new client once the connections are gone.
TEST_F(HostileTransportTest, FullFdTableNeitherSpinsNorFloodsTheLog) {
  Start("transport { session_timeout_ms: 60000 }");
  const rlimit low{64, 64};
  ASSERT_EQ(::prlimit(daemon_->pid(), RLIMIT_NOFILE, &low, nullptr), 0) << std::strerror(errno);
  std::vector<UniqueFd> conns;
  for (int i = 0; i < 100; ++i) {
    for (const auto& [name, type] : {std::pair<std::string, int>{"handles.sock", SOCK_SEQPACKET},
                                     std::pair<std::string, int>{"commd.sock", SOCK_STREAM}}) {
      auto c = ConnectUnix(Socket(name), type);
      if (c.ok()) conns.push_back(*std::move(c));
    }
  }
  absl::SleepFor(absl::Milliseconds(500));  // let the daemon reach its limit
  const long ticks_before = CpuTicks(daemon_->pid());
  const int lines_before = CountLines(daemon_->Log(), "");
  absl::SleepFor(absl::Seconds(2));
  const long ticks = CpuTicks(daemon_->pid()) - ticks_before;
  const int lines = CountLines(daemon_->Log(), "") - lines_before;
  const double refused =
      Metric(R"(commd_connections_refused_total{reason="fd_limit",socket="handles.sock"})") +
      Metric(R"(commd_connections_refused_total{reason="fd_limit",socket="commd.sock"})");
  std::cout << "fd limit 64: " << ticks << " ticks of CPU in 2 s (" << ::sysconf(_SC_CLK_TCK)
            << "/s), " << lines << " log lines, " << refused << " connections refused\n";
  EXPECT_LT(ticks, ::sysconf(_SC_CLK_TCK) / 2);  // a spinning loop would use ~2 s
  EXPECT_LE(lines, 4);  // one "out of file descriptors" line per socket per 5 s at most
  EXPECT_GT(refused, 0);
  conns.clear();
  absl::SleepFor(absl::Milliseconds(500));
  auto client = Connect();  // still under the limit of 64
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->GetStatus().ok());
}

// uid 1001 at its shares of sessions and connections leaves uid 1002 fully served; the
// refusals name the uid, the count, the limit and the field.
TEST_F(HostileTransportTest, OneUidAtItsSharesLeavesOthersServed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids (setpriv)";
  Start("limits { max_sessions: 16 per_uid { sessions: 2 fd_connections: 4 } }");
  std::vector<std::unique_ptr<ChildProcess>> holders;
  for (int i = 0; i < 2; ++i) {
    auto c = ChildProcess::Start(As(1001, {"wait"}), Env());
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->WaitForLog("connected", absl::Seconds(20))) << (*c)->Log();
    holders.push_back(*std::move(c));
  }
  ProcessResult third = RunProcess(As(1001, {"exit"}), absl::Seconds(30), Env());
  EXPECT_NE(third.exit_code, 0);
  EXPECT_THAT(third.output, HasSubstr("uid 1001 holds 2 of its 2 sessions "
                                      "(limits.per_uid.sessions)"));
  // Two sessions hold two fd-channel connections; two more reach the share of four.
  auto hold = ChildProcess::Start(As(1001, {"hold", "4"}), Env());
  ASSERT_TRUE(hold.ok());
  ASSERT_TRUE((*hold)->WaitForLog("held", absl::Seconds(20))) << (*hold)->Log();
  EXPECT_THAT((*hold)->Log(), HasSubstr("held 2"));
  EXPECT_THAT((*hold)->Log(), HasSubstr("refused 8 uid 1001 holds 4 of its 4 connections to "
                                        "handles.sock (limits.per_uid.fd_connections)"));
  EXPECT_EQ(Metric(R"(commd_connections_refused_total{reason="per_uid_limit",)"
                   R"(socket="handles.sock"})"),
            2);
  ProcessResult other = RunProcess(As(1002, {"store-set", "k", "v"}), absl::Seconds(30), Env());
  EXPECT_EQ(other.exit_code, 0) << other.output;
  EXPECT_THAT(other.output, HasSubstr("set"));
}

// A session token works only from the process that opened the session: a copy presented by
// another process, of the same uid or another, is UNAUTHENTICATED.
TEST_F(HostileTransportTest, CopiedTokenIsRefusedInAnotherProcess) {
  Start("");
  auto handles = ConnectUnix(Socket("handles.sock"), SOCK_SEQPACKET);
  ASSERT_TRUE(handles.ok());
  v1::HandleRequest open;
  open.mutable_open_session()->set_job_id("victim");
  ASSERT_TRUE(SendMessage(handles->get(), open.SerializeAsString()).ok());
  auto received = ReceiveMessage(handles->get(), 65536);
  ASSERT_TRUE(received.ok() && received->has_value());
  v1::HandleResponse response;
  ASSERT_TRUE(response.ParseFromString((*received)->bytes));
  const std::string token = response.open_session().session_token();
  ASSERT_FALSE(token.empty()) << response.message();

  // The owner's own calls succeed.
  auto stub = v1::Node::NewStub(
      grpc::CreateChannel("unix:" + Socket("commd.sock"), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("commd-session", token);
  v1::NodeStatus status;
  ASSERT_TRUE(stub->GetStatus(&ctx, {}, &status).ok());

  ProcessResult same_uid =
      RunProcess({COMMD_TEST_CLIENT, "use-token", token}, absl::Seconds(30), Env());
  EXPECT_THAT(same_uid.output, HasSubstr("status 16 session token of pid"));
  EXPECT_THAT(same_uid.output, HasSubstr("honoured only from the process that opened it"));
  if (::geteuid() == 0) {
    ProcessResult other_uid = RunProcess(As(1001, {"use-token", token}), absl::Seconds(30), Env());
    EXPECT_THAT(other_uid.output, HasSubstr("status 16 session token of pid"));
    EXPECT_THAT(other_uid.output, HasSubstr("(uid 1001)"));
  }
  // Closing the session needs the connection that opened it: a copied token on another
  // process's connection is NOT_FOUND (the same answer as a token that does not exist).
  ProcessResult close_same_uid =
      RunProcess({COMMD_TEST_CLIENT, "close-token", token}, absl::Seconds(30), Env());
  EXPECT_THAT(close_same_uid.output,
              HasSubstr("close 5 no open session with that token on this connection"));
  if (::geteuid() == 0) {
    ProcessResult close_other_uid =
        RunProcess(As(1001, {"close-token", token}), absl::Seconds(30), Env());
    EXPECT_THAT(close_other_uid.output,
                HasSubstr("close 5 no open session with that token on this connection"));
  }
  // The refusals left the owner's session intact.
  grpc::ClientContext again;
  again.AddMetadata("commd-session", token);
  EXPECT_TRUE(stub->GetStatus(&again, {}, &status).ok());
}

}  // namespace
}  // namespace commd::testing
