// moe/grouped/cuda: the routed experts as two grouped GEMMs of our own over the permuted rows, driven by the
// row tiles the router's scan left on the device (no host look at the routing, so the whole MoE captures in a
// CUDA graph). cuBLAS's grouped GEMM needs each group's sizes on the host, i.e. a host synchronisation per
// layer; a fixed-size batched GEMM over all experts would read every expert's weights at decode.
//
// One kernel, two epilogues: gate+up (B tiles interleave 8 gate rows and the same 8 up rows, so each warp holds
// both halves of its outputs and writes silu(gate) * up as bf16) and down (fp32 rows). bf16 mma.sync m16n8k16
// with fp32 accumulation, operands staged through shared memory by cp.async in a multi-stage pipeline, rows
// 128 bytes (64 K values) with a 16-byte-chunk XOR swizzle so ldmatrix reads are free of bank conflicts.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "harness/cuda_check.h"
#include "harness/errors.h"
#include "variants/common/cuda/cp_async.cuh"
#include "variants/common/cuda/mma.cuh"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/cuda/wgmma.cuh"
#include "variants/moe/cuda/moe_cuda.h"
#include "variants/moe/cuda/moe_kernels.cuh"

namespace dslab::moe::cuda {
namespace {

constexpr int kTileK = 64;  // one 128-byte row of bf16

struct GroupedArgs {
  const int2* tiles;  // (expert, first permuted row)
  const int32_t* num_tiles;
  const int32_t* offsets;      // [experts + 1]
  const int32_t* perm_token;   // gather: A row of permuted row p is a[perm_token[p]] (null: a[p])
  const __nv_bfloat16* a;      // [rows][K]
  const __nv_bfloat16* b0;     // gate (or down) [experts][N][K]
  const __nv_bfloat16* b1;     // up [experts][N][K] (gate+up only)
  const int32_t* weight_slot;  // an expert's place in b0/b1 (null: the expert itself)
  int N, K;
  __nv_bfloat16* h;    // gate+up: [rows][N]
  float* y;            // down: [rows][N]
  __nv_bfloat16* y16;  // down, where given: the rows in bf16 instead of y
  // The tile list, offsets and gathers were written two or more launches back (down after gate+up): the CTA's
  // first weight stages may be copied before griddepcontrol.wait (see grouped_gemm_kernel).
  bool b_early;
};

// Element offset of (row, 16-byte chunk) in a [rows][64] tile, chunks XOR-swizzled by the row.
__device__ inline int swz(int row, int chunk) { return row * kTileK + ((chunk ^ (row & 7)) << 3); }

// The CTA's row tile and output columns: (expert, first permuted row) from the router's list, its rows (up to BM),
// the expert's weight slab, and the first output column (gate+up: BN B rows make BN / 2 outputs); false past the
// list's end. CTAs run in launch order (x fastest), taken here in groups of kTileGroup row tiles that walk every
// column tile together: a group's A rows (a few MB) are read from HBM once and from L2 for each column tile, and an
// expert's weight tile by its row tiles side by side. (With row tiles fastest over the whole list, each column tile
// walked every expert's rows: prefill's A, 117 MB of gathered rows at V3 8192 tokens, past L2, came from HBM once per
// column tile: ncu saw DRAM 74-83% busy moving ~1.6x the weights' bytes.) The grid's x is a multiple of kTileGroup.
constexpr int kTileGroup = 4;
struct CtaTile {
  int row0, rows, out0;
  int64_t slab;
};
template <int BM, int BN, bool GATE_UP>
__device__ inline bool cta_tile(const GroupedArgs& g, CtaTile& ct) {
  const int column_tiles = int(gridDim.y), linear = int(blockIdx.x) + int(gridDim.x) * int(blockIdx.y);
  const int group = linear / (kTileGroup * column_tiles), within = linear % (kTileGroup * column_tiles);
  const int tile_index = group * kTileGroup + within % kTileGroup, column_tile = within / kTileGroup;
  if (tile_index >= *g.num_tiles) return false;
  const int2 tile = g.tiles[tile_index];
  const int expert = tile.x;
  ct = {tile.y, min(BM, g.offsets[expert + 1] - tile.y), column_tile * (GATE_UP ? BN / 2 : BN),
        g.weight_slot ? g.weight_slot[expert] : expert};
  return true;
}
// The grid over `max_tiles` row tiles and the column tiles of N outputs (gate+up: BN / 2 a tile).
inline dim3 tile_grid(int max_tiles, int N, int outputs) {
  return dim3(unsigned((max_tiles + kTileGroup - 1) / kTileGroup * kTileGroup), unsigned((N + outputs - 1) / outputs));
}

// One output row's share of a warp's accumulators: n8 blocks acc[j] in the mma/wgmma layout (this lane's columns
// 2 (lane % 4) + {0, 1}; elements 2 half + {0, 1}). Gate+up: blocks j (gate) and j + 1 (up) are the same 8 outputs,
// from col0 + 8 (j / 2), written as silu(gate) * up in bf16; down: block j is columns col0 + 8 j, written as fp32.
template <bool GATE_UP, int N8>
__device__ inline void store_row(const GroupedArgs& g, int64_t row, int half, int col0, const float (&acc)[N8][4]) {
  const int lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int j = 0; j < N8; j += GATE_UP ? 2 : 1) {
    const int col = col0 + 8 * (GATE_UP ? j / 2 : j) + 2 * (lane % 4);
    if (col >= g.N) continue;
    if (GATE_UP) {
      const float h0 = silu(acc[j][2 * half]) * acc[j + 1][2 * half];
      const float h1 = silu(acc[j][2 * half + 1]) * acc[j + 1][2 * half + 1];
      *reinterpret_cast<__nv_bfloat162*>(g.h + row * g.N + col) = __floats2bfloat162_rn(h0, h1);
    } else if (g.y16) {
      *reinterpret_cast<__nv_bfloat162*>(g.y16 + row * g.N + col) =
          __floats2bfloat162_rn(acc[j][2 * half], acc[j][2 * half + 1]);
    } else {
      *reinterpret_cast<float2*>(g.y + row * g.N + col) = make_float2(acc[j][2 * half], acc[j][2 * half + 1]);
    }
  }
}

// One CTA's operand copies, a stage (64 K values) at a time into [rows][64] swizzled tiles: its BM permuted A rows
// (gathered through perm_token) and its BN B rows of expert `slab` (gate+up: rows 16q..16q+7 the gate rows of outputs
// out0 + 8q.., rows 16q+8.. the up rows of the same outputs). Each thread's global row pointers are fixed over K,
// so they are found once; rows past the expert's or N, and K past its end, are copied as zeros.
template <int BM, int BN, int THREADS, bool GATE_UP>
struct TileLoader {
  static constexpr int kBChunks = BN * 8 / THREADS, kAChunks = (BM * 8 + THREADS - 1) / THREADS;
  const __nv_bfloat16* b_row[kBChunks];
  bool b_ok[kBChunks];
  const __nv_bfloat16* a_row[kAChunks];
  bool a_ok[kAChunks];
  const GroupedArgs& g;
  int tid;

