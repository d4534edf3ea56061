// Hopper's warpgroup MMA (wgmma, sm_90a): shared-memory operand descriptors, fences and group waits, shared by the
// kernels of ours that use it (the fused MLA decode, the grouped MoE GEMMs). Operand tiles are "K-major, 128-byte
// swizzle": 64-column (128-byte) blocks, each row's 16-byte chunks XOR-ed by the row (mod 8), 8-row groups 1024
// bytes apart, tiles 1024-byte aligned.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "variants/common/cp_async.cuh"

namespace dslab {

// Element offset of (row, col) in such a tile of `rows` rows (col < 64 x the tile's blocks).
__device__ __forceinline__ int swz(int row, int col, int rows) {
  return (col >> 6) * (rows * 64) + row * 64 + ((((col & 63) >> 3) ^ (row & 7)) << 3) + (col & 7);
}

// Descriptor of a K-major, 128-byte-swizzled operand starting at `p`: stride between 8-row groups 1024 bytes; the
// leading-dimension offset is unused for this layout. Adding n to it moves the start by 16 n bytes (a k16 step of
// bf16 is + 2).
__device__ __forceinline__ uint64_t wgmma_desc(const void* p) {
  return uint64_t((smem_addr(p) & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// A [rows][32] tile (64-byte rows) in the 64-byte swizzle: 16-byte chunk c of row r at c ^ (r / 2 mod 4), 8-row
// groups 512 bytes apart. Element offset of (row, col < 32), and the K-major descriptor of such a tile at `p`.
__device__ __forceinline__ int swz64(int row, int col) { return row * 32 + ((((col >> 3) ^ (row >> 1)) & 3) << 3) + (col & 7); }
__device__ __forceinline__ uint64_t wgmma_desc_sw64(const void* p) {
  return uint64_t((smem_addr(p) & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(512 >> 4) << 32) | (uint64_t(2) << 62);
}
// The same tile read as an MN-major operand (its 64-column blocks along N, `rows` rows each, 8-row groups along K).
__device__ __forceinline__ uint64_t wgmma_desc_mn(const void* p, int rows) {
  return uint64_t((smem_addr(p) & 0x3FFFF) >> 4) | (uint64_t(rows * 128 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
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
