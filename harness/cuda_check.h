// Every CUDA and cuBLAS call is checked; a launch is followed by DSLAB_CHECK_LAUNCH().
#pragma once
#include <stdexcept>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#define DSLAB_CUDA(call)                                                                                           \
  do {                                                                                                             \
    cudaError_t dslab_err_ = (call);                                                                               \
    if (dslab_err_ != cudaSuccess)                                                                                 \
      throw std::runtime_error(std::string(#call) + " failed at " __FILE__ ":" + std::to_string(__LINE__) + ": " + \
                               cudaGetErrorString(dslab_err_));                                                    \
  } while (0)

#define DSLAB_CHECK_LAUNCH() DSLAB_CUDA(cudaGetLastError())

#define DSLAB_CUBLAS(call)                                                                                         \
  do {                                                                                                             \
    cublasStatus_t dslab_st_ = (call);                                                                             \
    if (dslab_st_ != CUBLAS_STATUS_SUCCESS)                                                                        \
      throw std::runtime_error(std::string(#call) + " failed at " __FILE__ ":" + std::to_string(__LINE__) + ": " + \
                               cublasGetStatusString(dslab_st_));                                                  \
  } while (0)
