// Throwaway: does an L2 prefetch of a weight matrix speed up cuBLAS's small-M GEMM?
#include "probe.cuh"
#include <vector>
#include <algorithm>

// mode 0: memory order, `chunk`-byte bulk prefetches; mode 1: K-major (1 KB of every row, then the next KB)
__global__ void prefetch(const char* w, size_t rows, size_t row_bytes, int mode, uint32_t chunk) {
  const size_t total = rows * row_bytes;
  const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x, nt = size_t(gridDim.x) * blockDim.x;
  if (mode == 0) {
    for (size_t i = tid; i * chunk < total; i += nt) {
      uint32_t sz = uint32_t(total - i * chunk < chunk ? total - i * chunk : chunk);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + i * chunk), "r"(sz) : "memory");
    }
  } else {
    const size_t per_row = row_bytes / chunk;
    for (size_t i = tid; i < rows * per_row; i += nt) {
      const size_t kc = i / rows, row = i % rows;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + row * row_bytes + kc * chunk), "r"(chunk) : "memory");
    }
  }
}
int main() {
  cublasHandle_t h; CB(cublasCreate(&h));
  void* ws; CK(cudaMalloc(&ws, 32 << 20)); CB(cublasSetWorkspace(h, ws, 32 << 20));
  size_t flush_bytes = 200 << 20; void* fl; CK(cudaMalloc(&fl, flush_bytes));
  cudaStream_t s0, s1; CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CB(cublasSetStream(h, s0));
  cudaEvent_t a, b, f, j; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); CK(cudaEventCreate(&f)); CK(cudaEventCreate(&j));
  struct Shape { const char* name; int out, in; };
  Shape shapes[] = {{"qkv_a", 2112, 7168}, {"q_b16", 3072, 1536}, {"o_proj16", 7168, 2048}, {"q_b128", 24576, 1536}, {"o_proj128", 7168, 16384}};
  for (int rows : {64, 128})
  for (auto sh : shapes) {
    __nv_bfloat16 *w, *x; float* y;
    CK(cudaMalloc(&w, size_t(sh.out) * sh.in * 2)); CK(cudaMalloc(&x, size_t(rows) * sh.in * 2)); CK(cudaMalloc(&y, size_t(rows) * sh.out * 4));
    fill_hashed<<<1024, 256>>>(w, size_t(sh.out) * sh.in, 1); fill_hashed<<<1024, 256>>>(x, size_t(rows) * sh.in, 2); CK(cudaDeviceSynchronize());
    const float alpha = 1, beta = 0;
    auto gemm = [&] { CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.out, rows, sh.in, &alpha, w, CUDA_R_16BF, sh.in, x, CUDA_R_16BF, sh.in, &beta, y, CUDA_R_32F, sh.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); };
    auto pf = [&](cudaStream_t s, int mode, uint32_t chunk, int grid) { prefetch<<<grid, 128, 0, s>>>((const char*)w, sh.out, size_t(sh.in) * 2, mode, chunk); CK(cudaGetLastError()); };
    auto flush = [&] { CK(cudaMemsetAsync(fl, 0, flush_bytes, s0)); };
    auto median = [&](auto&& body) {
      std::vector<float> v;
      for (int i = 0; i < 25; ++i) { body(); CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); v.push_back(ms * 1e3f); }
      std::sort(v.begin(), v.end()); return v[v.size() / 2];
    };
    gemm(); CK(cudaDeviceSynchronize());
    float cold = median([&] { flush(); CK(cudaEventRecord(a, s0)); gemm(); CK(cudaEventRecord(b, s0)); });
    float hot = median([&] { flush(); gemm(); CK(cudaEventRecord(a, s0)); gemm(); CK(cudaEventRecord(b, s0)); });
    printf("M=%d %-10s %6.1f MB cold %6.1f us (%.2f TB/s) hot %6.1f us", rows, sh.name, sh.out * double(sh.in) * 2 / 1e6, cold, sh.out * double(sh.in) * 2 / cold / 1e6, hot);
    struct Cfg { int mode; uint32_t chunk; int grid; bool concurrent; };
    Cfg cfgs[] = {{0, 16384, 16, false}, {0, 4096, 64, false}, {1, 1024, 64, false}, {0, 4096, 64, true}, {1, 1024, 64, true}, {1, 512, 132, true}};
    for (auto c : cfgs) {
      float t = median([&] {
        flush(); CK(cudaEventRecord(a, s0));
        if (c.concurrent) { CK(cudaEventRecord(f, s0)); CK(cudaStreamWaitEvent(s1, f)); pf(s1, c.mode, c.chunk, c.grid); CK(cudaEventRecord(j, s1)); gemm(); CK(cudaStreamWaitEvent(s0, j)); }
        else { pf(s0, c.mode, c.chunk, c.grid); gemm(); }
        CK(cudaEventRecord(b, s0)); });
      printf(" | %s m%d c%u g%d %6.1f", c.concurrent ? "par" : "seq", c.mode, c.chunk, c.grid, t);
    }
    float pf_only = median([&] { flush(); CK(cudaEventRecord(a, s0)); pf(s0, 0, 4096, 64); CK(cudaEventRecord(b, s0)); });
    printf(" | pf kernel alone %5.1f\n", pf_only);
    cudaFree(w); cudaFree(x); cudaFree(y);
  }
  return 0;
}
