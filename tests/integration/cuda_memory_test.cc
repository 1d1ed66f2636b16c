// The daemon's CUDA memory backend and the SDK's CUDA mapping end to end, on the fake driver
// (tests/fixtures/fake_libcuda, loaded by daemon and ranks through COMMD_CUDA_DRIVER_LIBRARY):
// the real daemon, real cuda_rank processes. The fake node has 4 GPUs; each rank sees one of
// them as its cuda:0 through its own CUDA_VISIBLE_DEVICES, as under SLURM or Kubernetes.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"
#include "tests/integration/fake_device_memory.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kConfig[] = "session { release_grace_ms: 200 }\n";
constexpr size_t kBytes = 12345;  // one 2 MiB granule per rank with the pad

// The fake's UUID of physical GPU `i`, as nvidia-smi prints UUIDs.
std::string FakeUuid(int i) {
  return absl::StrCat("GPU-66616b65-2d67-7075-0000-0000000000", i < 16 ? "0" : "", absl::Hex(i));
}

class CudaMemoryTest : public ::testing::Test {
 protected:
  // Starts the daemon on the fake driver with 4 GPUs and `env` added; false (and the test
  // skips) in builds without CUDA.
  bool StartDaemon(std::vector<std::string> env) {
    env.push_back(std::string("COMMD_CUDA_DRIVER_LIBRARY=") + COMMD_FAKE_LIBCUDA);
    env.push_back("COMMD_FAKE_CUDA_DEVICES=4");
    std::ofstream(tmp_.Join("commd.textproto")) << kConfig;
    DaemonProcess::Options options;
    options.extra_env = env;
    options.extra_args = {"--config", tmp_.Join("commd.textproto")};
    auto daemon = DaemonProcess::Start(tmp_.Join("run"), options);
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    if (!daemon.ok()) return false;
    daemon_ = std::move(*daemon);
    auto client = Connect();
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return false;
    client_ = std::move(*client);
    auto status = client_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() && status->cuda_status().rfind("built without CUDA", 0) != 0;
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect() {
    ClientOptions options;
    options.runtime_dir = daemon_->runtime_dir();
    options.job_id = "job";
    return Client::Connect(options);
  }

  // The environment of a rank process of job "job" on this daemon and the fake driver's 4
  // GPUs, seeing `visible` (CUDA_VISIBLE_DEVICES), with `extra` added.
  std::vector<std::string> RankEnv(const std::string& visible,
                                   std::vector<std::string> extra = {}) {
    extra.push_back("COMMD_RUNTIME_DIR=" + daemon_->runtime_dir());
    extra.push_back("COMMD_JOB_ID=job");
    extra.push_back(std::string("COMMD_CUDA_DRIVER_LIBRARY=") + COMMD_FAKE_LIBCUDA);
    extra.push_back("COMMD_FAKE_CUDA_DEVICES=4");
    extra.push_back("CUDA_VISIBLE_DEVICES=" + visible);
    return extra;
  }

  // A cuda_rank whose CUDA_VISIBLE_DEVICES is `visible`, with `env` added; it exits once
  // Go(rank) exists.
  std::unique_ptr<ChildProcess> Rank(const std::string& group, int rank, int world,
                                     const std::string& visible,
                                     std::vector<std::string> env = {}) {
    auto child = ChildProcess::Start({CUDA_RANK, group, std::to_string(rank), std::to_string(world),
                                      std::to_string(kBytes), Go(rank)},
                                     RankEnv(visible, std::move(env)));
    EXPECT_TRUE(child.ok()) << child.status();
    return child.ok() ? std::move(*child) : nullptr;
  }

  // The daemon's ordinals of `group`'s members, by rank.
  std::vector<std::string> MemberDevices(const std::string& group) {
    std::vector<std::string> out;
    auto groups = client_->ListGroups();
    EXPECT_TRUE(groups.ok()) << groups.status();
    if (!groups.ok()) return out;
    for (const auto& g : groups->groups()) {
      if (g.name() != group) continue;
      for (const auto& m : g.members()) out.push_back(m.device());
    }
    return out;
  }

  std::string Go(int rank) const { return tmp_.Join(absl::StrCat("go", rank)); }

  // Runs two ranks, on physical GPUs 2 and 1 (each its own cuda:0), through cuda_rank's
  // allocate / check zero / exchange / dirty / release / allocate again, and checks where
  // the daemon placed them. Then rank 0 leaves while rank 1 still maps its buffer, a job of
  // one rank runs through the same steps on rank 0's GPU (a memory that was freed under rank
  // 1 would be handed to it, zeroed and dirtied), and rank 1 checks rank 0's pattern before
  // it leaves; the daemon must then free everything.
  void RunRound(const std::string& group, const std::vector<std::string>& rank_env) {
    for (int r : {0, 1}) std::filesystem::remove(Go(r));
    auto r0 = Rank(group, 0, 2, "2", rank_env);
    auto r1 = Rank(group, 1, 2, "1,3", rank_env);
    ASSERT_TRUE(r0 && r1);
    ASSERT_TRUE(r0->WaitForLog("OK", absl::Seconds(60))) << r0->Log();
    ASSERT_TRUE(r1->WaitForLog("OK", absl::Seconds(60))) << r1->Log();
    // Both said cuda:0; the daemon placed each on the GPU with its UUID.
    EXPECT_THAT(MemberDevices(group), ::testing::ElementsAre("cuda:2", "cuda:1"));
    EXPECT_GT(
        MetricValue(*daemon_, R"(commd_memory_allocated_bytes{backend="cuda",device="cuda:2"})"),
        0);
    EXPECT_GT(
        MetricValue(*daemon_, R"(commd_memory_allocated_bytes{backend="cuda",device="cuda:1"})"),
        0);
    ExpectExit(*r0, 0);
    // The daemon frees rank 0's share once its session is gone (after the release grace);
    // rank 1's mapping keeps the memory itself alive.
    const std::string gpu2 = R"(commd_memory_allocated_bytes{backend="cuda",device="cuda:2"})";
    for (int i = 0; i < 500 && MetricValue(*daemon_, gpu2) != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ExpectExit(*Rank(group + "-after", 0, 1, "2", rank_env), 0);  // Go(0) exists: runs through
    ExpectExit(*r1, 1);
    ExpectCudaMemoryFreed();
  }

  // Lets rank `rank` go and expects it to exit 0.
  void ExpectExit(ChildProcess& process, int rank) {
    std::ofstream(Go(rank)) << "go";
    auto result = process.Wait(absl::Seconds(30));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 0) << result->output;
  }

  // The daemon gave every allocation back and maps no device memory (it maps each only to
  // zero it).
  void ExpectCudaMemoryFreed() {
    const std::string bytes = R"(commd_memory_allocated_bytes{backend="cuda"})";
    for (int i = 0; i < 500 && MetricValue(*daemon_, bytes) != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(MetricValue(*daemon_, bytes), 0);
    EXPECT_EQ(FakeDeviceMemoryOf(daemon_->pid()).mappings, 0);
  }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

// An NVSwitch node without IMEX: fabric handles are advertised but refused; the daemon falls
// back to POSIX fds once per device, says so, and the job runs. Freed memory comes back to
// the daemon unzeroed from the driver (the fake recycles it, as a GPU does) and reads zero;
// a second round leaks no fd or mapping.
TEST_F(CudaMemoryTest, FabricRefusedFallsBackZeroesRecycledMemoryAndLeaksNothing) {
  if (!StartDaemon({"COMMD_FAKE_CUDA_FABRIC=no-imex"})) GTEST_SKIP() << "built without CUDA";
  ASSERT_NO_FATAL_FAILURE(RunRound("g", {"COMMD_FAKE_CUDA_FABRIC=no-imex"}));
  for (int d : {1, 2}) {
    EXPECT_THAT(daemon_->Log(),
                HasSubstr(absl::StrCat("cuda:", d,
                                       " supports fabric handles but cuMemCreate with one failed "
                                       "(CUDA_ERROR_NOT_PERMITTED")));
  }
  // The driver keeps freed memory for reuse: one granule per GPU, or two on GPU 2 when rank
  // 0's last buffer was freed after rank 1 let go of it (the release grace decides).
  const FakeDeviceMemory pooled = FakeDeviceMemoryOf(daemon_->pid());
  EXPECT_GE(pooled.fds, 2);
  EXPECT_LE(pooled.fds, 3);
  const int fds = daemon_->CountOpenFds();
  ASSERT_NO_FATAL_FAILURE(RunRound("g2", {"COMMD_FAKE_CUDA_FABRIC=no-imex"}));
  // Recycled (and read zero), not made anew: at most the one-rank job's granule is new.
  EXPECT_LE(FakeDeviceMemoryOf(daemon_->pid()).fds, 3);
  EXPECT_LE(daemon_->CountOpenFds(), fds + 2);  // 6 allocations, 10 imports: a leak shows
}

// Fabric handles work: the buffer still travels as a POSIX fd, and the fabric handle that
// comes along is labelled, never taken for a legacy IPC handle.
TEST_F(CudaMemoryTest, WithFabricHandlesRanksStillMapPosixFds) {
  if (!StartDaemon({"COMMD_FAKE_CUDA_FABRIC=1"})) GTEST_SKIP() << "built without CUDA";
  ASSERT_NO_FATAL_FAILURE(RunRound("g", {"COMMD_FAKE_CUDA_FABRIC=1"}));
  EXPECT_THAT(daemon_->Log(), ::testing::Not(HasSubstr("supports fabric handles but")));
}

// Several ranks on one GPU (issue #36): four rank processes that all see physical GPU 2 as
// their cuda:0 join one group; the daemon places every rank on cuda:2, each rank maps the
// others' buffers on that one device and reads their patterns (before and after peers
// leave), and the daemon frees everything once they are gone.
TEST_F(CudaMemoryTest, RanksSharingOneGpuMapEachOthersBuffers) {
  if (!StartDaemon({})) GTEST_SKIP() << "built without CUDA";
  constexpr int kWorld = 4;
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    std::filesystem::remove(Go(r));
    ranks.push_back(Rank("shared", r, kWorld, "2"));
    ASSERT_NE(ranks.back(), nullptr);
  }
  for (auto& r : ranks) ASSERT_TRUE(r->WaitForLog("OK", absl::Seconds(60))) << r->Log();
  EXPECT_THAT(MemberDevices("shared"),
              ::testing::ElementsAre("cuda:2", "cuda:2", "cuda:2", "cuda:2"));
  for (int r = 0; r < kWorld; ++r) ExpectExit(*ranks[r], r);
  ExpectCudaMemoryFreed();
}

// Devices without virtual memory management: cuMemAlloc + legacy IPC handles, zeroed too.
TEST_F(CudaMemoryTest, LegacyIpcBuffersAreZeroedAndPlacedByUuid) {
  if (!StartDaemon({"COMMD_FAKE_CUDA_VMM=0"})) GTEST_SKIP() << "built without CUDA";
  ASSERT_NO_FATAL_FAILURE(RunRound("g", {"COMMD_FAKE_CUDA_VMM=0"}));
}

// A rank on a GPU the daemon does not see (the daemon started under a CUDA_VISIBLE_DEVICES
// that hides it) is refused by name, not given another GPU's memory.
TEST_F(CudaMemoryTest, GpuTheDaemonDoesNotSeeIsNamed) {
  if (!StartDaemon({"CUDA_VISIBLE_DEVICES=0,1"})) GTEST_SKIP() << "built without CUDA";
  auto rank = Rank("g", 0, 1, "3");
  ASSERT_TRUE(rank);
  auto result = rank->Wait(absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1);
  EXPECT_THAT(result->output, HasSubstr(absl::StrCat("FAILED_PRECONDITION: device ", FakeUuid(3),
                                                     " is not one of the CUDA devices commd sees (",
                                                     FakeUuid(0), ", ", FakeUuid(1), ")")));
}

// A lost GPU: the daemon cannot read its UUID and says which and why.
TEST_F(CudaMemoryTest, LostGpuIsNamed) {
  std::ofstream(tmp_.Join("lost")) << "1";
  if (!StartDaemon({"COMMD_FAKE_CUDA_LOST_DEVICE_FILE=" + tmp_.Join("lost")})) {
    GTEST_SKIP() << "built without CUDA";
  }
  auto rank = Rank("g", 0, 1, "1");
  ASSERT_TRUE(rank);
  auto result = rank->Wait(absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1);
  EXPECT_THAT(result->output, HasSubstr(absl::StrCat("device ", FakeUuid(1), " is not one of")));
  EXPECT_THAT(result->output, HasSubstr("cuda:1 unreadable: CUDA_ERROR_DEVICE_UNAVAILABLE"));
}

// A GPU out of memory: RESOURCE_EXHAUSTED to every rank, and the rank that did get memory
// gives it back.
TEST_F(CudaMemoryTest, OutOfDeviceMemoryIsResourceExhaustedAndLeaksNothing) {
  if (!StartDaemon({"COMMD_FAKE_CUDA_MEMORY_BYTES=2097152"})) GTEST_SKIP() << "built without CUDA";
  auto r0 = Rank("g", 0, 2, "0");
  auto r1 = Rank("g", 1, 2, "0");
  ASSERT_TRUE(r0 && r1);
  for (auto* r : {r0.get(), r1.get()}) {
    auto result = r->Wait(absl::Seconds(30));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 1);
    EXPECT_THAT(result->output, HasSubstr("RESOURCE_EXHAUSTED"));
    EXPECT_THAT(result->output, HasSubstr("CUDA_ERROR_OUT_OF_MEMORY"));
  }
  ExpectCudaMemoryFreed();
}

// A named buffer is mapped on the GPU it lives on, found by UUID in each process's own
// enumeration: created on physical GPU 2 (the creator's cuda:0), attached by a process that
// sees that GPU as its cuda:1 (and has no cuda:2 at all); a process that does not see it is
// told which GPU the buffer is on.
TEST_F(CudaMemoryTest, AttachPersistentMapsOnTheGpuWithTheBuffersUuid) {
  if (!StartDaemon({})) GTEST_SKIP() << "built without CUDA";
  auto run = [&](const std::string& mode, const std::string& visible) {
    auto child = ChildProcess::Start({CUDA_RANK, mode, "named"}, RankEnv(visible));
    EXPECT_TRUE(child.ok()) << child.status();
    if (!child.ok()) return ProcessResult{};
    auto result = (*child)->Wait(absl::Seconds(30));
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : ProcessResult{};
  };
  const ProcessResult created = run("create", "2");
  ASSERT_EQ(created.exit_code, 0) << created.output;
  const ProcessResult attached = run("attach", "3,2");
  EXPECT_EQ(attached.exit_code, 0) << attached.output;
  const ProcessResult blind = run("attach", "0,1");
  EXPECT_EQ(blind.exit_code, 1) << blind.output;
  EXPECT_THAT(blind.output,
              HasSubstr(absl::StrCat("FAILED_PRECONDITION: persistent buffer "
                                     "'named' lives on GPU ",
                                     FakeUuid(2), ", which this process does not see")));
}

// The SDK's CUDA collectives with only the kernel launch replaced (cuda_launch_rank): scratch
// per stream, CUDA graph capture refused, a partial coalesced launch failing the group for
// good. The fake driver's call log then shows the order a GPU needs on the way out: the
// context is synchronised before each device mapping is unmapped (the SDK's CuMemMapping),
// and each stream's scratch was a buffer of its own, freed once.
TEST_F(CudaMemoryTest, CollectivesOnTheFakeDriverKeepScratchPerStreamAndFailPartialLaunches) {
#ifndef CUDA_LAUNCH_RANK
  GTEST_SKIP() << "built without CUDA";
#else
  if (!StartDaemon({})) GTEST_SKIP() << "built without CUDA";
  const std::string log = tmp_.Join("calls.log");
  auto child = ChildProcess::Start({CUDA_LAUNCH_RANK, "g"},
                                   RankEnv("3", {"COMMD_FAKE_CUDA_CALL_LOG=" + log}));
  ASSERT_TRUE(child.ok()) << child.status();
  const std::string rank_pid = std::to_string((*child)->pid());  // Wait forgets it
  auto result = (*child)->Wait(absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->exit_code, 0) << result->output;
  EXPECT_THAT(result->output, HasSubstr("OK"));
  std::ifstream in(log);
  std::vector<std::string> calls;  // the rank's, in order
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() == 3 && f[0] == rank_pid) calls.push_back(f[1]);
  }
  int unmaps = 0, frees = 0;
  bool synced = false;
  for (const std::string& c : calls) {
    frees += c == "cuMemFree" ? 1 : 0;  // the scratch of streams 0x1000, 0x2000, 0x3000
    if (c == "cuCtxSynchronize") synced = true;
    if (c == "cuMemUnmap") {
      EXPECT_TRUE(synced) << "unmap " << unmaps << " without a synchronisation before it";
      synced = false;
      ++unmaps;
    }
  }
  EXPECT_EQ(frees, 3) << ::testing::PrintToString(calls);
  EXPECT_GE(unmaps, 1) << ::testing::PrintToString(calls);  // the symmetric buffer
