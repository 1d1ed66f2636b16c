// The daemon through its clients: the SDK, raw gRPC and fd-channel peers, commctl, /metrics.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "commd/commd.h"
#include "commd/v1/health.grpc.pb.h"
#include "commd/v1/node.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/unix_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"
#include "tests/integration/raw_grpc.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

class DaemonClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start(tmp_.Join("run"));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& job = "") {
    ClientOptions options;
    options.runtime_dir = daemon_->runtime_dir();
    options.job_id = job;
    return Client::Connect(options);
  }

  double Metric(const std::string& key) { return MetricValue(*daemon_, key); }

  ProcessResult Commctl(std::vector<std::string> args) {
    std::vector<std::string> argv = {COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv);
  }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(DaemonClientTest, StatusThroughTheSdk) {
  auto client = Connect("job-a");
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->job_id(), "job-a");
  auto status = (*client)->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->pid(), daemon_->pid());
  EXPECT_EQ(status->runtime_dir(), daemon_->runtime_dir());
  EXPECT_EQ(status->metrics_address(), daemon_->metrics_address());
  EXPECT_EQ(status->sessions(), 1u);
  EXPECT_FALSE(status->cuda_status().empty());
  EXPECT_GE(status->uptime_ms(), 0);
}

TEST_F(DaemonClientTest, JobIdFromEnvironmentAndValidation) {
  ::setenv("COMMD_JOB_ID", "from-env", 1);
  auto client = Connect();
  ::unsetenv("COMMD_JOB_ID");
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->job_id(), "from-env");

  auto bad = Connect("../etc");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("job id \"../etc\" is invalid: must not start with '.', '-' or '/'"));
  auto too_long = Connect(std::string(129, 'j'));
  ASSERT_FALSE(too_long.ok());
  EXPECT_THAT(too_long.status().message(), HasSubstr("longer than 128 bytes"));
}

