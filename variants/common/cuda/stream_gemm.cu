// stream_gemm (stream_gemm.h): 128 output features of up to 128 rows per CTA, K streamed through tensor-memory-
// accelerator copies into a ring of stages. The MMAs run "swapped": the weight tile is the M operand (two 64-feature
// halves) and the rows the N operand, padded only to 16, 32, 64 or 128 (kRows) - with the rows as M, 16 rows would
// pad to 64 and three quarters of every MMA would multiply zeros (a 64-row version ran 2.5x slower than cuBLAS at 16
// rows and one split, its MMAs the bottleneck: H100).
#include "variants/common/cuda/stream_gemm.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "harness/cuda_check.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/cuda/tensor_map.h"
#include "variants/common/cuda/tma.cuh"
#include "variants/common/cuda/wgmma.cuh"

namespace dslab::gpu {
namespace {

constexpr int kFeatures = 128;      // output features (m) a CTA computes: two 64-feature MMA halves
constexpr int kChunk = 64;          // K a stage holds: one 128-byte swizzled row per feature / row
constexpr int kMaxSplits = 8;       // K splits: the CTAs of a cluster (the portable cluster size)
constexpr int kThreads = 128 + 32;  // one consumer warpgroup, one producer warp
constexpr int kWeightTileBytes = kFeatures * kChunk * 2;
// A stage: the weight tile (16 KB), then kRows rows of the chunk. As many stages as keep a CTA within ~110 KB, so
// two CTAs share an SM (6 stages at 16 rows, 3 at 128): ~200 KB of copies in flight per SM.
template <int kRows>
__host__ __device__ constexpr int stage_bytes() {
  return kWeightTileBytes + kRows * kChunk * 2;
}
template <int kRows>
__host__ __device__ constexpr int stages() {
  return 110 * 1024 / stage_bytes<kRows>();
}
template <int kRows>
constexpr size_t smem_bytes() {
  return size_t(stages<kRows>()) * stage_bytes<kRows>() + 2 * stages<kRows>() * 8 + 1024;
}

struct Params {
  CUtensorMap a_map;  // the weight: [rows of all batches][k], boxes of 128 features x 64
  CUtensorMap b_map;  // the rows: [n][ldb], boxes of kRows rows x 64
  int m, n, chunks, splits;
  int a_batch_rows;     // stride_a / lda
  int b_batch_columns;  // stride_b
  void* c;
  int64_t ldc, stride_c;
  int c_bf16;
  float beta;
};

__device__ __forceinline__ void store_value(float* dst, float v, float beta) {
  *dst = beta != 0.0f ? v + beta * *dst : v;
}
__device__ __forceinline__ void store_value(__nv_bfloat16* dst, float v, float beta) {
  *dst = __float2bfloat16_rn(beta != 0.0f ? v + beta * __bfloat162float(*dst) : v);
}
// One output (feature f of `row`) of batch entry `batch` into C: fp32 or bf16, plus beta C.
__device__ __forceinline__ void store_output(const Params& p, int batch, int row, int f, float v) {
  const int64_t at = int64_t(batch) * p.stride_c + int64_t(row) * p.ldc + f;
  if (p.c_bf16)
    store_value(static_cast<__nv_bfloat16*>(p.c) + at, v, p.beta);
  else
    store_value(static_cast<float*>(p.c) + at, v, p.beta);
}
// Every thread of the CTA (the consumers and the producer warp): named barrier 1.
__device__ __forceinline__ void bar_sync_all() { asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory"); }

// Grid (feature tiles, splits, batch): a consumer warpgroup and a producer warp. The producer's first thread copies
// each stage's weight tile and rows (one mbarrier "full" per stage) once the MMAs of the chunk kStages before it have
// released the stage ("empty"); the weight tiles of the first kStages chunks go before griddepcontrol.wait (the
// weights are the caller's, written before the step), the rows - which the kernel before this one writes - after
// it. The consumers keep one chunk's MMAs in flight while the next chunk's are issued.
template <int kRows>
__global__ void __launch_bounds__(kThreads) stream_gemm_kernel(const __grid_constant__ Params p) {
  constexpr int kStages = stages<kRows>(), kStageBytes = stage_bytes<kRows>();
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  const int tile = blockIdx.x, split = blockIdx.y, batch = blockIdx.z;
  const int first = int(int64_t(split) * p.chunks / p.splits),
            count = int(int64_t(split + 1) * p.chunks / p.splits) - first;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 128);
    }
  }
  __syncthreads();
  float d[2][kRows / 8][4];  // [feature half][row group of 8][fragment]
  if (threadIdx.x >= 128) {  // ---- the producer warp (its first thread)
    if (threadIdx.x == 128) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.a_map) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.b_map) : "memory");
      const int feature_row = batch * p.a_batch_rows + tile * kFeatures, column0 = batch * p.b_batch_columns;
      const int ahead = min(kStages, count);
      for (int i = 0; i < ahead; ++i) {
        mbarrier_expect_bytes(&full[i], kStageBytes);
        tma_load(smem + i * kStageBytes, &p.a_map, (first + i) * kChunk, feature_row, &full[i]);
      }
      pdl_wait();
      pdl_launch_dependents();
      for (int i = 0; i < count; ++i) {
        const int s = i % kStages;
        uint8_t* const stage = smem + s * kStageBytes;
        if (i >= kStages) {
          mbarrier_wait(&empty[s], (i / kStages - 1) & 1);
          mbarrier_expect_bytes(&full[s], kStageBytes);
          tma_load(stage, &p.a_map, (first + i) * kChunk, feature_row, &full[s]);
        }
        tma_load(stage + kWeightTileBytes, &p.b_map, column0 + (first + i) * kChunk, 0, &full[s]);
      }
    } else {
      pdl_wait();
      pdl_launch_dependents();
    }
  } else {       // ---- the consumer warpgroup
    pdl_wait();  // (C, read where beta != 0 and written below, may be the kernels' before)
    pdl_launch_dependents();
#pragma unroll
    for (auto& half : d)
#pragma unroll
      for (auto& x : half) x[0] = x[1] = x[2] = x[3] = 0.0f;
    const uint64_t desc0 = wgmma_desc(smem);
#pragma unroll 1
    for (int i = 0; i < count; ++i) {
      const int s = i % kStages;
      mbarrier_wait(&full[s], (i / kStages) & 1);
      const uint64_t a_desc = desc0 + uint64_t(s) * kStageBytes / 16, b_desc = a_desc + kWeightTileBytes / 16;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk) {
        // D[64 features x kRows rows] += weights[64 x 16] · rows[kRows x 16]^T, each feature half
        wgmma_m64nNk16<kRows>(d[0], a_desc + kk * 2, b_desc + kk * 2, 1);
        wgmma_m64nNk16<kRows>(d[1], a_desc + 64 * 128 / 16 + kk * 2, b_desc + kk * 2, 1);
      }
      wgmma_commit();
      wgmma_wait<1>();  // the previous chunk's MMAs are done: its stage goes back to the producer
      if (i > 0) mbarrier_arrive(&empty[(i - 1) % kStages]);
    }
    wgmma_wait<0>();
  }
  const int t = threadIdx.x, lane = t % 32;
  const int f_lo = (t / 32) * 16 + lane / 4;  // this thread's features (+ 8, + 64, + 72) and rows (+ 1) per row group
  if (p.splits == 1) {                        // the tile's outputs, from the registers
    if (t >= 128) return;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int g = 0; g < kRows / 8; ++g)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int f = tile * kFeatures + h * 64 + f_lo + (e / 2) * 8, row = g * 8 + (lane % 4) * 2 + e % 2;
          if (f < p.m && row < p.n) store_output(p, batch, row, f, d[h][g][e]);
        }
    return;
  }
  // Split K: the cluster's CTAs (one per split, grid y) leave their sums in their own shared memory, [row][feature],
  // and each then adds up its share of the rows from every CTA's (distributed shared memory) and stores them. (Every
  // thread meets the cluster's barriers, the producer warp too.)
  bar_sync_all();  // (every MMA of this CTA has read its stages, which the sums overwrite)
  float* const sums = reinterpret_cast<float*>(smem);
  if (t < 128) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int g = 0; g < kRows / 8; ++g)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sums[(g * 8 + (lane % 4) * 2 + e % 2) * kFeatures + h * 64 + f_lo + (e / 2) * 8] = d[h][g][e];
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = int(cluster.block_rank()), rows_each = (p.n + p.splits - 1) / p.splits;
  const int row0 = rank * rows_each, rows = min(p.n, row0 + rows_each) - row0;
  // Four features a thread a pass, every CTA's four loaded before any is added (a remote load's latency paid once
  // per pass, not once per CTA: a loop adding one remote value at a time made two splits slower than one).
  const float* remote[kMaxSplits];
