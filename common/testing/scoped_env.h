// ScopedEnv: one environment variable set for the life of a test's scope, then restored (to
// its earlier value, or unset). The fakes of tests/fixtures (fake_libcuda, fake_libcublas,
// fake_libnccl) read their orders from the environment at each call.
//
//   ScopedEnv version("COMMD_FAKE_CUDA_DRIVER_VERSION", "12020");
//
// Not thread-safe (setenv is not): tests set it before starting threads.
#ifndef COMMD_COMMON_TESTING_SCOPED_ENV_H_
#define COMMD_COMMON_TESTING_SCOPED_ENV_H_

#include <optional>
#include <string>

namespace commd {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const std::string name_;
  std::optional<std::string> old_;  // nullopt: was unset
};

}  // namespace commd

#endif  // COMMD_COMMON_TESTING_SCOPED_ENV_H_
