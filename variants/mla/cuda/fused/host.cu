// mla/fused/cuda: FlashMLA-style decode attention over the paged latent cache. All q heads (and the MTP
// token) of a request are rows of one MQA against the request's shared [c_kv ‖ k_pe] keys; the keys are split
// across SMs (split-KV, a balanced run of key blocks per CTA), each split runs an online softmax on the tensor
// cores, and a combine kernel merges the splits by their log-sum-exp (at 8-32 tokens a CTA multiplying the merged rows
// by W_UV too, whole requests' rows as well: merge_absorb_kernel, no absorb GEMM after it). Two kernels over 64-row
// tiles (16 or 32 rows padded to 64): a bf16 cache with more than 32 rows a tile (128 heads) and whole 64-key blocks in
// a page takes two warpgroups that trade the scoring and multiplying of a pair of blocks (namespace seesaw, FlashMLA's
// Hopper structure); an fp8 cache at 16 rows from tensor copies (16 heads, one token) a kernel with the products
// transposed (the keys along the MMA's rows) that runs Q K^T on FP8 tensor cores straight from the landed block and
// P V with the block expanded into registers (namespace fp8); an int8 cache at up to 32 rows, or fp8 at 32 (an MTP
// token), a kernel also transposed whose producer warpgroups expand each block into fp16 tiles that its consumer
// warpgroups multiply (namespace narrow); every other case (16 heads bf16, 128 heads quantised, small pages, a token
// selector's keys) warpgroups with fixed roles that overlap the softmax with the products (namespace roles), int8 / fp8
// blocks landing raw and dequantised to fp16 in shared memory by the warpgroup about to score them. The projections
// around it are the shared GPU ones (cuBLAS, or own GEMVs: the proj axis). The kernels are in their own units
// (sm90_bf16_h16.cu, sm90_bf16_h128.cu, sm90_fp8_h16.cu, sm90_int8_h16.cu; shared pieces in common.cuh); here are the
// split-KV plan, the combine kernel and the op.
#include <algorithm>
#include <cmath>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/tuning.h"
#include "variants/common/cuda/cp_async.cuh"
#include "variants/common/cuda/mma.cuh"
#include "variants/common/cuda/tensor_map.h"
#include "variants/mla/cuda/fused/common.cuh"

