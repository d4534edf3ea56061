// Throwaway: a_cc_me's batched attention GEMMs at 16 heads, q_len 1 (M = 16 rows per request) vs M = 32, and a
// swapped orientation; batch 64, N = 4097 keys. cuBLAS strided-batched, flushed L2, median of 15.
#include "probe.cuh"
#include <vector>
#include <algorithm>
__global__ void fill(__nv_bfloat16* p, size_t n) { for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = __float2bfloat16(float(int(i * 2654435761u % 1000)) / 1000.0f - 0.5f); }
int main() {
  cublasHandle_t h; CB(cublasCreate(&h));
  void* ws; CK(cudaMalloc(&ws, 32 << 20)); CB(cublasSetWorkspace(h, ws, 32 << 20));
  size_t flush_bytes = 200 << 20; void* fl; CK(cudaMalloc(&fl, flush_bytes));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  const int B = 64, W = 576, R = 512;
  for (int N : {4097, 4098, 4104, 32769}) {
    __nv_bfloat16 *lat, *q, *p, *o; float* s;
    CK(cudaMalloc(&lat, size_t(B) * N * W * 2)); CK(cudaMalloc(&q, size_t(B) * 64 * R * 2)); CK(cudaMalloc(&p, size_t(B) * 64 * N * 2));
    CK(cudaMalloc(&o, size_t(B) * 64 * R * 2)); CK(cudaMalloc(&s, size_t(B) * 64 * N * 4));
    fill<<<1024, 256>>>(lat, size_t(B) * N * W); fill<<<1024, 256>>>(q, size_t(B) * 64 * R); fill<<<1024, 256>>>(p, size_t(B) * 64 * N); CK(cudaDeviceSynchronize());
    const float one = 1, zero = 0;
    auto t = [&](auto&& f) { std::vector<float> v; for (int i = 0; i < 15; ++i) { CK(cudaMemset(fl, 0, flush_bytes)); CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); v.push_back(ms * 1e3f); } std::sort(v.begin(), v.end()); return v[7]; };
    for (int M : {16, 32, 64}) {
      float sc = t([&] { CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, R, &one, lat, CUDA_R_16BF, W, (long long)N * W, q, CUDA_R_16BF, R, (long long)M * R, &zero, s, CUDA_R_32F, N, (long long)M * N, B, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); });
      float sw = t([&] { CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, R, &one, q, CUDA_R_16BF, R, (long long)M * R, lat, CUDA_R_16BF, W, (long long)N * W, &zero, s, CUDA_R_32F, M, (long long)M * N, B, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); });
      float pv = t([&] { CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, R, M, N, &one, lat, CUDA_R_16BF, W, (long long)N * W, p, CUDA_R_16BF, N, (long long)M * N, &zero, o, CUDA_R_16BF, R, (long long)M * R, B, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); });
      float pvs = t([&] { CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_T, M, R, N, &one, p, CUDA_R_16BF, N, (long long)M * N, lat, CUDA_R_16BF, W, (long long)N * W, &zero, o, CUDA_R_16BF, M, (long long)M * R, B, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); });
      printf("N %d M %d: scores %7.1f us (swapped %7.1f) | P V %7.1f us (swapped %7.1f)\n", N, M, sc, sw, pv, pvs);
    }
    cudaFree(lat); cudaFree(q); cudaFree(p); cudaFree(o); cudaFree(s);
  }
  return 0;
}
