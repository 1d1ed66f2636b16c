#include "common/cuda_driver_api.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/cuda_check.h"
#include "common/dl_library.h"
#include "common/status_macros.h"

namespace commd {
namespace {

#define COMMD_CUDA_DRIVER_FLOOR_CHECK_(member, symbol, version) \
  static_assert(version <= kCudaDriverFloor, #symbol "'s ABI is newer than the driver floor");
COMMD_CUDA_DRIVER_FUNCTIONS(COMMD_CUDA_DRIVER_FLOOR_CHECK_)
#undef COMMD_CUDA_DRIVER_FLOOR_CHECK_

std::string AbiText(int version) { return absl::StrCat(version / 1000, ".", version % 1000 / 10); }

const char* QueryResultName(CUdriverProcAddressQueryResult r) {
  switch (r) {
    case CU_GET_PROC_ADDRESS_SUCCESS:
      return "found";
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND:
      return "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT:
      return "CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT";
  }
  return "unknown query result";
}

// The driver's version, read before anything else: below the floor the rest of the table
// cannot be asked for, and the operator needs the version, not a missing symbol.
absl::StatusOr<int> DriverVersion(const DlLibrary& lib) {
  PFN_cuDriverGetVersion_v2020 get_version = nullptr;
  if (absl::Status st =
          lib.Resolve({{"cuDriverGetVersion", DlAddress(&get_version)}}, "a CUDA driver");
      !st.ok()) {
    return absl::UnavailableError(
        absl::StrCat(st.message(), " (", kCudaDriverLibraryEnv, " names the library to load)"));
  }
  int version = 0;
  if (CUresult r = get_version(&version); r != CUDA_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("cuDriverGetVersion in ", lib.name(), " failed with CUresult ", r));
  }
  if (version < kCudaDriverFloor) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver ", CudaDriverVersionText(version), " in ", lib.name(),
        " is below commd's floor ", CudaDriverVersionText(kCudaDriverFloor),
        ": commd asks for its driver entry points through cuGetProcAddress_v2, new in 12.0; "
        "upgrade the NVIDIA driver"));
  }
  return version;
}

absl::Status Resolve(PFN_cuGetProcAddress_v12000 get_proc, CudaDriverApi& api) {
  // Legacy default stream: the null stream means what it means to the SDK's callers and to
  // its runtime, which are not built with per-thread default streams.
  constexpr cuuint64_t kFlags = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
  const auto resolve = [&](const char* symbol, int version, void** fn) -> absl::Status {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const CUresult r = get_proc(symbol, fn, version, kFlags, &found);
    if (r == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && *fn != nullptr) {
      return absl::OkStatus();
    }
    return absl::UnavailableError(
        absl::StrCat("CUDA driver ", CudaDriverVersionText(api.driver_version), " in ", api.library,
                     " has no ", symbol, " at ABI ", AbiText(version),
                     ": cuGetProcAddress_v2 returned CUresult ", r, ", ", QueryResultName(found)));
  };
#define COMMD_CUDA_DRIVER_RESOLVE_(member, symbol, version) \
  RETURN_IF_ERROR(resolve(#symbol, version, reinterpret_cast<void**>(&api.member)));
  COMMD_CUDA_DRIVER_FUNCTIONS(COMMD_CUDA_DRIVER_RESOLVE_)
#undef COMMD_CUDA_DRIVER_RESOLVE_
  return absl::OkStatus();
}

}  // namespace

std::string CudaDriverVersionText(int version) {
  // Driver branches of the CUDA releases (NVIDIA's release notes, "CUDA Toolkit and
  // Corresponding Driver Versions"): operators know drivers by branch.
  static constexpr struct {
    int version;
    int branch;
  } kBranches[] = {{11040, 470}, {11060, 510}, {11070, 515}, {11080, 520}, {12000, 525},
                   {12010, 530}, {12020, 535}, {12030, 545}, {12040, 550}, {12050, 555},
                   {12060, 560}, {12080, 570}, {12090, 575}, {13000, 580}};
  std::string text = AbiText(version);
  for (const auto& b : kBranches) {
    if (b.version == version) absl::StrAppend(&text, " (R", b.branch, ")");
  }
  return text;
}

absl::Status CheckDriverServesRuntime(int driver_version, const std::string& library,
                                      int runtime_version) {
  const int needed = runtime_version / 1000 * 1000;
  if (driver_version >= needed) return absl::OkStatus();
  // The driver loaded, so it is at or above the floor: a build with the toolkit of its own
  // major version serves it (kCudaDriverFloor's major at the least).
  const int serving_major = std::max(driver_version, kCudaDriverFloor) / 1000;
  return absl::FailedPreconditionError(absl::StrCat(
      "the SDK was built with CUDA runtime ", AbiText(runtime_version),
      ", which needs CUDA driver ", CudaDriverVersionText(needed),
      " or newer; this node's driver is ", CudaDriverVersionText(driver_version), " (", library,
      "): install a commd build made with the CUDA ", serving_major,
      ".x toolkit (it serves drivers from ", CudaDriverVersionText(serving_major * 1000),
      " on), or upgrade the NVIDIA driver to ", CudaDriverVersionText(needed),
      " or newer (docs/operations.md \"The CUDA driver\")"));
}

std::string CudaUuidText(const CUuuid& uuid) {
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    absl::StrAppend(&text, absl::Hex(static_cast<unsigned char>(uuid.bytes[i]), absl::kZeroPad2));
  }
  return text;
}

absl::StatusOr<CudaDriverApi> LoadCudaDriver(const std::string& library) {
  absl::StatusOr<DlLibrary> lib = DlLibrary::Open(library);
  if (!lib.ok()) {
    return absl::UnavailableError(absl::StrCat("no CUDA driver: ", lib.status().message()));
  }
  CudaDriverApi api;
  api.library = library;
  ASSIGN_OR_RETURN(api.driver_version, DriverVersion(*lib));
  PFN_cuGetProcAddress_v12000 get_proc = nullptr;
  if (absl::Status st =
          lib->Resolve({{"cuGetProcAddress_v2", DlAddress(&get_proc)}}, "a CUDA driver");
      !st.ok()) {
    return absl::UnavailableError(absl::StrCat(st.message(), " (it reports version ",
                                               CudaDriverVersionText(api.driver_version), ")"));
  }
  RETURN_IF_ERROR(Resolve(get_proc, api));
  lib->KeepLoaded();  // cuInit starts driver threads; a driver is never unloaded
  if (CUresult r = api.init(0); r != CUDA_SUCCESS) {
    const char* name = nullptr;
    api.get_error_name(r, &name);
    return absl::UnavailableError(absl::StrCat(
        "CUDA driver ", CudaDriverVersionText(api.driver_version), " in ", library,
        " present but cuInit failed: ", name != nullptr ? name : "unknown", " (CUresult ", r, ")"));
  }
  return api;
}

absl::StatusOr<const CudaDriverApi*> CudaDriver() {
  static const absl::StatusOr<CudaDriverApi> api = [] {
    const char* library = std::getenv(kCudaDriverLibraryEnv);
    return LoadCudaDriver(library != nullptr && *library != '\0' ? library : kCudaDriverLibrary);
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

std::string CuErrorText(CUresult result) {
  const char* name = nullptr;
  if (auto api = CudaDriver();
      api.ok() && (*api)->get_error_name(result, &name) == CUDA_SUCCESS && name != nullptr) {
    return name;
  }
  return absl::StrCat("CUresult ", static_cast<int>(result));
}

}  // namespace commd
