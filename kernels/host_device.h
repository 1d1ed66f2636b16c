// COMMD_HOST_DEVICE marks the element functions that both the CPU collectives and the CUDA
// kernels call, so each algorithm's per-element logic is written once.
//
//   COMMD_HOST_DEVICE inline float Twice(float x) { return 2 * x; }
//
// Under nvcc it expands to `__host__ __device__`; in host-only builds to nothing, so those
// builds need no CUDA header.
#ifndef COMMD_KERNELS_HOST_DEVICE_H_
#define COMMD_KERNELS_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define COMMD_HOST_DEVICE __host__ __device__
#else
#define COMMD_HOST_DEVICE
#endif

#endif  // COMMD_KERNELS_HOST_DEVICE_H_
