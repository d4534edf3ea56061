// dslab's weight-streaming GEMM for decode-sized row counts (Hopper: tensor-memory-accelerator copies, warpgroup
// MMAs), one more candidate of GemmTuner (tuned_gemm.h), kept where it is measured fastest. What it does that the
// library's kernels cannot: it is launched with programmatic dependent launch (variants/common/cuda/pdl.cuh) and copies
// its first weight tiles - written before the step, never by the kernel before it - ahead of griddepcontrol.wait, so a
// projection's weights start streaming while the kernel before it drains (cuBLAS's kernels start only once it has
// finished: five of the 16-head MLA step's ten kernels). Each CTA computes 128 output features of every row (at most
// 128 rows, the MMAs' N) over a range of K; where K is split, the splits of a tile form a cluster and add up through
// distributed shared memory. Measured on the H100: within 2% of cuBLASLt's best on
// large weights (V3's o_proj, q_b_proj at 16 rows: chosen there), 1.1-1.8x slower on small ones, and slower in the
// 16-head step even with its early copies (forced: 1.02-1.13x) - the tuner keeps whichever is faster per shape.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "variants/common/cuda/tuned_gemm.h"

namespace dslab::gpu {

// Whether stream_gemm runs shape s: A a transposed weight (op_a T: [m][k] rows, lda apart; batches whole rows
// apart), B the rows (op_b N: [n][k], ldb apart; batches stride_b columns along a row), n <= 128, k a multiple of 64,
// 16-byte aligned pointers (the shape's alignment: A, B and C) and leading dimensions of A and B.
bool stream_gemm_fits(const GemmShape& s);
// Whether K may be split `splits` ways for shape s: a cluster of at most 8 CTAs, each with at least two 64-wide
// K chunks.
bool stream_gemm_splits_ok(const GemmShape& s, int splits);

// C = A·B (+ beta C) on `stream`, with programmatic dependent launch. splits > 1: K cut into that many ranges, one CTA
// each, the CTAs of a feature tile one cluster that sums their products through distributed shared memory (no
// partials in global memory, no second kernel).
void stream_gemm(const GemmShape& s, int splits, const void* a, const void* b, void* c, float beta,
                 StreamGemmMaps& maps, cudaStream_t stream);

}  // namespace dslab::gpu
