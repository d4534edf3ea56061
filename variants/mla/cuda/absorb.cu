// The absorbed forms' per-head products past kGemvRows rows on the tensor cores (absorb_mma in mla_cuda.h): the
// query's q_nope · W_UK into q_cat (with the query's RoPE in the same launch) and the output's o_lat · W_UV^T.
//
// Why a kernel of ours: at decode sizes these are 64-128 rows against a 2 MB (16 heads) to 16 MB (128 heads)
// weight, a few microseconds of copies, and cuBLAS's batched GEMM, launched without programmatic dependent launch,
// starts only once the kernel before it has finished and then waits out its weight loads. Here each CTA's weight
// tile is copied before pdl_wait, while the kernel ahead (q_b's GEMM, the decode's merge) still runs, and only the
// activations wait. proj=cublas keeps cuBLAS's batched GEMM (and the separate rope_q_kernel) as the baseline.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "harness/cuda_check.h"
#include "variants/common/mma_sync.cuh"
#include "variants/common/pdl.cuh"
#include "variants/common/tma.cuh"
#include "variants/mla/cuda/kernels.cuh"
#include "variants/mla/cuda/mla_cuda.h"

namespace dslab::mla::cuda {

namespace {

// A CTA: one head (blockIdx.y), kAbsorbRows rows (blockIdx.z) and NT output columns (blockIdx.x); warp w multiplies
// rows 16w..16w+15 by all NT columns (m16n8k16). Both operands are held whole in shared memory, each of their rows
// one bulk copy (the tensor-memory accelerator: a CTA's 16-200 KB in a few hundred requests from one warp, where
// 16-byte cp.async from every thread took 2-3x as long at 128 heads), rows padded by 16 bytes so that the 8 rows an
// ldmatrix reads fall in 8 different bank groups. The weights' copies and the activations' complete on two mbarriers.
constexpr int kAbsorbWarps = 4, kAbsorbThreads = 32 * kAbsorbWarps, kAbsorbRows = 16 * kAbsorbWarps;
constexpr int kRowPad = 8;                // elements (16 bytes) past each shared-memory row
constexpr int64_t kAbsorbMaxRows = 256;   // decode sizes; past them the weights are a small part and cuBLAS stays

struct AbsorbArgs {
  const __nv_bfloat16* x;  // A of head b: x + b x_batch, rows ldx apart, K contiguous
  int64_t ldx, x_batch;
  const __nv_bfloat16* w;  // B of head b: w + b w_batch, [K][N] (k-major) or [N][K]
  int64_t w_batch;
  __nv_bfloat16* y;  // y + b y_batch + m ldy + n
  int64_t ldy, y_batch;
  int rows, K, N;
  QueryRope rope;  // rope.q null: none
};

// The query's RoPE for rows m_first, m_first + m_step, ... < m_end of head `head`, by one warp: lane p rotates pair
// p of each row (rope parts up to kAbsorbMaxRope wide). kRopeRows rows' loads are issued before any store (a row's
// pairs are read and written in place, so every lane reads before any lane writes: the __syncwarp), one round trip
// for kRopeRows rows rather than rope_q_row's one a row.
constexpr int kRopeRows = 8;
__device__ void rope_rows(const QueryRope& r, int head, int m_first, int m_end, int m_step) {
  const int lane = int(threadIdx.x) % 32, half = r.rope / 2;
  const int row_width = r.nope + r.rope, cat_width = r.r + r.rope;
  for (int m0 = m_first; m0 < m_end; m0 += kRopeRows * m_step) {
    float2 y[kRopeRows];
#pragma unroll
    for (int i = 0; i < kRopeRows; ++i) {
      const int m = m0 + i * m_step;
      if (m >= m_end || lane >= half) continue;
      const __nv_bfloat162 pair = reinterpret_cast<const __nv_bfloat162*>(r.q + (int64_t(m) * r.heads + head) * row_width + r.nope)[lane];
      y[i] = rope_pair(__bfloat1622float2(pair), r.cos_table[int64_t(m) * half + lane], r.sin_table[int64_t(m) * half + lane]);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kRopeRows; ++i) {
      const int m = m0 + i * m_step;
      if (m >= m_end || lane >= half) continue;
      const int64_t row = int64_t(m) * r.heads + head;
      const __nv_bfloat16 lo = __float2bfloat16_rn(y[i].x), hi = __float2bfloat16_rn(y[i].y);
      __nv_bfloat16* x = r.q + row * row_width + r.nope;
      __nv_bfloat16* c = r.q_cat + row * cat_width + r.r;
      x[lane] = lo, x[lane + half] = hi;
      c[lane] = lo, c[lane + half] = hi;
    }
  }
}

template <int NT, bool W_K_MAJOR>
__global__ void __launch_bounds__(kAbsorbThreads) absorb_mma_kernel(AbsorbArgs a) {
  extern __shared__ __align__(128) __nv_bfloat16 tiles[];
  const int K = a.K, a_ld = K + kRowPad, b_ld = (W_K_MAJOR ? NT : K) + kRowPad, b_rows = W_K_MAJOR ? K : NT;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int head = int(blockIdx.y), n0 = int(blockIdx.x) * NT, m0 = int(blockIdx.z) * kAbsorbRows;
  const int rows = min(kAbsorbRows, a.rows - m0);
  __nv_bfloat16* const sa = tiles;                      // [kAbsorbRows][a_ld]
  __nv_bfloat16* const sb = tiles + kAbsorbRows * a_ld;  // [K][b_ld] (k-major) or [NT][b_ld]
  uint64_t* const bars = reinterpret_cast<uint64_t*>(sb + b_rows * b_ld);  // weights, activations
  if (tid == 0) {
    mbarrier_init(&bars[0], 1);
    mbarrier_init(&bars[1], 1);
  }
  __syncthreads();

  // The weights are constant over the step: copied before the wait (see variants/common/pdl.cuh).
  const __nv_bfloat16* w = a.w + int64_t(head) * a.w_batch;
  const uint32_t b_row_bytes = uint32_t(W_K_MAJOR ? NT : K) * 2;
  if (warp == 0) {
    if (lane == 0) mbarrier_expect_bytes(&bars[0], b_row_bytes * uint32_t(b_rows));
    __syncwarp();
    for (int r = lane; r < b_rows; r += 32)
      bulk_load(sb + r * b_ld, W_K_MAJOR ? w + int64_t(r) * a.N + n0 : w + int64_t(n0 + r) * K, b_row_bytes, &bars[0]);
  }
  pdl_wait();
  pdl_launch_dependents();
  if (warp == 0) {
    const __nv_bfloat16* x = a.x + int64_t(head) * a.x_batch + int64_t(m0) * a.ldx;
    if (lane == 0) mbarrier_expect_bytes(&bars[1], uint32_t(K) * 2 * uint32_t(rows));
    __syncwarp();
    for (int m = lane; m < rows; m += 32) bulk_load(sa + m * a_ld, x + int64_t(m) * a.ldx, uint32_t(K) * 2, &bars[1]);
  }
  // Rows past the end: zeros (never stored; no copy writes them).
  for (int i = tid; i < (kAbsorbRows - rows) * a_ld / 8; i += kAbsorbThreads)
    reinterpret_cast<uint4*>(sa + rows * a_ld)[i] = make_uint4(0, 0, 0, 0);
  // The query's RoPE while the copies land, its rows spread over the head's column-tile CTAs and their warps (it
  // writes q's rope part, which no A tile reads: A is the nope part).
  if (a.rope.q)
    rope_rows(a.rope, head, m0 + int(blockIdx.x) * kAbsorbWarps + warp, m0 + rows, int(gridDim.x) * kAbsorbWarps);
  __syncthreads();  // the zeroed rows
  mbarrier_wait(&bars[0], 0);
  mbarrier_wait(&bars[1], 0);

  // Columns in chunks of at most 128 (64 accumulators a thread).
  constexpr int kChunk = NT < 128 ? NT : 128;
  __nv_bfloat16* y = a.y + int64_t(head) * a.y_batch;
  const __nv_bfloat16* a_rows = sa + (16 * warp + lane % 16) * a_ld + 8 * (lane / 16);
  for (int c0 = 0; c0 < NT; c0 += kChunk) {
    float acc[kChunk / 8][4] = {};
    for (int k16 = 0; k16 < K / 16; ++k16) {
      uint32_t af[4];
      ldmatrix_x4(smem_addr(a_rows + 16 * k16), af[0], af[1], af[2], af[3]);
#pragma unroll
      for (int j = 0; j < kChunk / 16; ++j) {  // two n8 tiles at a time
        uint32_t b0, b1, b2, b3;
        if (W_K_MAJOR)  // rows k of [K][NT], transposed into "col" fragments
          ldmatrix_x4_trans(smem_addr(sb + (16 * k16 + 8 * ((lane / 8) % 2) + lane % 8) * b_ld + c0 + 16 * j + 8 * (lane / 16)), b0, b1, b2, b3);
        else  // rows n of [NT][K]: already "col"
          ldmatrix_x4(smem_addr(sb + (c0 + 16 * j + 8 * (lane / 16) + lane % 8) * b_ld + 16 * k16 + 8 * ((lane / 8) % 2)), b0, b1, b2, b3);
        mma_bf16(acc[2 * j], af, b0, b1);
        mma_bf16(acc[2 * j + 1], af, b2, b3);
      }
    }
    // Accumulator j: rows lane / 4 (+ 8) of the warp's 16, columns 2 (lane % 4) + {0, 1} of n8 tile j.
#pragma unroll
    for (int j = 0; j < kChunk / 8; ++j) {
      const int col = n0 + c0 + 8 * j + 2 * (lane % 4);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int m = 16 * warp + lane / 4 + 8 * half;
        if (m < rows)
          *reinterpret_cast<__nv_bfloat162*>(y + int64_t(m0 + m) * a.ldy + col) = __floats2bfloat162_rn(acc[j][2 * half], acc[j][2 * half + 1]);
      }
    }
  }
}

size_t smem_bytes(int NT, int64_t K, bool w_k_major) {
  const int64_t b = w_k_major ? K * (NT + kRowPad) : NT * (K + kRowPad);
  return size_t(kAbsorbRows * (K + kRowPad) + b) * 2 + 2 * sizeof(uint64_t);
}

int device_attribute(cudaDeviceAttr what) {
  int device = 0, value = 0;
  DSLAB_CUDA(cudaGetDevice(&device));
  DSLAB_CUDA(cudaDeviceGetAttribute(&value, what, device));
  return value;
}
int multiprocessors() {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  return sms;
}
size_t max_smem() {
  static const size_t bytes = size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  return bytes;
}

template <int NT, bool W_K_MAJOR>
void launch(const AbsorbArgs& a, int64_t batch, cudaStream_t stream) {
  static const bool opted_in = [] {
    DSLAB_CUDA(cudaFuncSetAttribute(absorb_mma_kernel<NT, W_K_MAJOR>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_smem())));
    return true;
  }();
  (void)opted_in;
  const dim3 grid(unsigned(a.N / NT), unsigned(batch), unsigned((a.rows + kAbsorbRows - 1) / kAbsorbRows));
  launch_pdl(absorb_mma_kernel<NT, W_K_MAJOR>, grid, dim3(kAbsorbThreads), smem_bytes(NT, a.K, W_K_MAJOR), stream, a);
}

