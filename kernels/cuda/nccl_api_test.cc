// The NCCL table (kernels/cuda/nccl_api.h) against tests/fixtures/fake_libnccl, which records
// every call and answers as a nonblocking communicator: what a missing, old or wrong library is
// told as, that communicators are made nonblocking and polled to the end, that a stop or a
// deadline while NCCL is in progress aborts the communicator, and how NCCL's errors read. And
// that the toolkit's real libnccl.so.2 resolves every entry point (dlopen needs no GPU).
#include "kernels/cuda/nccl_api.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/testing/scoped_env.h"
#include "gtest/gtest.h"

namespace commd::kernels {
namespace {

// The fake's call log, one call a line.
class NcclApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_ = ::testing::TempDir() + "/fake_nccl_calls_" + std::to_string(::getpid());
    std::filesystem::remove(log_);
  }
  void TearDown() override { std::filesystem::remove(log_); }
  std::vector<std::string> Calls() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    std::vector<std::string> lines = absl::StrSplit(s.str(), '\n', absl::SkipEmpty());
    return lines;
  }
  int CountOf(const std::string& prefix) const {
    int n = 0;
    for (const std::string& c : Calls()) n += c.rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
  }
  NcclApi Load() {
    auto api = LoadNccl(COMMD_FAKE_LIBNCCL);
    EXPECT_TRUE(api.ok()) << api.status();
    return api.ok() ? *api : NcclApi{};
  }
  std::string log_;
};

TEST_F(NcclApiTest, MissingLibraryIsUnavailableNamingIt) {
  auto api = LoadNccl("/nonexistent/libnccl.so.2");
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(absl::IsUnavailable(api.status())) << api.status();
  EXPECT_NE(api.status().message().find("cannot load /nonexistent/libnccl.so.2"), std::string::npos)
      << api.status();
}

TEST_F(NcclApiTest, LibraryWithoutTheEntryPointsIsNamedWithTheFirstMissing) {
  auto api = LoadNccl("libc.so.6");
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().message(),
            "libc.so.6 is not a usable NCCL (2.14 or later): it exports no ncclGetVersion");
}

TEST_F(NcclApiTest, NcclOlderThanTheFloorIsRefusedWithItsVersion) {
  ScopedEnv version("COMMD_FAKE_NCCL_VERSION", "21305");
  auto api = LoadNccl(COMMD_FAKE_LIBNCCL);
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(absl::IsUnavailable(api.status())) << api.status();
  EXPECT_NE(api.status().message().find("is NCCL 2.13.5 (21305); commd needs 2.14 or later"),
            std::string::npos)
      << api.status();
}

TEST_F(NcclApiTest, FakeResolvesWithItsVersion) {
  const NcclApi api = Load();
  EXPECT_EQ(api.version, 22809);
  EXPECT_EQ(api.library, COMMD_FAKE_LIBNCCL);
}

// The process's table from COMMD_NCCL_LIBRARY: one test only, since it is loaded once.
TEST_F(NcclApiTest, TheProcessTableFailsPreconditionNamingTheLibraryAndTheVariable) {
  ScopedEnv library(kNcclLibraryEnv, "/nonexistent/libnccl-test.so");
  auto api = Nccl();
  ASSERT_FALSE(api.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(api.status())) << api.status();
  EXPECT_NE(api.status().message().find(
                "collectives across nodes on CUDA memory need NCCL 2.14 or later (libnccl.so.2"),
            std::string::npos)
      << api.status();
  EXPECT_NE(api.status().message().find("COMMD_NCCL_LIBRARY names another library): cannot "
                                        "load /nonexistent/libnccl-test.so"),
            std::string::npos)
      << api.status();
}

TEST_F(NcclApiTest, CommunicatorsAreNonblockingAndPolledUntilEveryRankJoined) {
  ScopedEnv calls("COMMD_FAKE_NCCL_CALL_LOG", log_);
  ScopedEnv polls("COMMD_FAKE_NCCL_POLLS", "3");
  const NcclApi api = Load();
  ncclUniqueId id{};
  std::snprintf(id.internal, sizeof(id.internal), "the-id");
  auto comm =
      InitNcclComm(api, 4, 2, id, "commd.span/g/1/lane0", nullptr, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(comm.ok()) << comm.status();
  const std::vector<std::string> got = Calls();
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0], "ncclCommInitRankConfig nranks=4 rank=2 blocking=0 id=the-id");
  EXPECT_EQ(CountOf("ncclCommGetAsyncError"), 3);  // in progress twice, then done
  EXPECT_EQ(CountOf("ncclCommAbort"), 0);
  api.comm_abort(*comm);
}