  __device__ TileLoader(const GroupedArgs& args, int thread, int64_t slab, int out0, int row0, int rows)
      : g(args), tid(thread) {
    const int64_t K = g.K;
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      const int n = (tid + i * THREADS) / 8;
      int col;
      const __nv_bfloat16* base;
      if (GATE_UP) {
        col = out0 + 8 * (n / 16) + n % 8;
        base = (n % 16) < 8 ? g.b0 : g.b1;
      } else {
        col = out0 + n;
        base = g.b0;
      }
      b_ok[i] = col < g.N;
      b_row[i] = base + (slab * g.N + (b_ok[i] ? col : 0)) * K;
    }
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const int r = (tid + i * THREADS) / 8;
      a_ok[i] = r < rows && tid + i * THREADS < BM * 8;
      const int p = row0 + (a_ok[i] ? r : 0);
      a_row[i] = g.a + int64_t(g.perm_token ? g.perm_token[p] : p) * K;
    }
  }

  __device__ void load(__nv_bfloat16* sa, __nv_bfloat16* sb, int kt) const {
    load_a(sa, kt);
    load_b(sb, kt);
  }
  __device__ void load_a(__nv_bfloat16* sa, int kt) const {
    const int k0 = kt * kTileK;
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const int id = tid + i * THREADS;
      if (id >= BM * 8) break;
      const int r = id / 8, c = id % 8;
      const bool ok = a_ok[i] && k0 + c * 8 < g.K;
      cp_async16(sa + swz(r, c), ok ? a_row[i] + k0 + c * 8 : g.a, ok);
    }
  }
  __device__ void load_b(__nv_bfloat16* sb, int kt) const {
    const int k0 = kt * kTileK;
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      const int id = tid + i * THREADS;
      const int n = id / 8, c = id % 8;
      const bool ok = b_ok[i] && k0 + c * 8 < g.K;
      cp_async16(sb + swz(n, c), ok ? b_row[i] + k0 + c * 8 : g.b0, ok);
    }
  }
};

