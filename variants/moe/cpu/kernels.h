// The two inner kernels of the CPU MoE engine, over weights packed by moe::pack (VNNI tiles).
// C0 = A * B0 and C1 = A * B1 for one 16-column block each. A is packed activations: tiles of 16 rows x
// 32 K (1 KiB, contiguous), tile (row tile rt, K block kb) at a + (rt * k_blocks + kb) * 512, zero beyond the
// real rows and K, so an AMX tile load is one contiguous KiB. C0/C1 fp32 [rows][ldc], 16 columns per row.
// Two blocks per call: gate and up of the same columns (fused), or two adjacent down blocks.
#pragma once
#include <cstdint>

#include "variants/common/bf16.h"

namespace dslab::moe::kernels {

// AMX: rows must be a multiple of 16 (pad A with zero rows). Call amx_configure() once per thread first.
void amx_configure();
void amx_release();  // hands the tile state back (end of a parallel region)
void amx_two_blocks(const bf16* a, int64_t rows, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0, float* c1,
                    int64_t ldc);

// AVX-512-BF16: any row count (only the real rows are computed).
void avx512_two_blocks(const bf16* a, int64_t rows, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0,
                       float* c1, int64_t ldc);

// bf16(SiLU(g) * u) for rows < rows of a 16-column block, written into packed activations: row r at
// h + (r / 16) * row_tile_stride + (r % 16) * 32 (h points at the block's first column); g, u [rows][16] fp32.
void swiglu_block(const float* g, const float* u, int64_t rows, bf16* h, int64_t row_tile_stride);

// ---- INT8 (moe/amx_int8/cpu) ----
// Weights int8 in tiles of 16 K-quads x 16 columns (64 bytes a row): tile (nb, kb) at b + (nb * k_blocks + kb)
// * 1024, row r holding k = 4r..4r+3 of each column; K blocks of 64. Activations int8 packed like the bf16
// ones: tile (rt, kb) of 16 rows x 64 K at a + (rt * k_blocks + kb) * 1024. Outputs are int32 dot products.
void amx_i8_two_blocks(const int8_t* a, int64_t rows, const int8_t* b0, const int8_t* b1, int64_t k_blocks, int32_t* c0,
                       int32_t* c1, int64_t ldc);
// AVX-512-VNNI reads the same layouts. VPDPBUSD multiplies unsigned by signed bytes, so the activations
// are offset by 128 and 128 * (column sum of the weights) is subtracted: colsum0/colsum1 hold 16 sums each.
void vnni_two_blocks(const int8_t* a, int64_t rows, const int8_t* b0, const int8_t* b1, int64_t k_blocks,
                     const int32_t* colsum0, const int32_t* colsum1, int32_t* c0, int32_t* c1, int64_t ldc);
// h[r][c] = SiLU(g) * u with g = cg[r][c] * row_scale[r] * gate_scale[c], u likewise; fp32 out, row stride ldh.
void swiglu_i32_block(const int32_t* cg, const int32_t* cu, int64_t rows, const float* row_scale,
                      const float* gate_scale, const float* up_scale, float* h, int64_t ldh);

}  // namespace dslab::moe::kernels
