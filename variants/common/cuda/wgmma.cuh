// Hopper's warpgroup MMA (wgmma, sm_90a): shared-memory operand descriptors, fences and group waits, shared by the
// kernels of ours that use it (the fused MLA decode, the grouped MoE GEMMs). Operand tiles are "K-major, 128-byte
// swizzle": 64-column (128-byte) blocks, each row's 16-byte chunks XOR-ed by the row (mod 8), 8-row groups 1024
// bytes apart, tiles 1024-byte aligned.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "variants/common/cuda/cp_async.cuh"

namespace dslab {

// Element offset of (row, col) in such a tile of `rows` rows (col < 64 x the tile's blocks).
__device__ __forceinline__ int swz(int row, int col, int rows) {
  return (col >> 6) * (rows * 64) + row * 64 + ((((col & 63) >> 3) ^ (row & 7)) << 3) + (col & 7);
}

// Descriptor of a K-major, 128-byte-swizzled operand starting at `p`: stride between 8-row groups 1024 bytes; the
// leading-dimension offset is unused for this layout. Adding n to it moves the start by 16 n bytes (a k16 step of
// bf16 is + 2).
__device__ __forceinline__ uint64_t wgmma_desc(const void* p) {
  return uint64_t((smem_addr(p) & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
// A [rows][32] tile (64-byte rows) in the 64-byte swizzle: 16-byte chunk c of row r at c ^ (r / 2 mod 4), 8-row
// groups 512 bytes apart. Element offset of (row, col < 32), and the K-major descriptor of such a tile at `p`.
__device__ __forceinline__ int swz64(int row, int col) {
  return row * 32 + ((((col >> 3) ^ (row >> 1)) & 3) << 3) + (col & 7);
}
__device__ __forceinline__ uint64_t wgmma_desc_sw64(const void* p) {
  return uint64_t((smem_addr(p) & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(512 >> 4) << 32) |
         (uint64_t(2) << 62);
}
// The same tile read as an MN-major operand (its 64-column blocks along N, `rows` rows each, 8-row groups along K).
__device__ __forceinline__ uint64_t wgmma_desc_mn(const void* p, int rows) {
  return uint64_t((smem_addr(p) & 0x3FFFF) >> 4) | (uint64_t(rows * 128 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// D[64 x N] (+)= A[64 x 16] · B[N x 16]^T with both operands K-major in shared memory (the descriptors above) and fp32
// accumulators d[N / 8][4] (the m64nNk16 fragment); bf16 operands, or fp16 (kHalf); accumulate 0: D = A·B. N is 16,
// 32, 64 or 128: one asm body each, the element type and A's layout their only other differences. kTransA: A is
// MN-major instead (its 64 rows contiguous, 8-K-row groups 1024 bytes apart: wgmma_desc_mn), e.g. V^T read from a
// [key][column] tile.
#define DSLAB_WGMMA_M64N16K16(T, TA)                                                                             \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." T "." T                                                      \
      " "                                                                                                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, " TA ", 0;\n}\n"                                       \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), \
        "+f"(d[1][3])                                                                                            \
      : "l"(a), "l"(b), "r"(accumulate))
#define DSLAB_WGMMA_M64N32K16(T, TA)                                                                               \
  asm volatile(                                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                                 \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T                                                        \
      " "                                                                                                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, " TA ", 0;\n}\n" \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),   \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),   \
        "+f"(d[3][2]), "+f"(d[3][3])                                                                               \
      : "l"(a), "l"(b), "r"(accumulate))
#define DSLAB_WGMMA_M64N64K16(T, TA)                                                                               \
  asm volatile(                                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T                                                        \
      " "                                                                                                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, " TA ", 0;\n}\n"                           \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),   \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),   \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),   \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),   \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])                                                 \
      : "l"(a), "l"(b), "r"(accumulate))
#define DSLAB_WGMMA_M64N128K16(T, TA)                                                                                  \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T                                                           \
      " "                                                                                                              \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "     \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, "  \
      "1, 1, " TA ", 0;\n}\n"                                                                                          \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),       \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),       \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),       \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),       \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),       \
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),     \
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),                \
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),                \
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),                \
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])                                                 \
      : "l"(a), "l"(b), "r"(accumulate))