// BM rows x BN B rows (gate+up: BN / 2 gate + BN / 2 up rows = BN / 2 outputs) per CTA, WARPS warps of which
// WARPS_M along the rows.
//
// Launched with launch_pdl (variants/common/cuda/pdl.cuh). With g.b_early (down, after gate+up) the CTA finds its tile
// and copies its first STAGES - 1 weight stages before griddepcontrol.wait: the tile list comes from the router two
// launches back, finished once gate+up (which triggers after its own wait) let this kernel start, and the weights
// from no kernel; the A rows (gate+up's output) are copied after the wait. At decode each CTA streams its ~200 KB of
// weights once, so its pipeline's fill is a large part of its time, and this overlaps it with gate+up's tail.
template <int BM, int BN, int WARPS, int WARPS_M, int STAGES, bool GATE_UP>
__global__ void __launch_bounds__(WARPS * 32) grouped_gemm_kernel(GroupedArgs g) {
  if (!g.b_early) {
    pdl_wait();
    pdl_launch_dependents();
  }
  constexpr int kThreads = WARPS * 32, kTileN = BN;
  constexpr int WARPS_N = WARPS / WARPS_M, WTM = BM / WARPS_M, WTN = kTileN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
  static_assert(NT % 2 == 0 && MT >= 1, "warp tile: whole m16 rows, pairs of n8 columns");
  extern __shared__ __align__(128) __nv_bfloat16 smem[];
  __nv_bfloat16* sa = smem;                         // [STAGES][BM][64]
  __nv_bfloat16* sb = smem + STAGES * BM * kTileK;  // [STAGES][128][64]

  CtaTile ct;
  if (!cta_tile<BM, kTileN, GATE_UP>(g, ct)) return;  // (a CTA that exits counts as having triggered its dependents)
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int k_tiles = (g.K + kTileK - 1) / kTileK;

  const TileLoader<BM, kTileN, kThreads, GATE_UP> loader(g, tid, ct.slab, ct.out0, ct.row0, ct.rows);
  auto load_stage = [&](int stage, int kt) { loader.load(sa + stage * BM * kTileK, sb + stage * kTileN * kTileK, kt); };

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

  if (g.b_early) {  // one group of the first stages' weights, then (after the wait) one group per stage of A rows:
#pragma unroll      // the loop's wait for all but the newest STAGES - 2 groups still finds stage kt whole
    for (int s = 0; s < STAGES - 1; ++s)
      if (s < k_tiles) loader.load_b(sb + s * kTileN * kTileK, s);
    cp_async_commit();
    pdl_wait();
    pdl_launch_dependents();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) loader.load_a(sa + s * BM * kTileK, s);
      cp_async_commit();
    }
  } else {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      cp_async_commit();
    }
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is no longer read by anyone
    const int next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(next % STAGES, next);
    cp_async_commit();
    const __nv_bfloat16* ta = sa + (kt % STAGES) * BM * kTileK;
    const __nv_bfloat16* tb = sb + (kt % STAGES) * kTileN * kTileK;
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      uint32_t af[MT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int r = wm * WTM + i * 16 + lane % 16;
        ldmatrix_x4(smem_addr(ta + swz(r, kk * 2 + lane / 16)), af[i][0], af[i][1], af[i][2], af[i][3]);
      }
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        const int n = wn * WTN + j * 8 + lane % 8 + (lane / 16) * 8;
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(smem_addr(tb + swz(n, kk * 2 + (lane / 8) % 2)), b0, b1, b2, b3);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          mma_bf16(acc[i][j], af[i], b0, b1);
          mma_bf16(acc[i][j + 1], af[i], b2, b3);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue. Accumulator (i, j): rows lane/4 and lane/4 + 8 of m-tile i, columns 2 (lane % 4) + {0, 1} of n-tile j;
  // this warp's n-tiles start at B row wn * WTN (gate+up: output wn * WTN / 2).
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * WTM + i * 16 + lane / 4 + half * 8;
      if (r < ct.rows) store_row<GATE_UP>(g, ct.row0 + r, half, ct.out0 + (GATE_UP ? wn * WTN / 2 : wn * WTN), acc[i]);
    }
}

