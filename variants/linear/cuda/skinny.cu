// The skinny GEMM of linear() (variants/linear/cuda/gemv.cu): y[rows][out] (+ beta y) = x[rows][in] · w[out][in]^T
// for kGemvRows < rows <= kSkinnyMaxRows on Hopper's warpgroup MMA, picked where a handle's projections are `own`.
// At these sizes a decode step's projections stream their weights (a V3 q_b_proj is 9-75 MB for 16-128 heads) and
// the rows are few: cuBLAS's GEMMs read them at 0.9-2.5 TB/s on the H100 (V3 batch 64, session 22: qkv_a 23 us for
// 30 MB), where the weights alone could stream at ~3.
//
// Swapped operands, so that the weight fills the MMA's 64-row side: each CTA (one warpgroup) computes a 128-feature
// x BN-row tile of y^T = w · x^T by two wgmma m64nBNk16 a k16 step (BN 32 or 64: the rows rounded up; rows past `rows` are zeros,
// copied as such; 65-128 rows: two CTAs a feature tile, side by side in launch order so that the second reads the
// weights from L2), both operands K-major from 128-byte-swizzled shared-memory stages filled by cp.async, as many
// stages as fit (one CTA an SM): a weight stream needs its bytes in flight, and with two stages ahead a CTA waited
// out each stage's latency (0.3-1.3 TB/s, H100, session 22); 128 features a CTA halve the x bytes per weight byte. The weight tile's first stages are copied before
// griddepcontrol.wait (the weights depend on no kernel; x comes from the one before). K is split over gridDim.y
// CTAs where that fills the SMs better (skinny_splits): each writes its fp32 partial tile to the handle's workspace
// and the last of a tile's CTAs to finish (a per-tile counter) adds them up and writes y.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "harness/cuda_check.h"
#include "harness/host.h"
#include "variants/common/pdl.cuh"
#include "variants/common/wgmma.cuh"
#include "variants/mla/cuda/mla_cuda.h"

namespace dslab::mla::cuda {

namespace {

constexpr int kFeatures = 128;  // weight rows (output features) per CTA: two MMAs' M of 64, sharing each x stage
constexpr int kTileK = 64;     // K values per stage (one 128-byte swizzled block)
constexpr int kThreads = 128;  // one warpgroup
constexpr int kRowTile = 64;    // rows per CTA at most (more rows: a CTA per 64-row half, side by side in x)
constexpr int kCtasPerSm = 1;
constexpr size_t kSmemLimit = 220 * 1024;
template <int BN>
struct Tile {
  static constexpr size_t kStageBytes = size_t(kFeatures + BN) * kTileK * 2;
  static constexpr int kStages = int(kSmemLimit / kStageBytes);  // 64 rows: 9 (112 KB of weights in flight), 32: 11
  static constexpr int kAhead = kStages - 2;  // copies in flight ahead of the stage multiplied (as grouped_wgmma_kernel)
  static constexpr size_t kSmemBytes = kStages * kStageBytes + 1024;  // (+ room to align the stages to 1024 bytes)
};
// Per-split partials: at most this many floats of the workspace (16 MB).
constexpr size_t kPartialFloats = size_t(4) << 20;

// d (+)= A[64 x 16] . B[N x 16]^T for the row tiles (bf16, both K-major descriptors); d = A . B^T where !accumulate.
__device__ inline void wgmma_m64n32k16_bf16(float (&d)[4][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
               : "l"(a), "l"(b), "r"(accumulate));
}
__device__ inline void wgmma_m64n64k16_bf16(float (&d)[8][4], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
               : "l"(a), "l"(b), "r"(accumulate));
}
template <int BN>
__device__ __forceinline__ void wgmma_rows(float (&d)[BN / 8][4], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (BN == 64) wgmma_m64n64k16_bf16(d, a, b, accumulate);
  else wgmma_m64n32k16_bf16(d, a, b, accumulate);
}

struct SkinnyArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  void* y;
  bool y_bf16;
  float beta;
  int rows, in, out;
  int row_tiles;          // kRowTile-row tiles: blockIdx.x = feature tile x row_tiles + row tile
  int k_tiles_per_split;  // K tiles (kTileK) of each split; the last split takes what is left
  float* partials;        // [split][rows][out] (gridDim.y > 1)
  int* arrivals;          // [blockIdx.x]: splits done so far; the last resets it to 0
};

