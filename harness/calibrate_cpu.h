// CPU peak-rate probes. Compiled with AMX/AVX-512 flags: call only after checking cpu_info().
#pragma once
#include <cstdint>

namespace dslab::calibrate {
// Floating-point operations performed per thread; the caller times the parallel region.
double amx_bf16_flops_per_thread(int64_t iterations);
// VDPBF16PS zmm on `accumulators` (12 or 24) independent register chains, or (0) in the MoE engine's kernel shape:
// L1-resident weight rows times broadcast token pairs into 8 accumulators, 1024 instructions per iteration.
double avx512_bf16_flops_per_thread(int64_t iterations, int accumulators);
double amx_int8_ops_per_thread(int64_t iterations);  // TDPBSSD: int8 multiply-adds x 2
// Sums a buffer with 64-byte loads as `streams` (1, 2, 4 or 8) side-by-side parts, each software-prefetched
// `prefetch_lines` lines ahead (0: none); returns a value so the reads stay. Threads read disjoint parts.
float read_sum(const float* data, int64_t n, int streams, int prefetch_lines);
// The largest odd number of 64-byte lines in `floats` floats, in floats: parts of a buffer this long start out of
// step with each other, so threads and streams reading them side by side do not walk one DRAM channel phase
// together (were the parts a multiple of a large power of two, they would crowd the same channels and banks where a
// kernel's scattered reads spread over all of them; STREAM offsets its arrays for the same reason).
int64_t odd_lines(int64_t floats);
// Copies n floats (64-byte aligned) with 64-byte loads and ordinary stores: STREAM's copy.
void copy_lines(const float* from, float* to, int64_t n);
}  // namespace dslab::calibrate