template <int N, bool kHalf = false, bool kTransA = false>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "m64nNk16: N of 16, 32, 64 or 128");
#define DSLAB_WGMMA_TYPED(M)      \
  if constexpr (kHalf && kTransA) \
    M("f16", "1");                \
  else if constexpr (kHalf)       \
    M("f16", "0");                \
  else if constexpr (kTransA)     \
    M("bf16", "1");               \
  else                            \
    M("bf16", "0")
  if constexpr (N == 16) {
    DSLAB_WGMMA_TYPED(DSLAB_WGMMA_M64N16K16);
  } else if constexpr (N == 32) {
    DSLAB_WGMMA_TYPED(DSLAB_WGMMA_M64N32K16);
  } else if constexpr (N == 64) {
    DSLAB_WGMMA_TYPED(DSLAB_WGMMA_M64N64K16);
  } else {
    DSLAB_WGMMA_TYPED(DSLAB_WGMMA_M64N128K16);
  }
#undef DSLAB_WGMMA_TYPED
}
#undef DSLAB_WGMMA_M64N16K16
#undef DSLAB_WGMMA_M64N32K16
#undef DSLAB_WGMMA_M64N64K16
#undef DSLAB_WGMMA_M64N128K16

// The same with A from registers: this thread's m64k16 fragment a[4] (rows g = 16 warp + lane / 4 and g + 8,
// columns 2 (lane % 4) + {0, 1} in a[0] / a[1] and + 8 in a[2] / a[3], two values a word). N of 16, 32 or 64.
#define DSLAB_WGMMA_M64N16K16_RS(T)                                                                              \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." T "." T                                                      \
      " "                                                                                                        \
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"                              \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), \
        "+f"(d[1][3])                                                                                            \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
#define DSLAB_WGMMA_M64N32K16_RS(T)                                                                                  \
  asm volatile(                                                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                                   \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T                                                          \
      " "                                                                                                            \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, " \
      "0;\n}\n"                                                                                                      \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),     \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),     \
        "+f"(d[3][2]), "+f"(d[3][3])                                                                                 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
#define DSLAB_WGMMA_M64N64K16_RS(T)                                                                                \
  asm volatile(                                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T                                                        \
      " "                                                                                                          \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                  \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),   \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),   \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),   \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),   \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])                                                 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
template <int N, bool kHalf = false>
__device__ __forceinline__ void wgmma_m64nNk16_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b,
                                                  int accumulate) {
  static_assert(N == 16 || N == 32 || N == 64, "m64nNk16 with A from registers: N of 16, 32 or 64");
  if constexpr (N == 16) {
    if constexpr (kHalf)
      DSLAB_WGMMA_M64N16K16_RS("f16");
    else
      DSLAB_WGMMA_M64N16K16_RS("bf16");
  } else if constexpr (N == 32) {
    if constexpr (kHalf)
      DSLAB_WGMMA_M64N32K16_RS("f16");
    else
      DSLAB_WGMMA_M64N32K16_RS("bf16");
  } else {
    if constexpr (kHalf)
      DSLAB_WGMMA_M64N64K16_RS("f16");
    else
      DSLAB_WGMMA_M64N64K16_RS("bf16");
  }
}
#undef DSLAB_WGMMA_M64N16K16_RS
#undef DSLAB_WGMMA_M64N32K16_RS
#undef DSLAB_WGMMA_M64N64K16_RS

// D[64 x 16] (+)= A[64 x 32] . B[16 x 32]^T, e4m3 operands in shared memory (both K-major: FP8 products take no
// transpose), fp32 accumulators as m64n16k16's; a k32 step is 32 bytes (+ 2 on a descriptor).
__device__ __forceinline__ void wgmma_m64n16k32_e4m3(float (&d)[2][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3])
      : "l"(a), "l"(b), "r"(accumulate));
}

