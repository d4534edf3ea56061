// Warp-level tensor-core MMAs (mma.sync, sm_80+) and the ldmatrix loads that feed them: the one copy of these PTX
// wrappers the kernels that multiply small tiles per warp use (the grouped MoE GEMMs, the MLA merge's output absorb).
#pragma once
#include <cstdint>

namespace dslab {

// Four 8 x 8 b16 matrices from shared memory (lanes 8i .. 8i + 7 address matrix i's rows) into r0 .. r3.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// d[16 x 8] += a[16 x 16] · b[16 x 8], bf16 operands (a row-major fragments, b column-major), fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, "
      "%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace dslab