// ---- Decode tiles as GEMVs (4-row tiles) ------------------------------------------------------------------------
// At a few rows an expert the MMA tiles stream weights through a shared-memory pipeline whose depth per CTA bounds
// the bytes in flight; here every warp streams its own weight row(s) with all of its loads in flight at once, as
// the own GEMV (gemv.cu) does for the projections: CTA (column block, row tile) takes kGemvFeatures output features
// of the tile's expert, a warp one feature (gate+up: its gate and up rows), each lane a batch of 16-byte chunks of
// its row(s) at a time, then every row of the tile (up to kGemvTileRows, one at decode's usual token an expert) against
// them; an expert with more rows has more tiles, each streaming its weights again. With b_early (down after gate+up)
// the CTA finds its tile and issues its first batch of weight loads before griddepcontrol.wait.
constexpr int kGemvWarps = 8, kGemvFeatures = kGemvWarps, kGemvMaxRows = kGemvTileRows;
// 16-byte chunks a lane loads a batch, of each weight row: 8 (down), 4 of gate and 4 of up (gate+up; 8 each spilled
// at the 80 registers that leave room for three CTAs an SM)
constexpr int kGemvLoadsGateUp = 4, kGemvLoadsDown = 8;
template <bool GATE_UP>
__global__ void __launch_bounds__(kGemvWarps * 32, 3) grouped_gemv_kernel(GroupedArgs g) {
  constexpr int kGemvLoads = GATE_UP ? kGemvLoadsGateUp : kGemvLoadsDown;
  if (!g.b_early) {
    pdl_wait();
    pdl_launch_dependents();
  }
  const int tile_index = int(blockIdx.y), warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const bool has_tile = tile_index < *g.num_tiles;
  int row0 = 0, rows = 0;
  const int n = int(blockIdx.x) * kGemvFeatures + warp;
  const bool feature_ok = has_tile && n < g.N;
  const uint4 *w0 = nullptr, *w1 = nullptr;
  if (has_tile) {
    const int2 tile = g.tiles[tile_index];
    row0 = tile.y;
    rows = min(kGemvMaxRows, g.offsets[tile.x + 1] - tile.y);
    const int64_t slab = g.weight_slot ? g.weight_slot[tile.x] : tile.x;
    const int64_t at = (slab * g.N + (feature_ok ? n : 0)) * g.K;
    w0 = reinterpret_cast<const uint4*>(g.b0 + at);
    if (GATE_UP) w1 = reinterpret_cast<const uint4*>(g.b1 + at);
  }
  const int chunks = g.K / 8;
  uint4 v0[kGemvLoads], v1[kGemvLoads];
  auto load = [&](int c) {
#pragma unroll
    for (int u = 0; u < kGemvLoads; ++u) {
      const int at = c + 32 * u;
      const bool ok = feature_ok && at < chunks;
      v0[u] = ok ? __ldcs(w0 + at) : make_uint4(0, 0, 0, 0);  // (streamed once: evict first)
      if (GATE_UP) v1[u] = ok ? __ldcs(w1 + at) : make_uint4(0, 0, 0, 0);
    }
  };
  load(lane);
  if (g.b_early) {
    pdl_wait();
    pdl_launch_dependents();
  }
  if (!feature_ok) return;
  float acc0[kGemvMaxRows] = {}, acc1[kGemvMaxRows] = {};
  const __nv_bfloat16* x_rows[kGemvMaxRows];  // the tile's A rows (gathered through perm_token)
#pragma unroll
  for (int m = 0; m < kGemvMaxRows; ++m) {
    const int64_t p = row0 + min(m, rows - 1);
    x_rows[m] = g.a + int64_t(g.perm_token ? g.perm_token[p] : p) * g.K;
  }
  for (int c = lane;;) {
    // Chunk by chunk, each row's x chunk used as it lands (every row's batch of x held at once: 207 registers)
#pragma unroll
    for (int u = 0; u < kGemvLoads; ++u) {
      const int at = min(c + 32 * u, chunks - 1);  // (past the end: a valid chunk against zero weights)
      const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&v0[u]);
      const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&v1[u]);
#pragma unroll
      for (int m = 0; m < kGemvMaxRows; ++m) {
        if (m >= rows) break;
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x_rows[m]) + at);
        const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 x = __bfloat1622float2(x2[i]), w = __bfloat1622float2(a2[i]);
          acc0[m] = fmaf(w.x, x.x, fmaf(w.y, x.y, acc0[m]));
          if (GATE_UP) {
            const float2 w1f = __bfloat1622float2(b2[i]);
            acc1[m] = fmaf(w1f.x, x.x, fmaf(w1f.y, x.y, acc1[m]));
          }
        }
      }
    }
    c += 32 * kGemvLoads;
    if (c >= chunks) break;
    load(c);
  }
