// The reference's counter-based weights generated on the GPU, bit for bit (variants/common/rng.h), so a
// layer's many gigabytes of weights never cross PCIe and the reference can rebuild any tensor on the host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace dslab {

// dst[i] = bf16(offset + scale * uniform_pm1(stream_id(seed, name), i)) for i < n: ref::random_bf16's values.
void fill_random_bf16(void* dst, size_t n, uint64_t seed, const std::string& name, float scale, float offset = 0,
                      cudaStream_t stream = 0);
// sqrt(3 / fan_in): unit-variance outputs from unit-variance inputs (the reference's weight scale).
float fan_in_scale(int64_t fan_in);

}  // namespace dslab
