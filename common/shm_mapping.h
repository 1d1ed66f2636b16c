// An owned MAP_SHARED mapping of a file descriptor (memfd), unmapped on destruction.
//
//   ASSIGN_OR_RETURN(SharedMapping m, SharedMapping::Map(fd, bytes));
//   std::memcpy(m.data(), src, n);
#ifndef COMMD_COMMON_SHM_MAPPING_H_
#define COMMD_COMMON_SHM_MAPPING_H_

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"

namespace commd {

class SharedMapping {
 public:
  SharedMapping() = default;
  // Maps `bytes` of `fd` read-write (the fd may be closed afterwards). `bytes` must not exceed
  // the file's size: FAILED_PRECONDITION otherwise, since touching past the end would SIGBUS.
  static absl::StatusOr<SharedMapping> Map(int fd, size_t bytes);
  SharedMapping(SharedMapping&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  SharedMapping& operator=(SharedMapping&& other) noexcept {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }
  ~SharedMapping() { Reset(); }

  void* data() const { return data_; }
  size_t size() const { return size_; }
  void Reset();

 private:
  SharedMapping(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace commd

#endif  // COMMD_COMMON_SHM_MAPPING_H_
