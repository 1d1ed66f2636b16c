// The one table of NCCL entry points commd calls (the collectives of a group spanning nodes on
// CUDA memory, client/src/cuda_span_collectives.cc), loaded with dlopen as
// kernels/cuda/cublas_api.h loads cuBLAS: the SDK links no NCCL, so it still loads (and its
// host and node-local groups run) on machines without it, and only a spanning CUDA group's
// first collective needs it.
//
//   ASSIGN_OR_RETURN(const NcclApi* nccl, Nccl());
//   ASSIGN_OR_RETURN(ncclComm_t comm, InitNcclComm(*nccl, nodes, node, id, stop, deadline));
//   RETURN_IF_ERROR(WaitNccl(*nccl, comm, nccl->all_reduce(...), "ncclAllReduce", stop, deadline));
//
// The library is $COMMD_NCCL_LIBRARY when set (a path or a soname), else libnccl.so.2.
// Floor: NCCL 2.14, for nonblocking communicators (ncclConfig_t.blocking = 0), which is what
// lets an abort end a rank blocked in NCCL: no NCCL call then blocks the calling thread, each
// may return ncclInProgress, and the caller polls ncclCommGetAsyncError until it is no
// longer in progress, checking its own stop condition between polls; ncclCommAbort then ends
// the communicator and whatever of it still runs on the device (NCCL's "Fault tolerance"
// documentation; PyTorch's ProcessGroupNCCL does the same under
// TORCH_NCCL_USE_COMM_NONBLOCKING). ncclGetLastError (2.13) and ncclRedOpCreatePreMulSum
// (2.11) are older, as are ncclSend/ncclRecv and ncclGroupStart/ncclGroupEnd (2.7; on a
// nonblocking communicator ncclGroupEnd may return ncclInProgress and is polled like a call). Only
// in builds with CUDA headers (nccl.h from the toolkit).
#ifndef COMMD_KERNELS_CUDA_NCCL_API_H_
#define COMMD_KERNELS_CUDA_NCCL_API_H_

#include <nccl.h>

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace commd::kernels {

inline constexpr char kNcclLibrary[] = "libnccl.so.2";
inline constexpr char kNcclLibraryEnv[] = "COMMD_NCCL_LIBRARY";
inline constexpr int kNcclFloor = 21400;  // ncclGetVersion's code for 2.14.0

using NcclGetVersionFn = ncclResult_t (*)(int*);
using NcclGetUniqueIdFn = ncclResult_t (*)(ncclUniqueId*);
using NcclCommInitRankConfigFn = ncclResult_t (*)(ncclComm_t*, int nranks, ncclUniqueId, int rank,
                                                  ncclConfig_t*);
using NcclCommFn = ncclResult_t (*)(ncclComm_t);
using NcclCommGetAsyncErrorFn = ncclResult_t (*)(ncclComm_t, ncclResult_t*);
using NcclGetErrorStringFn = const char* (*)(ncclResult_t);
using NcclGetLastErrorFn = const char* (*)(ncclComm_t);
using NcclAllReduceFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                         ncclComm_t, cudaStream_t);
using NcclBroadcastFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int root,
                                         ncclComm_t, cudaStream_t);
using NcclRedOpCreatePreMulSumFn = ncclResult_t (*)(ncclRedOp_t*, void* scalar, ncclDataType_t,
                                                    ncclScalarResidence_t, ncclComm_t);
using NcclRedOpDestroyFn = ncclResult_t (*)(ncclRedOp_t, ncclComm_t);
using NcclSendFn = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int peer, ncclComm_t,
                                    cudaStream_t);
using NcclRecvFn = ncclResult_t (*)(void*, size_t, ncclDataType_t, int peer, ncclComm_t,
                                    cudaStream_t);
using NcclGroupFn = ncclResult_t (*)();

