// Device helpers the GPU MoE ops share.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace dslab::moe::cuda {

__device__ inline float silu(float g) { return g / (1.0f + __expf(-g)); }

// h[r][j] = bf16(silu(gate_up[r][j]) * gate_up[r][inter + j]) for rows x inter.
void silu_mul(const float* gate_up, int64_t rows, int64_t inter, __nv_bfloat16* h, cudaStream_t stream);

}  // namespace dslab::moe::cuda
