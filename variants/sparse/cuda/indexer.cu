// The lightning indexer's kernels (indexer.h): index keys by a cuBLAS GEMM (prepare) or a block per new key (a step),
// e4m3 with a scale per key as the CPU state rounds them; index queries by a cuBLAS GEMM, e4m3 with a scale per head;
// scores by FP8 tensor-core tiles of 64 keys x 64 heads (a tensor copy and a warpgroup MMA a tile where pages hold
// whole tiles; cp.async and mma.sync where they do not).
#include <cuda_fp8.h>

#include <algorithm>
#include <stdexcept>

#include "harness/cuda_check.h"
#include "harness/host.h"
#include "variants/common/cuda/cp_async.cuh"
#include "variants/common/cuda/tensor_map.h"
#include "variants/common/cuda/tma.cuh"
#include "variants/common/cuda/wgmma.cuh"
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/indexer.h"

namespace dslab::sparse::cuda {
namespace {

static_assert(kIndexDim == 128 && kIndexHeads == 64, "the kernels below tile 64 heads x 128 dims");

// e4m3 (saturating at 448, round to nearest even) of x / scale, as sparse::round_e4m3 rounds it.
__device__ inline uint8_t to_e4m3(float x, float scale) {
  return uint8_t(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}
__device__ inline float key_scale(float amax) { return amax > 0 ? __fdiv_rn(amax, 448.0f) : 1.0f; }

// A warp per output row of 128 fp32 values: the row's scale and its e4m3 bytes. Output row i = t * out_group + j
// reads input row t * in_group + j mod in_group (index queries: index head j takes MLA head j mod heads; keys: 1, 1).
__global__ void quantize_rows_kernel(const float* __restrict__ rows, int64_t n, int in_group, int out_group,
                                     uint8_t* __restrict__ out, float* __restrict__ scales) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  if (row >= n) return;
  const int64_t in_row = row / out_group * in_group + row % out_group % in_group;
  const float4 v = reinterpret_cast<const float4*>(rows + in_row * kIndexDim)[lane];
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = key_scale(amax);
  const uint32_t packed = uint32_t(to_e4m3(v.x, scale)) | uint32_t(to_e4m3(v.y, scale)) << 8 |
                          uint32_t(to_e4m3(v.z, scale)) << 16 | uint32_t(to_e4m3(v.w, scale)) << 24;
  reinterpret_cast<uint32_t*>(out + row * kIndexDim)[lane] = packed;
  if (lane == 0) scales[row] = scale;
}

// A block per new key, kStepSlices slices of the width x 128 output dims: each thread sums its slice of the key
// (staged in shared memory) against the projection's column, its loads unrolled (a single thread walking all 576
// dims waited on one load at a time: 50 us for one key), then the slices meet in shared memory; the block's amax,
// the e4m3 byte.
constexpr int kStepSlices = 8, kStepThreads = kStepSlices * kIndexDim, kMaxStepWidth = 1024;
__global__ void __launch_bounds__(kStepThreads)
    step_keys_kernel(const __nv_bfloat16* __restrict__ cache, int width, const int32_t* __restrict__ lengths, int q_len,
                     const int32_t* __restrict__ page_table, int pages_per_request, int page_size,
                     const __nv_bfloat16* __restrict__ projection, uint8_t* __restrict__ keys,
                     float* __restrict__ scales, int32_t* __restrict__ keys_after) {
  __shared__ float row[kMaxStepWidth];
  __shared__ float partial[kStepSlices][kIndexDim];
  __shared__ float warp_amax[kIndexDim / 32];
  const int r = int(blockIdx.x) / q_len, k = lengths[r] + int(blockIdx.x) % q_len, tid = int(threadIdx.x);
  const int j = tid % kIndexDim, slice = tid / kIndexDim;
  if (tid == 0 && int(blockIdx.x) % q_len == 0) keys_after[r] = lengths[r] + q_len;
  const int64_t slot = int64_t(page_table[int64_t(r) * pages_per_request + k / page_size]) * page_size + k % page_size;
  for (int d = tid; d < width; d += kStepThreads) row[d] = __bfloat162float(cache[slot * width + d]);
  __syncthreads();
  const int per_slice = (width + kStepSlices - 1) / kStepSlices, first = slice * per_slice,
            last = min(width, first + per_slice);
  float acc = 0;
#pragma unroll 8
  for (int d = first; d < last; ++d) acc += row[d] * __bfloat162float(projection[int64_t(d) * kIndexDim + j]);
  partial[slice][j] = acc;
  __syncthreads();
  if (slice != 0) return;
  acc = 0;
#pragma unroll
  for (int s = 0; s < kStepSlices; ++s) acc += partial[s][j];
  float amax = fabsf(acc);
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (j % 32 == 0) warp_amax[j / 32] = amax;
  asm volatile("bar.sync 1, %0;" ::"n"(kIndexDim));  // (slice 0's four warps only)
  amax = fmaxf(fmaxf(warp_amax[0], warp_amax[1]), fmaxf(warp_amax[2], warp_amax[3]));
  const float scale = key_scale(amax);
  keys[slot * kIndexDim + j] = to_e4m3(acc, scale);
  if (j == 0) scales[slot] = scale;
}

// Scores by FP8 tensor-core products (mma.sync m16n8k32 e4m3, fp32 accumulate: the products of e4m3 codes and
// their sums are exact in fp32), scaled per head and per key. Warp w keeps all 64 index heads' query codes in
// registers (its A fragments, loaded once) and multiplies them by keys 16w..16w+15 of a tile of 64 (2 n-tiles), then
// ReLU(query scale x dot), sums the heads and reduces over the lanes sharing a key. The next tiles' keys and scales
// are copied in (cp.async, kScoreStages deep) while this one's are multiplied. Each 32-dim step's order is permuted
// alike in A and B (mma slots 4t..4t+3 take dims 8t..8t+3, slots 16+4t.. take 8t+4..8t+7), so a lane's eight key bytes
// of a step are one 64-bit load. (An fp16 version, keys converted e4m3 -> fp16 in the loop, ran at 1.2 TB/s: the
// conversions and the fp16 MMAs, not HBM, were its limit.)
constexpr int kTileKeys = 64, kScoreThreads = 128,
              kKeyStride = kIndexDim + 32;  // (160-byte rows: conflict-free 64-bit loads)
// Each CTA keeps three tiles' copies going while it multiplies a fourth; three CTAs an SM (at most 168 registers a
// thread, no spills): at two (171 registers), each scheduler had two warps to hide a tile's wait with (ncu,
// 17).
constexpr int kScoreStages = 4, kScoreCtasPerSm = 3;

__device__ inline void mma_fp8_16832(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, "
      "%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kScoreThreads, kScoreCtasPerSm)
    scores_kernel(const uint8_t* __restrict__ queries, const float* __restrict__ query_scales,
                  const uint8_t* __restrict__ index_keys, const float* __restrict__ index_scales,
                  const int32_t* __restrict__ page_table, int pages_per_request, int page_size,
                  const int32_t* __restrict__ keys, int64_t scores_per_request, float* __restrict__ scores) {
  constexpr int kSteps = kIndexDim / 32, kHeadTiles = kIndexHeads / 16;
  __shared__ __align__(16) uint8_t sk[kScoreStages][kTileKeys * kKeyStride];
  __shared__ __align__(16) float sscale[kScoreStages][kTileKeys];
  const int r = int(blockIdx.y), tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int n_keys = keys[r];
  const int32_t* table = page_table + int64_t(r) * pages_per_request;
  // Tile `tile`'s keys (zeros past the request's) into buffer `buf`, as one commit group. Thread tid copies chunk
  // tid % 8 of keys tid / 8 + 16 j. Where pages hold whole tiles (page_size a multiple of 64) a tile's keys are
  // consecutive slots of one page: one page-table lookup a tile (ncu: the per-chunk lookups' integer divisions were
  // most of this kernel's instructions, issue-bound at two warps a scheduler); otherwise a lookup per key.
  const int chunk = tid % (kIndexDim / 16), key0 = tid / (kIndexDim / 16);
  constexpr int kKeysPerPass = kScoreThreads / (kIndexDim / 16);
  const bool whole_tiles = page_size % kTileKeys == 0;
  // (page: the tile's page-table entry where tiles are whole, loaded an iteration before its copy is issued, so the
  // copy does not wait on the table read)
  auto page_of = [&](int tile) {
    return whole_tiles && tile * kTileKeys < n_keys ? __ldg(table + tile * kTileKeys / page_size) : 0;
  };
  auto load_tile = [&](int tile, int buf, int32_t page) {
    const int k0 = tile * kTileKeys;
    const int64_t base = int64_t(page) * page_size + k0 % page_size;
    auto slot_of = [&](int key) {
      return whole_tiles ? base + key : int64_t(table[(k0 + key) / page_size]) * page_size + (k0 + key) % page_size;
    };
#pragma unroll
    for (int j = 0; j < kTileKeys / kKeysPerPass; ++j) {
      const int key = key0 + j * kKeysPerPass;
      const bool valid = k0 + key < n_keys;
      cp_async16(&sk[buf][key * kKeyStride + chunk * 16],
                 index_keys + (valid ? slot_of(key) : 0) * kIndexDim + chunk * 16, valid);
    }
    if (tid < kTileKeys) {
      const bool valid = k0 + tid < n_keys;
      cp_async4(&sscale[buf][tid], index_scales + (valid ? slot_of(tid) : 0), valid);
    }
    cp_async_commit();
  };
  const int first = int(blockIdx.x), stride = int(gridDim.x);
  if (first * kTileKeys >= n_keys) return;
    // The first kScoreStages - 1 tiles in flight (an empty group for each past the request's: the waits count groups).
#pragma unroll
  for (int i = 0; i < kScoreStages - 1; ++i) {
    if ((first + i * stride) * kTileKeys < n_keys)
      load_tile(first + i * stride, i, page_of(first + i * stride));
    else
      cp_async_commit();
  }
  // A fragments: heads 16 mt + g and + 8; step ks's dims 8t..8t+3 in slots 4t.., 8t+4..8t+7 in slots 16+4t..
  uint32_t a[kHeadTiles][kSteps][4];
  float head_scale[kHeadTiles][2];
#pragma unroll
  for (int mt = 0; mt < kHeadTiles; ++mt) {
    const int64_t row = int64_t(r) * kIndexHeads + mt * 16 + g;
    const uint8_t* q0 = queries + row * kIndexDim;
    const uint8_t* q8 = q0 + 8 * kIndexDim;
    head_scale[mt][0] = query_scales[row], head_scale[mt][1] = query_scales[row + 8];
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const uint2 lo = *reinterpret_cast<const uint2*>(q0 + ks * 32 + 8 * t),
                  hi = *reinterpret_cast<const uint2*>(q8 + ks * 32 + 8 * t);
      a[mt][ks][0] = lo.x, a[mt][ks][1] = hi.x, a[mt][ks][2] = lo.y, a[mt][ks][3] = hi.y;
    }
  }
  int32_t ahead_page = page_of(first + (kScoreStages - 1) * stride);
  for (int i = 0, tile = first; tile * kTileKeys < n_keys; ++i, tile += stride) {
    const int buf = i % kScoreStages, ahead = tile + (kScoreStages - 1) * stride;
    if (ahead * kTileKeys < n_keys)
      load_tile(ahead, (i + kScoreStages - 1) % kScoreStages, ahead_page);
    else
      cp_async_commit();
    ahead_page = page_of(ahead + stride);
    cp_async_wait<kScoreStages - 1>();
    __syncthreads();  // (this tile's keys landed for every thread)
    float acc[kHeadTiles][2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const uint2 b =
            *reinterpret_cast<const uint2*>(&sk[buf][(warp * 16 + nt * 8 + g) * kKeyStride + ks * 32 + 8 * t]);
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt) mma_fp8_16832(acc[mt][nt], a[mt][ks], b.x, b.y);
      }
      // acc[mt][nt][c]: head 16 mt + g (+8 for c >= 2), key warp*16 + nt*8 + 2t + (c & 1).
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int col = 0; col < 2; ++col) {
        float sum = 0;
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt)  // (ReLU(s x) = s ReLU(x): scales are positive)
          sum = fmaf(head_scale[mt][0], fmaxf(acc[mt][nt][col], 0.0f),
                     fmaf(head_scale[mt][1], fmaxf(acc[mt][nt][2 + col], 0.0f), sum));
        for (int o = 4; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const int key = warp * 16 + nt * 8 + 2 * t + col, k = tile * kTileKeys + key;
        if (g == 0 && k < n_keys)
          scores[int64_t(r) * scores_per_request + k] = sum * (1.0f / kIndexHeads) * sscale[buf][key];
      }
    __syncthreads();  // (every warp done with this buffer before a later iteration's copy overwrites it)
  }
}