#pragma unroll
  for (int q = 0; q < kMaxSplits; ++q) remote[q] = cluster.map_shared_rank(sums, q < p.splits ? q : 0);
  for (int e = t; e < rows * (kFeatures / 4); e += kThreads) {
    const int row = row0 + e / (kFeatures / 4), f = (e % (kFeatures / 4)) * 4;
    if (tile * kFeatures + f >= p.m) continue;
    float4 x[kMaxSplits];
#pragma unroll
    for (int q = 0; q < kMaxSplits; ++q)
      if (q < p.splits) x[q] = *reinterpret_cast<const float4*>(remote[q] + row * kFeatures + f);
    float4 v = x[0];
#pragma unroll
    for (int q = 1; q < kMaxSplits; ++q)
      if (q < p.splits) v.x += x[q].x, v.y += x[q].y, v.z += x[q].z, v.w += x[q].w;
    const float out[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (tile * kFeatures + f + j < p.m) store_output(p, batch, row, tile * kFeatures + f + j, out[j]);
  }
  cluster.sync();  // (no CTA leaves while another still reads its sums)
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// With programmatic dependent launch, and the splits of a tile as one cluster (grid y); the kernel's shared-memory
// allowance raised on its first launch.
template <int kRows>
void launch_rows(const Params& p, dim3 grid, cudaStream_t stream) {
  static const bool configured = [] {
    DSLAB_CUDA(cudaFuncSetAttribute(stream_gemm_kernel<kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(smem_bytes<kRows>())));
    return true;
  }();
  (void)configured;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes<kRows>();
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = programmatic_launch() ? 1 : 0;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = 1, attributes[1].val.clusterDim.y = grid.y, attributes[1].val.clusterDim.z = 1;
  config.attrs = attributes;
  config.numAttrs = grid.y > 1 ? 2 : 1;
  DSLAB_CUDA(cudaLaunchKernelEx(&config, stream_gemm_kernel<kRows>, p));
}

int padded_rows(int64_t n) { return n <= 16 ? 16 : n <= 32 ? 32 : n <= 64 ? 64 : 128; }

}  // namespace