// A name is echoed cut to its first 64 bytes plus its length: whole, a name from 8 KiB up
// would overflow gRPC's trailer limit and come back as RESOURCE_EXHAUSTED "metadata size
// exceeds limit" instead of the INVALID_ARGUMENT that says what is wrong.
TEST_F(DaemonClientTest, LongNamesAreInvalidArgumentWithACutEcho) {
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  // 8 KiB, and 1 MiB less a little for the rest of the request (limits.max_message_bytes
  // is 4 MiB).
  for (const size_t bytes : {size_t{8} << 10, (size_t{1} << 20) - 256}) {
    const std::string name(bytes, 'n');
    const std::string echo = absl::StrCat("\"", std::string(64, 'n'), "…\" (", bytes, " bytes)");
    auto join = (*client)->JoinGroup({.name = name, .rank = 0, .world_size = 1});
    EXPECT_EQ(join.status().code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_EQ(join.status().message(),
              absl::StrCat("group name ", echo, " is invalid: longer than 256 bytes"));
    auto create = (*client)->AllocatePersistent(name, 4096);
    EXPECT_EQ(create.status().code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_THAT(create.status().message(), HasSubstr(absl::StrCat("buffer name ", echo)));
    auto attach = (*client)->AttachPersistent(name);
    EXPECT_EQ(attach.status().code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_THAT(attach.status().message(), HasSubstr(absl::StrCat("buffer name ", echo)));
    auto abort = (*client)->Abort(name, "stop");
    EXPECT_EQ(abort.status().code(), absl::StatusCode::kNotFound) << bytes;
    EXPECT_EQ(abort.status().message(), absl::StrCat("no formed group ", echo, " to abort"));
    auto health = (*client)->GetHealth(name);
    EXPECT_EQ(health.status().code(), absl::StatusCode::kNotFound) << bytes;
    EXPECT_EQ(health.status().message(), absl::StrCat("no group ", echo));
    auto dump = (*client)->Dump(name);
    EXPECT_EQ(dump.status().code(), absl::StatusCode::kNotFound) << bytes;
    EXPECT_EQ(dump.status().message(), absl::StrCat("no formed group ", echo, " to dump"));
  }
  // Job ids travel on the fd channel, whose packets stop at 64 KiB.
  auto job = Connect(std::string(8 << 10, 'j'));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(),
            absl::StrCat("job id \"", std::string(64, 'j'),
                         "…\" (8192 bytes) is invalid: longer than 128 bytes"));
  // The session still works.
  EXPECT_TRUE((*client)->GetStatus().ok());
}

TEST_F(DaemonClientTest, CallsWithoutAValidTokenAreUnauthenticated) {
  auto channel = RawChannel(daemon_->runtime_dir());
  auto node = v1::Node::NewStub(channel);
  EXPECT_EQ(UnauthenticatedProblems([&](grpc::ClientContext& ctx) {
              v1::NodeStatus out;
              return node->GetStatus(&ctx, {}, &out);
            }),
            "");
  EXPECT_EQ(Metric(R"(commd_rpc_errors_total{code="UNAUTHENTICATED",method="GetStatus"})"), 2);
  // The health of groups (their descriptions included) is no more open.
  auto health = v1::Health::NewStub(channel);
  EXPECT_EQ(UnauthenticatedProblems([&](grpc::ClientContext& ctx) {
              v1::GetHealthResponse out;
              return health->GetHealth(&ctx, {}, &out);
            }),
            "");
}

TEST_F(DaemonClientTest, NoDaemonIsUnavailableNamingTheSocket) {
  TempDir empty;
  ClientOptions options;
  options.runtime_dir = empty.path();
  options.connect_timeout = absl::Milliseconds(300);
  auto client = Client::Connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr(empty.path() + "/handles.sock"));

  // COMMD_RUNTIME_DIR is where the SDK looks when no dir is given.
  ::setenv("COMMD_RUNTIME_DIR", empty.path().c_str(), 1);
  auto from_env = Client::Connect({.connect_timeout = absl::Milliseconds(100)});
  ::unsetenv("COMMD_RUNTIME_DIR");
  ASSERT_FALSE(from_env.ok());
  EXPECT_THAT(from_env.status().message(), HasSubstr(empty.path()));
}

TEST_F(DaemonClientTest, GarbageOnEitherSocketDropsOnlyThatConnection) {
  const int baseline_fds = daemon_->CountOpenFds();
  std::mt19937 rng(std::random_device{}());
  std::string garbage(512, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());

  // fd channel: a packet that is not a HandleRequest, then one larger than the limit.
  for (size_t size : {garbage.size(), size_t{100} << 10}) {
    auto conn = ConnectUnix(daemon_->runtime_dir() + "/handles.sock", SOCK_SEQPACKET);
    ASSERT_TRUE(conn.ok()) << conn.status();
    std::string packet = garbage;
    packet.resize(size, 'x');
    ASSERT_TRUE(SendMessage(conn->get(), packet).ok());
    const timeval tv{5, 0};
    ::setsockopt(conn->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    auto reply = ReceiveMessage(conn->get(), 4096);
    ASSERT_FALSE(reply.ok()) << "daemon answered garbage of " << size << " bytes";
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable);  // closed by the daemon
  }
  // gRPC socket: bytes that are not HTTP/2.
  {
    auto conn = ConnectUnix(daemon_->runtime_dir() + "/commd.sock", SOCK_STREAM);
    ASSERT_TRUE(conn.ok());
    ASSERT_EQ(::send(conn->get(), garbage.data(), garbage.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(garbage.size()));
    char buf[256];
    ssize_t n;
    while ((n = ::recv(conn->get(), buf, sizeof(buf), 0)) > 0) {
    }
    EXPECT_EQ(n, 0);  // the daemon hung up
  }
  auto client = Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->GetStatus().ok());
  client->reset();
  EXPECT_TRUE(daemon_->WaitForLog("malformed packet", absl::Seconds(5)));
  EXPECT_TRUE(daemon_->WaitForLog("exceeds 65536 bytes", absl::Seconds(5)));
  // Every connection the garbage opened is closed again.
  for (int i = 0; i < 100 && daemon_->CountOpenFds() > baseline_fds; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LE(daemon_->CountOpenFds(), baseline_fds);
}

TEST_F(DaemonClientTest, SessionsEndWhenClosedOrWhenTheProcessExits) {
  {
    auto client = Connect();
    ASSERT_TRUE(client.ok());
    EXPECT_EQ(Metric("commd_sessions"), 1);
  }
  for (int i = 0; i < 100 && Metric("commd_sessions") != 0; ++i)
    absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(Metric("commd_sessions"), 0);
  EXPECT_EQ(Metric(R"(commd_sessions_released_total{reason="closed"})"), 1);

  // A process that exits without closing anything.
  ProcessResult r = RunProcess({COMMD_TEST_CLIENT, "exit"}, absl::Seconds(30),
                               {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("connected default"));
  for (int i = 0; i < 100 && Metric("commd_sessions") != 0; ++i)
    absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(Metric("commd_sessions"), 0);
  EXPECT_EQ(Metric(R"(commd_sessions_released_total{reason="process_exited"})"), 1);
}

TEST_F(DaemonClientTest, MetricsEndpointServesParsableExposition) {
  auto client = Connect();
  ASSERT_TRUE(client.ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*client)->GetStatus().ok());
  ASSERT_TRUE((*client)->GetTopology().ok());
  auto metrics = Scrape(*daemon_);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const auto& m = *metrics;
  EXPECT_EQ(m.at(R"(commd_build_info{version=")" COMMD_VERSION_STRING R"("})"), 1);
  EXPECT_GT(m.at("commd_start_time_seconds"), 1.7e9);
  EXPECT_EQ(m.at("commd_sessions"), 1);
  EXPECT_EQ(m.at(R"(commd_rpc_duration_seconds_count{method="GetStatus"})"), 5);
  EXPECT_EQ(m.at(R"(commd_rpc_duration_seconds_count{method="GetTopology"})"), 1);
  EXPECT_EQ(m.at(R"(commd_rpc_duration_seconds_bucket{le="+Inf",method="GetStatus"})"), 5);
  EXPECT_GT(m.at(R"(commd_rpc_duration_seconds_sum{method="GetStatus"})"), 0);
  bool topology_info = false;
  for (const auto& [key, value] : m) {
    if (key.rfind("commd_topology_info{", 0) == 0) topology_info = value == 1;
  }
  EXPECT_TRUE(topology_info);
  auto missing = HttpGet(daemon_->metrics_address(), "/nope");
  EXPECT_FALSE(missing.ok());
}

TEST_F(DaemonClientTest, CommctlStatusAndTopoInTextAndJson) {
  ProcessResult text = Commctl({"status"});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr(absl::StrCat("(pid ", daemon_->pid(), ")")));
  EXPECT_THAT(text.output, HasSubstr("runtime dir  " + daemon_->runtime_dir()));

  ProcessResult json = Commctl({"status", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  auto parsed = nlohmann::json::parse(json.output);
  EXPECT_EQ(parsed["pid"], std::to_string(daemon_->pid()));  // int64 is a JSON string
  EXPECT_EQ(parsed["runtime_dir"], daemon_->runtime_dir());
  EXPECT_EQ(parsed["sessions"], 1);

  ProcessResult topo = Commctl({"--json", "topo"});
  ASSERT_EQ(topo.exit_code, 0) << topo.output;
  auto t = nlohmann::json::parse(topo.output);
  EXPECT_GE(t["pus"].get<int>(), 1);
  EXPECT_FALSE(t["numa_nodes"].empty());
  ProcessResult topo_text = Commctl({"topo"});
  ASSERT_EQ(topo_text.exit_code, 0) << topo_text.output;
  EXPECT_THAT(topo_text.output, HasSubstr("NONE"));
}

TEST_F(DaemonClientTest, CommctlErrors) {
  ProcessResult unknown = Commctl({"frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("unknown command 'frobnicate'"));
  ProcessResult none = RunProcess({COMMCTL_BINARY});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_THAT(none.output, HasSubstr("commctl --help"));
  TempDir empty;
  ProcessResult down =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", empty.path(), "--timeout", "0.2", "status"});
  EXPECT_EQ(down.exit_code, 1);
  EXPECT_THAT(down.output, HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(down.output, HasSubstr(empty.path() + "/handles.sock"));
  EXPECT_EQ(std::count(down.output.begin(), down.output.end(), '\n'), 1) << down.output;
  ProcessResult help = RunProcess({COMMCTL_BINARY, "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("Commands:"));
}

TEST_F(DaemonClientTest, DaemonFdsReturnToBaselineAfterClients) {
  {
    auto warm = Connect();
    ASSERT_TRUE(warm.ok());
    ASSERT_TRUE((*warm)->GetStatus().ok());
  }
  absl::SleepFor(absl::Milliseconds(200));
  const int baseline = daemon_->CountOpenFds();
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < 8; ++i) {
      auto c = Connect();
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE((*c)->GetStatus().ok());
      clients.push_back(std::move(*c));
    }
    EXPECT_GT(daemon_->CountOpenFds(), baseline);
  }
  for (int i = 0; i < 250 && daemon_->CountOpenFds() > baseline; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LE(daemon_->CountOpenFds(), baseline);
  EXPECT_EQ(Metric("commd_sessions"), 0);
}

// A daemon on the DGX H100-like fixture (hwloc XML, fake NVML reading `nvml_json`).
absl::StatusOr<std::unique_ptr<DaemonProcess>> StartOnFakeDgxH100(TempDir& tmp,
                                                                  const std::string& nvml_json) {
  std::ofstream(tmp.Join("commd.textproto"))
      << "topology {\n  hwloc_xml: \"" << COMMD_TOPOLOGY_FIXTURES
      << "/dgx_h100.xml\"\n  nvml_library: \"" << COMMD_FAKE_NVML << "\"\n  sysfs_root: \""
      << tmp.path() << "\"\n}\n";
  return DaemonProcess::Start(tmp.Join("run"),
                              {.extra_args = {"--config", tmp.Join("commd.textproto")},
                               .extra_env = {"COMMD_FAKE_NVML_CONFIG=" + nvml_json}});
}

// The whole path from NVML (a fake library, as no GPU is here) and an hwloc topology of a
// DGX H100-like node through the daemon to the SDK, commctl and /metrics.
TEST(DaemonTopologyTest, FakeDgxH100ThroughDaemonSdkCommctlAndMetrics) {
  TempDir tmp;
  auto daemon =
      StartOnFakeDgxH100(tmp, std::string(COMMD_TOPOLOGY_FIXTURES) + "/dgx_h100.nvml.json");
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ClientOptions options;
  options.runtime_dir = (*daemon)->runtime_dir();
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto topo = (*client)->GetTopology();
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_EQ(topo->nvml_status(), "ok");
  EXPECT_EQ(topo->classification(), v1::FULLY_CONNECTED);
  ASSERT_EQ(topo->gpus_size(), 8);
  ASSERT_EQ(topo->gpu_links_size(), 8);
  EXPECT_EQ(topo->gpu_links(0).links(0).label(), "X");
  EXPECT_EQ(topo->gpu_links(0).links(1).label(), "NV18");

  ProcessResult text =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", (*daemon)->runtime_dir(), "topo"});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("NV18"));
  EXPECT_THAT(text.output, HasSubstr("FULLY_CONNECTED"));

  auto metrics = Scrape(**daemon);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->at(R"(commd_topology_nvlinks{gpu="0",peer="1",type="NV18"})"), 18);
  bool info = false;
  for (const auto& [key, value] : *metrics) {
    info = info ||
           (key.find("commd_topology_info{classification=\"FULLY_CONNECTED\",gpus=\"8\"") == 0 &&
            value == 1);
  }
  EXPECT_TRUE(info);
}

// A GPU that NVML reports lost reaches commctl as lost, in words and in JSON, never as SYS.
TEST(DaemonTopologyTest, LostGpuIsShownLostByCommctl) {
  TempDir tmp;
  std::ifstream in(std::string(COMMD_TOPOLOGY_FIXTURES) + "/dgx_h100.nvml.json");
  nlohmann::json nvml = nlohmann::json::parse(in);
  nvml["devices"][5]["lost"] = true;
  std::ofstream(tmp.Join("nvml.json")) << nvml.dump();
  auto daemon = StartOnFakeDgxH100(tmp, tmp.Join("nvml.json"));
  ASSERT_TRUE(daemon.ok()) << daemon.status();

  ProcessResult text =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", (*daemon)->runtime_dir(), "topo"});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output,
              HasSubstr("\nGPU5  LOST  LOST  LOST  LOST  LOST   X    LOST  LOST  N/A"));
  EXPECT_THAT(text.output, HasSubstr("\nGPU5 is LOST: NVML reports it lost"));
  EXPECT_THAT(text.output, HasSubstr("Warning: GPU 5: lost: nvmlDeviceGetName: GPU is lost"));
  for (absl::string_view line : absl::StrSplit(text.output, '\n')) {
    if (absl::StartsWith(line, "GPU5 ")) {
      EXPECT_THAT(line, ::testing::Not(HasSubstr("SYS")));
    }
  }

  ProcessResult json =
      RunProcess({COMMCTL_BINARY, "--runtime-dir", (*daemon)->runtime_dir(), "--json", "topo"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const nlohmann::json t = nlohmann::json::parse(json.output, nullptr, false);
  ASSERT_FALSE(t.is_discarded()) << json.output;
  EXPECT_EQ(t["gpus"][5]["lost"], true) << json.output;
  EXPECT_EQ(t["gpus"][4]["lost"], false) << json.output;
  EXPECT_EQ(t["gpu_links"][0]["links"][5]["label"], "LOST");
  EXPECT_EQ(t["gpu_links"][0]["links"][5]["type"], "LINK_LOST");
  EXPECT_EQ(t["gpu_links"][5]["links"][0]["label"], "LOST");
}

TEST(ClientLibraryTest, SharedLibraryExportsOnlyTheSdk) {
  ProcessResult nm =
      RunProcess({"/usr/bin/nm", "-D", "-C", "--defined-only", COMMD_CLIENT_SHARED_LIBRARY});
  ASSERT_EQ(nm.exit_code, 0) << nm.output;
  int exported = 0;
  for (absl::string_view line : absl::StrSplit(nm.output, '\n', absl::SkipEmpty())) {
    // "<address> <type> <name>"
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    ASSERT_EQ(parts.size(), 3u) << line;
    const absl::string_view name = parts[2];
    if (name == "COMMD_0.1") continue;  // the version node
    ++exported;
    const bool ours = name.find("commd::") != absl::string_view::npos ||
                      name.rfind("descriptor_table_commd_", 0) == 0;
    EXPECT_TRUE(ours) << "exports a symbol that is not the SDK's: " << name;
  }
  EXPECT_GT(exported, 10);
  EXPECT_THAT(nm.output, HasSubstr("commd::Client::Connect("));
}

}  // namespace
}  // namespace commd::testing
