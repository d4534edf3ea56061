// CPU peak-rate probes. Compiled with AMX/AVX-512 flags: call only after checking cpu_info().
#pragma once
#include <cstdint>

namespace dslab::calibrate {
// Floating-point operations performed per thread; the caller times the parallel region.
double amx_bf16_flops_per_thread(int64_t iterations);
double avx512_bf16_flops_per_thread(int64_t iterations);
double amx_int8_ops_per_thread(int64_t iterations);  // TDPBSSD: int8 multiply-adds x 2
// Sums a buffer with 64-byte loads (all threads read disjoint parts); returns a value so the reads stay.
float read_sum(const float* data, int64_t n);
}  // namespace dslab::calibrate
