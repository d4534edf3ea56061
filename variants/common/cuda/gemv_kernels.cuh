// The own GEMV's arguments and the K-major batched GEMV's body (gemv.cu), for kernels elsewhere that run it beside
// work of their own in one launch (the fused MLA decode's latent norm with the W_UK absorb: variants/mla/cuda/op.cu).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "variants/common/cuda/blas.h"
#include "variants/common/cuda/pdl.cuh"

namespace dslab::gpu::gemv {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;

struct GemvArgs {
  const __nv_bfloat16* x;
  int64_t K, ldx, x_batch;
  const __nv_bfloat16* w;
  int64_t N, w_batch;
  int split;
  void* y;
  bool y_bf16;
  float beta;
  int64_t ldy, y_batch, N1;
  float* y2;
};
// A batched_gemv's operands (blas.h) as the kernels' arguments: one warp a feature (split 1), bf16 y, no beta.
inline GemvArgs batched_args(const BatchedGemv& g) {
  return {g.x, g.K, g.ldx, g.x_batch, g.w, g.N, g.w_batch, 1, g.y, true, 0.0f, g.ldy, g.y_batch, g.N, nullptr};
}

// y[m][b][n] = sum_k x[m][b][k] w[b][k][n] for M rows of batch b, w K-major (row k holds the N columns
// contiguously: the absorbed forms' W_UK, [nope][r] per head, which gemv_kernel's layout would read with a stride).
// A CTA takes one batch and kKnColumns columns: 16 column chunks of 8 x 16 k-slices, each thread loading its
// slice's rows of one chunk (16 bytes each, all in flight before the first FMA), then a shared-memory sum over the
// slices. At V2-Lite's 16 heads (K 128, N 512: 2 MB) that is 64 CTAs of 256 threads, 8 loads a thread.
constexpr int kKnChunks = 16, kKnSlices = kGemvThreads / kKnChunks, kKnColumns = 8 * kKnChunks, kKnRowsAtOnce = 8;
template <int M>
__device__ __forceinline__ void gemv_kn_block(const GemvArgs& a, int column_block, int batch) {
  __shared__ float partial[kKnSlices][M][kKnColumns];
  const int chunk = int(threadIdx.x) % kKnChunks, slice = int(threadIdx.x) / kKnChunks;
  const int64_t n0 = int64_t(column_block) * kKnColumns + 8 * chunk;
  const int64_t per_slice = (a.K + kKnSlices - 1) / kKnSlices;
  const int64_t k0 = min(a.K, slice * per_slice), k1 = min(a.K, k0 + per_slice);
  const bool col_ok = n0 < a.N;
  const __nv_bfloat16* x = a.x + int64_t(batch) * a.x_batch;
  const __nv_bfloat16* w = a.w + int64_t(batch) * a.w_batch + (col_ok ? n0 : 0);

  float acc[M][8] = {};
  uint4 v[kKnRowsAtOnce];
  auto load = [&](int64_t k) {
#pragma unroll
    for (int u = 0; u < kKnRowsAtOnce; ++u)
      v[u] = col_ok && k + u < k1 ? __ldcs(reinterpret_cast<const uint4*>(w + (k + u) * a.N)) : make_uint4(0, 0, 0, 0);
  };
  load(k0);  // (the weights before pdl_wait, as gemv_kernel)
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t k = k0; k < k1; k += kKnRowsAtOnce) {
    if (k != k0) load(k);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int u = 0; u < kKnRowsAtOnce; ++u) {
        const float xk = k + u < k1 ? __bfloat162float(x[m * a.ldx + k + u]) : 0.0f;
        const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(w2[i]);
          acc[m][2 * i] = fmaf(xk, f.x, acc[m][2 * i]);
          acc[m][2 * i + 1] = fmaf(xk, f.y, acc[m][2 * i + 1]);
        }
      }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j) partial[slice][m][8 * chunk + j] = acc[m][j];
  __syncthreads();
  for (int o = int(threadIdx.x); o < M * kKnColumns; o += kGemvThreads) {
    const int m = o / kKnColumns, col = o % kKnColumns;
    const int64_t n = int64_t(column_block) * kKnColumns + col;
    if (n >= a.N) continue;
    float sum = 0;
#pragma unroll
    for (int s = 0; s < kKnSlices; ++s) sum += partial[s][m][col];
    static_cast<__nv_bfloat16*>(a.y)[int64_t(batch) * a.y_batch + m * a.ldy + n] = __float2bfloat16_rn(sum);
  }
}

}  // namespace dslab::gpu::gemv