// ---- bf16 / fp16 with V transposed (MN-major B) into a 64-register half of a 128-column accumulator: the fixed-role
// decode kernel's P V The transposed-B wrapper below takes bf16 or (kHalf) fp16 operands: one asm body, the element
// type T its only difference. (Both operands K-major: wgmma_m64nNk16, variants/common/cuda/wgmma.cuh.)
#define DSLAB_WGMMA_M64N128K16_VT(T)                                                                                   \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                                                       \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T                                                           \
      " "                                                                                                              \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "     \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, "  \
      "1, 1, 0, 1;\n}\n"                                                                                               \
      : "+f"(d[16 * H + 0][0]), "+f"(d[16 * H + 0][1]), "+f"(d[16 * H + 0][2]), "+f"(d[16 * H + 0][3]),                \
        "+f"(d[16 * H + 1][0]), "+f"(d[16 * H + 1][1]), "+f"(d[16 * H + 1][2]), "+f"(d[16 * H + 1][3]),                \
        "+f"(d[16 * H + 2][0]), "+f"(d[16 * H + 2][1]), "+f"(d[16 * H + 2][2]), "+f"(d[16 * H + 2][3]),                \
        "+f"(d[16 * H + 3][0]), "+f"(d[16 * H + 3][1]), "+f"(d[16 * H + 3][2]), "+f"(d[16 * H + 3][3]),                \
        "+f"(d[16 * H + 4][0]), "+f"(d[16 * H + 4][1]), "+f"(d[16 * H + 4][2]), "+f"(d[16 * H + 4][3]),                \
        "+f"(d[16 * H + 5][0]), "+f"(d[16 * H + 5][1]), "+f"(d[16 * H + 5][2]), "+f"(d[16 * H + 5][3]),                \
        "+f"(d[16 * H + 6][0]), "+f"(d[16 * H + 6][1]), "+f"(d[16 * H + 6][2]), "+f"(d[16 * H + 6][3]),                \
        "+f"(d[16 * H + 7][0]), "+f"(d[16 * H + 7][1]), "+f"(d[16 * H + 7][2]), "+f"(d[16 * H + 7][3]),                \
        "+f"(d[16 * H + 8][0]), "+f"(d[16 * H + 8][1]), "+f"(d[16 * H + 8][2]), "+f"(d[16 * H + 8][3]),                \
        "+f"(d[16 * H + 9][0]), "+f"(d[16 * H + 9][1]), "+f"(d[16 * H + 9][2]), "+f"(d[16 * H + 9][3]),                \
        "+f"(d[16 * H + 10][0]), "+f"(d[16 * H + 10][1]), "+f"(d[16 * H + 10][2]), "+f"(d[16 * H + 10][3]),            \
        "+f"(d[16 * H + 11][0]), "+f"(d[16 * H + 11][1]), "+f"(d[16 * H + 11][2]), "+f"(d[16 * H + 11][3]),            \
        "+f"(d[16 * H + 12][0]), "+f"(d[16 * H + 12][1]), "+f"(d[16 * H + 12][2]), "+f"(d[16 * H + 12][3]),            \
        "+f"(d[16 * H + 13][0]), "+f"(d[16 * H + 13][1]), "+f"(d[16 * H + 13][2]), "+f"(d[16 * H + 13][3]),            \
        "+f"(d[16 * H + 14][0]), "+f"(d[16 * H + 14][1]), "+f"(d[16 * H + 14][2]), "+f"(d[16 * H + 14][3]),            \
        "+f"(d[16 * H + 15][0]), "+f"(d[16 * H + 15][1]), "+f"(d[16 * H + 15][2]), "+f"(d[16 * H + 15][3])             \
      : "l"(a), "l"(b))

// O[64 x 128] (+)= P[64 x 16] · V[16 x 128] with V MN-major (transposed B), into d[16 H .. 16 H + 15]: a 64-register
// accumulator, which ptxas compiles in a kernel whose threads start with 128 registers (it refuses the 256-column
// form there, even where setmaxnreg has raised the count).
template <int H, bool kHalf>
__device__ inline void wgmma_m64n128k16_vt(float (&d)[32][4], uint64_t a, uint64_t b) {
  if constexpr (kHalf)
    DSLAB_WGMMA_M64N128K16_VT("f16");
  else
    DSLAB_WGMMA_M64N128K16_VT("bf16");
}
#undef DSLAB_WGMMA_M64N128K16_VT