namespace dslab::mla::cuda {
namespace {

using namespace fused_decode;

// The unit in which auto_kv_splits counts a step's keys (its blocks-per-CTA threshold). The split itself (split_kv)
// is in the kernel's own blocks (block_keys_for: 32 or 64 keys), so that a segment starts on a block boundary and a
// tensor copy's block lies in one page (page_size % block keys == 0).
constexpr int kBlockKeys = 64;

// Segments of at most this many blocks on average make the two-warpgroup kernel's block and Q copies evict_first in
// L2. At 128 heads, batch 128 (two whole requests a CTA, switching all at once) the hint made the kernel 1.5-1.9%
// faster at 4K keys (65 blocks a segment), the same within noise at 8K (129) and 0.4-0.9% slower at 16K (257) in
// four interleaved runs (H100; hinting half the copies, or the second row tile's only: 1.4-8% slower): a
// switch's fetches (its code among them) find their lines in L2, while the blocks two row tiles share are sooner lost.
// With the padding block walked first 8K gains too: 1.3% at batch 64 (one segment a CTA) in all of 3 + 4
// interleaved rounds of two calls, 0.1-0.2% at batch 128 (H100) - so 8K's 129 blocks are under the bound.
constexpr int64_t kStreamEvictFirstBlocks = 160;
constexpr int kCombineWarps = 4, kCombineThreads = 32 * kCombineWarps, kCombineMaxSegments = 1024, kCombineAhead = 2;
constexpr int kMergeVectors = kLatent / 4 / 32;  // float4 columns a lane holds of a merged row: lane + 32 c

// One warp's share of merging partial row `row` of a request's segments (range: first, count): acc = the sum over
// its segments first, first + stride, ... of 2^(lse - max) o_i, and total = the sum of 2^(lse - max) over all of
// them (every lane reads every segment's lse; max and total by shuffles, so no block barrier). The first kAhead of
// its segments' rows are loaded together with the lse (the rows do not depend on the weights).
template <int kAhead>
__device__ __forceinline__ void weigh_segments(const float* __restrict__ o_partial,
                                               const float* __restrict__ lse_partial, int partial_rows, int2 range,
                                               int row, int first, int stride, int lane, float4 (&acc)[kMergeVectors],
                                               float& total) {
  auto lse_of = [&](int i) { return lse_partial[int64_t(range.x + i) * partial_rows + row]; };
  auto load_row = [&](int i, float4(&v)[kMergeVectors]) {
    const float4* src =
        reinterpret_cast<const float4*>(o_partial + (int64_t(range.x + i) * partial_rows + row) * kLatent);
#pragma unroll
    for (int c = 0; c < kMergeVectors; ++c) v[c] = src[lane + 32 * c];
  };
  float4 ahead[kAhead][kMergeVectors];
#pragma unroll
  for (int a = 0; a < kAhead; ++a)
    if (first + a * stride < range.y) load_row(first + a * stride, ahead[a]);
  float mx = -INFINITY;
  for (int i = lane; i < range.y; i += 32) mx = fmaxf(mx, lse_of(i));
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  // (a segment that saw no key has lse -inf and weight 0: the decode kernel wrote its partial as zeros)
  auto weight_of = [&](float lse) { return lse == -INFINITY ? 0.0f : exp2f(lse - mx); };
  total = 0;
  for (int i = lane; i < range.y; i += 32) total += weight_of(lse_of(i));  // (the lse again: from L1)
  for (int o = 16; o; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  auto add = [&](float w, const float4(&v)[kMergeVectors]) {
#pragma unroll
    for (int c = 0; c < kMergeVectors; ++c)
      acc[c].x += w * v[c].x, acc[c].y += w * v[c].y, acc[c].z += w * v[c].z, acc[c].w += w * v[c].w;
  };
#pragma unroll
  for (int c = 0; c < kMergeVectors; ++c) acc[c] = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int a = 0; a < kAhead; ++a)
    if (first + a * stride < range.y) add(weight_of(lse_of(first + a * stride)), ahead[a]);
#pragma unroll 2
  for (int i = first + kAhead * stride; i < range.y; i += stride) {
    float4 v[kMergeVectors];
    load_row(i, v);
    add(weight_of(lse_of(i)), v);
  }
}

// Merge a request's segments: o = sum_i 2^(lse_i - max) o_i / sum_i 2^(lse_i - max). One block per (row, request),
// each warp summing every kCombineWarps-th segment's partial row (16-byte loads), the warps' sums added in shared
// memory. The kernel is a chain of latencies after the decode kernel's last CTA - the step's critical path - so the
// chain is kept short: each warp loads its first kCombineAhead segments' rows together with the lse of every segment
// (the rows do not depend on the weights), and every warp finds the maximum and the total itself by shuffles, with no
// block barrier before the one that adds the warps' sums. (Against loading the lse, then two block reductions, then
// the rows: the step 0.2-0.3 us shorter at 16 heads, batch 64, 4K, H100; the merge still ends ~3.7 us
// after the decode kernel, most of it the wait for that grid's end.)
__global__ void __launch_bounds__(kCombineThreads)
    merge_splits_kernel(const float* __restrict__ o_partial, const float* __restrict__ lse_partial, int partial_rows,
                        const int2* __restrict__ request_segments, int rows, __nv_bfloat16* __restrict__ o_lat) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  __shared__ float4 warp_sums[kCombineWarps][kLatent / 4];
  const int row = blockIdx.x, b = blockIdx.y, tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int2 range = request_segments[b];  // first segment, count (<= kCombineMaxSegments: checked by the host)
  if (range.y == 1) return;                // the decode kernel wrote it
  float4 acc[kMergeVectors];
  float total;
  weigh_segments<kCombineAhead>(o_partial, lse_partial, partial_rows, range, row, warp, kCombineWarps, lane, acc,
                                total);
#pragma unroll
  for (int c = 0; c < kMergeVectors; ++c) warp_sums[warp][lane + 32 * c] = acc[c];
  __syncthreads();
  const float inv = 1.0f / total;
  __nv_bfloat16* dst = o_lat + (int64_t(b) * rows + row) * kLatent;
  for (int v = tid; v < kLatent / 4; v += kCombineThreads) {
    float4 sum = warp_sums[0][v];
    for (int w = 1; w < kCombineWarps; ++w)
      sum.x += warp_sums[w][v].x, sum.y += warp_sums[w][v].y, sum.z += warp_sums[w][v].z, sum.w += warp_sums[w][v].w;
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(dst + 4 * v);
    out[0] = __floats2bfloat162_rn(sum.x * inv, sum.y * inv);
    out[1] = __floats2bfloat162_rn(sum.z * inv, sum.w * inv);
  }
}

// The merge and the output absorb in one kernel (where every CTA gets up to 32 tokens): CTA (h, g)
// merges head h's rows of tokens g * per_cta .. into a bf16 tile (8 or more tokens a CTA: one row per warp at a time,
// as merge_splits_kernel does a row; fewer: every warp takes every kAbsorbWarps-th segment of each row in turn, their
// sums added in shared memory, so that one long request's row is not one warp's chain of segment loads; a request the
// decode kernel wrote whole is read from o_lat), then multiplies the tile by
// W_UV[h]^T on the tensor cores (mma.sync: each warp 16 of the head's 128 output columns over all 512 latent
// ones) and writes attn. W_UV[h] (128 KB) is copied before griddepcontrol.wait - the weights are the caller's,
// written before the step - so it streams in while the decode kernel's last CTAs run, and what is left after them
// is the merge's reads and a 16 x 128 x 512 product a tile: no absorb GEMM launched after the merge, no round trip
// of o_lat through L2.
constexpr int kAbsorbWarps = 8, kAbsorbThreads = 32 * kAbsorbWarps, kAbsorbTile = 16;  // tokens an MMA tile
constexpr int kAbsorbMinTokens = kAbsorbWarps;     // tokens a CTA from which each warp merges rows of its own
constexpr int kAbsorbMaxTokens = 2 * kAbsorbTile;  // and at most (see FusedCuda::prepare_form)
constexpr int kAbsorbAhead = 4;                    // segments' rows a warp loads before it weighs them
constexpr int kAbsorbVd = 128;                     // v_head_dim this kernel takes (DeepSeek V2, V2-Lite, V3)
constexpr int kAbsorbStride =
    kLatent + 8;  // bf16 a shared row: 16 bytes of padding, so ldmatrix's 8 rows hit 8 bank groups
constexpr size_t kAbsorbSmemBytes =
    size_t(kAbsorbVd + kAbsorbTile) * kAbsorbStride * 2 + size_t(kAbsorbWarps) * kLatent * 4;  // (+ the warps' sums)
struct MergeAbsorbParams {
  const float* o_partial;    // [segment][partial_rows][kLatent]
  const float* lse_partial;  // [segment][partial_rows]
  int partial_rows;
  const int2* request_segments;  // per request: first segment, count (1: written whole to o_lat)
  const __nv_bfloat16* o_lat;    // [token][heads][kLatent]: the whole requests' rows
  const __nv_bfloat16* w_uv;     // head h's W_UV [kAbsorbVd][kLatent] at w_uv + h * w_head_stride
  int64_t w_head_stride;
  __nv_bfloat16* attn;  // [token][heads][kAbsorbVd]
  int tokens, q_len, heads, tokens_per_cta;
};
__global__ void __launch_bounds__(kAbsorbThreads, 1) merge_absorb_kernel(const __grid_constant__ MergeAbsorbParams p) {
  extern __shared__ __align__(16) uint8_t absorb_smem[];
  __nv_bfloat16* const w = reinterpret_cast<__nv_bfloat16*>(absorb_smem);  // [kAbsorbVd][kAbsorbStride]
  __nv_bfloat16* const tile = w + kAbsorbVd * kAbsorbStride;               // [kAbsorbTile][kAbsorbStride]
  float4* const warp_sums = reinterpret_cast<float4*>(tile + kAbsorbTile * kAbsorbStride);  // [warps][kLatent / 4]
  const int h = int(blockIdx.x), warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  constexpr int kChunks = kLatent / 8;  // 16-byte chunks a row
  {  // this warp's 16 rows of W_UV[h] (the rows its MMAs read: no block barrier needed for them)
    const __nv_bfloat16* src = p.w_uv + int64_t(h) * p.w_head_stride;
    for (int i = lane; i < 16 * kChunks; i += 32) {
      const int row = warp * 16 + i / kChunks, chunk = i % kChunks;
      cp_async16(w + row * kAbsorbStride + chunk * 8, src + int64_t(row) * kLatent + chunk * 8, true);
    }
    cp_async_commit();
  }
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  const int first = int(blockIdx.y) * p.tokens_per_cta, end = min(p.tokens, first + p.tokens_per_cta);
  const bool warps_share_rows = p.tokens_per_cta < kAbsorbWarps;
  for (int t0 = first; t0 < end; t0 += kAbsorbTile) {
    if (warps_share_rows) {  // ---- the tile's rows, merged one at a time by all warps (the rest zero)
      for (int r = 0; r < kAbsorbTile; ++r) {
        const int token = t0 + r;
        uint2* const dst = reinterpret_cast<uint2*>(tile + r * kAbsorbStride);
        const int tid = int(threadIdx.x);
        if (token >= end) {
          if (tid < kLatent / 4) dst[tid] = make_uint2(0, 0);
          continue;
        }
        const int b = token / p.q_len, row = (token % p.q_len) * p.heads + h;
        const int2 range = p.request_segments[b];
        if (range.y == 1) {  // written whole by the decode kernel
          if (tid < kLatent / 4)
            dst[tid] = reinterpret_cast<const uint2*>(p.o_lat + (int64_t(token) * p.heads + h) * kLatent)[tid];
          continue;
        }
        float4 acc[kMergeVectors];
        float total;
        weigh_segments<kAbsorbAhead>(p.o_partial, p.lse_partial, p.partial_rows, range, row, warp, kAbsorbWarps, lane,
                                     acc, total);
#pragma unroll
        for (int c = 0; c < kMergeVectors; ++c) warp_sums[warp * (kLatent / 4) + lane + 32 * c] = acc[c];
        __syncthreads();
        if (tid < kLatent / 4) {
          float4 sum = warp_sums[tid];
#pragma unroll
          for (int w = 1; w < kAbsorbWarps; ++w) {
            const float4 v = warp_sums[w * (kLatent / 4) + tid];
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
          }
          const float inv = 1.0f / total;
          const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x * inv, sum.y * inv),
                               hi = __floats2bfloat162_rn(sum.z * inv, sum.w * inv);
          dst[tid] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
        }
        __syncthreads();  // (the sums are rewritten by the next row's warps)
      }
    }
    for (int r = warp; r < kAbsorbTile && !warps_share_rows; r += kAbsorbWarps) {  // ---- one row a warp
      const int token = t0 + r;
      uint2* const dst = reinterpret_cast<uint2*>(tile + r * kAbsorbStride);  // (4 bf16 a float4 column)
      if (token >= end) {
#pragma unroll
        for (int c = 0; c < kMergeVectors; ++c) dst[lane + 32 * c] = make_uint2(0, 0);
        continue;
      }
      const int b = token / p.q_len, row = (token % p.q_len) * p.heads + h;
      const int2 range = p.request_segments[b];
      if (range.y == 1) {  // written whole by the decode kernel
        const uint2* src = reinterpret_cast<const uint2*>(p.o_lat + (int64_t(token) * p.heads + h) * kLatent);
#pragma unroll
        for (int c = 0; c < kMergeVectors; ++c) dst[lane + 32 * c] = src[lane + 32 * c];
        continue;
      }
      float4 acc[kMergeVectors];
      float total;
      weigh_segments<kAbsorbAhead>(p.o_partial, p.lse_partial, p.partial_rows, range, row, 0, 1, lane, acc, total);
      const float inv = 1.0f / total;
#pragma unroll
      for (int c = 0; c < kMergeVectors; ++c) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(acc[c].x * inv, acc[c].y * inv),
                             hi = __floats2bfloat162_rn(acc[c].z * inv, acc[c].w * inv);
        dst[lane + 32 * c] =
            make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
      }
    }
    cp_async_wait<0>();  // (this thread's weight chunks; the barrier makes every thread's visible)
    __syncthreads();
    // ---- attn[tile rows][h][16 warp .. + 16] = tile · W_UV[h]^T
    float acc[2][2][4] = {};  // [k step parity][n tile]: two chains of dependent MMAs instead of one
#pragma unroll 8
    for (int ks = 0; ks < kLatent / 16; ++ks) {
      uint32_t a[4], b0, b1, b2, b3;
      ldmatrix_x4(smem_addr(tile + (lane % 16) * kAbsorbStride + ks * 16 + (lane / 16) * 8), a[0], a[1], a[2], a[3]);
      const int n = warp * 16 + lane % 8 + (lane / 16) * 8;
      ldmatrix_x4(smem_addr(w + n * kAbsorbStride + ks * 16 + ((lane / 8) % 2) * 8), b0, b1, b2, b3);
      mma_bf16(acc[ks % 2][0], a, b0, b1);
      mma_bf16(acc[ks % 2][1], a, b2, b3);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int token = t0 + lane / 4 + 8 * half;
        if (token >= end) continue;
        const int col = warp * 16 + j * 8 + 2 * (lane % 4);
        *reinterpret_cast<__nv_bfloat162*>(p.attn + (int64_t(token) * p.heads + h) * kAbsorbVd + col) =
            __floats2bfloat162_rn(acc[0][j][2 * half] + acc[1][j][2 * half],
                                  acc[0][j][2 * half + 1] + acc[1][j][2 * half + 1]);
      }
    __syncthreads();  // (the tile is rewritten by the next tokens' merge)
  }
}