// Copies K tile kt's weight rows (`weights`) or x rows into `stage` ([64 + 128][64] swizzled: weights first), zeros
// where a row or the K tile ends (in % 8 == 0: a 16-byte chunk is wholly inside or outside).
__device__ __forceinline__ void copy_weights(const SkinnyArgs& g, __nv_bfloat16* stage, int kt, int tid) {
  const int feature0 = int(blockIdx.x) / g.row_tiles * kFeatures;
  for (int c = tid; c < kFeatures * 8; c += kThreads) {
    const int row = c / 8, col = (c % 8) * 8, k = kt * kTileK + col;
    const bool valid = feature0 + row < g.out && k < g.in;
    cp_async16(stage + swz(row, col, kFeatures), g.w + (valid ? int64_t(feature0 + row) * g.in + k : 0), valid);
  }
}
template <int BN>
__device__ __forceinline__ void copy_x(const SkinnyArgs& g, __nv_bfloat16* stage, int kt, int tid) {
  __nv_bfloat16* const xs = stage + kFeatures * kTileK;
  const int row0 = int(blockIdx.x) % g.row_tiles * kRowTile;
  for (int c = tid; c < BN * 8; c += kThreads) {
    const int row = c / 8, col = (c % 8) * 8, k = kt * kTileK + col;
    const bool valid = row0 + row < g.rows && k < g.in;
    cp_async16(xs + swz(row, col, BN), g.x + (valid ? int64_t(row0 + row) * g.in + k : 0), valid);
  }
}

// This thread's accumulators: feature feature0 + 16 warp + lane / 4 (+ 8 for e >= 2), row 8 j + 2 (lane % 4) + e % 2.
__device__ __forceinline__ void store(const SkinnyArgs& g, int feature, int row, float v) {
  const int64_t i = int64_t(row) * g.out + feature;
  if (g.y_bf16) {
    __nv_bfloat16* y = static_cast<__nv_bfloat16*>(g.y) + i;
    *y = __float2bfloat16(g.beta != 0.0f ? v + g.beta * __bfloat162float(*y) : v);
  } else {
    float* y = static_cast<float*>(g.y) + i;
    *y = g.beta != 0.0f ? v + g.beta * *y : v;
  }
}