// X(member, exported symbol, pointer type).
#define COMMD_NCCL_FUNCTIONS(X)                                                      \
  X(get_version, ncclGetVersion, NcclGetVersionFn)                                   \
  X(get_unique_id, ncclGetUniqueId, NcclGetUniqueIdFn)                               \
  X(comm_init_rank_config, ncclCommInitRankConfig, NcclCommInitRankConfigFn)         \
  X(comm_abort, ncclCommAbort, NcclCommFn)                                           \
  X(comm_get_async_error, ncclCommGetAsyncError, NcclCommGetAsyncErrorFn)            \
  X(get_error_string, ncclGetErrorString, NcclGetErrorStringFn)                      \
  X(get_last_error, ncclGetLastError, NcclGetLastErrorFn)                            \
  X(all_reduce, ncclAllReduce, NcclAllReduceFn)                                      \
  X(broadcast, ncclBroadcast, NcclBroadcastFn)                                       \
  X(red_op_create_pre_mul_sum, ncclRedOpCreatePreMulSum, NcclRedOpCreatePreMulSumFn) \
  X(red_op_destroy, ncclRedOpDestroy, NcclRedOpDestroyFn)                            \
  X(send, ncclSend, NcclSendFn)                                                      \
  X(recv, ncclRecv, NcclRecvFn)                                                      \
  X(group_start, ncclGroupStart, NcclGroupFn)                                        \
  X(group_end, ncclGroupEnd, NcclGroupFn)

struct NcclApi {
#define COMMD_NCCL_MEMBER_(member, symbol, type) type member = nullptr;
  COMMD_NCCL_FUNCTIONS(COMMD_NCCL_MEMBER_)
#undef COMMD_NCCL_MEMBER_
  std::string library;  // what was loaded, as given to dlopen
  int version = 0;      // ncclGetVersion's code (22809 for 2.28.9)
};

// Loads `library`, resolves every entry point and checks the version against kNcclFloor.
// UNAVAILABLE naming the library (dlerror's text, the missing symbol, or its version and the
// floor) otherwise. A loaded library stays loaded. Thread-safe.
absl::StatusOr<NcclApi> LoadNccl(const std::string& library);

// The process's table, loaded once: $COMMD_NCCL_LIBRARY, else libnccl.so.2. FAILED_PRECONDITION
// naming the library, why, and how to provide it when it does not load. Thread-safe; the
// pointer lives as long as the process.
absl::StatusOr<const NcclApi*> Nccl();

// "ncclAllReduce: ncclRemoteError (6): remote process exited or there was a network error;
// NCCL's last error: <ncclGetLastError>" (the last part only when NCCL has one).
std::string NcclErrorText(const NcclApi& api, ncclComm_t comm, ncclResult_t result,
                          const std::string& call);

// The status an NCCL failure stands for: UNAVAILABLE for a remote or system error (a peer or
// the network went), INTERNAL otherwise; the text is NcclErrorText's.
absl::Status NcclError(const NcclApi& api, ncclComm_t comm, ncclResult_t result,
                       const std::string& call);

// Finishes a call on nonblocking communicator `comm` that returned `first`: polls
// ncclCommGetAsyncError while it says ncclInProgress (sleeping 50 us, growing to 1 ms),
// checking `stop` and `deadline` between polls. OK once it is done; ABORTED when `stop` said
// so and DEADLINE_EXCEEDED past `deadline` (the caller then aborts the communicator: it is of no
// further use); NcclError for a failure. Blocks.
absl::Status WaitNccl(const NcclApi& api, ncclComm_t comm, ncclResult_t first,
                      const std::string& call, const std::function<bool()>& stop,
                      absl::Time deadline);

// A nonblocking communicator (ncclConfig_t.blocking = 0, named `name` in NCCL's logs) of
// `nranks`, this process its rank `rank`, from `id`: ncclCommInitRankConfig, then WaitNccl
// until every rank has joined. On any failure the half-made communicator is aborted
// (AbortNcclComm, for up to 1 s) before the error is returned. The CUDA device must be current.
// Blocks.
absl::StatusOr<ncclComm_t> InitNcclComm(const NcclApi& api, int nranks, int rank,
                                        const ncclUniqueId& id, const std::string& name,
                                        const std::function<bool()>& stop, absl::Time deadline);

// Aborts `comm` (ncclCommAbort: frees it and ends its work still running on the device). On a
// nonblocking communicator the abort itself may answer ncclInProgress: it is then polled with
// ncclCommGetAsyncError until it is no longer in progress or `deadline` passes (as PyTorch's
// ProcessGroupNCCL does), so that its resources are gone when this returns. Never call
// anything on `comm` afterwards. Blocks at most until `deadline`.
void AbortNcclComm(const NcclApi& api, ncclComm_t comm, absl::Time deadline);

namespace cuda_internal {
// Tests of the host side replace the table; null restores the loaded one. Not thread-safe
// against calls: set it before any.
void SetNcclForTesting(const NcclApi* api);
}  // namespace cuda_internal

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_CUDA_NCCL_API_H_