// Where pages hold whole 64-key tiles (page_size a multiple of 64): a tile is one tensor copy of its 64 index keys,
// landing swizzled as the warpgroup MMA reads them, and one bulk copy of their scales, both counted on the stage's
// mbarrier; the warpgroup's e4m3 MMA takes the 64 keys x 64 heads product in four instructions (k = 32 bytes each,
// keys as A, queries as B), after which each thread holds 2 keys x 16 heads and sums its heads in registers (two
// shuffles a key across the quad). The mma.sync kernel above spent ~620 instructions a warp on a tile (fragment
// loads, 32 MMAs, an 8-lane sum per key): issued every 1.8 cycles at 2.7 warps a scheduler, it read HBM at 0.49 of
// its peak (ncu, V3 batch 16 128K, H100).
constexpr int kTmaStages = 4, kTmaThreads = 128;
constexpr uint32_t kTileBytes = kTileKeys * kIndexDim;
struct __align__(1024) TmaScoresSmem {
  uint8_t q[kIndexHeads * kIndexDim];  // e4m3 queries, [head][128 bytes], swizzled like the tiles
  uint8_t keys[kTmaStages][kTileBytes];
  float scales[kTmaStages][kTileKeys];
  uint64_t full[kTmaStages];
};
constexpr size_t kTmaSmemBytes = sizeof(TmaScoresSmem) + 1024;  // (+ alignment of the dynamic window to 1024 bytes)

