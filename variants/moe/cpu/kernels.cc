// Compiled with AMX and AVX-512-BF16 flags: callers check the CPU first (CpuVariant::available).
#include "variants/moe/cpu/kernels.h"

#include <immintrin.h>

#include <cstring>

namespace dslab::moe::kernels {

void amx_configure() {
  // Palette 1; tmm0-3 accumulators (16 x 16 fp32), tmm4-5 A (16 x 32 bf16), tmm6-7 B (16 K-pairs x 16 columns).
  alignas(64) unsigned char cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;
    cfg[48 + t] = 16;
  }
  // ldtilecfg's asm operand names only the first 8 bytes: without this barrier GCC drops the other stores.
  __asm__ __volatile__("" : : "r"(cfg) : "memory");
  _tile_loadconfig(cfg);
}

void amx_release() { _tile_release(); }

void amx_two_blocks(const bf16* a, int64_t rows, int64_t lda, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0,
                    float* c1, int64_t ldc) {
  const int64_t a_stride = lda * 2, c_stride = ldc * 4;
  for (int64_t m = 0; m < rows; m += 32) {
    const bf16* a0 = a + m * lda;
    if (m + 16 < rows) {  // two row tiles share each B tile load
      const bf16* a1 = a0 + 16 * lda;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        _tile_loadd(4, a0 + kb * 32, a_stride);
        _tile_loadd(5, a1 + kb * 32, a_stride);
        _tile_loadd(6, b0 + kb * 512, 64);
        _tile_loadd(7, b1 + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0 + m * ldc, c_stride);
      _tile_stored(1, c1 + m * ldc, c_stride);
      _tile_stored(2, c0 + (m + 16) * ldc, c_stride);
      _tile_stored(3, c1 + (m + 16) * ldc, c_stride);
    } else {
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        _tile_loadd(4, a0 + kb * 32, a_stride);
        _tile_loadd(6, b0 + kb * 512, 64);
        _tile_loadd(7, b1 + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
      }
      _tile_stored(0, c0 + m * ldc, c_stride);
      _tile_stored(1, c1 + m * ldc, c_stride);
    }
  }
}

namespace {

inline __m512bh pair_of(const bf16* p) {  // broadcast one (k, k+1) activation pair to all 16 lanes
  int32_t v;
  std::memcpy(&v, p, 4);
  return (__m512bh)_mm512_set1_epi32(v);
}

inline __m512bh row_of(const bf16* p) { return (__m512bh)_mm512_loadu_si512(p); }

}  // namespace

void avx512_two_blocks(const bf16* a, int64_t rows, int64_t lda, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0,
                       float* c1, int64_t ldc) {
  int64_t m = 0;
  for (; m + 4 <= rows; m += 4) {  // four tokens share each weight load
    __m512 acc[4][2];
    for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < k_blocks; ++kb)
      for (int r = 0; r < 16; ++r) {
        const __m512bh w0 = row_of(b0 + kb * 512 + r * 32), w1 = row_of(b1 + kb * 512 + r * 32);
        for (int t = 0; t < 4; ++t) {
          const __m512bh x = pair_of(a + (m + t) * lda + kb * 32 + 2 * r);
          acc[t][0] = _mm512_dpbf16_ps(acc[t][0], x, w0);
          acc[t][1] = _mm512_dpbf16_ps(acc[t][1], x, w1);
        }
      }
    for (int t = 0; t < 4; ++t) {
      _mm512_storeu_ps(c0 + (m + t) * ldc, acc[t][0]);
      _mm512_storeu_ps(c1 + (m + t) * ldc, acc[t][1]);
    }
  }
  for (; m < rows; ++m) {  // one token: split K in two chains per block to hide the FMA latency
    __m512 e0 = _mm512_setzero_ps(), e1 = e0, o0 = e0, o1 = e0;
    const bf16* x = a + m * lda;
    for (int64_t kb = 0; kb < k_blocks; ++kb)
      for (int r = 0; r < 16; r += 2) {
        const bf16* w0 = b0 + kb * 512 + r * 32;
        const bf16* w1 = b1 + kb * 512 + r * 32;
        const __m512bh xe = pair_of(x + kb * 32 + 2 * r), xo = pair_of(x + kb * 32 + 2 * r + 2);
        e0 = _mm512_dpbf16_ps(e0, xe, row_of(w0));
        e1 = _mm512_dpbf16_ps(e1, xe, row_of(w1));
        o0 = _mm512_dpbf16_ps(o0, xo, row_of(w0 + 32));
        o1 = _mm512_dpbf16_ps(o1, xo, row_of(w1 + 32));
      }
    _mm512_storeu_ps(c0 + m * ldc, _mm512_add_ps(e0, o0));
    _mm512_storeu_ps(c1 + m * ldc, _mm512_add_ps(e1, o1));
  }
}

}  // namespace dslab::moe::kernels
