# COMMD_CUDA=AUTO turns CUDA on when nvcc is found. With CUDA on, device code is built for
# sm_80 and sm_90 (SASS) and compute_90 (PTX); the driver is loaded at run time
# (common/cuda_driver_api.h: dlopen and cuGetProcAddress), so one binary runs on nodes with
# and without a driver. Only the SDK's kernel launches link the CUDA runtime (statically); the
# daemon has none.
set(COMMD_HAVE_CUDA OFF)
if(NOT COMMD_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_commd_nvcc nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
    if(_commd_nvcc)
      set(CMAKE_CUDA_COMPILER ${_commd_nvcc})
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90)  # as kernels/CMakeLists.txt: PTX of the newest
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(COMMD_HAVE_CUDA ON)
  elseif(COMMD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "COMMD_CUDA=ON but nvcc was not found (set CMAKE_CUDA_COMPILER or CUDA_HOME)")
  endif()
endif()
message(STATUS "commd: CUDA parts ${COMMD_HAVE_CUDA}")