// Keys a block (see roles): 32 where a 64-row tile holds at most 32 real rows (16 heads, or 16 with an MTP token)
// of a bf16 cache, else 64. (A quantised block expanded in 32-key stages ran 4-7% slower, H100.)
// `requested` (the block_keys axis; 0: auto) overrides it: 64 at up to 32 bf16 rows takes the two-warpgroup kernel.
int block_keys_for(int64_t rows, KvDtype kv, int64_t requested) {
  if (requested == 32 && kv != KvDtype::bf16)
    throw BadInput("mla/fused/cuda: block_keys 32: a quantised cache's blocks are 64 keys");
  if (requested > 0) return int(requested);
  return rows <= 32 && kv == KvDtype::bf16 ? 32 : 64;
}

// Where both block sizes apply (a bf16 cache of whole 64-key blocks a page, at most 32 rows: 16 heads), which is
// faster depends on the GPU: 32-key blocks in the fixed-roles kernel were tuned on the H100 (3.35 TB/s), where they
// match FlashInfer; on the H200 (4.8 TB/s) the two-warpgroup kernel's 64-key blocks stream faster (16 heads, batch
// 64-128, 32K keys: 13-16% shorter kernel; 4K: -2% at batch 64, +12% at batch 128). So auto takes the tuning cache's
// measured choice (family mla_fused_block_keys, by rows and the keys a CTA walks, pow2-bucketed; the mla/fused/cuda
// variant measures it on first use), else this table: 64 on an H200 where a CTA walks more than 2048 keys (where
// it was measured faster), 32 elsewhere. Only where the op's owner asks for tuned launches (MlaOp::use_tuned_launches:
// the MLA variants, the layer step and the engine; the 16-head two-warpgroup path is checked inside the layer by
// GpuLayer.SixteenHeadsIn64KeyBlocksMatchTheStack and the block_keys axis). Elsewhere 32.
constexpr const char* kBlockKeysFamily = "mla_fused_block_keys";
bool block_keys_tunable(int64_t rows, KvDtype kv, int64_t page_size) {
  return rows <= 32 && kv == KvDtype::bf16 && page_size % 64 == 0;
}
std::string block_keys_key(int64_t rows, int64_t keys_per_cta) {
  int64_t bucket = 1;
  while (bucket < keys_per_cta) bucket *= 2;
  return "rows " + std::to_string(rows) + ", keys a CTA <= " + std::to_string(bucket);
}
int default_block_keys(int64_t keys_per_cta) {
  return gpu_info().name.find("H200") != std::string::npos && keys_per_cta > 2048 ? 64 : 32;
}

