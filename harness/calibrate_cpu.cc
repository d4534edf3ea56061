#include "harness/calibrate_cpu.h"

#include <immintrin.h>

#include <cstring>

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

double avx512_bf16_flops_per_thread(int64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f81), y = (__m512bh)_mm512_set1_epi16(0x3f7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, y);
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return double(iterations) * 12 * (16 * 2 * 2);
}

float read_sum(const float* data, int64_t n) {
  // Eight independent accumulators: enough loads in flight that the probe, not the add chain, waits on DRAM.
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_load_ps(data + i + 16 * j));
  for (int j = 1; j < 8; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  float s = _mm512_reduce_add_ps(acc[0]);
  for (; i < n; ++i) s += data[i];
  return s;
}

}  // namespace dslab::calibrate