#pragma unroll
  for (int m = 0; m < kGemvMaxRows; ++m) {
    if (m >= rows) break;
    float a = acc0[m], b = acc1[m];
    for (int o = 16; o; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      if (GATE_UP) b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (lane != 0) continue;
    const int64_t row = row0 + m;
    if (GATE_UP)
      g.h[row * g.N + n] = __float2bfloat16_rn(silu(a) * b);
    else if (g.y16)
      g.y16[row * g.N + n] = __float2bfloat16_rn(a);
    else
      g.y[row * g.N + n] = a;
  }
}

template <bool GATE_UP>
void launch_gemv_tiles(const GroupedArgs& g, int max_tiles, cudaStream_t stream) {
  const dim3 grid(unsigned((g.N + kGemvFeatures - 1) / kGemvFeatures), unsigned(max_tiles));
  launch_pdl(grouped_gemv_kernel<GATE_UP>, grid, dim3(kGemvWarps * 32), 0, stream, g);
  DSLAB_CHECK_LAUNCH();
}

// One of the grouped kernels over the router's row tiles (tile_grid) and the column tiles of its BN B rows, its
// dynamic shared memory opted into on first use (outside any capture: the variants run a step before capturing).
template <auto kKernel, int BN, bool GATE_UP>
void launch_tiles(const GroupedArgs& g, int max_tiles, int threads, size_t smem, cudaStream_t stream) {
  static bool configured = false;
  if (!configured) {
    DSLAB_CUDA(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    configured = true;
  }
  launch_pdl(kKernel, tile_grid(max_tiles, g.N, GATE_UP ? BN / 2 : BN), dim3(threads), smem, stream, g);
  DSLAB_CHECK_LAUNCH();
}

template <int BM, int BN, int WARPS, int WARPS_M, int STAGES, bool GATE_UP>
void launch(const GroupedArgs& g, int max_tiles, cudaStream_t stream) {
  launch_tiles<grouped_gemm_kernel<BM, BN, WARPS, WARPS_M, STAGES, GATE_UP>, BN, GATE_UP>(
      g, max_tiles, WARPS * 32, size_t(STAGES) * (BM + BN) * kTileK * 2, stream);
}

// ---- Prefill tiles on Hopper's warpgroup MMA (moe/grouped_wgmma/cuda) ---------------------------------------------
// 128 rows x BN B rows per CTA, two warpgroups of 64 rows sharing each stage's B tile; every thread copies (cp.async,
// STAGES stages, STAGES - 2 in flight ahead of the one multiplied), each warpgroup multiplies its 64 rows by wgmma
// m64nBNk16 from the swizzled tiles (both operands K-major), keeping one k-stage's MMAs in flight while the next
// one's are issued. BN 256 (the default) copies 48 KB a k-stage for twice the FLOPs of BN 128's 32 KB and reads each
// A byte from shared memory once per 256 columns instead of 128: on the H100, V3 at 8192 tokens, 23.5 ms (BN 128, six
// stages) -> 19.0 ms, moe/loop/cuda over it 0.91x -> 1.12x in the same runs (before the tile groups).
// DSLAB_WGMMA_TILE=128x128 selects the BN 128 kernel (six stages) for such A/B runs.
constexpr int kWgRows = 128, kWgThreads = 256;
template <int BN, int STAGES>
constexpr size_t wg_smem() {
  return size_t(STAGES) * (kWgRows + BN) * kTileK * 2 + 1024;
}  // (+ room to align to 1024)

template <int BN, int STAGES, bool GATE_UP>
__global__ void __launch_bounds__(kWgThreads, 1) grouped_wgmma_kernel(GroupedArgs g) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  constexpr int kAhead = STAGES - 2;  // (the stage being multiplied and the one whose MMAs may still be in flight)
  extern __shared__ unsigned char wg_smem_raw[];
  // Stages start 1024-byte aligned (the swizzle's period, which the descriptors assume).
  __nv_bfloat16* sa = reinterpret_cast<__nv_bfloat16*>(
      wg_smem_raw + ((1024 - (smem_addr(wg_smem_raw) & 1023)) & 1023));  // [stages][128][64]
  __nv_bfloat16* sb = sa + STAGES * kWgRows * kTileK;                    // [stages][BN][64]

  CtaTile ct;
  if (!cta_tile<kWgRows, BN, GATE_UP>(g, ct)) return;
  const int tid = int(threadIdx.x), warpgroup = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
  const int k_tiles = (g.K + kTileK - 1) / kTileK;
  const TileLoader<kWgRows, BN, kWgThreads, GATE_UP> loader(g, tid, ct.slab, ct.out0, ct.row0, ct.rows);
  auto load_stage = [&](int kt) {
    loader.load(sa + (kt % STAGES) * kWgRows * kTileK, sb + (kt % STAGES) * BN * kTileK, kt);
  };

  float acc[BN / 8][4];
#pragma unroll
  for (auto& x : acc) x[0] = x[1] = x[2] = x[3] = 0.0f;
    // Tiles 0 .. kAhead - 1 in flight; iteration kt copies tile kt + kAhead into the stage tile kt - 2 used, whose MMAs
    // every warp has waited for (wgmma_wait<1> at the end of iteration kt - 1, before this iteration's barrier).
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_tiles) load_stage(s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kAhead - 1>();  // (groups: tiles 0 .. kt + kAhead - 1 committed; tile kt and those before landed)
    fence_proxy_async();          // this thread's copies (generic proxy) are read by the tensor cores (async proxy)
    __syncthreads();
    if (kt + kAhead < k_tiles) load_stage(kt + kAhead);
    cp_async_commit();
    const uint64_t a_desc = wgmma_desc(sa + (kt % STAGES) * kWgRows * kTileK + warpgroup * 64 * kTileK);
    const uint64_t b_desc = wgmma_desc(sb + (kt % STAGES) * BN * kTileK);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks)
      wgmma_tile<BN>(acc, a_desc + 2 * ks, b_desc + 2 * ks);  // (+32 bytes a k16 step)
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();

  // Epilogue: this thread's rows warpgroup * 64 + 16 warp + lane / 4 (+ 8), n8 block j's columns 2 (lane % 4) + {0, 1}.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warpgroup * 64 + warp * 16 + lane / 4 + half * 8;
    if (r < ct.rows) store_row<GATE_UP>(g, ct.row0 + r, half, ct.out0, acc);
  }
}

