// What every probe shares: abort on a failed CUDA / cuBLAS call, and fresh non-zero bf16 inputs.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
#define CB(x) do { cublasStatus_t e = (x); if (e != CUBLAS_STATUS_SUCCESS) { printf("cuBLAS %d at %d\n", int(e), __LINE__); exit(1);} } while (0)

// p[i] = a hash of (i, seed) mapped to [-0.05, 0.05).
__global__ void fill_hashed(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    p[i] = __float2bfloat16((float(h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}