// How many of the grid's CTAs get keys (kv_splits auto): auto_kv_splits' rule (about kAutoBlocksPerPart blocks a CTA,
// measured on the H100) is one or two blocks a CTA too many at short caches on the H200 (batch 1 at 4K keys, batch
// 4 and 16 at 1K: 4-7% behind the best fixed count, mla-fused.md), and right elsewhere. So where the op's owner asks
// for tuned launches the count is measured on first use (family mla_fused_kv_splits, by rows, batch and keys a request
// pow2-bucketed, with the key block already settled; the value 0 is the rule): the rule, 32, 64 and the whole grid,
// timed whole steps on the point's own inputs by mla/fused/cuda. Without a measurement the rule stands.
constexpr const char* kSplitsFamily = "mla_fused_kv_splits";
std::string splits_key(int64_t rows, int64_t batch, int64_t keys) {
  int64_t bucket = 1;
  while (bucket < keys) bucket *= 2;
  return "rows " + std::to_string(rows) + ", batch " + std::to_string(batch) +
         ", keys a request <= " + std::to_string(bucket);
}
std::vector<int64_t> split_candidates(int grid) {
  std::vector<int64_t> c = {0};
  for (int64_t n : {int64_t(32), int64_t(64), int64_t(grid)})
    if (n <= grid && std::find(c.begin(), c.end(), n) == c.end()) c.push_back(n);
  return c;
}

// The decode kernels, most specialised first (pick_decode_kernel takes the first that applies). Each kernel's unit
// states its own conditions (use_*); all are Hopper (sm_90a) kernels, the build's one architecture.
struct DecodeKernelEntry {
  DecodeKernel kernel;
  const char* name;
  bool (*applies)(const DecodeKey&);
};
constexpr DecodeKernelEntry kDecodeKernels[] = {
    // bf16, more than 32 rows (128 heads): FlashMLA's two warpgroups trading a pair of blocks
    {DecodeKernel::sm90_bf16_h128, "sm90_bf16_h128",
     [](const DecodeKey& k) { return k.arch == 90 && use_seesaw(k.tma, k.block_keys, k.kv); }},
    // fp8, 16 rows: Q K^T on FP8 tensor cores from the landed block, P V from registers
    {DecodeKernel::sm90_fp8_h16, "sm90_fp8_h16",
     [](const DecodeKey& k) { return k.arch == 90 && use_fp8(k.tma, k.rows, k.kv); }},
    // int8 up to 32 rows, fp8 at 32: producers expand blocks into fp16 tiles for consumers
    {DecodeKernel::sm90_int8_h16, "sm90_int8_h16",
     [](const DecodeKey& k) { return k.arch == 90 && use_narrow(k.tma, k.rows, k.kv); }},
    // everything else (bf16 at 16 heads, quantised at 128, small pages, a selector's keys): fixed roles
    {DecodeKernel::sm90_bf16_h16, "sm90_bf16_h16", [](const DecodeKey&) { return true; }},
};

int page_shift(int64_t page_size) {
  for (int shift = 0; shift < 31; ++shift)
    if (int64_t(1) << shift == page_size) return shift;
  return -1;
}