bool stream_gemm_fits(const GemmShape& s) {
  return s.op_a == CUBLAS_OP_T && s.op_b == CUBLAS_OP_N && s.n >= 1 && s.n <= 128 && s.k % kChunk == 0 &&
         s.k >= kChunk && s.lda % 8 == 0 && s.ldb % 8 == 0 && s.lda >= s.k && s.ldb >= s.k && s.alignment >= 16 &&
         (s.c_type == CUDA_R_32F || s.c_type == CUDA_R_16BF) &&
         (s.batch == 1 || (s.stride_a % s.lda == 0 && (s.batch - 1) * s.stride_b + s.k <= s.ldb));
}

bool stream_gemm_splits_ok(const GemmShape& s, int splits) {
  return splits == 1 || (splits <= kMaxSplits && s.k / kChunk >= 2 * splits);
}

void stream_gemm(const GemmShape& s, int splits, const void* a, const void* b, void* c, float beta,
                 StreamGemmMaps& maps, cudaStream_t stream) {
  if (!aligned16(a) || !aligned16(b)) throw std::logic_error("stream_gemm: operands must be 16-byte aligned");
  if (!stream_gemm_splits_ok(s, splits))
    throw std::logic_error("stream_gemm: " + std::to_string(splits) + " K splits do not fit this shape");
  const int rows = padded_rows(s.n);
  if (maps.a != a || maps.b != b) {
    const int64_t a_rows = (s.batch - 1) * (s.stride_a / s.lda) + s.m;
    maps.a_map = tensor_map_2d(a, a_rows, s.k, 2, kFeatures, kChunk, /*swizzle_bytes=*/128, s.lda);
    maps.b_map = tensor_map_2d(b, s.n, s.ldb, 2, rows, kChunk, /*swizzle_bytes=*/128);
    maps.a = a;
    maps.b = b;
  }
  Params p{};
  p.a_map = maps.a_map;
  p.b_map = maps.b_map;
  p.m = int(s.m);
  p.n = int(s.n);
  p.chunks = int(s.k / kChunk);
  p.splits = splits;
  p.a_batch_rows = int(s.stride_a / s.lda);
  p.b_batch_columns = int(s.stride_b);
  p.c = c;
  p.ldc = s.ldc;
  p.stride_c = s.stride_c;
  p.c_bf16 = s.c_type == CUDA_R_16BF;
  p.beta = beta;
  const dim3 grid(unsigned((s.m + kFeatures - 1) / kFeatures), unsigned(splits), unsigned(s.batch));
  switch (rows) {
    case 16:
      launch_rows<16>(p, grid, stream);
      break;
    case 32:
      launch_rows<32>(p, grid, stream);
      break;
    case 64:
      launch_rows<64>(p, grid, stream);
      break;
    default:
      launch_rows<128>(p, grid, stream);
      break;
  }
  DSLAB_CHECK_LAUNCH();
}

}  // namespace dslab::gpu
