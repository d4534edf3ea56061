// Throwaway: cuBLASLt algorithms for y = x W^T at M = 64 in both orientations (C^T = W x^T and C = x W^T).
#include "probe.cuh"
#include <cublasLt.h>
#include <vector>
#include <algorithm>
int main() {
  cublasLtHandle_t lt; CB(cublasLtCreate(&lt));
  size_t wsb = 64 << 20; void* ws; CK(cudaMalloc(&ws, wsb));
  size_t flush_bytes = 200 << 20; void* fl; CK(cudaMalloc(&fl, flush_bytes));
  cudaStream_t s0; CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  struct Shape { const char* name; int out, in; };
  Shape shapes[] = {{"qkv_a", 2112, 7168}, {"q_b16", 3072, 1536}, {"o_proj16", 7168, 2048}};
  const int rows = 64;
  for (auto sh : shapes) {
    __nv_bfloat16 *w, *x; float* y;
    CK(cudaMalloc(&w, size_t(sh.out) * sh.in * 2)); CK(cudaMalloc(&x, size_t(rows) * sh.in * 2)); CK(cudaMalloc(&y, size_t(rows) * sh.out * 4));
    fill_hashed<<<1024, 256>>>(w, size_t(sh.out) * sh.in, 1); fill_hashed<<<1024, 256>>>(x, size_t(rows) * sh.in, 2); CK(cudaDeviceSynchronize());
    for (int orient = 0; orient < 2; ++orient) for (cudaDataType ct : {CUDA_R_32F, CUDA_R_16BF}) {
      // orient 0: C^T[out x rows] = op(W)=T (W col-major [in x out]) * x^T (col-major [in x rows]), N
      // orient 1: C[rows x out] = op(x)=T (x col-major [in x rows]) * W (col-major [in x out]) N
      int m = orient ? rows : sh.out, n = orient ? sh.out : rows, k = sh.in;
      const void* A = orient ? (const void*)x : (const void*)w; const void* B = orient ? (const void*)w : (const void*)x;
      cublasLtMatmulDesc_t desc; CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      cublasLtMatrixLayout_t la, lb, lc;
      CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k)); CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k)); CB(cublasLtMatrixLayoutCreate(&lc, ct, m, n, m));
      cublasLtMatmulPreference_t pref; CB(cublasLtMatmulPreferenceCreate(&pref));
      CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
      cublasLtMatmulHeuristicResult_t res[32]; int found = 0;
      CB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 32, res, &found));
      const float alpha = 1, beta = 0;
      float best = 1e9; int besti = -1; float first = 0;
      for (int i = 0; i < found; ++i) {
        std::vector<float> t;
        bool ok = true;
        for (int r = 0; r < 15 && ok; ++r) {
          CK(cudaMemsetAsync(fl, 0, flush_bytes, s0)); CK(cudaEventRecord(a, s0));
          ok = cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, y, lc, y, lc, &res[i].algo, ws, wsb, s0) == CUBLAS_STATUS_SUCCESS;
          CK(cudaEventRecord(b, s0)); CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1e3f);
        }
        if (!ok) continue;
        std::sort(t.begin(), t.end());
        if (i == 0) first = t[7];
        if (t[7] < best) best = t[7], besti = i;
      }
      printf("%-9s orient %d out %s: %d algos, heuristic #0 %5.1f us, best #%d %5.1f us (%.2f TB/s)\n", sh.name, orient, ct == CUDA_R_32F ? "f32" : "bf16", found, first, besti, best, sh.out * double(sh.in) * 2 / best / 1e6);
      cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc); cublasLtMatmulDescDestroy(desc);
    }
    cudaFree(w); cudaFree(x); cudaFree(y);
  }
  return 0;
}