__global__ void __launch_bounds__(kTmaThreads)
    scores_tma_kernel(const __grid_constant__ CUtensorMap key_map, const uint8_t* __restrict__ queries,
                      const float* __restrict__ query_scales, const float* __restrict__ index_scales,
                      const int32_t* __restrict__ page_table, int pages_per_request, int page_size,
                      const int32_t* __restrict__ keys, int64_t scores_per_request, float* __restrict__ scores) {
  extern __shared__ uint8_t smem_raw[];
  TmaScoresSmem& sm = *reinterpret_cast<TmaScoresSmem*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  const int r = int(blockIdx.y), tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int n_keys = keys[r];
  const int first = int(blockIdx.x), stride = int(gridDim.x);
  if (first * kTileKeys >= n_keys) return;
  const int32_t* table = page_table + int64_t(r) * pages_per_request;
  // Tile `tile` (its keys consecutive slots of one page) into stage `buf` (thread 0).
  auto issue = [&](int tile, int buf) {
    const int k0 = tile * kTileKeys;
    const int64_t slot = int64_t(table[k0 / page_size]) * page_size + k0 % page_size;
    mbarrier_expect_bytes(&sm.full[buf], kTileBytes + kTileKeys * uint32_t(sizeof(float)));
    tma_load(sm.keys[buf], &key_map, 0, int(slot), &sm.full[buf]);  // (keys past the request's: read, never stored)
    bulk_load(sm.scales[buf], index_scales + slot, kTileKeys * uint32_t(sizeof(float)), &sm.full[buf]);
  };
  if (tid == 0) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(&key_map) : "memory");
    for (int s = 0; s < kTmaStages; ++s) mbarrier_init(&sm.full[s], 1);
  }
  __syncthreads();
  if (tid == 0)
    for (int i = 0; i < kTmaStages && (first + i * stride) * kTileKeys < n_keys; ++i) issue(first + i * stride, i);
  // The request's queries (64 heads x 128 bytes) into the swizzled layout, while the first tiles come.
  const uint8_t* q = queries + int64_t(r) * kIndexHeads * kIndexDim;
  for (int c = tid; c < kIndexHeads * (kIndexDim / 16); c += kTmaThreads) {
    const int row = c / (kIndexDim / 16), chunk = c % (kIndexDim / 16);
    *reinterpret_cast<uint4*>(sm.q + row * kIndexDim + ((chunk ^ (row & 7)) * 16)) =
        *reinterpret_cast<const uint4*>(q + row * kIndexDim + chunk * 16);
  }
  // This thread's heads n * 8 + 2 (lane % 4) + e of the accumulators' columns, and their scales.
  float head_scale[8][2];
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) head_scale[n][e] = query_scales[int64_t(r) * kIndexHeads + n * 8 + (lane % 4) * 2 + e];
  fence_proxy_async();  // the queries' stores are read by the tensor cores
  __syncthreads();
  const uint64_t q_desc = wgmma_desc(sm.q);
  const int key_lo = warp * 16 + lane / 4, key_hi = key_lo + 8;  // this thread's two accumulator rows
  float* const out = scores + int64_t(r) * scores_per_request;
