// The two inner kernels of the CPU MoE engine, over weights packed by moe::pack (VNNI tiles).
// C0 = A * B0 and C1 = A * B1 for one 16-column block each: A is bf16 row-major [rows][lda] (k_blocks*32
// columns used, zero beyond the real K); C0/C1 fp32 [rows][ldc], 16 columns written per row.
// Two blocks per call: gate and up of the same columns (fused), or two adjacent down blocks.
#pragma once
#include <cstdint>

#include "variants/common/bf16.h"

namespace dslab::moe::kernels {

// AMX: rows must be a multiple of 16 (pad A with zero rows). Call amx_configure() once per thread first.
void amx_configure();
void amx_release();  // hands the tile state back (end of a parallel region)
void amx_two_blocks(const bf16* a, int64_t rows, int64_t lda, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0,
                    float* c1, int64_t ldc);

// AVX-512-BF16: any row count (only the real rows are computed).
void avx512_two_blocks(const bf16* a, int64_t rows, int64_t lda, const bf16* b0, const bf16* b1, int64_t k_blocks, float* c0,
                       float* c1, int64_t ldc);

}  // namespace dslab::moe::kernels
