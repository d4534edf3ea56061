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

namespace {

// The first row chunk is the first to touch this column block's weights, which come from DRAM: tile
// loads do not trigger the hardware prefetchers well, so fetch the B tiles a few K blocks ahead.
constexpr int64_t kPrefetchBlocks = 4;
inline void prefetch_b(const bf16* b0, const bf16* b1, int64_t kb, int64_t k_blocks) {
  if (kb >= k_blocks) return;
  for (int line = 0; line < 16; ++line) {
    _mm_prefetch(reinterpret_cast<const char*>(b0 + kb * 512 + line * 32), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b1 + kb * 512 + line * 32), _MM_HINT_T0);
  }
}

}  // namespace

void amx_two_blocks(const bf16* a, int64_t rows, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0, float* c1,
                    int64_t ldc) {
  const int64_t a_stride = 64, c_stride = ldc * 4;
  for (int64_t m = 0; m < rows; m += 32) {
    const bf16* a0 = a + (m / 16) * k_blocks * 512;
    if (m + 16 < rows) {  // two row tiles share each B tile load
      const bf16* a1 = a0 + k_blocks * 512;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        if (m == 0) prefetch_b(b0, b1, kb + kPrefetchBlocks, k_blocks);
        _tile_loadd(4, a0 + kb * 512, a_stride);
        _tile_loadd(5, a1 + kb * 512, a_stride);
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
        if (m == 0) prefetch_b(b0, b1, kb + kPrefetchBlocks, k_blocks);
        _tile_loadd(4, a0 + kb * 512, a_stride);
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

void avx512_two_blocks(const bf16* a, int64_t rows, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0,
                       float* c1, int64_t ldc) {
  // Row m of packed A, K block kb, starts at row_of_a(m) + kb * 512.
  auto row_of_a = [&](int64_t m) { return a + (m / 16) * k_blocks * 512 + (m % 16) * 32; };
  int64_t m = 0;
  for (; m + 4 <= rows; m += 4) {  // four tokens share each weight load
    __m512 acc[4][2];
    for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < k_blocks; ++kb)
      for (int r = 0; r < 16; ++r) {
        const __m512bh w0 = row_of(b0 + kb * 512 + r * 32), w1 = row_of(b1 + kb * 512 + r * 32);
        for (int t = 0; t < 4; ++t) {
          const __m512bh x = pair_of(row_of_a(m + t) + kb * 512 + 2 * r);
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
    const bf16* x = row_of_a(m);
    for (int64_t kb = 0; kb < k_blocks; ++kb)
      for (int r = 0; r < 16; r += 2) {
        const bf16* w0 = b0 + kb * 512 + r * 32;
        const bf16* w1 = b1 + kb * 512 + r * 32;
        const __m512bh xe = pair_of(x + kb * 512 + 2 * r), xo = pair_of(x + kb * 512 + 2 * r + 2);
        e0 = _mm512_dpbf16_ps(e0, xe, row_of(w0));
        e1 = _mm512_dpbf16_ps(e1, xe, row_of(w1));
        o0 = _mm512_dpbf16_ps(o0, xo, row_of(w0 + 32));
        o1 = _mm512_dpbf16_ps(o1, xo, row_of(w1 + 32));
      }
    _mm512_storeu_ps(c0 + m * ldc, _mm512_add_ps(e0, o0));
    _mm512_storeu_ps(c1 + m * ldc, _mm512_add_ps(e1, o1));
  }
}

namespace {

// e^x for x in fp32 range via 2^(x log2 e) = 2^n * 2^f: a degree-5 polynomial for 2^f on [-0.5, 0.5]
// (relative error ~2e-7, far below the bf16 rounding that follows).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558146428443e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace

void swiglu_block(const float* g, const float* u, int64_t rows, bf16* h, int64_t row_tile_stride) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 gv = _mm512_loadu_ps(g + r * 16), uv = _mm512_loadu_ps(u + r * 16);
    const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
    bf16* dst = h + (r / 16) * row_tile_stride + (r % 16) * 32;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(silu, uv)));
  }
}

void amx_i8_two_blocks(const int8_t* a, int64_t rows, const int8_t* b0, const int8_t* b1, int64_t k_blocks, int32_t* c0,
                       int32_t* c1, int64_t ldc) {
  const int64_t c_stride = ldc * 4;
  for (int64_t m = 0; m < rows; m += 32) {
    const int8_t* a0 = a + (m / 16) * k_blocks * 1024;
    if (m + 16 < rows) {
      const int8_t* a1 = a0 + k_blocks * 1024;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        _tile_loadd(4, a0 + kb * 1024, 64);
        _tile_loadd(5, a1 + kb * 1024, 64);
        _tile_loadd(6, b0 + kb * 1024, 64);
        _tile_loadd(7, b1 + kb * 1024, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      }
      _tile_stored(0, c0 + m * ldc, c_stride);
      _tile_stored(1, c1 + m * ldc, c_stride);
      _tile_stored(2, c0 + (m + 16) * ldc, c_stride);
      _tile_stored(3, c1 + (m + 16) * ldc, c_stride);
    } else {
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        _tile_loadd(4, a0 + kb * 1024, 64);
        _tile_loadd(6, b0 + kb * 1024, 64);
        _tile_loadd(7, b1 + kb * 1024, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
      }
      _tile_stored(0, c0 + m * ldc, c_stride);
      _tile_stored(1, c1 + m * ldc, c_stride);
    }
  }
}

void vnni_two_blocks(const int8_t* a, int64_t rows, const int8_t* b0, const int8_t* b1, int64_t k_blocks,
                     const int32_t* colsum0, const int32_t* colsum1, int32_t* c0, int32_t* c1, int64_t ldc) {
  const __m512i offset = _mm512_set1_epi32(int32_t(0x80808080u));  // s8 -> u8: + 128 on each byte
  const __m512i corr0 = _mm512_slli_epi32(_mm512_loadu_si512(colsum0), 7),
                corr1 = _mm512_slli_epi32(_mm512_loadu_si512(colsum1), 7);
  for (int64_t m = 0; m < rows; ++m) {
    const int8_t* x = a + (m / 16) * k_blocks * 1024 + (m % 16) * 64;
    __m512i e0 = _mm512_setzero_si512(), e1 = e0, o0 = e0, o1 = e0;  // two chains per block hide the latency
    for (int64_t kb = 0; kb < k_blocks; ++kb)
      for (int r = 0; r < 16; r += 2) {
        int32_t qe, qo;
        std::memcpy(&qe, x + kb * 1024 + 4 * r, 4);
        std::memcpy(&qo, x + kb * 1024 + 4 * r + 4, 4);
        const __m512i xe = _mm512_xor_si512(_mm512_set1_epi32(qe), offset),
                      xo = _mm512_xor_si512(_mm512_set1_epi32(qo), offset);
        const int8_t* w0 = b0 + kb * 1024 + r * 64;
        const int8_t* w1 = b1 + kb * 1024 + r * 64;
        e0 = _mm512_dpbusd_epi32(e0, xe, _mm512_loadu_si512(w0));
        e1 = _mm512_dpbusd_epi32(e1, xe, _mm512_loadu_si512(w1));
        o0 = _mm512_dpbusd_epi32(o0, xo, _mm512_loadu_si512(w0 + 64));
        o1 = _mm512_dpbusd_epi32(o1, xo, _mm512_loadu_si512(w1 + 64));
      }
    _mm512_storeu_si512(c0 + m * ldc, _mm512_sub_epi32(_mm512_add_epi32(e0, o0), corr0));
    _mm512_storeu_si512(c1 + m * ldc, _mm512_sub_epi32(_mm512_add_epi32(e1, o1), corr1));
  }
}

void swiglu_i32_block(const int32_t* cg, const int32_t* cu, int64_t rows, const float* row_scale,
                      const float* gate_scale, const float* up_scale, float* h, int64_t ldh) {
  const __m512 one = _mm512_set1_ps(1.0f), gs = _mm512_loadu_ps(gate_scale), us = _mm512_loadu_ps(up_scale);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 rs = _mm512_set1_ps(row_scale[r]);
    const __m512 g = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(cg + r * 16)), gs), rs);
    const __m512 u = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(cu + r * 16)), us), rs);
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(h + r * ldh, _mm512_mul_ps(silu, u));
  }
}

}  // namespace dslab::moe::kernels