// The column tile: the narrowest whose grid is one CTA an SM at most (a CTA's copies, all issued at once, are what
// keeps HBM busy; a second wave would wait out a second round of them), else the widest that fits shared memory.
// Narrow tiles re-read their rows' A from L2 once a tile. 0: none fits.
constexpr int kColumnTiles[] = {16, 32, 64, 128, 256, 512}, kMaxNMajorTile = 128;  // (launch() instantiates these)
int column_tile(const BatchedGemv& g, int64_t rows, int64_t batch) {
  const int64_t row_tiles = (rows + kAbsorbRows - 1) / kAbsorbRows;
  int chosen = 0;
  for (const int nt : kColumnTiles) {
    if ((!g.w_k_major && nt > kMaxNMajorTile) || g.N % nt || smem_bytes(nt, g.K, g.w_k_major) > max_smem()) continue;
    chosen = nt;
    if (g.N / nt * batch * row_tiles <= multiprocessors()) break;
  }
  return chosen;
}

}  // namespace

bool absorb_mma_fits(const BlasHandle& h, const BatchedGemv& g, int64_t rows) {
  const auto aligned = [](const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return h.projections() == Projections::own && rows > kGemvRows && rows <= kAbsorbMaxRows && g.K % 16 == 0 && aligned(g.x, 16) && g.ldx % 8 == 0 && g.x_batch % 8 == 0 && aligned(g.w, 16) &&
         g.w_batch % 8 == 0 && g.N % 8 == 0 && aligned(g.y, 4) && g.ldy % 2 == 0 && g.y_batch % 2 == 0 &&
         column_tile(g, rows, 1) != 0;
}

void absorb_mma(const BlasHandle& h, const BatchedGemv& g, int64_t rows, int64_t batch, const QueryRope* rope) {
  if (!absorb_mma_fits(h, g, rows)) throw std::logic_error("absorb_mma: operands absorb_mma_fits declines");
  AbsorbArgs a{g.x, g.ldx, g.x_batch, g.w, g.w_batch, g.y, g.ldy, g.y_batch, int(rows), int(g.K), int(g.N), {}};
  if (rope) {
    if (rope->rope > kAbsorbMaxRope) throw std::logic_error("absorb_mma: rope parts past 64 wide are rope_q_kernel's");
    a.rope = *rope;
  }
  const cudaStream_t stream = h.stream();
  const int nt = column_tile(g, rows, batch);
  switch (g.w_k_major ? nt : -nt) {
    case 16: launch<16, true>(a, batch, stream); break;
    case 32: launch<32, true>(a, batch, stream); break;
    case 64: launch<64, true>(a, batch, stream); break;
    case 128: launch<128, true>(a, batch, stream); break;
    case 256: launch<256, true>(a, batch, stream); break;
    case 512: launch<512, true>(a, batch, stream); break;
    case -16: launch<16, false>(a, batch, stream); break;
    case -32: launch<32, false>(a, batch, stream); break;
    case -64: launch<64, false>(a, batch, stream); break;
    default: launch<128, false>(a, batch, stream); break;
  }
  DSLAB_CHECK_LAUNCH();
}

}  // namespace dslab::mla::cuda
