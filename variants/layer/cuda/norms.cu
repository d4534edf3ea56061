// The residual stream's RMSNorms between a step's ops (norms.h).
#include "variants/layer/cuda/norms.h"

#include "harness/cuda_check.h"
#include "variants/common/cuda/pdl.cuh"

namespace dslab::layer::cuda {
namespace {

constexpr int kNormThreads = 256;

__device__ inline float block_sum(float v) {
  __shared__ float partial[kNormThreads / 32];
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  __syncthreads();
  return total;
}

// The residual stream's norms, one block per token, each value loaded once and held in registers (a decode step
// runs two per layer on one token: their latency chain, not bandwidth, is their cost).
constexpr int kNormPerThread = 32;  // hidden_size up to kNormThreads * kNormPerThread = 8192

// xb = bf16(v * rsqrt(mean(v^2) + eps) * w) for this thread's values v[k], weights w[k] at j = threadIdx.x + k *
// kNormThreads (the weights loaded beside the values, so the reduction is the only wait after the loads).
__device__ inline void norm_values(const float (&v)[kNormPerThread], const float (&w)[kNormPerThread], float ss,
                                   int hidden, float eps, __nv_bfloat16* xb) {
  const float inv = rsqrtf(block_sum(ss) / float(hidden) + eps);
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int j = int(threadIdx.x) + k * kNormThreads;
    if (j < hidden) xb[j] = __float2bfloat16_rn(v[k] * inv * w[k]);
  }
}

// The step's input into the residual stream, and its first norm: row ids[t] of the embedding (whole model), else
// row t of this step's random hidden states (inputs[step]). Every load is issued before the first store (with the
// stores interleaved, the compiler had to assume they might alias the next loads and waited out each load in turn:
// 8 us per norm at batch 1 on the H100).
__global__ void __launch_bounds__(kNormThreads)
    input_norm_kernel(const __nv_bfloat16* __restrict__ source, const int32_t* __restrict__ ids,
                      const int32_t* __restrict__ step, int64_t tokens, int hidden,
                      const __nv_bfloat16* __restrict__ weight, float eps, float* __restrict__ resid,
                      __nv_bfloat16* __restrict__ xb) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t row = ids ? int64_t(ids[t]) : int64_t(*step) * tokens + t;
  const __nv_bfloat16* src = source + row * hidden;
  float* r = resid + t * hidden;
  float v[kNormPerThread], w[kNormPerThread], ss = 0;
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int j = int(threadIdx.x) + k * kNormThreads;
    v[k] = j < hidden ? __bfloat162float(src[j]) : 0.0f;
    w[k] = j < hidden ? __bfloat162float(weight[j]) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int j = int(threadIdx.x) + k * kNormThreads;
    if (j < hidden) r[j] = v[k];
    ss += v[k] * v[k];
  }
  norm_values(v, w, ss, hidden, eps, xb + t * hidden);
}

// resid += add; then, with a weight, the next op's input xb = RMSNorm(resid) * weight (loads first, as above).
__global__ void __launch_bounds__(kNormThreads)
    add_norm_kernel(float* __restrict__ resid, const float* __restrict__ add, int hidden,
                    const __nv_bfloat16* __restrict__ weight, float eps, __nv_bfloat16* __restrict__ xb) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  float* r = resid + t * hidden;
  const float* a = add + t * hidden;
  float v[kNormPerThread], w[kNormPerThread], ss = 0;
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int j = int(threadIdx.x) + k * kNormThreads;
    v[k] = j < hidden ? r[j] + a[j] : 0.0f;
    w[k] = j < hidden && weight ? __bfloat162float(weight[j]) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int j = int(threadIdx.x) + k * kNormThreads;
    if (j < hidden) r[j] = v[k];
    ss += v[k] * v[k];
  }
  if (weight) norm_values(v, w, ss, hidden, eps, xb + t * hidden);
}

}  // namespace

void input_norm(const __nv_bfloat16* source, const int32_t* ids, const int32_t* step, int64_t tokens, int hidden,
                const __nv_bfloat16* weight, float eps, float* resid, __nv_bfloat16* xb, cudaStream_t stream) {
  launch_pdl(input_norm_kernel, dim3(unsigned(tokens)), dim3(kNormThreads), 0, stream, source, ids, step, tokens,
             hidden, weight, eps, resid, xb);
  DSLAB_CHECK_LAUNCH();
}

void add_norm(int64_t tokens, float* resid, const float* add, int hidden, const __nv_bfloat16* weight, float eps,
              __nv_bfloat16* xb, cudaStream_t stream) {
  launch_pdl(add_norm_kernel, dim3(unsigned(tokens)), dim3(kNormThreads), 0, stream, resid, add, hidden, weight, eps,
             xb);
  DSLAB_CHECK_LAUNCH();
}

}  // namespace dslab::layer::cuda