// ---- m64n256k16 with V transposed (MN-major B), A from registers or shared memory: the two-warpgroup decode kernel's
// P V
#define DSLAB_WGMMA_M64N256K16_RS_VT(T)                                                                                \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                                                       \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T                                                           \
      " "                                                                                                              \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "     \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, " \
      "%67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, " \
      "%89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, "  \
      "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "   \
      "%127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                                        \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),       \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),       \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),       \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),       \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),       \
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),     \
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),                \
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),                \
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),                \
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]),                \
        "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),                \
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]),                \
        "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),                \
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]),                \
        "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),                \
        "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]),                \
        "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),                \
        "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]),                \
        "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),                \
        "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]),                \
        "+f"(d[31][2]), "+f"(d[31][3])                                                                                 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
#define DSLAB_WGMMA_M64N256K16_SS_VT(T)                                                                                \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"                                                                       \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T                                                           \
      " "                                                                                                              \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "     \
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, " \
      "%67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, " \
      "%89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, "  \
      "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "   \
      "%127}, %128, %129, p, 1, 1, 0, 1;\n}\n"                                                                         \
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),       \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),       \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),       \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),       \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),       \
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),     \
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),                \
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),                \
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),                \
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]),                \
        "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),                \
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]),                \
        "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),                \
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]),                \
        "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),                \
        "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]),                \
        "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),                \
        "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]),                \
        "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),                \
        "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]),                \
        "+f"(d[31][2]), "+f"(d[31][3])                                                                                 \
      : "l"(a), "l"(b))
// O[:, 0 .. 255] += P[64 x 16] (registers, or a K-major shared tile) · V[16 x 256] (MN-major): one MMA a k16 step
// for a warpgroup's half of O (FlashMLA's shape; the threads of this 256-thread kernel may hold its 128 floats).
__device__ inline void wgmma_m64n256k16_rs_vt(float (&d)[32][4], const uint32_t (&a)[4], uint64_t b) {
  DSLAB_WGMMA_M64N256K16_RS_VT("bf16");
}
__device__ inline void wgmma_m64n256k16_ss_vt(float (&d)[32][4], uint64_t a, uint64_t b) {
  DSLAB_WGMMA_M64N256K16_SS_VT("bf16");
}
#undef DSLAB_WGMMA_M64N256K16_RS_VT
#undef DSLAB_WGMMA_M64N256K16_SS_VT

// ---- e4m3 m64n64k32: the DeepSeek-V3.2 indexer's scores
// D[64 x 64] (+)= A[64 x 32] . B[64 x 32]^T, e4m3 operands in shared memory (both K-major), fp32 accumulators.
__device__ inline void wgmma_m64n64k32_e4m3(float (&d)[8][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, "
      "1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "r"(accumulate));
}

// ---- bf16 m64n128k16 / m64n256k16, always accumulating: the grouped MoE GEMMs' tiles
// d (+)= A[64 x 16] . B[BN x 16]^T, fp32 accumulators d[BN / 8][4] in the m16n8 layout per warp (rows 16 w + lane / 4
// and + 8, columns 8 j + 2 (lane % 4) and + 1).
__device__ inline void wgmma_m64n128k16(float (&d)[16][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, "
      "0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]),
        "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),
        "+f"(d[15][3])
      : "l"(a), "l"(b));
}
__device__ inline void wgmma_m64n256k16(float (&d)[32][4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, "
      "%68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "
      "%90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "
      "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]),
        "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),
        "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]),
        "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]),
        "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]),
        "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]),
        "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]),
        "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
        "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]),
        "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]),
        "+f"(d[31][2]), "+f"(d[31][3])
      : "l"(a), "l"(b));
}
template <int BN>
__device__ inline void wgmma_tile(float (&d)[BN / 8][4], uint64_t a, uint64_t b) {
  if constexpr (BN == 256)
    wgmma_m64n256k16(d, a, b);
  else
    wgmma_m64n128k16(d, a, b);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_and_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Until at most N committed wgmma groups of this warp are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes this thread's shared-memory writes (cp.async, st.shared) visible to the tensor cores' async reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace dslab