class FusedCuda final : public MlaOp {
 public:
  FusedCuda() : MlaOp(Algo::a_cc_me, /*fused=*/true) {}
  // Block-sparse: the kernel walks the selector's pages (see PageSelector).
  explicit FusedCuda(std::unique_ptr<PageSelector> selector)
      : MlaOp(Algo::a_cc_me, /*fused=*/true), selector_(std::move(selector)) {}
  bool sparse() const override { return selector_ != nullptr; }
  int64_t attended_keys(int64_t keys, int64_t page_size, const Shape& s) const override {
    return selector_ ? selector_->kept_keys(keys, page_size, s) : keys;
  }
  Cost selection_cost(const ModelConfig& m, const Shape& s, int64_t page_size) const override {
    return selector_ ? selector_->cost(m, s, page_size) : Cost{};
  }
  std::vector<std::vector<int64_t>> attended_key_indices() const override {
    return selector_ ? selector_->key_indices() : std::vector<std::vector<int64_t>>{};
  }
  std::map<std::string, double> selection_counters() const override {
    return selector_ ? selector_->launch_counters() : std::map<std::string, double>{};
  }
  // One more step (eager) with the decode kernel's phase clocks on; per CTA that walked blocks, each phase's time
  // from its griddepcontrol.wait (the SM clock, converted at the CTA's own clock rate: its global-timer span over
  // its clock span), and the medians over those CTAs: where a CTA's serial chain goes at batch 1, where few blocks
  // each leave the chain's fixed part exposed. decode_phase_us.wait: from entry to the wait's end (PDL's early
  // start: the kernels before still running; with early loads, after the first copies are queued, so loads_issued
  // and first_block_landed may be negative); per_block: (last - first block's P V) / (blocks - 1), blocks of
  // decode_phase.block_keys keys (32 or 64: see roles); decode_phase.sm_ghz: the SM clock as it ran. The
  // two-warpgroup kernel (seesaw) records loads_issued, q_landed, first_block_scored (its first pair's scores),
  // first_block_accumulated (the end of its first pair), last_block_accumulated and done, and where a CTA walks two
  // segments or more, first_segment_accumulated (its first segment's last pair done), first_segment_written,
  // second_segment_q_landed and second_segment_first_accumulated (what switching segments costs, against two
  // per_block); the other phases are absent from its results. The narrow and fp8 kernels (quantised caches at 16
  // heads) record loads_issued, q_landed, first_block_landed, first_block_scored, first_block_handed_over,
  // first/last_block_accumulated and done, and per block (its totals over the CTA's blocks over their count): the
  // narrow kernel the scorer's block_tile_wait, block_score, block_softmax and block_accumulate and a producer's
  // block_landing_wait, block_tile_free_wait and block_expand; the fp8 kernel the scorer's block_tile_wait,
  // block_score and block_softmax and an accumulator's block_landing_wait, block_expand, block_p_wait and
  // block_accumulate (see Phase). decode_phase_us.last_done: the slowest CTA's
  // done (each phase above is the median over CTAs).
  std::map<std::string, double> phase_counters() override;
  void attention_core_only(bool on) override { core_only_ = on; }
  std::vector<TunedChoice> tuned_choices() const override { return tuned_; }

