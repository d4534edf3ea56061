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
void avx512_two_blocks(const bf16* a, int64_t rows, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0, float* c1,
                       int64_t ldc);

// bf16(SiLU(g) * u) for rows < rows of a 16-column block, written into packed activations: row r at
// h + (r / 16) * row_tile_stride + (r % 16) * 32 (h points at the block's first column); g, u [rows][16] fp32.
void swiglu_block(const float* g, const float* u, int64_t rows, bf16* h, int64_t row_tile_stride);

}  // namespace dslab::moe::kernels