template <int BN>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) skinny_gemm_kernel(SkinnyArgs g) {
  using T = Tile<BN>;
  constexpr int kStages = T::kStages, kAhead = T::kAhead;
  extern __shared__ unsigned char skinny_smem_raw[];
  __nv_bfloat16* const stages =
      reinterpret_cast<__nv_bfloat16*>(skinny_smem_raw + ((1024 - (smem_addr(skinny_smem_raw) & 1023)) & 1023));
  auto stage_of = [&](int kt) { return stages + (kt % kStages) * (T::kStageBytes / 2); };
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int k_tiles = (g.in + kTileK - 1) / kTileK;
  const int kt0 = int(blockIdx.y) * g.k_tiles_per_split;
  const int kt1 = blockIdx.y + 1 == gridDim.y ? k_tiles : min(k_tiles, kt0 + g.k_tiles_per_split);

  // The first stages' weights before the wait (one group), then each stage's x (a group each): the loop's waits
  // count groups from the end, so the extra first group changes nothing there.
  for (int s = 0; s < kAhead; ++s)
    if (kt0 + s < kt1) copy_weights(g, stage_of(kt0 + s), kt0 + s, tid);
  cp_async_commit();
  pdl_wait();  // (launched with launch_pdl: see variants/common/pdl.cuh) x, y and the workspace from here on
  pdl_launch_dependents();
  for (int s = 0; s < kAhead; ++s) {
    if (kt0 + s < kt1) copy_x<BN>(g, stage_of(kt0 + s), kt0 + s, tid);
    cp_async_commit();
  }

  // Each K tile's product in its own accumulators, added to the running sums in fp32 (round to nearest): summed
  // in the MMA's accumulators over all of K (16384 for V3's o_proj), y was 1.8-2.0e-5 off the fp64 product where
  // cuBLAS's was 3.4e-6 (H100, session 22).
  float acc[2][BN / 8][4];  // [feature half]
#pragma unroll
  for (auto& h : acc)
#pragma unroll
    for (auto& a : h) a[0] = a[1] = a[2] = a[3] = 0.0f;
  for (int kt = kt0; kt < kt1; ++kt) {
    cp_async_wait<kAhead - 1>();  // tile kt (and those before) landed
    fence_proxy_async();          // this thread's copies (generic proxy) are read by the tensor cores (async proxy)
    __syncthreads();              // everyone's copies of tile kt; everyone past the MMAs of tile kt - 2 (whose stage is refilled now)
    if (kt + kAhead < kt1) {
      copy_weights(g, stage_of(kt + kAhead), kt + kAhead, tid);
      copy_x<BN>(g, stage_of(kt + kAhead), kt + kAhead, tid);
    }
    cp_async_commit();
    const __nv_bfloat16* stage = stage_of(kt);
    // (the second 64 weight rows start 8 KB on: 1024-byte aligned, as the swizzle's descriptors need)
    const uint64_t w_desc = wgmma_desc(stage), x_desc = wgmma_desc(stage + kFeatures * kTileK);
    float part[2][BN / 8][4];  // (the first k16 step overwrites them: no zeroing, which ptxas fenced the MMAs around)
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {  // (+32 bytes a k16 step)
      wgmma_rows<BN>(part[0], w_desc + 2 * ks, x_desc + 2 * ks, ks > 0);
      wgmma_rows<BN>(part[1], w_desc + 64 * 64 * 2 / 16 + 2 * ks, x_desc + 2 * ks, ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();  // (the stage is refilled only after the next iteration's barrier)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][j][e] += part[h][j][e];
  }
  cp_async_wait<0>();

  const int feature0 = int(blockIdx.x) / g.row_tiles * kFeatures, row0 = int(blockIdx.x) % g.row_tiles * kRowTile;
  const int feature_lo = feature0 + warp * 16 + lane / 4;
  auto for_each = [&](auto&& f) {  // f(feature, row, accumulator) over this thread's real outputs
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int feature = feature_lo + h * 64 + (e / 2) * 8, row = row0 + j * 8 + (lane % 4) * 2 + e % 2;
          if (feature < g.out && row < g.rows) f(feature, row, acc[h][j][e]);
        }
  };
  if (gridDim.y == 1) {
    for_each([&](int feature, int row, float v) { store(g, feature, row, v); });
    return;
  }
  // Split K: the partial tile out, then the tile's last CTA sums every split's (threadFenceReduction's pattern),
  // 16 bytes a load, eight splits' loads in flight (out % 4 == 0 where K is split: skinny_splits).
  float* const mine = g.partials + int64_t(blockIdx.y) * g.rows * g.out;
  for_each([&](int feature, int row, float v) { mine[int64_t(row) * g.out + feature] = v; });
  __threadfence();
  __shared__ bool last;
  __syncthreads();
  if (tid == 0) last = atomicAdd(&g.arrivals[blockIdx.x], 1) == int(gridDim.y) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t split_stride = int64_t(g.rows) * g.out / 4;  // float4s between splits
  const int rows_here = min(kRowTile, g.rows - row0);
  for (int c = tid; c < rows_here * (kFeatures / 4); c += kThreads) {
    const int row = row0 + c / (kFeatures / 4), feature = feature0 + (c % (kFeatures / 4)) * 4;
    if (feature >= g.out) continue;
    const float4* src = reinterpret_cast<const float4*>(g.partials + int64_t(row) * g.out + feature);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = 0; s < int(gridDim.y); ++s) {
      const float4 v = __ldcg(src + s * split_stride);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    store(g, feature, row, sum.x);
    store(g, feature + 1, row, sum.y);
    store(g, feature + 2, row, sum.z);
    store(g, feature + 3, row, sum.w);
  }
  if (tid == 0) g.arrivals[blockIdx.x] = 0;  // (for the next launch: this one's CTAs have all arrived)
}

}  // namespace

