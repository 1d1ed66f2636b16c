// What a process holds of tests/fixtures/fake_libcuda's device memory (memfds named
// "fake-cuda-memory"): open fds and mappings, read from /proc. Shared by cuda_memory_test
// (about the daemon) and cuda_rank (about itself), for leak checks.
#ifndef COMMD_TESTS_INTEGRATION_FAKE_DEVICE_MEMORY_H_
#define COMMD_TESTS_INTEGRATION_FAKE_DEVICE_MEMORY_H_

#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace commd::testing {

struct FakeDeviceMemory {
  int fds = 0;
  int mappings = 0;
};

inline FakeDeviceMemory FakeDeviceMemoryOf(pid_t pid) {
  constexpr char kName[] = "fake-cuda-memory";
  const std::string proc = "/proc/" + std::to_string(pid);
  FakeDeviceMemory out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    if (std::filesystem::read_symlink(e.path(), ec).string().find(kName) != std::string::npos) {
      ++out.fds;
    }
  }
  std::ifstream maps(proc + "/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(kName) != std::string::npos) ++out.mappings;
  }
  return out;
}

}  // namespace commd::testing

#endif  // COMMD_TESTS_INTEGRATION_FAKE_DEVICE_MEMORY_H_
