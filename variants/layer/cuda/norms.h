// The residual stream's RMSNorms between a step's ops, one block per token, launched with programmatic dependent
// launch (a decode step runs two per layer on one token: their latency chain, not bandwidth, is their cost).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dslab::layer::cuda {

// The step's input into the residual stream, and its first norm: resid[t] = row ids[t] of `source` (the embedding;
// ids null: row t of this step's hidden states, source + step[0] * tokens * hidden), xb = RMSNorm(resid) * weight.
void input_norm(const __nv_bfloat16* source, const int32_t* ids, const int32_t* step, int64_t tokens, int hidden,
                const __nv_bfloat16* weight, float eps, float* resid, __nv_bfloat16* xb, cudaStream_t stream);
// resid += add; then, with a weight, the next op's input xb = RMSNorm(resid) * weight.
void add_norm(int64_t tokens, float* resid, const float* add, int hidden, const __nv_bfloat16* weight, float eps,
              __nv_bfloat16* xb, cudaStream_t stream);

}  // namespace dslab::layer::cuda
