// The CUDA memory backend: cuMem allocations exported as POSIX fds (and fabric handles where
// the device supports them), with cuIpcGetMemHandle as the fallback on devices without
// virtual memory management. See daemon/memory/memory_backend.h. Built only with CUDA.
#ifndef COMMD_DAEMON_MEMORY_CUDA_MEMORY_BACKEND_H_
#define COMMD_DAEMON_MEMORY_CUDA_MEMORY_BACKEND_H_

#include "daemon/memory/memory_backend.h"

#endif  // COMMD_DAEMON_MEMORY_CUDA_MEMORY_BACKEND_H_
