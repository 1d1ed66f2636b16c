#include "daemon/memory/host/memory_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "gtest/gtest.h"

namespace commd::memory {
namespace {

int OpenFds() {
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd");
       it != std::filesystem::directory_iterator(); ++it) {
    ++n;
  }
  return n;
}

off_t SizeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_size;
}

TEST(HostMemoryBackendTest, RoundsToPagesAndSeals) {
  HostMemoryBackend backend;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t bytes : {size_t{1}, page, page + 1, size_t{1} << 20, size_t{3000001}}) {
    auto block = backend.Allocate(Device::Host(), bytes, "test");
    ASSERT_TRUE(block.ok()) << block.status();
    EXPECT_EQ(block->bytes % page, 0u);
    EXPECT_GE(block->bytes, bytes);
    EXPECT_LT(block->bytes, bytes + page);
    EXPECT_EQ(SizeOf(block->fd.get()), static_cast<off_t>(block->bytes));
    const int seals = ::fcntl(block->fd.get(), F_GET_SEALS);
    EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    auto exported = backend.Export(*block);
    ASSERT_TRUE(exported.ok());
    EXPECT_NE(exported->fd.get(), block->fd.get());
    // A client holding the exported fd can neither shrink nor grow it.
    EXPECT_EQ(::ftruncate(exported->fd.get(), 0), -1);
    EXPECT_EQ(errno, EPERM);
    EXPECT_EQ(::ftruncate(exported->fd.get(), block->bytes * 2), -1);
    EXPECT_EQ(SizeOf(block->fd.get()), static_cast<off_t>(block->bytes));
    backend.Release(*std::move(block));
  }
}

TEST(HostMemoryBackendTest, AnotherProcessSeesTheSameBytes) {
  HostMemoryBackend backend;
  auto block = backend.Allocate(Device::Host(), 1 << 20, "shared");
  ASSERT_TRUE(block.ok());
  auto exported = backend.Export(*block);
  ASSERT_TRUE(exported.ok());
  void* mine =
      ::mmap(nullptr, block->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, block->fd.get(), 0);
  ASSERT_NE(mine, MAP_FAILED);
  const pid_t child = ::fork();
  if (child == 0) {
    void* theirs =
        ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, exported->fd.get(), 0);
    if (theirs == MAP_FAILED) ::_exit(1);
    for (size_t i = 0; i < (1 << 20); ++i) static_cast<unsigned char*>(theirs)[i] = i * 7 + 3;
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (size_t i = 0; i < (1 << 20); ++i) {
    ASSERT_EQ(static_cast<unsigned char*>(mine)[i], static_cast<unsigned char>(i * 7 + 3)) << i;
  }
  ::munmap(mine, block->bytes);
}

TEST(HostMemoryBackendTest, BadRequestsSayWhatIsAllowed) {
  HostMemoryBackend backend;
  auto zero = backend.Allocate(Device::Host(), 0, "x");
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("host allocation of 0 bytes; allowed 1 to"),
            absl::string_view::npos);
  auto huge = backend.Allocate(Device::Host(), std::numeric_limits<size_t>::max(), "x");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  auto gpu = backend.Allocate(Device::Cuda(0), 4096, "x");
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gpu.status().message().find("serves only 'host', not cuda:0"), absl::string_view::npos);
}

TEST(HostMemoryBackendTest, NoDescriptorLeaksOverManyCycles) {
  HostMemoryBackend backend;
  const int before = OpenFds();
  for (int i = 0; i < 1000; ++i) {
    auto block = backend.Allocate(Device::Host(), 4096, "cycle");
    ASSERT_TRUE(block.ok());
    auto exported = backend.Export(*block);
    ASSERT_TRUE(exported.ok());
    backend.Release(*std::move(block));
  }
  EXPECT_EQ(OpenFds(), before);
}

TEST(DeviceTest, ParsesAndPrints) {
  EXPECT_EQ(ParseDevice("host")->ToString(), "host");
  EXPECT_EQ(*ParseDevice("cuda:7"), Device::Cuda(7));
  EXPECT_EQ(ParseDevice("cuda:1023")->ToString(), "cuda:1023");
  for (const char* bad : {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:1024", "cuda:+1", "cuda:1x",
                          "HOST", "cuda:00001"}) {
    auto d = ParseDevice(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find("allowed 'host' or 'cuda:N'"), absl::string_view::npos);
  }
}

}  // namespace
}  // namespace commd::memory