TEST_F(NcclApiTest, AStopWhileInProgressAbortsTheCommunicator) {
  ScopedEnv calls("COMMD_FAKE_NCCL_CALL_LOG", log_);
  ScopedEnv polls("COMMD_FAKE_NCCL_POLLS", "1000000");
  const NcclApi api = Load();
  int asked = 0;
  auto comm = InitNcclComm(
      api, 2, 0, ncclUniqueId{}, "c", [&] { return ++asked > 5; }, absl::Now() + absl::Seconds(30));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsAborted(comm.status())) << comm.status();
  EXPECT_EQ(comm.status().message(), "ncclCommInitRankConfig: stopped while NCCL was in progress");
  EXPECT_EQ(CountOf("ncclCommAbort rank=0"), 1);
}

// A nonblocking abort that answers in progress is polled until it is done.
TEST_F(NcclApiTest, AnAbortInProgressIsPolledToItsEnd) {
  ScopedEnv calls("COMMD_FAKE_NCCL_CALL_LOG", log_);
  const NcclApi api = Load();
  auto comm = InitNcclComm(api, 2, 0, ncclUniqueId{}, "c", nullptr, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(comm.ok()) << comm.status();
  ScopedEnv polls("COMMD_FAKE_NCCL_POLLS", "4");
  AbortNcclComm(api, *comm, absl::Now() + absl::Seconds(5));
  const std::vector<std::string> got = Calls();
  ASSERT_GE(got.size(), 5u);
  EXPECT_EQ(got[got.size() - 5], "ncclCommAbort rank=0");
  for (size_t i = got.size() - 4; i < got.size(); ++i) EXPECT_EQ(got[i], "ncclCommGetAsyncError");
}

TEST_F(NcclApiTest, TheDeadlineWhileInProgressAbortsTheCommunicator) {
  ScopedEnv calls("COMMD_FAKE_NCCL_CALL_LOG", log_);
  ScopedEnv polls("COMMD_FAKE_NCCL_POLLS", "1000000");
  const NcclApi api = Load();
  auto comm =
      InitNcclComm(api, 2, 1, ncclUniqueId{}, "c", nullptr, absl::Now() + absl::Milliseconds(30));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_EQ(CountOf("ncclCommAbort rank=1"), 1);
}

TEST_F(NcclApiTest, ARemoteErrorIsUnavailableWithNcclsStringAndLastError) {
  ScopedEnv calls("COMMD_FAKE_NCCL_CALL_LOG", log_);
  const NcclApi api = Load();
  auto comm = InitNcclComm(api, 2, 0, ncclUniqueId{}, "c", nullptr, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(comm.ok()) << comm.status();
  ScopedEnv polls("COMMD_FAKE_NCCL_POLLS", "2");
  ScopedEnv result("COMMD_FAKE_NCCL_RESULT", "6");
  float* data = reinterpret_cast<float*>(0x1000);
  const ncclResult_t first = api.all_reduce(data, data, 12, ncclFloat32, ncclSum, *comm, nullptr);
  EXPECT_EQ(first, ncclInProgress);
  const absl::Status st =
      WaitNccl(api, *comm, first, "ncclAllReduce", nullptr, absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_EQ(st.message(),
            "ncclAllReduce: remote process exited or there was a network error (ncclResult_t 6); "
            "NCCL's last error: ncclCommGetAsyncError");
  EXPECT_EQ(CountOf("ncclAllReduce send=0x1000 recv=0x1000 count=12 dtype=7 op=0 rank=0"), 1);
  api.comm_abort(*comm);
}

TEST_F(NcclApiTest, TheToolkitsNcclResolvesEveryEntryPoint) {
  const char* home = std::getenv("CUDA_HOME");
  std::string library;
  for (const std::string& dir : {std::string(home != nullptr ? home : "/usr/local/cuda") + "/lib64",
                                 std::string("/usr/lib/x86_64-linux-gnu")}) {
    if (std::filesystem::exists(dir + "/" + kNcclLibrary)) {
      library = dir + "/" + kNcclLibrary;
      break;
    }
  }
  if (library.empty()) GTEST_SKIP() << "no " << kNcclLibrary << " in the toolkit";
  auto api = LoadNccl(library);
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_GE(api->version, kNcclFloor);
  EXPECT_EQ(NcclErrorText(*api, nullptr, ncclInvalidArgument, "ncclAllReduce")
                .rfind("ncclAllReduce: invalid argument (run with NCCL_DEBUG=WARN for details) "
                       "(ncclResult_t 4)",
                       0),
            0u)
      << NcclErrorText(*api, nullptr, ncclInvalidArgument, "ncclAllReduce");
}

}  // namespace
}  // namespace commd::kernels