 protected:
  bool supports_kv_dtype(KvDtype d) const override {
    return !selector_ || d == KvDtype::bf16;
  }  // (the bounds read bf16 pages)
  std::string form_unsupported(const ModelConfig& m, const Shape& s) const override {
    return selector_ ? selector_->unsupported(m, s) : "";
  }
  void prepare_form() override {
    if (selector_) selector_->prepare(m_, s_, *b_.cache, b_.lengths, arena_);
    const int64_t T = s_.tokens(), M = s_.q_len * nh_;
    if (M % 16) throw BadInput("mla/fused/cuda: heads x q_len must be a multiple of 16, got " + std::to_string(M));
    // 64-row tiles always (16 heads pad 16 rows to 64: the spare MMA rows cost less than a lockstep kernel's
    // softmax stalls at 16- or 32-row tiles, measured 0.59-0.90 vs 0.55-0.83 of the roofline on the H200).
    row_tiles_ = int((M + kTileRows - 1) / kTileRows);
    parts_ = parts_for(s_);
    // A request split across CTAs crosses at most one run boundary per piece: segments <= batch + parts.
    max_segments_ = int(s_.batch) + parts_;
    if (parts_ + 1 > kCombineMaxSegments)
      throw std::logic_error("mla/fused/cuda: more splits per request than the combine kernel merges");
    q_cat_buffer_.scratch(arena_, size_t(T * nh_ * width_));
    q_cat_ = q_cat_buffer_.get();
    o_lat_.scratch(arena_, size_t(T * nh_ * r_));
    o_partial_.scratch(arena_, size_t(max_segments_) * size_t(row_tiles_ * kTileRows) * kLatent);
    lse_partial_.scratch(arena_, size_t(max_segments_) * size_t(row_tiles_ * kTileRows));
    block_keys_ = block_keys_for(M, s_.kv_dtype, s_.block_keys);
    tuned_.clear();
    if (tuned_launches_ && s_.block_keys == 0 && !selector_ &&
        block_keys_tunable(M, s_.kv_dtype, b_.cache->page_size)) {
      const int64_t keys_per_cta = s_.batch * s_.keys() / parts_;
      TunedChoice t{kBlockKeysFamily, block_keys_key(M, keys_per_cta), &Shape::block_keys, {32, 64}, false};
      if (const auto v = TuningCache::instance().lookup(t.family, t.key)) {
        block_keys_ = v->get<int>();
        t.from_cache = true;
      } else {
        block_keys_ = default_block_keys(keys_per_cta);
        TuningCache::instance().use_default(t.family, t.key, block_keys_);
      }
      tuned_.push_back(t);
    }
    // The CTAs given keys (see kSplitsFamily): a tuner's candidate, the cache's measured count, or the rule (0).
    splits_ = 0;
    if (s_.measured_splits > 0) {
      splits_ = int(std::min<int64_t>(s_.measured_splits, parts_));
    } else if (tuned_launches_ && s_.kv_splits == 0 && !selector_) {
      TunedChoice t{kSplitsFamily, splits_key(M, s_.batch, s_.keys()), &Shape::measured_splits,
                    split_candidates(parts_), false};
      if (const auto v = TuningCache::instance().lookup(t.family, t.key)) {
        splits_ = int(std::min<int64_t>(v->get<int64_t>(), parts_));
        t.from_cache = true;
      } else {
        TuningCache::instance().use_default(t.family, t.key, 0);
      }
      tuned_.push_back(t);
    }
    // The merge absorbs the output too (requests split or not; fused_absorbs) where each of its CTAs gets at most
    // two MMA tiles of tokens: head x token-group CTAs, as many groups as fill the GPU once, a warp's worth of tokens
    // a group from 8 tokens (below 8 a CTA's warps share each row's segments: one warp walking a long request's
    // segments alone was the reason the absorb ran apart below 8 tokens). Past two tiles a CTA walks its tiles one
    // after another - at 128 heads, one CTA a head, 64 tokens took 20 us where cuBLAS's absorb takes ~9 (H100).
    absorb_tokens_per_cta_ = 0;
    if (s_.fused_absorbs && vd_ == kAbsorbVd && r_ == kLatent) {
      const int64_t min_tokens = T >= kAbsorbMinTokens ? kAbsorbMinTokens : 1;
      const int64_t groups = std::min<int64_t>(T / min_tokens, std::max<int64_t>(1, gpu_info().sms / nh_));
      const int64_t per_cta = (T + groups - 1) / groups;
      if (per_cta <= kAbsorbMaxTokens) {
        absorb_tokens_per_cta_ = int(per_cta);
        DSLAB_CUDA(cudaFuncSetAttribute(merge_absorb_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(kAbsorbSmemBytes)));
      }
    }
    tma_ = b_.cache->page_size % block_keys_ == 0;
    // (the narrow kernel copies half-blocks: its ring of raw blocks and two fp16 tiles fit only so; the fp8 kernel's
    // Q K^T reads whole blocks as they land, 64-byte rows swizzled)
    const DecodeKernel kernel = pick_decode_kernel(decode_key(tma_));
    if (tma_) {
      if (kernel == DecodeKernel::sm90_fp8_h16)
        kv_map_ = cache_tensor_map(*b_.cache, block_keys_, 64);
      else
        kv_map_ = cache_tensor_map(*b_.cache, kernel == DecodeKernel::sm90_int8_h16 ? kNarrowBoxKeys : block_keys_,
                                   s_.kv_dtype == KvDtype::bf16 ? 128 : 0);
    }
    if (kernel == DecodeKernel::sm90_bf16_h128) {  // (its Q tiles and outputs; a token selector's steps may still take
                                                   // the fixed roles)
      q_map_ = tensor_map_2d(q_cat_, T * nh_, kWidth, 2, kTileRows, 64, /*swizzle_bytes=*/128);
      if (T * nh_ >= kTileRows)
        o_map_ = tensor_map_2d(o_lat_.get(), T * nh_, kLatent, 2, kTileRows, 64, /*swizzle_bytes=*/128);
    }
  }
  // The schedule blob: segments (int4 each) at 0, the CTAs' segment ranges (int2) at 4 * max_segments_, the
  // requests' (int2) after them.
  size_t schedule_ints_for(const ModelConfig&, const Shape& s) const override {
    const int64_t parts = parts_for(s), max_segments = s.batch + parts;
    return size_t(4 * max_segments + 2 * parts + 2 * s.batch);
  }
  MlaSchedule schedule(const std::vector<int64_t>& lengths) const override {
    // The kernel writes requests it covers whole straight to o_lat (it never writes padding rows): those need
    // no merge, so the plan keeps requests whole where that costs little balance (measured at 128 heads on the
    // H200, one run, two rounds: +2-5% of the roofline at 4K-8K, -0.5% at 16K-32K).
    // The grid has parts_ CTAs per row tile; with kv_splits auto the lengths decide how many of them take keys
    // (the rest exit at once), so one captured graph serves short and long steps alike.
    std::vector<int64_t> walked = lengths;  // (sparse: the keys the selection keeps, before this step's)
    if (selector_)
      for (int64_t& l : walked) l = selector_->kept_keys(l + s_.q_len, b_.cache->page_size, s_) - s_.q_len;
    const int used = s_.kv_splits > 0 ? parts_
                     : splits_ > 0    ? splits_
                                      : auto_kv_splits(walked, s_.q_len, kBlockKeys, parts_);
    // Cut in the kernel's blocks: in 64-key units the 16-head step's 64 requests of 4K (65 units each, 4160 in all)
    // came to 32 units on each of 130 CTAs, two SMs idle; in 32-key blocks, 63 on each of 132 (1.6% fewer keys a
    // CTA; measured: the kernel the same within noise, the step 0.3% faster; H100).
    std::optional<SplitKv> cut;
    if (s_.split_plan != SplitPlan::packed) cut = split_kv_per_request(walked, s_.q_len, block_keys_, used);
    if (!cut) cut = split_kv(walked, s_.q_len, block_keys_, used, /*whole_requests=*/true);
    const SplitKv& plan = *cut;
    if (int(plan.segments.size()) > max_segments_ || int64_t(lengths.size()) != s_.batch)
      throw std::logic_error("mla/fused/cuda: schedule exceeds its capacity");
    MlaSchedule out;
    out.blob.assign(schedule_ints(), 0);
    int32_t* seg = out.blob.data();
    int32_t* part = seg + 4 * max_segments_;
    int32_t* req = part + 2 * parts_;
    for (size_t i = 0; i < plan.segments.size(); ++i) {
      const auto& g = plan.segments[i];
      const int32_t whole = plan.requests[size_t(g.request)].count == 1 ? 1 : 0;
      seg[4 * i] = g.request, seg[4 * i + 1] = g.first_key, seg[4 * i + 2] = g.end_key, seg[4 * i + 3] = whole;
    }
    for (int i = 0; i < parts_; ++i) {  // (parts past `used`: no segments)
      const bool in_use = i < int(plan.parts.size());
      part[2 * i] = in_use ? plan.parts[size_t(i)].first : int32_t(plan.segments.size());
      part[2 * i + 1] = in_use ? plan.parts[size_t(i)].count : 0;
    }
    for (size_t i = 0; i < plan.requests.size(); ++i)
      req[2 * i] = plan.requests[i].first, req[2 * i + 1] = plan.requests[i].count;
    out.segments = int(plan.segments.size());
    out.merges = std::any_of(plan.requests.begin(), plan.requests.end(), [](const auto& r) { return r.count > 1; });
    merges_ = merges_ || out.merges;
    const double mean_blocks = mla::mean_segment_blocks(plan, block_keys_);
    stream_evict_first_ = mean_blocks > 0 && mean_blocks <= double(kStreamEvictFirstBlocks);
    return out;
  }
  // The cache as a 2-D tensor [slots][576] for the tensor memory accelerator, box_keys x 64-column boxes, swizzled by
  // `swizzle_bytes`: bf16 by 128 as the MMAs read them; int8 / fp8 as they are, for the scorer or producers to expand
  // (see roles::Geometry), or fp8 by 64 for the fp8 kernel's e4m3 MMAs.
  static CUtensorMap cache_tensor_map(const PagedLatentCache& c, int box_keys, int swizzle_bytes) {
    const int element_bytes = c.dtype == KvDtype::bf16 ? 2 : 1;
    return tensor_map_2d(c.values.get(), int64_t(c.values.size()) / (kWidth * element_bytes), kWidth, element_bytes,
                         box_keys, 64, swizzle_bytes);
  }
  void attend() override {
    const int M = int(s_.q_len * nh_);
    concat_query();
    CacheView view = cache_view(*b_.cache);
    const int32_t* lengths = b_.lengths;
    if (selector_) {
      selector_->select(q_cat_, stream_, blas_, [this](const char* op) { mark(op); });
      view.page_table = selector_->page_table();
      view.pages_per_request = selector_->pages_per_request();
      view.page_size = selector_->keys_per_entry(view.page_size);
      lengths = selector_->lengths();
    }
    const int4* segments = reinterpret_cast<const int4*>(schedule_buffer());
    const int2* part_segments = reinterpret_cast<const int2*>(schedule_buffer() + 4 * max_segments_);
    const int2* request_segments = part_segments + parts_;
    // (a token selector's entries are single keys: copied key by key, not by the tensor memory accelerator)
    Params params{kv_map_,
                  q_map_,
                  o_map_,
                  tma_ && view.page_size % block_keys_ == 0,
                  q_cat_,
                  view,
                  lengths,
                  segments,
                  part_segments,
                  o_partial_.get(),
                  lse_partial_.get(),
                  M,
                  int(nh_),
                  int(s_.q_len),
                  float(scale_ * M_LOG2E),
                  page_shift(view.page_size),
                  row_tiles_ * kTileRows,
                  o_lat_.get(),
                  record_phases_ ? phases_.get() : nullptr,
                  /*early_loads=*/!selector_ && !cache_written_just_before(),
                  /*evict_first=*/s_.l2_evict == L2Evict::first};
    switch (pick_decode_kernel(decode_key(params.tma))) {
      case DecodeKernel::sm90_bf16_h128:
        launch_seesaw(params, parts_, row_tiles_,
                      s_.l2_evict == L2Evict::automatic ? stream_evict_first_ : s_.l2_evict == L2Evict::first, stream_);
        break;
      case DecodeKernel::sm90_fp8_h16:
        launch_fp8(params, parts_, stream_);
        break;
      case DecodeKernel::sm90_int8_h16:
        launch_narrow(params, s_.kv_dtype, parts_, stream_);
        break;
      case DecodeKernel::sm90_bf16_h16:
        launch_roles(params, s_.kv_dtype, parts_, row_tiles_, block_keys_, stream_);
        break;
    }
    mark("decode");
    if (absorb_tokens_per_cta_ > 0 &&
        !core_only_) {  // the merge absorbs too (and copies the whole requests' rows): merge_absorb_kernel
      const int64_t T = s_.tokens();
      const MergeAbsorbParams mp{o_partial_.get(),   lse_partial_.get(), row_tiles_ * kTileRows,
                                 request_segments,   o_lat_.get(),       w_->kv_b.get() + nope_ * r_,
                                 (nope_ + vd_) * r_, attn_.get(),        int(T),
                                 int(s_.q_len),      int(nh_),           absorb_tokens_per_cta_};
      const unsigned groups = unsigned((T + absorb_tokens_per_cta_ - 1) / absorb_tokens_per_cta_);
      launch_pdl(merge_absorb_kernel, dim3(unsigned(nh_), groups), dim3(kAbsorbThreads), kAbsorbSmemBytes, stream_, mp);
      DSLAB_CHECK_LAUNCH();
      // (one kernel: op_us.combine holds the absorb too, and there is no op_us.absorb_o; the attention kernel's own
      // time, kernel_s, is taken with the plain merge: attention_core_only)
      mark("combine");
      return;
    }
    if (merges_ || lengths_vary_) {  // (a step replayed with other lengths may split requests this one did not)
      launch_pdl(merge_splits_kernel, dim3(unsigned(M), unsigned(s_.batch)), dim3(kCombineThreads), 0, stream_,
                 o_partial_.get(), lse_partial_.get(), row_tiles_ * kTileRows, request_segments, M, o_lat_.get());
      DSLAB_CHECK_LAUNCH();
    }
    mark("combine");
    absorb_output(o_lat_.get());
    mark("absorb_o");
  }