#endif
}

// A rank on a driver older than the CUDA runtime the SDK was built with (the fake reporting
// 12.8, R570, which the daemon's and the SDK's driver floor accept): its first collective fails
// FAILED_PRECONDITION naming both versions and what to install, instead of the runtime's
// cudaErrorInsufficientDriver at the kernels' preload.
TEST_F(CudaMemoryTest, ADriverOlderThanTheSdksRuntimeIsNamedWithWhatToInstall) {
#ifndef CUDA_LAUNCH_RANK
  GTEST_SKIP() << "built without CUDA";
#else
  if (!StartDaemon({})) GTEST_SKIP() << "built without CUDA";
  auto child = ChildProcess::Start({CUDA_LAUNCH_RANK, "old", "status"},
                                   RankEnv("2", {"COMMD_FAKE_CUDA_DRIVER_VERSION=12080"}));
  ASSERT_TRUE(child.ok()) << child.status();
  auto result = (*child)->Wait(absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->exit_code, 0) << result->output;
  if (result->output.find("RUNTIME 12") != std::string::npos) {
    GTEST_SKIP() << "a CUDA 12.x build runs on every driver from 12.0: " << result->output;
  }
  EXPECT_THAT(result->output,
              HasSubstr("STATUS FAILED_PRECONDITION: collectives on CUDA buffers of device cuda:0: "
                        "the SDK was built with CUDA runtime 13."));
  EXPECT_THAT(result->output,
              HasSubstr(", which needs CUDA driver 13.0 (R580) or newer; this node's driver is "
                        "12.8 (R570) ("));
  EXPECT_THAT(result->output,
              HasSubstr("install a commd build made with the CUDA 12.x toolkit (it serves drivers "
                        "from 12.0 (R525) on), or upgrade the NVIDIA driver to 13.0 (R580) or "
                        "newer"));
#endif
}

