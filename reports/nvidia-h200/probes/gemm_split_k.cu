// Throwaway: split-K as a strided-batched cuBLAS GEMM over K slices (fp32 partials) + a sum kernel.
#include "probe.cuh"
#include <vector>
#include <algorithm>
#include <cmath>
__global__ void sum_parts(const float4* parts, float4* out, size_t n4, int s) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    float4 a = parts[i];
    for (int k = 1; k < s; ++k) { float4 b = parts[i + k * n4]; a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w; }
    out[i] = a;
  }
}
int main() {
  cublasHandle_t h; CB(cublasCreate(&h));
  void* ws; CK(cudaMalloc(&ws, 32 << 20)); CB(cublasSetWorkspace(h, ws, 32 << 20));
  size_t flush_bytes = 200 << 20; void* fl; CK(cudaMalloc(&fl, flush_bytes));
  cudaStream_t s0; CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking)); CB(cublasSetStream(h, s0));
  cudaEvent_t a, b, c; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); CK(cudaEventCreate(&c));
  struct Shape { const char* name; int out, in; };
  Shape shapes[] = {{"qkv_a", 2112, 7168}, {"q_b16", 3072, 1536}, {"o_proj16", 7168, 2048}, {"q_b128", 24576, 1536}, {"o_proj128", 7168, 16384}};
  for (int rows : {64, 128})
  for (auto sh : shapes) {
    __nv_bfloat16 *w, *x; float *y, *parts;
    CK(cudaMalloc(&w, size_t(sh.out) * sh.in * 2)); CK(cudaMalloc(&x, size_t(rows) * sh.in * 2)); CK(cudaMalloc(&y, size_t(rows) * sh.out * 4));
    CK(cudaMalloc(&parts, size_t(16) * rows * sh.out * 4));
    fill_hashed<<<1024, 256>>>(w, size_t(sh.out) * sh.in, 1); fill_hashed<<<1024, 256>>>(x, size_t(rows) * sh.in, 2); CK(cudaDeviceSynchronize());
    const float alpha = 1, beta = 0;
    const double mb = sh.out * double(sh.in) * 2 / 1e6;
    printf("M=%d %-10s %6.1f MB:", rows, sh.name, mb);
    std::vector<float> ref(size_t(rows) * sh.out), got(ref.size());
    for (int s : {1, 2, 3, 4, 6, 8, 12, 16}) {
      if (sh.in % s || (sh.in / s) % 64) continue;
      const int kk = sh.in / s;
      auto run = [&](bool reduce) {
        if (s == 1) { CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.out, rows, sh.in, &alpha, w, CUDA_R_16BF, sh.in, x, CUDA_R_16BF, sh.in, &beta, y, CUDA_R_32F, sh.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); return; }
        CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.out, rows, kk, &alpha, w, CUDA_R_16BF, sh.in, kk, x, CUDA_R_16BF, sh.in, kk, &beta, parts, CUDA_R_32F, sh.out, size_t(rows) * sh.out, s, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (reduce) { sum_parts<<<264, 256, 0, s0>>>((const float4*)parts, (float4*)y, size_t(rows) * sh.out / 4, s); CK(cudaGetLastError()); }
      };
      run(true); CK(cudaDeviceSynchronize());
      CK(cudaMemcpy((s == 1 ? ref : got).data(), y, ref.size() * 4, cudaMemcpyDeviceToHost));
      double err = 0, nrm = 0; if (s > 1) for (size_t i = 0; i < ref.size(); ++i) { err += (got[i] - ref[i]) * double(got[i] - ref[i]); nrm += ref[i] * double(ref[i]); }
      std::vector<float> tg, tr;
      for (int i = 0; i < 25; ++i) {
        CK(cudaMemsetAsync(fl, 0, flush_bytes, s0)); CK(cudaEventRecord(a, s0)); run(false); CK(cudaEventRecord(b, s0));
        if (s > 1) { sum_parts<<<264, 256, 0, s0>>>((const float4*)parts, (float4*)y, size_t(rows) * sh.out / 4, s); CK(cudaGetLastError()); }
        CK(cudaEventRecord(c, s0)); CK(cudaEventSynchronize(c));
        float m1, m2; CK(cudaEventElapsedTime(&m1, a, b)); CK(cudaEventElapsedTime(&m2, a, c)); tg.push_back(m1 * 1e3f); tr.push_back(m2 * 1e3f);
      }
      std::sort(tg.begin(), tg.end()); std::sort(tr.begin(), tr.end());
      printf(" | S%d %5.1f (+sum %5.1f) %.1e", s, tg[12], tr[12], s > 1 ? std::sqrt(err / nrm) : 0.0);
    }
    printf("\n");
    cudaFree(w); cudaFree(x); cudaFree(y); cudaFree(parts);
  }
  return 0;
}