 private:
  DecodeKey decode_key(bool tma) const {
    return {gpu_info().cc_major * 10 + gpu_info().cc_minor, s_.q_len * nh_, s_.kv_dtype, tma, block_keys_};
  }
  // Split-KV, balanced (see mla::split_kv): one CTA per SM and row tile, or the kv_splits axis's count.
  static int parts_for(const Shape& s) {
    const int row_tiles = int((s.q_len * s.heads + kTileRows - 1) / kTileRows);
    const int per_sm = std::max(1, gpu_info().sms / row_tiles);
    return s.kv_splits > 0 ? int(std::min<int64_t>(s.kv_splits, kCombineMaxSegments - 1)) : per_sm;
  }
  std::unique_ptr<PageSelector> selector_;
  bool record_phases_ = false;
  DeviceArray<unsigned long long> phases_;
  int row_tiles_ = 1, parts_ = 1, max_segments_ = 0, block_keys_ = 64;
  int absorb_tokens_per_cta_ = 0;  // > 0: merge_absorb_kernel's tokens a CTA, where it replaces the merge and absorb
  bool core_only_ = false;         // attention_core_only: the plain merge, o_lat for absorb_output
  bool tma_ = false;
  std::vector<TunedChoice> tuned_;
  int splits_ = 0;  // CTAs given keys by the tuning cache or a tuner's candidate, of parts_; 0: auto_kv_splits
  mutable bool merges_ = false;  // a schedule made so far splits a request across CTAs, left to combine
  // The last schedule's segments average at most kStreamEvictFirstBlocks blocks: the two-warpgroup kernel's copies
  // then leave L2 first (launch_seesaw's evict_first). A CUDA graph keeps the value it was captured with (a hint only).
  mutable bool stream_evict_first_ = false;
  CUtensorMap kv_map_{}, q_map_{}, o_map_{};
  DeviceArray<__nv_bfloat16> q_cat_buffer_, o_lat_;
  DeviceArray<float> o_partial_, lse_partial_;
};