#pragma unroll 1
  for (int i = 0, tile = first; tile * kTileKeys < n_keys; ++i, tile += stride) {
    const int buf = i % kTmaStages;
    mbarrier_wait(&sm.full[buf], (i / kTmaStages) & 1);
    float d[8][4];
    const uint64_t k_desc = wgmma_desc(sm.keys[buf]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kIndexDim / 32; ++ks)
      wgmma_m64n64k32_e4m3(d, k_desc + 2 * ks, q_desc + 2 * ks, ks > 0);  // (+32 bytes a step)
    wgmma_commit_and_wait();
    float lo = 0, hi = 0;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // (ReLU(s x) = s ReLU(x): scales are positive)
        lo = fmaf(head_scale[n][e], fmaxf(d[n][e], 0.0f), lo);
        hi = fmaf(head_scale[n][e], fmaxf(d[n][2 + e], 0.0f), hi);
      }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      lo += __shfl_xor_sync(0xffffffffu, lo, o);
      hi += __shfl_xor_sync(0xffffffffu, hi, o);
    }
    const float scale_lo = sm.scales[buf][key_lo], scale_hi = sm.scales[buf][key_hi];
    __syncthreads();  // every thread's MMAs on stage buf are done and its scales read: the stage takes a later tile
    const int ahead = tile + kTmaStages * stride;
    if (tid == 0 && ahead * kTileKeys < n_keys) issue(ahead, buf);
    const int k_lo = tile * kTileKeys + key_lo, k_hi = tile * kTileKeys + key_hi;
    if (lane % 4 == 0 && k_lo < n_keys) out[k_lo] = lo * (1.0f / kIndexHeads) * scale_lo;
    if (lane % 4 == 1 && k_hi < n_keys) out[k_hi] = hi * (1.0f / kIndexHeads) * scale_hi;
  }
}

}  // namespace