// A collective on CUDA buffers recorded by hand and run as two all-reduce parts
// (CollectiveOptions::part_of; cuda_launch_rank parts, launches replaced), between two
// all-reduces of the rank's own: the rank's ring holds that one entry between theirs, with
// the sizes it was begun with, completed, flagged by the NaN/Inf the second part's kernel
// counted, and no entry of the parts. The progress words the stream wrote say all completed.
TEST_F(CudaMemoryTest, PartsOfACollectiveOnCudaBuffersWriteItsOneEntry) {
#ifndef CUDA_LAUNCH_RANK
  GTEST_SKIP() << "built without CUDA";
#else
  if (!StartDaemon({})) GTEST_SKIP() << "built without CUDA";
  const std::string release = tmp_.Join("release");
  auto child = ChildProcess::Start({CUDA_LAUNCH_RANK, "parts", "parts", release}, RankEnv("1"));
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->WaitForLog("HOLDING", absl::Seconds(60))) << (*child)->Log();
  auto dump = client_->Dump("parts");
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->files_size(), 1);
  std::ifstream in(dump->files(0));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << dump->files(0);
  const nlohmann::json& entries = j["entries"];
  ASSERT_EQ(entries.size(), 3u) << entries.dump(1);
  for (int i : {0, 2}) {
    const nlohmann::json& own = entries[i];
    EXPECT_EQ(own["collective_seq_id"], i + 1);
    EXPECT_EQ(own["input_sizes"], nlohmann::json::parse("[[16]]"));
    EXPECT_EQ(own["state"], "completed");
    EXPECT_EQ(own["commd"]["nan_found"], false);
  }
  const nlohmann::json& whole = entries[1];
  EXPECT_EQ(whole["collective_seq_id"], 2);
  EXPECT_EQ(whole["profiling_name"], "nccl:all_reduce");
  EXPECT_EQ(whole["input_sizes"], nlohmann::json::parse("[[2048]]"));
  EXPECT_EQ(whole["output_sizes"], nlohmann::json::parse("[[2048]]"));
  EXPECT_EQ(whole["state"], "completed");
  EXPECT_EQ(whole["commd"]["nan_found"], true);
  // Each part counted one check; only the second found any.
  EXPECT_EQ(j["commd"]["counters"]["nan_checks"], 2);
  EXPECT_EQ(j["commd"]["counters"]["nans_found"], 1);
  ASSERT_EQ(j["pg_status"].size(), 1u) << j["pg_status"].dump();
  for (const auto& [pg, status] : j["pg_status"].items()) {
    EXPECT_EQ(status["last_started_collective"], 3) << pg;
    EXPECT_EQ(status["last_completed_collective"], 3) << pg;
  }
  std::ofstream(release) << "go";
  auto result = (*child)->Wait(absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0) << result->output;
  EXPECT_THAT(result->output, HasSubstr("OK"));
