#include "harness/calibrate_cpu.h"

#include <immintrin.h>

#include <cstring>
#include <stdexcept>

namespace dslab::calibrate {
namespace {

// Palette 1, all eight tiles 16 rows x 64 bytes: tmm0-3 accumulators, tmm4-5 A, tmm6-7 B.
void configure_tiles() {
  alignas(64) unsigned char cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;  // bytes per row
    cfg[48 + t] = 16;      // rows
  }
  // ldtilecfg's asm operand names only the first 8 bytes: without this barrier GCC drops the other stores.
  __asm__ __volatile__("" : : "r"(cfg) : "memory");
  _tile_loadconfig(cfg);
}

}  // namespace

double amx_bf16_flops_per_thread(int64_t iterations) {
  configure_tiles();
  alignas(64) uint16_t operand[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = uint16_t(0x3f80 + (i % 61));  // ~1.0..1.5, never zero
  alignas(64) float acc[16 * 16] = {};
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iterations; ++i) {  // four independent accumulators keep the unit busy
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, acc, 64);
  _tile_release();
  volatile float sink = acc[0];
  (void)sink;
  return double(iterations) * 4 * (16.0 * 16 * 32 * 2);
}

double amx_int8_ops_per_thread(int64_t iterations) {
  configure_tiles();
  alignas(64) int8_t operand[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) operand[i] = int8_t(i % 13 - 6 + (i % 13 == 6));  // never zero
  alignas(64) int32_t acc[16 * 16] = {};
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, acc, 64);
  _tile_release();
  volatile int32_t sink = acc[0];
  (void)sink;
  return double(iterations) * 4 * (16.0 * 16 * 64 * 2);
}

namespace {

// ACC independent accumulators: enough chains that VDPBF16PS's latency never limits its issue rate (24 covers a
// 6-cycle latency at two per cycle); the loop keeps them all in zmm registers (checked with objdump).
template <int ACC>
double avx512_bf16_chains(int64_t iterations) {
  __m512 acc[ACC];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f81), y = (__m512bh)_mm512_set1_epi16(0x3f7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 32
    for (int k = 0; k < ACC; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], x, y);
  }
  __m512 s = acc[0];
  for (int k = 1; k < ACC; ++k) s = _mm512_add_ps(s, acc[k]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return double(iterations) * ACC * (16 * 2 * 2);
}

}  // namespace

int64_t odd_lines(int64_t floats) {
  const int64_t lines = floats / 16;
  return (lines % 2 ? lines : lines - 1) * 16;
}

namespace {

// Reads S contiguous parts of [data, data + n) side by side, one 64-byte line of each per step: S streams for
// the hardware prefetchers (each part odd_lines long, out of step with the others); with prefetch_lines > 0 each
// stream is also prefetched that many lines ahead (what the MoE engine does for its weight tiles).
template <int S>
float read_streams(const float* data, int64_t n, int prefetch_lines) {
  const int64_t part = S == 1 ? n / 16 * 16 : odd_lines(n / S);
  const float* p[S];
  for (int s = 0; s < S; ++s) p[s] = data + s * part;
  constexpr int kAcc = S >= 8 ? S : 8;
  __m512 acc[kAcc];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const int64_t ahead = int64_t(prefetch_lines) * 16;
  int64_t i = 0;
  if (ahead > 0)
    for (; i + ahead < part; i += 16 * (kAcc / S)) {
#pragma GCC unroll 8
      for (int j = 0; j < kAcc; ++j) {
        const float* line = p[j % S] + i + 16 * (j / S);
        _mm_prefetch(reinterpret_cast<const char*>(line + ahead), _MM_HINT_T0);
        acc[j] = _mm512_add_ps(acc[j], _mm512_load_ps(line));
      }
    }
  for (; i + 16 * (kAcc / S) <= part; i += 16 * (kAcc / S)) {
#pragma GCC unroll 8
    for (int j = 0; j < kAcc; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_load_ps(p[j % S] + i + 16 * (j / S)));
  }
  for (int j = 1; j < kAcc; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  float sum = _mm512_reduce_add_ps(acc[0]);
  for (int s = 0; s < S; ++s)
    for (int64_t k = i; k < part; ++k) sum += p[s][k];
  return sum;
}

// The instruction stream of the MoE engine's vector-matrix kernel without its DRAM traffic: 16 KB of weights
// (L1-resident) times four tokens' broadcast bf16 pairs, two weight rows per step into eight accumulators. On some
// hosts this mix reaches a higher VDPBF16PS rate than the register-only chains (which hold the FP units busier
// and may run at a lower clock), so the ceiling takes the larger.
double avx512_bf16_kernel_shaped(int64_t iterations) {
  alignas(64) static thread_local uint16_t weights[2][16 * 256];  // two 16-row x 256 bf16 blocks (8 KB each)
  alignas(64) static thread_local uint16_t tokens[4][512];
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 16 * 256; ++i) weights[b][i] = uint16_t(0x3f80 + (i * 7 + b) % 29);
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 512; ++i) tokens[t][i] = uint16_t(0x3f80 + (i * 3 + t) % 31);
  __m512 acc[4][2];
  for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
  constexpr int kSteps = 128;  // (row pair) steps over the 16 KB before it repeats
  for (int64_t i = 0; i < iterations; ++i)
    for (int r = 0; r < kSteps; ++r) {
      const __m512bh w0 = (__m512bh)_mm512_load_si512(weights[0] + r * 32),
                     w1 = (__m512bh)_mm512_load_si512(weights[1] + r * 32);
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        int32_t pair;
        std::memcpy(&pair, tokens[t] + 2 * r, 4);
        const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
        acc[t][0] = _mm512_dpbf16_ps(acc[t][0], x, w0);
        acc[t][1] = _mm512_dpbf16_ps(acc[t][1], x, w1);
      }
    }
  __m512 s = _mm512_setzero_ps();
  for (auto& r : acc) s = _mm512_add_ps(s, _mm512_add_ps(r[0], r[1]));
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return double(iterations) * kSteps * 8 * (16 * 2 * 2);
}

}  // namespace

double avx512_bf16_flops_per_thread(int64_t iterations, int accumulators) {
  switch (accumulators) {
    case 0:
      return avx512_bf16_kernel_shaped(iterations);
    case 12:
      return avx512_bf16_chains<12>(iterations);
    case 24:
      return avx512_bf16_chains<24>(iterations);
  }
  throw std::invalid_argument("avx512_bf16_flops_per_thread: accumulators must be 0 (kernel-shaped), 12 or 24");
}

float read_sum(const float* data, int64_t n, int streams, int prefetch_lines) {
  switch (streams) {
    case 1:
      return read_streams<1>(data, n, prefetch_lines);
    case 2:
      return read_streams<2>(data, n, prefetch_lines);
    case 4:
      return read_streams<4>(data, n, prefetch_lines);
    case 8:
      return read_streams<8>(data, n, prefetch_lines);
  }
  throw std::invalid_argument("read_sum: streams must be 1, 2, 4 or 8");
}

void copy_lines(const float* from, float* to, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j) _mm512_store_ps(to + i + 16 * j, _mm512_load_ps(from + i + 16 * j));
  for (; i < n; ++i) to[i] = from[i];
}

}  // namespace dslab::calibrate
