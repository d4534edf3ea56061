// Asynchronous global -> shared copies (cp.async, sm_80+), the one copy of these PTX wrappers every kernel of ours
// that stages operands through shared memory uses (the fused MLA decode, the grouped MoE GEMMs, the indexer).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dslab {

// A generic pointer into shared memory as the 32-bit shared-window address PTX takes.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 (or 4) bytes from global to shared memory; `valid` false writes zeros and reads nothing (src may be any address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
// The copies issued since the last commit, as one group; then wait until at most N groups are still in flight.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace dslab