#endif
}

// The fused matmuls' CUDA path (cuda_matmul_rank, three ranks on three fake GPUs) with only
// the launches and cuBLAS replaced, the replacements doing each step on the fake's host-backed
// device memory: each rank checks the refusal without cuBLAS, the order of its arrival,
// waits, GEMMs (on each peer's buffer where it lies, own shard first, ring order), scales,
// barrier and reduction, every GEMM's pointers and column-major arguments, and the results
// against a float64 reference.
TEST_F(CudaMemoryTest, FusedMatmulsOnTheFakeDriverFollowTheHostProtocol) {
#ifndef CUDA_MATMUL_RANK
  GTEST_SKIP() << "built without CUDA";
#else
  if (!StartDaemon({})) GTEST_SKIP() << "built without CUDA";
  constexpr int kWorld = 3;
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    auto child = ChildProcess::Start(
        {CUDA_MATMUL_RANK, "fused", std::to_string(r), std::to_string(kWorld)},
        RankEnv(std::to_string(r), {"COMMD_CUBLAS_LIBRARY=/nonexistent/libcublas.so.13"}));
    ASSERT_TRUE(child.ok()) << child.status();
    ranks.push_back(std::move(*child));
  }
  for (int r = 0; r < kWorld; ++r) {
    auto result = ranks[r]->Wait(absl::Seconds(90));
    ASSERT_TRUE(result.ok()) << "rank " << r << ": " << result.status();
    EXPECT_EQ(result->exit_code, 0) << "rank " << r << ": " << result->output;
    EXPECT_THAT(result->output, HasSubstr("OK")) << "rank " << r;
  }
#endif
}

}  // namespace
}  // namespace commd::testing
