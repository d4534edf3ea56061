#include "variants/common/cuda/device_random.h"

#include <cuda_bf16.h>

#include <cmath>

#include "harness/cuda_check.h"
#include "variants/common/rng.h"

namespace dslab {
namespace {

__global__ void fill_random_bf16_kernel(__nv_bfloat16* dst, size_t n, uint64_t stream, float scale, float offset) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(__fadd_rn(offset, __fmul_rn(scale, uniform_pm1(stream, uint64_t(i)))));
}

}  // namespace

void fill_random_bf16(void* dst, size_t n, uint64_t seed, const std::string& name, float scale, float offset,
                      cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, 65536));
  fill_random_bf16_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), n, stream_id(seed, name), scale,
                                                      offset);
  DSLAB_CHECK_LAUNCH();
}

float fan_in_scale(int64_t fan_in) { return float(std::sqrt(3.0 / double(fan_in))); }

}  // namespace dslab
