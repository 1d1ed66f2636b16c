#include "common/shm_mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace commd {

absl::StatusOr<SharedMapping> SharedMapping::Map(int fd, size_t bytes) {
  struct stat st {};
  SYS_RETURN_IF_ERROR(::fstat(fd, &st));
  if (bytes == 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map ", bytes, " bytes of a file of ", st.st_size, " bytes"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap of ", bytes, " bytes"));
  return SharedMapping(p, bytes);
}

void SharedMapping::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace commd
