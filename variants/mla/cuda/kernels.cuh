// Device-side helpers the GPU MLA forms share: the paged cache as kernels see it, per-token quantised stores
// and loads (one warp per token), block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "variants/common/cuda/cp_async.cuh"
#include "variants/mla/cuda/mla_cuda.h"

namespace dslab::mla::cuda {

// A warp holds one token's values, element i = lane + 32 k; 18 per lane covers the 576-wide latent.
constexpr int kMaxValuesPerLane = 18;

struct CacheView {
  uint8_t* values;
  float* scales;
  const int32_t* page_table;
  int64_t page_size, width, groups, pages_per_request;
  KvDtype dtype;
  __device__ int64_t slot(int64_t request, int64_t token) const {
    return int64_t(page_table[request * pages_per_request + token / page_size]) * page_size + token % page_size;
  }
};

inline CacheView cache_view(const PagedLatentCache& c) {
  return {c.values.get(),      c.scales.get(), c.shared_page_table ? c.shared_page_table : c.page_table.get(),
          c.page_size,         c.width,        c.groups,
          c.pages_per_request, c.dtype};
}

__device__ inline float warp_max(float x) {
  for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Quantisation: group g holds elements [64 g, 64 g + 64), i.e. k = 2g and 2g + 1 of every lane.
__device__ inline float quant_max(KvDtype d) { return d == KvDtype::int8 ? 127.0f : 448.0f; }

__device__ inline void store_token(const CacheView& c, int64_t slot, const float* v, int lane) {
  if (c.dtype == KvDtype::bf16) {
    __nv_bfloat16* dst = reinterpret_cast<__nv_bfloat16*>(c.values) + slot * c.width;
    for (int k = 0; k < kMaxValuesPerLane; ++k)
      if (lane + 32 * k < c.width) dst[lane + 32 * k] = __float2bfloat16_rn(v[k]);
    return;
  }
  uint8_t* dst = c.values + slot * c.width;
  for (int g = 0; g < c.groups; ++g) {
    float m = 0;
    for (int k = 2 * g; k < 2 * g + 2; ++k)
      if (lane + 32 * k < c.width) m = fmaxf(m, fabsf(v[k]));
    m = warp_max(m);
    const float scale = m > 0 ? m / quant_max(c.dtype) : 1.0f;
    if (lane == 0) c.scales[slot * c.groups + g] = scale;
    for (int k = 2 * g; k < 2 * g + 2; ++k) {
      const int64_t i = lane + 32 * k;
      if (i >= c.width) continue;
      if (c.dtype == KvDtype::int8) {
        dst[i] = uint8_t(int8_t(max(-127, min(127, __float2int_rn(v[k] / scale)))));
      } else {
        const __nv_fp8_e4m3 q(v[k] / scale);  // saturating conversion
        dst[i] = *reinterpret_cast<const uint8_t*>(&q);
      }
    }
  }
}

__device__ inline float dequantize(KvDtype d, uint8_t q, float scale) {
  if (d == KvDtype::int8) return float(int8_t(q)) * scale;
  __nv_fp8_e4m3 f;
  *reinterpret_cast<uint8_t*>(&f) = q;
  return float(f) * scale;
}

__device__ inline void load_token(const CacheView& c, int64_t slot, float* v, int lane) {
  for (int k = 0; k < kMaxValuesPerLane; ++k) {
    const int64_t i = lane + 32 * k;
    if (i >= c.width) break;
    if (c.dtype == KvDtype::bf16)
      v[k] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(c.values)[slot * c.width + i]);
    else
      v[k] = dequantize(c.dtype, c.values[slot * c.width + i], c.scales[slot * c.groups + i / 64]);
  }
}

// Block-wide reductions for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ inline float block_reduce(float x, bool is_max) {
  __shared__ float partial[32];
  __shared__ float result;
  for (int o = 16; o; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // partial may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) partial[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = partial[0];
    for (int w = 1; w < warps; ++w) r = is_max ? fmaxf(r, partial[w]) : r + partial[w];
    result = r;
  }
  __syncthreads();
  return result;
}
__device__ inline float block_sum(float x) { return block_reduce(x, false); }
__device__ inline float block_max(float x) { return block_reduce(x, true); }

}  // namespace dslab::mla::cuda