template <int BN, int STAGES, bool GATE_UP>
void launch_wgmma(const GroupedArgs& g, int max_tiles, cudaStream_t stream) {
  launch_tiles<grouped_wgmma_kernel<BN, STAGES, GATE_UP>, BN, GATE_UP>(g, max_tiles, kWgThreads, wg_smem<BN, STAGES>(),
                                                                       stream);
}

// The wgmma tile's width: 256 unless DSLAB_WGMMA_TILE=128x128 (read once; anything else is an error).
bool wgmma_narrow_tile() {
  static const bool narrow = [] {
    const char* v = std::getenv("DSLAB_WGMMA_TILE");
    if (!v || !*v || std::string(v) == "128x256") return false;
    if (std::string(v) == "128x128") return true;
    throw BadInput(std::string("DSLAB_WGMMA_TILE: \"") + v + "\" is not a tile (expected 128x256 or 128x128)");
  }();
  return narrow;
}

template <bool GATE_UP>
void launch_for_tile(int tile_rows, int tile_width, bool wgmma, const GroupedArgs& g, int max_tiles,
                     cudaStream_t stream) {
  if (wgmma && tile_rows == kWgRows)
    return wgmma_narrow_tile() ? launch_wgmma<128, 6, GATE_UP>(g, max_tiles, stream)
                               : launch_wgmma<256, 4, GATE_UP>(g, max_tiles, stream);
  switch (tile_rows) {
    // Decode: weight streaming, so narrow CTAs (64 B rows, 4 warps, 60 KB: three per SM) for more of them in
    // flight (a V2-Lite layer's 6 experts x 1408 outputs made 132 CTAs of 128 B rows; its down GEMM 96). The width
    // is measured per GPU and shape with the row tile (choose_tile_rows): 32 B rows (2 warps, 36 KB: six per SM,
    // twice the CTAs to spread over the SMs), 64, or 128 (8 warps, four stages, 74 KB: three per SM). 4-row tiles are
    // the GEMV form (grouped_gemv_kernel).
    case kGemvTileRows:
      launch_gemv_tiles<GATE_UP>(g, max_tiles, stream);
      break;
    case 16:
      if (tile_width == 32)
        launch<16, 32, 2, 1, 6, GATE_UP>(g, max_tiles, stream);
      else if (tile_width == 128)
        launch<16, 128, 8, 1, 4, GATE_UP>(g, max_tiles, stream);
      else
        launch<16, 64, 4, 1, 6, GATE_UP>(g, max_tiles, stream);
      break;
    case 64:
      launch<64, 128, 8, 2, 4, GATE_UP>(g, max_tiles, stream);
      break;
    // (96 KB of shared memory would let two CTAs share an SM, but 169-171 registers x 256 threads hold one: prefill
    // here runs at 0.54-0.59x the speed of moe/grouped_wgmma/cuda's tiles, H100)
    default:
      launch<128, 128, 8, 2, 3, GATE_UP>(g, max_tiles, stream);
      break;
  }
}

