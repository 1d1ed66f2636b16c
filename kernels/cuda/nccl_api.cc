#include "kernels/cuda/nccl_api.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/dl_library.h"
#include "common/status_macros.h"

namespace commd::kernels {
namespace {

const NcclApi* g_testing = nullptr;

std::string VersionText(int code) {
  // NCCL_VERSION: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return absl::StrCat(major, ".", minor, ".", code % 100);
}

}  // namespace

absl::StatusOr<NcclApi> LoadNccl(const std::string& library) {
  ASSIGN_OR_RETURN(DlLibrary lib, DlLibrary::Open(library));
  NcclApi api;
  api.library = library;
  const DlSymbol table[] = {
#define COMMD_NCCL_SYMBOL_(member, symbol, type) {#symbol, DlAddress(&api.member)},
      COMMD_NCCL_FUNCTIONS(COMMD_NCCL_SYMBOL_)
#undef COMMD_NCCL_SYMBOL_
  };
  RETURN_IF_ERROR(lib.Resolve(table, "a usable NCCL (2.14 or later)"));
  if (const ncclResult_t r = api.get_version(&api.version); r != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat(library, ": ncclGetVersion failed (", static_cast<int>(r), ")"));
  }
  if (api.version < kNcclFloor) {
    return absl::UnavailableError(absl::StrCat(
        library, " is NCCL ", VersionText(api.version), " (", api.version,
        "); commd needs 2.14 or later (nonblocking communicators, so that an abort ends a "
        "rank blocked in NCCL)"));
  }
  lib.KeepLoaded();  // communicators live in it
  return api;
}

absl::StatusOr<const NcclApi*> Nccl() {
  if (g_testing != nullptr) return g_testing;
  static const absl::StatusOr<NcclApi> api = []() -> absl::StatusOr<NcclApi> {
    const char* env = std::getenv(kNcclLibraryEnv);
    const std::string library = env != nullptr && *env != '\0' ? env : kNcclLibrary;
    absl::StatusOr<NcclApi> loaded = LoadNccl(library);
    if (loaded.ok()) return loaded;
    return absl::FailedPreconditionError(absl::StrCat(
        "collectives across nodes on CUDA memory need NCCL 2.14 or later (", kNcclLibrary,
        " from the CUDA toolkit, the nvidia-nccl wheel or the libnccl2 package; ", kNcclLibraryEnv,
        " names another library): ", loaded.status().message()));
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

std::string NcclErrorText(const NcclApi& api, ncclComm_t comm, ncclResult_t result,
                          const std::string& call) {
  const char* text = api.get_error_string != nullptr ? api.get_error_string(result) : nullptr;
  const char* last = api.get_last_error != nullptr ? api.get_last_error(comm) : nullptr;
  std::string out = absl::StrCat(call, ": ", text != nullptr ? text : "unknown NCCL result",
                                 " (ncclResult_t ", static_cast<int>(result), ")");
  if (last != nullptr && *last != '\0') absl::StrAppend(&out, "; NCCL's last error: ", last);
  return out;
}

absl::Status NcclError(const NcclApi& api, ncclComm_t comm, ncclResult_t result,
                       const std::string& call) {
  const std::string text = NcclErrorText(api, comm, result, call);
  if (result == ncclRemoteError || result == ncclSystemError) {
    return absl::UnavailableError(text);
  }
  return absl::InternalError(text);
}

absl::Status WaitNccl(const NcclApi& api, ncclComm_t comm, ncclResult_t first,
                      const std::string& call, const std::function<bool()>& stop,
                      absl::Time deadline) {
  ncclResult_t state = first;
  absl::Duration nap = absl::Microseconds(50);
  while (state == ncclInProgress) {
    if (stop && stop()) {
      return absl::AbortedError(absl::StrCat(call, ": stopped while NCCL was in progress"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(call, ": NCCL still in progress (ncclInProgress) at the deadline"));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(1));
    if (const ncclResult_t r = api.comm_get_async_error(comm, &state); r != ncclSuccess) {
      return NcclError(api, comm, r, absl::StrCat(call, " (ncclCommGetAsyncError)"));
    }
  }
  if (state != ncclSuccess) return NcclError(api, comm, state, call);
  return absl::OkStatus();
}

absl::StatusOr<ncclComm_t> InitNcclComm(const NcclApi& api, int nranks, int rank,
                                        const ncclUniqueId& id, const std::string& name,
                                        const std::function<bool()>& stop, absl::Time deadline) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name.c_str();
  ncclComm_t comm = nullptr;
  const ncclResult_t first = api.comm_init_rank_config(&comm, nranks, id, rank, &config);
  if (comm == nullptr) {
    return NcclError(api, nullptr, first == ncclSuccess ? ncclInternalError : first,
                     "ncclCommInitRankConfig");
  }
  absl::Status st = WaitNccl(api, comm, first, "ncclCommInitRankConfig", stop, deadline);
  if (!st.ok()) {
    AbortNcclComm(api, comm, absl::Now() + absl::Seconds(1));
    return st;
  }
  return comm;
}

void AbortNcclComm(const NcclApi& api, ncclComm_t comm, absl::Time deadline) {
  ncclResult_t state = api.comm_abort(comm);
  while (state == ncclInProgress && absl::Now() < deadline) {
    absl::SleepFor(absl::Microseconds(200));
    if (api.comm_get_async_error(comm, &state) != ncclSuccess) return;
  }
}

namespace cuda_internal {
void SetNcclForTesting(const NcclApi* api) { g_testing = api; }
}  // namespace cuda_internal

}  // namespace commd::kernels