bool own_skinny(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, cudaDataType y_type) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return rows > kGemvRows && rows <= kSkinnyMaxRows && h.projections() == Projections::own && gpu_info().cc_major >= 9 &&
         in % 8 == 0 && aligned(x) && aligned(w) && (y_type == CUDA_R_32F || y_type == CUDA_R_16BF);
}

int skinny_splits(int64_t in, int64_t out, int64_t rows) {
  if (out % 4) return 1;  // (the reduction's 16-byte loads)
  const int64_t ctas = (out + kFeatures - 1) / kFeatures * ((rows + kRowTile - 1) / kRowTile);
  const int64_t k_tiles = (in + kTileK - 1) / kTileK, slots = int64_t(kCtasPerSm) * gpu_info().sms;
  const int64_t most = std::min<int64_t>({16, std::max<int64_t>(1, k_tiles / 8),  // at least 8 K tiles a split
                                          std::max<int64_t>(1, int64_t(kPartialFloats) / (rows * out))});
  // The split count whose last wave fills the SMs best (fewer splits where within 2%): e.g. V3's o_proj, 56 feature
  // tiles, takes 7 (392 CTAs: 99% of 3 waves of 132) rather than 1 (42% of one).
  auto filled = [&](int64_t s) { const int64_t n = ctas * s; return double(n) / double((n + slots - 1) / slots * slots); };
  int64_t best = 1;
  for (int64_t s = 2; s <= most; ++s)
    if (filled(s) > filled(best) + 0.02) best = s;
  return int(best);
}

template <int BN>
void launch_rows(const SkinnyArgs& args, dim3 grid, cudaStream_t stream) {
  static const bool configured = [] {
    DSLAB_CUDA(cudaFuncSetAttribute(skinny_gemm_kernel<BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tile<BN>::kSmemBytes)));
    return true;
  }();
  (void)configured;
  launch_pdl(skinny_gemm_kernel<BN>, grid, dim3(kThreads), Tile<BN>::kSmemBytes, stream, args);
  DSLAB_CHECK_LAUNCH();
}

void launch_skinny(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out, void* y,
                   cudaDataType y_type, float beta, cudaStream_t stream) {
  const int row_tiles = int((rows + kRowTile - 1) / kRowTile);
  const int ctas = int((out + kFeatures - 1) / kFeatures) * row_tiles, k_tiles = int((in + kTileK - 1) / kTileK);
  const int splits = skinny_splits(in, out, rows);
  const int per_split = (k_tiles + splits - 1) / splits;
  const int used = (k_tiles + per_split - 1) / per_split;  // (no split left without K tiles)
  SplitWorkspace ws = h.split_workspace();
  if (used > 1 && (size_t(used) * size_t(rows * out) > ws.floats || size_t(ctas) > ws.counters))
    throw std::logic_error("linear(): the skinny GEMM's split-K workspace is too small");
  const SkinnyArgs args{x, w, y, y_type == CUDA_R_16BF, beta, int(rows), int(in), int(out), row_tiles, per_split, ws.partials, ws.arrivals};
  const dim3 grid{unsigned(ctas), unsigned(used)};
  if (rows <= 32) launch_rows<32>(args, grid, stream);
  else launch_rows<64>(args, grid, stream);
}

size_t skinny_workspace_floats() { return kPartialFloats; }

}  // namespace dslab::mla::cuda
