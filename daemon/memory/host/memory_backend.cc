#include "daemon/memory/host/memory_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace commd::memory {

absl::StatusOr<MemoryBlock> HostMemoryBackend::Allocate(const Device& device, size_t bytes,
                                                        absl::string_view label) {
  if (device.kind != Device::Kind::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("the host backend serves only 'host', not ", device.ToString()));
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // Sizes beyond what an off_t can hold (or that overflow when rounded to a page) are no
  // memory anyone has.
  const size_t max = static_cast<size_t>(std::numeric_limits<off_t>::max()) / page * page;
  if (bytes == 0 || bytes > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("host allocation of ", bytes, " bytes; allowed 1 to ", max));
  }
  const size_t rounded = (bytes + page - 1) / page * page;
  // The name shows in /proc/<pid>/maps as "/memfd:<label>", which helps whoever debugs a leak.
  const std::string name = std::string(label.substr(0, 200));
  const int raw = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (raw < 0) return ErrnoStatus(errno, absl::StrCat("memfd_create for ", name));
  UniqueFd fd(raw);
  if (::ftruncate(fd.get(), static_cast<off_t>(rounded)) != 0) {
    const int err = errno;
    if (err == ENOSPC || err == ENOMEM || err == EFBIG) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory for ", rounded, " bytes is not there: ", std::strerror(err)));
    }
    return ErrnoStatus(err, absl::StrCat("ftruncate ", name));
  }
  // A client may not resize what it maps: a shrink would make the daemon's own reads of a
  // control block fault (SIGBUS), a grow would escape the job's byte limit.
  SYS_RETURN_IF_ERROR(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
  MemoryBlock block;
  block.device = device;
  block.bytes = rounded;
  block.fd = std::move(fd);
  return block;
}

absl::StatusOr<ExportedMemory> HostMemoryBackend::Export(const MemoryBlock& block) {
  SYS_ASSIGN_OR_RETURN(int dup, ::fcntl(block.fd.get(), F_DUPFD_CLOEXEC, 0));
  ExportedMemory out;
  out.fd.reset(dup);
  return out;
}

void HostMemoryBackend::Release(MemoryBlock block) {
  // Closing the daemon's descriptor is all: mappings clients hold keep the pages until they
  // unmap, and then the kernel frees them.
  block.fd.reset();
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateHostMemoryBackend() {
  return std::make_unique<HostMemoryBackend>();
}

}  // namespace commd::memory