void index_all_keys(cublasHandle_t blas, const __nv_bfloat16* cache, int64_t slots, int64_t width,
                    const __nv_bfloat16* projection, float* scratch, int64_t chunk, uint8_t* index_keys,
                    float* index_scales, cudaStream_t stream) {
  for (int64_t first = 0; first < slots; first += chunk) {
    const int64_t rows = std::min(chunk, slots - first);
    // Column-major: scratch (128 x rows) = projection^T (128 x width) . rows^T (width x rows).
    gpu::gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, kIndexDim, rows, width, projection, kIndexDim, 0, cache + first * width,
              width, 0, scratch, CUDA_R_32F, kIndexDim, 0, 1);
    quantize_rows_kernel<<<unsigned((rows * 32 + 255) / 256), 256, 0, stream>>>(
        scratch, rows, 1, 1, index_keys + first * kIndexDim, index_scales + first);
    DSLAB_CHECK_LAUNCH();
  }
}

void index_step_keys(const __nv_bfloat16* cache, int64_t width, const int32_t* lengths, int64_t q_len,
                     const int32_t* page_table, int64_t pages_per_request, int64_t page_size, int64_t batch,
                     const __nv_bfloat16* projection, uint8_t* index_keys, float* index_scales, int32_t* keys,
                     cudaStream_t stream) {
  if (width > kMaxStepWidth) throw std::invalid_argument("sparse index_step_keys: keys of at most 1024 values");
  step_keys_kernel<<<unsigned(batch * q_len), kStepThreads, 0, stream>>>(
      cache, int(width), lengths, int(q_len), page_table, int(pages_per_request), int(page_size), projection,
      index_keys, index_scales, keys);
  DSLAB_CHECK_LAUNCH();
}