std::map<std::string, double> FusedCuda::phase_counters() {
  const size_t slots = size_t(parts_) * size_t(row_tiles_) * kPhaseSlots;
  phases_.resize(slots);
  DSLAB_CUDA(cudaMemset(phases_.get(), 0, slots * sizeof(unsigned long long)));
  record_phases_ = true;
  try {
    forward(stream_);
  } catch (...) {
    record_phases_ = false;
    throw;
  }
  record_phases_ = false;
  DSLAB_CUDA(cudaStreamSynchronize(stream_));
  std::vector<unsigned long long> clocks(slots);
  DSLAB_CUDA(cudaMemcpy(clocks.data(), phases_.get(), slots * sizeof(unsigned long long), cudaMemcpyDeviceToHost));

  const std::pair<Phase, const char*> named[] = {{kLoadsIssued, "loads_issued"},
                                                 {kQLanded, "q_landed"},
                                                 {kFirstLanded, "first_block_landed"},
                                                 {kFirstScored, "first_block_scored"},
                                                 {kFirstMaxed, "first_block_maxed"},
                                                 {kFirstHandedOver, "first_block_handed_over"},
                                                 {kFirstAccumulated, "first_block_accumulated"},
                                                 {kLastAccumulated, "last_block_accumulated"},
                                                 {kDone, "done"},
                                                 {kFirstSegmentAccumulated, "first_segment_accumulated"},
                                                 {kFirstSegmentWritten, "first_segment_written"},
                                                 {kSecondQLanded, "second_segment_q_landed"},
                                                 {kSecondFirstAccumulated, "second_segment_first_accumulated"},
                                                 {kFirstSegmentLastPairs, "first_segment_last_pairs"},
                                                 {kFirstSegmentSummed, "first_segment_summed"},
                                                 {kFirstSegmentStored, "first_segment_stored"},
                                                 {kSecondScored, "second_segment_scored"},
                                                 {kFirstSegmentLastPair, "first_segment_last_pair"},
                                                 {kLastSegmentLastPairs, "last_segment_last_pairs"}};
  std::map<std::string, std::vector<double>> us;
  unsigned long long first_entry = ~0ull, last_exit = 0;
  double last_done = 0;
  for (size_t cta = 0; cta < slots / kPhaseSlots; ++cta) {
    const unsigned long long* c = clocks.data() + cta * kPhaseSlots;
    if (c[kBlocks] == 0 || c[kDone] <= c[kEntry] || c[kTimerExit] <= c[kTimerEntry])
      continue;  // (no keys: left at once)
    const double us_per_clock = double(c[kTimerExit] - c[kTimerEntry]) * 1e-3 / double(c[kDone] - c[kEntry]);
    us["sm_ghz"].push_back(1e-3 / us_per_clock);
    auto since_wait = [&](Phase ph) { return double(int64_t(c[ph] - c[kWaited])) * us_per_clock; };
    us["wait"].push_back(double(c[kWaited] - c[kEntry]) * us_per_clock);
    for (const auto& [ph, name] : named)
      if (c[ph]) us[name].push_back(since_wait(ph));  // (the two-warpgroup kernel records fewer phases)
    if (c[kBlocks] > 1)
      us["per_block"].push_back(double(c[kLastAccumulated] - c[kFirstAccumulated]) * us_per_clock /
                                double(c[kBlocks] - 1));
    const std::pair<Phase, const char*> spent[] = {
        {kSpentTileWait, "block_tile_wait"},       {kSpentScoring, "block_score"},
        {kSpentSoftmax, "block_softmax"},          {kSpentAccumulating, "block_accumulate"},
        {kSpentLandingWait, "block_landing_wait"}, {kSpentTileFreeWait, "block_tile_free_wait"},
        {kSpentExpanding, "block_expand"},         {kSpentPWait, "block_p_wait"}};
    for (const auto& [ph, name] : spent)  // (the narrow and fp8 kernels' per-block parts: totals over the CTA's blocks)
      if (c[ph]) us[name].push_back(double(c[ph]) * us_per_clock / double(c[kBlocks]));
    us["blocks"].push_back(double(c[kBlocks]));
    last_done = std::max(last_done, since_wait(kDone));
    first_entry = std::min(first_entry, c[kTimerEntry]), last_exit = std::max(last_exit, c[kTimerExit]);
  }
  std::map<std::string, double> out;
  if (us.empty()) return out;
  for (auto& [name, v] : us) {
    std::sort(v.begin(), v.end());
    out[(name == "blocks" || name == "sm_ghz" ? "decode_phase." : "decode_phase_us.") + name] = v[v.size() / 2];
  }
  // Where the slowest CTAs lose their time (the kernel ends with its last): the spread of the CTAs' ends and of their
  // block rates - a few slow SMs show in per_block_max, a late start in done_p90 against per_block's.
  auto quantile = [](const std::vector<double>& sorted, double q) {
    return sorted[size_t(q * double(sorted.size() - 1) + 0.5)];
  };
  if (us.count("done"))
    out["decode_phase_us.done_p10"] = quantile(us["done"], 0.1),
    out["decode_phase_us.done_p90"] = quantile(us["done"], 0.9);
  if (us.count("per_block"))
    out["decode_phase_us.per_block_min"] = us["per_block"].front(),
    out["decode_phase_us.per_block_max"] = us["per_block"].back();
  out["decode_phase.working_ctas"] = double(us["blocks"].size());
  out["decode_phase.block_keys"] = double(block_keys_);  // (blocks and per_block count blocks of this many keys)
  out["decode_phase_us.span"] = double(last_exit - first_entry) * 1e-3;
  out["decode_phase_us.last_done"] = last_done;  // (the slowest CTA's done: against the median's, the tail's cost)
  return out;
}

}  // namespace

std::unique_ptr<MlaOp> make_fused_op(std::unique_ptr<PageSelector> selector) {
  return std::make_unique<FusedCuda>(std::move(selector));
}

DSLAB_REGISTER_MLA_OP(
    FusedCuda, "mla/fused/cuda",
    "fused decode: split-KV online-softmax MQA over the paged latent (warpgroup MMAs; 128 heads: FlashMLA's "
    "two-warpgroup seesaw; 16 heads int8/fp8: keys along the MMA rows - fp8 by FP8 Q K^T from the landed block and P V "
    "from registers, int8 by producer warpgroups expanding for consumer warpgroups), bf16/int8/fp8 cache");

namespace fused_decode {
DecodeKernel pick_decode_kernel(const DecodeKey& key) {
  for (const auto& entry : kDecodeKernels)
    if (entry.applies(key)) return entry.kernel;
  return DecodeKernel::sm90_bf16_h16;
}
const char* decode_kernel_name(DecodeKernel kernel) {
  for (const auto& entry : kDecodeKernels)
    if (entry.kernel == kernel) return entry.name;
  return "unknown";
}
}  // namespace fused_decode

}  // namespace dslab::mla::cuda