// kWgmma: 128-row (prefill) tiles on grouped_wgmma_kernel, the others as moe/grouped/cuda.
template <bool kWgmma>
class MoeGrouped final : public MoeOp {
 public:
  bool graph_safe() const override { return true; }

 protected:
  void prepare_experts() override { h_.scratch(arena_, size_t(rows_ * inter_)); }
  const char* tile_kernels() const override { return kWgmma ? "mma.sync/wgmma" : "mma.sync"; }
  bool bf16_rows() const override { return true; }
  void experts() override {
    GroupedExperts e{tiles_.get(), num_tiles_.get(),   offsets_.get(),   perm_token_.get(),  max_tiles_, tile_rows_,
                     b_.x,         w_->gate_experts(), w_->up_experts(), w_->down_experts(), nullptr,    hidden_,
                     inter_,       h_.get(),           nullptr};
    e.wgmma = kWgmma;
    e.y16 = y16_.get();
    e.down_after_gate_up = true;
    e.tile_width = tile_width_;
    grouped_gate_up(e, stream_);
    mark("gate_up");
    grouped_down(e, stream_);
  }

 private:
  DeviceArray<__nv_bfloat16> h_;  // [rows][I]: silu(gate) * up of each permuted row
};
using MoeGroupedCuda = MoeGrouped<false>;
using MoeGroupedWgmma = MoeGrouped<true>;

}  // namespace

void grouped_gate_up(const GroupedExperts& e, cudaStream_t stream) {
  const GroupedArgs up{e.tiles,       e.num_tiles,  e.offsets,     e.perm_token, e.x,     e.gate,  e.up,
                       e.weight_slot, int(e.inter), int(e.hidden), e.h,          nullptr, nullptr, /*b_early=*/false};
  launch_for_tile<true>(e.tile_rows, e.tile_width, e.wgmma, up, e.max_tiles, stream);
}

void grouped_down(const GroupedExperts& e, cudaStream_t stream) {
  const GroupedArgs down{e.tiles,       e.num_tiles,   e.offsets,    nullptr, e.h, e.down, nullptr,
                         e.weight_slot, int(e.hidden), int(e.inter), nullptr, e.y, e.y16,  e.down_after_gate_up};
  launch_for_tile<false>(e.tile_rows, e.tile_width, e.wgmma, down, e.max_tiles, stream);
}

DSLAB_REGISTER_MOE_OP(
    MoeGroupedWgmma, "moe/grouped_wgmma/cuda",
    "moe/grouped/cuda with prefill's 128-row tiles on Hopper's warpgroup MMA (128 x 256 CTA tiles, wgmma m64n256k16, "
    "two warpgroups a CTA, four cp.async stages); decode tiles as moe/grouped/cuda");
DSLAB_REGISTER_MOE_OP(
    MoeGroupedCuda, "moe/grouped/cuda",
    "routed experts as two grouped GEMMs of our own (mma.sync, tiles by expert from the GPU router), SiLU*up fused, "
    "graph-capturable");

}  // namespace dslab::moe::cuda