void index_queries(cublasHandle_t blas, const __nv_bfloat16* q, int64_t tokens, int64_t heads, int64_t width,
                   const __nv_bfloat16* projection, float* scratch, uint8_t* out, float* scales, cudaStream_t stream) {
  // Column-major: scratch (128 x tokens*heads) = projection^T (128 x width) . q^T (width x tokens*heads).
  gpu::gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, kIndexDim, tokens * heads, width, projection, kIndexDim, 0, q, width, 0,
            scratch, CUDA_R_32F, kIndexDim, 0, 1);
  const int64_t rows = tokens * kIndexHeads;
  quantize_rows_kernel<<<unsigned((rows * 32 + 255) / 256), 256, 0, stream>>>(scratch, rows, int(heads), kIndexHeads,
                                                                              out, scales);
  DSLAB_CHECK_LAUNCH();
}

CUtensorMap index_key_map(const uint8_t* index_keys, int64_t slots) {
  return tensor_map_2d(index_keys, slots, kIndexDim, 1, kTileKeys, kIndexDim, /*swizzle_bytes=*/128);
}

void indexer_scores(const uint8_t* queries, const float* query_scales, const uint8_t* index_keys,
                    const CUtensorMap* index_key_map, const float* index_scales, const int32_t* page_table,
                    int64_t pages_per_request, int64_t page_size, const int32_t* keys, int64_t batch,
                    int64_t scores_per_request, float* scores, cudaStream_t stream) {
  // As many CTAs as fit at once over the batch (registers and shared memory bound it), each walking several tiles
  // (its queries loaded once): a second wave would leave its CTAs' whole share of tiles for the end.
  const bool tma = index_key_map && page_size % kTileKeys == 0;
  static const int resident_mma = [] {
    int n = 0;
    DSLAB_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, scores_kernel, kScoreThreads, 0));
    return std::max(1, n);
  }();
  static const int resident_tma = [] {
    int n = 0;
    DSLAB_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, scores_tma_kernel, kTmaThreads, kTmaSmemBytes));
    return std::max(1, n);
  }();
  const int64_t tiles = (scores_per_request + kTileKeys - 1) / kTileKeys;
  const unsigned per_request =
      unsigned(std::clamp<int64_t>((tma ? resident_tma : resident_mma) * int64_t(gpu_info().sms) / batch, 1, tiles));
  if (tma) {
    scores_tma_kernel<<<dim3(per_request, unsigned(batch)), kTmaThreads, kTmaSmemBytes, stream>>>(
        *index_key_map, queries, query_scales, index_scales, page_table, int(pages_per_request), int(page_size), keys,
        scores_per_request, scores);
  } else {
    scores_kernel<<<dim3(per_request, unsigned(batch)), kScoreThreads, 0, stream>>>(
        queries, query_scales, index_keys, index_scales, page_table, int(pages_per_request), int(page_size), keys,
        scores_per_request, scores);
  }
  DSLAB_CHECK_LAUNCH();
}

}  // namespace dslab::sparse::cuda
