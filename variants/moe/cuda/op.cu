// The MoE op on the GPU (moe_cuda.h): the router (gate, scoring, top-k) and permutation by expert on the device, the
// shared experts and the combine, and the registry every layer picks its MoE op from.
#include "variants/moe/cuda/moe_cuda.h"

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "harness/errors.h"
#include "variants/common/cuda/nvtx.h"
#include "harness/gpu.h"
#include "harness/host.h"
#include "harness/tuning.h"
#include "harness/op_registry.h"
#include "variants/common/cuda/device_random.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/rng.h"
#include "variants/moe/cuda/moe_kernels.cuh"

namespace dslab::moe::cuda {

using gpu::linear;

namespace {

// ---- router ------------------------------------------------------------------------------------------------

struct RouterParams {
  const float* logits;  // [tokens][E]
  const float* bias;    // [E] (noaux_tc)
  int tokens, E, topk, n_group, topk_group;
  bool sigmoid, grouped, noaux, norm_topk_prob;
  float routed_scaling_factor;
  int32_t* topk_ids;
  float* topk_weights;
  int32_t* counts;
};

// One warp per token, as ref::route does it: scores (softmax or sigmoid), for the grouped methods the
// topk_group best groups (noaux_tc: by the sum of their two best biased scores, group_limited_greedy: by their
// best score), then the topk best experts among them (ties to the lower index), weights from the unbiased
// scores, normalised (norm_topk_prob) and scaled. Each choice also counts a row for its expert.
// Token t's routing by one warp, in `scratch` (2 E floats).
__device__ void route_token(const RouterParams& p, int t, float* scratch) {
  const int lane = int(threadIdx.x) % 32;
  float* score = scratch;
  float* choice = score + p.E;
  const float* x = p.logits + int64_t(t) * p.E;
  float mx = -INFINITY;
  for (int e = lane; e < p.E; e += 32) mx = fmaxf(mx, x[e]);
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0;
  for (int e = lane; e < p.E; e += 32) {
    const float s = p.sigmoid ? 1.0f / (1.0f + expf(-x[e])) : expf(x[e] - mx);
    score[e] = s;
    sum += s;
  }
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  for (int e = lane; e < p.E; e += 32) {
    if (!p.sigmoid) score[e] /= sum;
    choice[e] = score[e] + (p.noaux ? p.bias[e] : 0.0f);
  }
  __syncwarp();
  if (p.grouped) {
    const int per_group = p.E / p.n_group;
    float group_score = -INFINITY;
    if (lane < p.n_group) {
      float best = -INFINITY, second = -INFINITY;
      for (int i = 0; i < per_group; ++i) {
        const float v = choice[lane * per_group + i];
        if (v > best)
          second = best, best = v;
        else if (v > second)
          second = v;
      }
      group_score = p.noaux ? best + (per_group > 1 ? second : 0.0f) : best;
    }
    bool allowed = false;
    __syncwarp();  // every lane has read its group's choices before any lane masks them
    for (int g = 0; g < p.topk_group; ++g) {
      float v = group_score;
      int i = lane;
      for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
      }
      if (lane == i) allowed = true, group_score = -INFINITY;
    }
    for (int g = 0; g < p.n_group; ++g) {
      if (__shfl_sync(0xffffffffu, allowed ? 1 : 0, g)) continue;
      for (int e = g * per_group + lane; e < (g + 1) * per_group; e += 32) choice[e] = p.noaux ? -INFINITY : 0.0f;
    }
    __syncwarp();
  }
  float weight_sum = 0, my_weight = 0;
  int my_id = 0;
  for (int k = 0; k < p.topk; ++k) {
    float v = -INFINITY;
    int i = p.E;
    for (int e = lane; e < p.E; e += 32)
      if (choice[e] > v || (choice[e] == v && e < i)) v = choice[e], i = e;
    for (int o = 16; o; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
    }
    __syncwarp();                    // every lane has scanned the choices before one is taken
    if (lane == 0) choice[i] = NAN;  // taken: NaN compares false with everything
    __syncwarp();
    const float w = score[i];
    weight_sum += w;
    if (lane == k) my_id = i, my_weight = w;
  }
  if (lane < p.topk) {
    float w = my_weight;
    if (p.topk > 1 && p.norm_topk_prob) w /= weight_sum + 1e-20f;
    p.topk_ids[t * p.topk + lane] = my_id;
    p.topk_weights[t * p.topk + lane] = w * p.routed_scaling_factor;
    atomicAdd(&p.counts[my_id], 1);
  }
}

constexpr int kRouterWarps = 4;
__global__ void router_kernel(RouterParams p) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  extern __shared__ float smem[];
  const int warp = int(threadIdx.x) / 32;
  const int t = int(blockIdx.x) * kRouterWarps + warp;
  if (t < p.tokens) route_token(p, t, smem + warp * 2 * p.E);
}

// Given routing: only the counts.
__global__ void count_kernel(const int32_t* ids, int n, int32_t* counts) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  const int i = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&counts[ids[i]], 1);
}

// One block: offsets (exclusive scan of the counts), the row tiles of tile_rows rows within each expert, then the
// scatter of every (token, k) to its expert's rows (cursors in shared memory), and the counts zeroed for the next
// step (so no memset node per step).
constexpr int kScanThreads = 1024;
struct ScanArgs {
  int32_t* counts;
  int E, tile_rows;
  const int32_t* ids;
  int rows, topk;
  int32_t* offsets;
  int2* tiles;
  int32_t *num_tiles, *perm_token, *slot;
};
__device__ void scan_scatter(const ScanArgs& a) {
  using Scan = cub::BlockScan<int2, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int cursor[kScanThreads];
  const int e = int(threadIdx.x);
  const int n = e < a.E ? a.counts[e] : 0;
  const int2 mine = make_int2(n, (n + a.tile_rows - 1) / a.tile_rows);
  int2 first, total;
  Scan(temp).ExclusiveScan(
      mine, first, make_int2(0, 0), [](int2 x, int2 y) { return make_int2(x.x + y.x, x.y + y.y); }, total);
  if (e < a.E) {
    a.offsets[e] = first.x;
    cursor[e] = first.x;
    a.counts[e] = 0;
    for (int i = 0; i < mine.y; ++i) a.tiles[first.y + i] = make_int2(e, first.x + i * a.tile_rows);
  }
  if (e == 0) {
    a.offsets[a.E] = total.x;
    *a.num_tiles = total.y;
  }
  __syncthreads();
  for (int i = e; i < a.rows; i += kScanThreads) {
    const int pos = atomicAdd(&cursor[a.ids[i]], 1);
    a.perm_token[pos] = i / a.topk;
    a.slot[i] = pos;
  }
}
__global__ void __launch_bounds__(kScanThreads) scan_scatter_kernel(ScanArgs a) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  scan_scatter(a);
}

// Decode: the router and the scan + scatter in one block (one kernel boundary less per MoE layer): a warp per
// token routes it, then the block's barrier (which also makes the warps' global writes visible to the whole
// block) and the scan + scatter as above.
constexpr int kFusedRouteTokens = kScanThreads / 32;
constexpr size_t kMaxRouterSmem =
    32 * 1024;  // dynamic shared memory, well inside the 48 KB a kernel gets without opting in
__global__ void __launch_bounds__(kScanThreads) route_scan_scatter_kernel(RouterParams p, ScanArgs a) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  extern __shared__ float smem[];
  const int warp = int(threadIdx.x) / 32;
  if (warp < p.tokens) route_token(p, warp, smem + warp * 2 * p.E);
  __syncthreads();
  scan_scatter(a);
}

// A warp's dot product of a token's hidden state x with an expert's gate row over their 16-byte chunks [begin, end),
// summed over the lanes: each lane's loads issued four at a time (one at a time, each lane waited out 8 (V2-Lite) to
// 28 (V3) HBM latencies in turn).
__device__ inline float gate_dot(const __nv_bfloat16* x, const __nv_bfloat16* gate_row, int begin, int end) {
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  const uint4* w = reinterpret_cast<const uint4*>(gate_row);
  float acc = 0;
  auto dot = [&](const uint4& a, const uint4& b) {
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 fa = __bfloat1622float2(a2[i]), fb = __bfloat1622float2(b2[i]);
      acc += fa.x * fb.x + fa.y * fb.y;
    }
  };
  int j = begin + int(threadIdx.x) % 32;
  for (; j + 96 < end; j += 128) {
    uint4 a[4], b[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) a[u] = __ldg(xr + j + 32 * u), b[u] = __ldg(w + j + 32 * u);
#pragma unroll
    for (int u = 0; u < 4; ++u) dot(a[u], b[u]);
  }
  for (; j < end; j += 32) dot(__ldg(xr + j), __ldg(w + j));
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

// The router's logits for a handful of tokens (decode) without a GEMM launch: one warp per (token, expert) dot
// product; blocks of 8 experts spread the gate's rows over the SMs.
constexpr int kGateThreads = 256;
__global__ void __launch_bounds__(kGateThreads)
    gate_logits_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ gate, int hidden, int E,
                       float* __restrict__ logits) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  const int t = blockIdx.x, e = int(blockIdx.y) * (kGateThreads / 32) + int(threadIdx.x) / 32;
  if (e >= E) return;
  const float acc = gate_dot(x + int64_t(t) * hidden, gate + int64_t(e) * hidden, 0, hidden / 8);
  if (threadIdx.x % 32 == 0) logits[int64_t(t) * E + e] = acc;
}

// Decode's whole routing in one kernel (one launch less per MoE layer than gate_logits_kernel +
// route_scan_scatter_kernel): blocks of (token, 8 experts), four warps an expert each taking a quarter of the
// hidden size, write the logits; the last block to finish (a counter in global memory, which that block resets for
// the next step or replay) reads them back from L2, routes every token (a warp each, as route_token) and runs the
// scan + scatter. (Each block's logit writes are fenced before its count, the last block's reads after it: the
// threadFenceReduction pattern.)
constexpr int kGateRouteExperts = 8, kGateRouteSplit = kScanThreads / 32 / kGateRouteExperts;
__global__ void __launch_bounds__(kScanThreads)
    gate_route_scan_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ gate, int hidden,
                           float* logits, unsigned* blocks_done, RouterParams p, ScanArgs a) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  extern __shared__ float smem[];  // [tokens][E] logits, then [tokens][2 E] routing scratch
  __shared__ float partial[kScanThreads / 32];
  __shared__ bool last;
  const int t = int(blockIdx.x), warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int e = int(blockIdx.y) * kGateRouteExperts + warp / kGateRouteSplit, part = warp % kGateRouteSplit;
  {
    const int chunks = hidden / 8, per_part = (chunks + kGateRouteSplit - 1) / kGateRouteSplit;
    const int begin = min(chunks, part * per_part), end = min(chunks, begin + per_part);
    const float acc = e < p.E ? gate_dot(x + int64_t(t) * hidden, gate + int64_t(e) * hidden, begin, end) : 0.0f;
    if (lane == 0) partial[warp] = acc;
  }
  __syncthreads();
  if (int(threadIdx.x) < kGateRouteExperts) {
    const int ex = int(blockIdx.y) * kGateRouteExperts + int(threadIdx.x);
    if (ex < p.E) {
      float sum = 0;
      for (int k = 0; k < kGateRouteSplit; ++k) sum += partial[int(threadIdx.x) * kGateRouteSplit + k];
      logits[int64_t(t) * p.E + ex] = sum;
    }
    __threadfence();  // this block's logits visible to every block before it is counted
  }
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(blocks_done, 1u) == gridDim.x * gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) *blocks_done = 0;  // (the next step's count starts from zero)
  float* staged = smem;
  for (int i = int(threadIdx.x); i < p.tokens * p.E; i += kScanThreads)
    staged[i] = __ldcg(logits + i);  // (L2: not a stale L1 line)
  __syncthreads();
  RouterParams from_smem = p;
  from_smem.logits = staged;
  if (warp < p.tokens) route_token(from_smem, warp, staged + p.tokens * p.E + warp * 2 * p.E);
  __syncthreads();  // (also makes the warps' global writes visible to the whole block)
  scan_scatter(a);
}

// out[t] (+)= sum over k of weight[t][k] * y[slot[t][k]] (+ add[t]): the weighted un-permute, onto the shared
// experts' output. A slot < 0 is a choice made elsewhere (in `add`, the CPU's per-token sum). Blocks take (token,
// 1024 columns): a decode step's few tokens still spread over many SMs. The slots and weights are loaded first,
// then every chosen row at once (walked k by k, each load waited out its own latency).
constexpr int kCombineColumns = 1024, kCombineMaxTopk = 16;
__device__ inline float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ inline float4 load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x)),
               b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
// Token t's chosen rows (slot < 0: none) and their weights, up to kCombineMaxTopk, the rest -1 and 0.
__device__ __forceinline__ void load_choices(const int32_t* __restrict__ slot, const float* __restrict__ weights, int t,
                                             int topk, int (&rows)[kCombineMaxTopk], float (&w)[kCombineMaxTopk]) {
#pragma unroll
  for (int k = 0; k < kCombineMaxTopk; ++k) {
    rows[k] = k < topk ? slot[t * topk + k] : -1;
    w[k] = rows[k] >= 0 ? weights[t * topk + k] : 0.0f;
  }
}
// acc += sum over k of w[k] * y[rows[k]][j .. j + 4), every chosen row loaded before the first add (walked k by k,
// each load waited out its own latency).
template <class Row>
__device__ __forceinline__ void add_chosen_rows(const Row* __restrict__ y, const int (&rows)[kCombineMaxTopk],
                                                const float (&w)[kCombineMaxTopk], int hidden, int j, float4& acc) {
  float4 v[kCombineMaxTopk];
#pragma unroll
  for (int k = 0; k < kCombineMaxTopk; ++k)
    v[k] = rows[k] >= 0 ? load4(y + int64_t(rows[k]) * hidden + j) : make_float4(0, 0, 0, 0);
#pragma unroll
  for (int k = 0; k < kCombineMaxTopk; ++k)
    acc.x += w[k] * v[k].x, acc.y += w[k] * v[k].y, acc.z += w[k] * v[k].z, acc.w += w[k] * v[k].w;
}
template <class Row>  // (the rows' type: fp32, or bf16 where the op writes them so)
__global__ void combine_kernel(const Row* __restrict__ y, const int32_t* __restrict__ slot,
                               const float* __restrict__ weights, int topk, int hidden, bool accumulate,
                               const float* __restrict__ add, float* __restrict__ out) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  const int t = blockIdx.x, j = int(blockIdx.y) * kCombineColumns + int(threadIdx.x) * 4;
  if (j >= hidden) return;
  int rows[kCombineMaxTopk];
  float w[kCombineMaxTopk];
  load_choices(slot, weights, t, topk, rows, w);
  float4 acc = accumulate ? *reinterpret_cast<const float4*>(out + int64_t(t) * hidden + j) : make_float4(0, 0, 0, 0);
  if (add) {
    const float4 a = *reinterpret_cast<const float4*>(add + int64_t(t) * hidden + j);
    acc.x += a.x, acc.y += a.y, acc.z += a.z, acc.w += a.w;
  }
  add_chosen_rows(y, rows, w, hidden, j, acc);
  *reinterpret_cast<float4*>(out + int64_t(t) * hidden + j) = acc;
}

// The combine with the residual stream's next step fused in (MoeBuffers::resid): one block per token, a thread per
// four columns (up to four passes of 512 threads: 1024 threads capped ptxas at 64 registers and it spilled), each
// thread's sums held in registers while the block reduces their squares: resid[t] += sum over k of weight[t][k] *
// y[slot[t][k]] (+ out[t], the shared experts') (+ add[t]); then, with a weight, xb[t] = bf16(RMSNorm(resid[t]) *
// weight). Every pass's loads are issued before the first store.
constexpr int kFusedCombineThreads = 512, kFusedCombinePasses = 4;
constexpr int kFusedCombineMaxHidden = kFusedCombinePasses * 4 * kFusedCombineThreads;  // 8192
template <class Row>
__global__ void __launch_bounds__(kFusedCombineThreads)
    combine_add_norm_kernel(const Row* __restrict__ y, const int32_t* __restrict__ slot,
                            const float* __restrict__ weights, int topk, int hidden, bool accumulate,
                            const float* __restrict__ add, const float* __restrict__ out, float* __restrict__ resid,
                            const __nv_bfloat16* __restrict__ norm_weight, float eps,
                            __nv_bfloat16* __restrict__ norm_out) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  const int t = blockIdx.x, stride = int(blockDim.x) * 4;
  int rows[kCombineMaxTopk];
  float w[kCombineMaxTopk];
  load_choices(slot, weights, t, topk, rows, w);
  float4 v[kFusedCombinePasses];
  float ss = 0;
#pragma unroll
  for (int pass = 0; pass < kFusedCombinePasses; ++pass) {
    const int j = pass * stride + int(threadIdx.x) * 4;
    v[pass] = make_float4(0, 0, 0, 0);
    if (j >= hidden) continue;
    const int64_t at = int64_t(t) * hidden + j;
    float4 acc = *reinterpret_cast<const float4*>(resid + at);
    const float4 o = accumulate ? *reinterpret_cast<const float4*>(out + at) : make_float4(0, 0, 0, 0);
    const float4 a = add ? *reinterpret_cast<const float4*>(add + at) : make_float4(0, 0, 0, 0);
    acc.x += o.x + a.x, acc.y += o.y + a.y, acc.z += o.z + a.z, acc.w += o.w + a.w;
    add_chosen_rows(y, rows, w, hidden, j, acc);
    v[pass] = acc;
    ss += acc.x * acc.x + acc.y * acc.y + acc.z * acc.z + acc.w * acc.w;
  }
#pragma unroll
  for (int pass = 0; pass < kFusedCombinePasses; ++pass) {
    const int j = pass * stride + int(threadIdx.x) * 4;
    if (j < hidden) *reinterpret_cast<float4*>(resid + int64_t(t) * hidden + j) = v[pass];
  }
  if (!norm_weight) return;
  __shared__ float partial[kFusedCombineThreads / 32];
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0;
  for (int i = 0; i < int(blockDim.x) / 32; ++i) total += partial[i];
  const float inv = rsqrtf(total / float(hidden) + eps);
#pragma unroll
  for (int pass = 0; pass < kFusedCombinePasses; ++pass) {
    const int j = pass * stride + int(threadIdx.x) * 4;
    if (j >= hidden) continue;
    const float4 nw = load4(norm_weight + j);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[pass].x * inv * nw.x, v[pass].y * inv * nw.y),
                         hi = __floats2bfloat162_rn(v[pass].z * inv * nw.z, v[pass].w * inv * nw.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(norm_out + int64_t(t) * hidden + j) = packed;
  }
}
// Its block: a thread per four columns, whole warps, at most kFusedCombineThreads (then a pass more per 2048 columns).
inline unsigned fused_combine_threads(int64_t hidden) {
  const int64_t quads = (hidden + 3) / 4, passes = (quads + kFusedCombineThreads - 1) / kFusedCombineThreads;
  return unsigned(((quads + passes - 1) / passes + 31) / 32 * 32);
}

__global__ void silu_mul_kernel(const float* gate_up, int64_t rows, int64_t inter, __nv_bfloat16* h) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * inter;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, j = i % inter;
    const float g = gate_up[r * 2 * inter + j], u = gate_up[r * 2 * inter + inter + j];
    h[i] = __float2bfloat16_rn(silu(g) * u);
  }
}

}  // namespace

void silu_mul(const float* gate_up, int64_t rows, int64_t inter, __nv_bfloat16* h, cudaStream_t stream) {
  if (rows * inter == 0) return;
  launch_pdl(silu_mul_kernel, dim3(unsigned(std::min<int64_t>((rows * inter + 255) / 256, 132 * 16))), dim3(256), 0,
             stream, gate_up, rows, inter, h);
  DSLAB_CHECK_LAUNCH();
}

// ---- the op ------------------------------------------------------------------------------------------------

// The rule (where nothing is measured: DSLAB_TUNE=off, ops without tile_kernels(); see choose_tile_rows). A tile
// should hold all of an expert's rows while they are few, so its weights stream once: 16-row tiles up to a mean of 4
// rows (the busiest expert then still fits), 64 up to 40, else 128 (compute-bound: fewer B reloads).
int tile_rows_for(double rows_per_expert) { return rows_per_expert <= 4 ? 16 : rows_per_expert <= 40 ? 64 : 128; }

std::pair<int, int> parse_moe_tile(const std::string& text) {
  if (text == "auto") return {0, 64};
  if (text == "gemv") return {kGemvTileRows, 64};
  if (text == "16x32" || text == "16x64" || text == "16x128") return {16, std::stoi(text.substr(3))};
  if (text == "64" || text == "128") return {std::stoi(text), 64};
  throw BadInput("axis moe_tile: '" + text + "' is not a tile (expected auto, 16x32, 16x64, 16x128, gemv, 64 or 128)");
}

double MoeOp::scratch_bytes(const ModelConfig& m, int64_t tokens, int64_t experts) {
  return moe::gpu_moe_scratch_bytes(m, tokens, experts);
}

MoeOp::SideStream::SideStream(BlasHandle* side_blas) : blas(side_blas) {
  DSLAB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DSLAB_CUDA(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
  DSLAB_CUDA(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
}

MoeOp::SideStream::~SideStream() {
  cudaEventDestroy(forked);
  cudaEventDestroy(joined);
  cudaStreamDestroy(stream);
}

void MoeOp::prepare(const ModelConfig& m, int64_t tokens, const MoeWeights& w, const MoeBuffers& b, BlasHandle& blas,
                    BlasHandle* side_blas, gpu::ScratchArena* arena) {
  if (m.n_routed_experts > kScanThreads)
    throw BadInput(m.source + ": n_routed_experts above " + std::to_string(kScanThreads) +
                   " is not supported on the GPU");
  if (m.n_group > 32) throw BadInput(m.source + ": n_group above 32 is not supported by the GPU router");
  if (m.hidden_size % 8 || m.moe_intermediate_size % 8)
    throw BadInput(m.source + ": hidden_size and moe_intermediate_size must be multiples of 8 for the GPU MoE");
  m_ = m;
  tokens_ = tokens;
  experts_ = w.experts;
  topk_ = m.num_experts_per_tok;
  if (topk_ > kCombineMaxTopk)
    throw BadInput(m.source + ": num_experts_per_tok: " + std::to_string(topk_) + ": the GPU MoE combines up to " +
                   std::to_string(kCombineMaxTopk) + " experts per token");
  hidden_ = m.hidden_size;
  if (b.resid && hidden_ > kFusedCombineMaxHidden)
    throw BadInput(m.source + ": hidden_size " + std::to_string(hidden_) +
                   ": the combine with the next norm fused in takes up to " + std::to_string(kFusedCombineMaxHidden) +
                   " (fused_norms off)");
  inter_ = m.moe_intermediate_size;
  rows_ = tokens_ * topk_;
  w_ = &w;
  b_ = b;
  blas_ = &blas;
  arena_ = arena;
  logits_.resize(size_t(tokens_ * m.n_routed_experts));
  topk_ids_.resize(size_t(rows_));
  topk_weights_.resize(size_t(rows_));
  counts_.resize(size_t(experts_));
  counts_.zero();  // (then the scan leaves them zero after each step)
  gate_blocks_done_.resize(1);
  gate_blocks_done_.zero();  // (then gate_route_scan_kernel's last block leaves it zero)
  offsets_.resize(size_t(experts_ + 1));
  perm_token_.scratch(arena_, size_t(rows_));
  slot_.resize(size_t(rows_));
  num_tiles_.resize(1);
  if (bf16_rows())
    y16_.scratch(arena_, size_t(rows_ * hidden_));
  else
    y_.scratch(arena_, size_t(rows_ * hidden_));
  if (w.shared.intermediate > 0) shared_.prepare(m, w.shared, tokens, arena_);
  side_.reset();
  if (side_blas && w.shared.intermediate > 0) side_ = std::make_unique<SideStream>(side_blas);
  combined_by_experts_ = false;
  combine_slot_ = nullptr;
  experts_sum_ = nullptr;
  set_tile_rows(tile_rows_for(double(rows_) / double(experts_)));  // (what prepare_experts may size its tiles by)
  prepare_experts();
  choose_tile_rows();
  choose_router();
  DSLAB_CUDA(cudaDeviceSynchronize());
}

void MoeOp::set_tile_rows(int rows) {
  tile_rows_ = rows;
  max_tiles_ = int(rows_ / tile_rows_ + std::min(experts_, rows_));
  tiles_.resize(size_t(max_tiles_));
}

// Family "moe_tile_rows", key "tokens T experts E topk K hidden H inter I <kernels>". The measurement routes the op's
// tokens (random inputs, not the run's, which may not be written yet) to `topk` distinct experts each, uniformly (the
// balance a trained router's auxiliary loss aims for), and times the routing's scan and both grouped GEMMs at each
// tile size from a flushed L2, best of three runs after a warm-up. Outside prepare() nothing is measured, so a
// graph capture never sees it.
void MoeOp::choose_tile_rows() {
  // A tile: its rows, and at 16 rows its width (B rows a CTA; the others have one width each).
  struct Tile {
    int rows, width;
    bool operator==(const Tile& o) const { return rows == o.rows && (rows != 16 || width == o.width); }
  };
  const Tile rule{tile_rows_for(double(rows_) / double(experts_)), 64};
  const auto use = [&](Tile t) {
    set_tile_rows(t.rows);
    tile_width_ = t.rows == 16 ? t.width : 64;
  };
  const char* kernels = tile_kernels();
  if (!kernels) {  // (prepare() set the rule's rows already)
    tile_width_ = 64;
    return;
  }
  if (forced_tile_rows_ > 0) return use({forced_tile_rows_, forced_tile_width_});
  int device = 0;
  DSLAB_CUDA(cudaGetDevice(&device));
  const std::string key = "tokens " + std::to_string(tokens_) + " experts " + std::to_string(experts_) + " topk " +
                          std::to_string(topk_) + " hidden " + std::to_string(hidden_) + " inter " +
                          std::to_string(inter_) + " " + kernels;
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, Tile> chosen;  // this process's choices, by device and key
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = chosen.find({device, key}); it != chosen.end()) return use(it->second);
  static constexpr Tile kCandidates[] = {{kGemvTileRows, 64}, {16, 32}, {16, 64}, {16, 128}, {64, 64}, {128, 64}};
  const auto json_of = [](Tile t) {
    nlohmann::json j{{"tile_rows", t.rows}};
    if (t.rows == 16) j["tile_width"] = t.width;
    return j;
  };
  TuningCache& cache = TuningCache::instance();
  // One token (each chosen expert one row): the GEMV form, unmeasured. Timed alone (route and experts from a flushed
  // L2, below) it is within a few percent of the MMA tiles on V2-Lite's experts (55.8 against 54.5 us, H200) and 13%
  // faster on V3's (214 against 247 us), but inside the decode step, where its down GEMV's weights stream under the
  // gate+up's tail, the whole V2-Lite step at batch 1 took 2.38 / 2.46 ms against 2.58 / 2.58 with 16 x 64 tiles
  // (two interleaved runs, graph, H200): the standalone timing would pick the slower one for the step.
  if (tokens_ == 1) {
    const Tile gemv{kGemvTileRows, 64};
    cache.use_default("moe_tile_rows", key, json_of(gemv));
    chosen[{device, key}] = gemv;
    return use(gemv);
  }
  // (an entry of 16-row tiles without a width predates the width's measurement: measured again)
  if (const auto v = cache.lookup("moe_tile_rows", key);
      v && v->is_object() && v->contains("tile_rows") && (v->at("tile_rows") != 16 || v->contains("tile_width"))) {
    const Tile t{v->at("tile_rows").get<int>(), v->value("tile_width", 64)};
    if (std::find(std::begin(kCandidates), std::end(kCandidates), t) != std::end(kCandidates)) {
      use(t);
      chosen[{device, key}] = t;
      return;
    }
  }
  if (cache.mode() == TuningCache::Mode::off || topk_ > experts_) {
    cache.use_default("moe_tile_rows", key, json_of(rule));
    chosen[{device, key}] = rule;
    return use(rule);
  }
  // Uniform routing: each token's experts are the first `topk` of a seeded shuffle of all of them.
  std::vector<int32_t> ids(static_cast<size_t>(rows_)), order(static_cast<size_t>(experts_));
  for (int64_t t = 0; t < tokens_; ++t) {
    for (int64_t e = 0; e < experts_; ++e) order[size_t(e)] = int32_t(e);
    for (int64_t k = 0; k < topk_; ++k) {
      const int64_t pick = k + int64_t(splitmix64(uint64_t(t * experts_ + k)) % uint64_t(experts_ - k));
      std::swap(order[size_t(k)], order[size_t(pick)]);
      ids[size_t(t * topk_ + k)] = order[size_t(k)];
    }
  }
  DeviceArray<int32_t> given_ids(ids.size());
  given_ids.upload(ids);
  DeviceArray<__nv_bfloat16> x(size_t(tokens_ * hidden_));
  fill_random_bf16(x.get(), x.size(), 1, "moe.tile_tuning_inputs", std::sqrt(3.0f));  // uniform, unit variance
  const MoeBuffers run = b_;
  b_.x = x.get();
  b_.topk_ids = given_ids.get();
  stream_ = 0;
  marks_ = nullptr;
  Tile best = rule;
  double best_us = 0, rule_us = 0;
  for (const Tile t : kCandidates) {
    use(t);
    const double us = 1e6 * gpu::fastest_seconds([&] {
                        route();
                        experts();
                      });
    if (t == rule) rule_us = us;
    if (best_us == 0 || us < best_us) best = t, best_us = us;
  }
  b_ = run;
  DSLAB_CUDA(cudaDeviceSynchronize());
  use(best);
  chosen[{device, key}] = best;
  nlohmann::json record = json_of(best);
  record["us"] = best_us, record["rule"] = rule.rows, record["rule_us"] = rule_us;
  cache.record("moe_tile_rows", key, record);
}

size_t MoeOp::router_smem_per_token() const { return 2 * size_t(m_.n_routed_experts) * 4; }

size_t MoeOp::gate_route_smem() const {
  return size_t(tokens_) * (router_smem_per_token() + size_t(m_.n_routed_experts) * 4);
}

bool MoeOp::one_kernel_router_fits() const {
  return tokens_ <= kFusedRouteTokens && gate_route_smem() <= kMaxRouterSmem;
}

// Family "moe_router", key "tokens T experts E topk K groups G hidden H": whether the one-kernel router is faster
// than the gate kernel (up to kGateKernelTokens tokens) or GEMM followed by the routing kernel. Measured in prepare()
// on random tokens (the run's may not be written yet) through the op's own gate, each path from a flushed L2, best of
// three runs after a warm-up. Only where the one kernel can run (a warp a token, its scratch in shared memory).
void MoeOp::choose_router() {
  const bool rule = tokens_ <= kGateKernelTokens;
  one_kernel_router_ = rule && one_kernel_router_fits();
  if (router_kernels_ == RouterKernels::one_kernel && !b_.topk_ids && !one_kernel_router_fits())
    throw BadInput("axis router: one_kernel routes up to " + std::to_string(kFusedRouteTokens) +
                   " tokens with their scratch in 32 KB of shared memory, not " + std::to_string(tokens_) + " of " +
                   std::to_string(m_.n_routed_experts) + " experts");
  if (router_kernels_ != RouterKernels::automatic) {
    one_kernel_router_ = router_kernels_ == RouterKernels::one_kernel;
    return;
  }
  if (b_.topk_ids || !one_kernel_router_fits()) return;  // (given routing, or no choice to make)
  int device = 0;
  DSLAB_CUDA(cudaGetDevice(&device));
  const std::string key = "tokens " + std::to_string(tokens_) + " experts " + std::to_string(m_.n_routed_experts) +
                          " topk " + std::to_string(topk_) + " groups " + std::to_string(m_.n_group) + " hidden " +
                          std::to_string(hidden_);
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, bool> chosen;  // this process's choices, by device and key
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = chosen.find({device, key}); it != chosen.end()) {
    one_kernel_router_ = it->second;
    return;
  }
  TuningCache& cache = TuningCache::instance();
  if (const auto v = cache.lookup("moe_router", key); v && v->is_object() && v->contains("one_kernel")) {
    one_kernel_router_ = chosen[{device, key}] = v->at("one_kernel").get<bool>();
    return;
  }
  if (cache.mode() == TuningCache::Mode::off) {
    cache.use_default("moe_router", key, nlohmann::json{{"one_kernel", rule}});
    chosen[{device, key}] = rule;
    return;
  }
  DeviceArray<__nv_bfloat16> x(size_t(tokens_ * hidden_));
  fill_random_bf16(x.get(), x.size(), 1, "moe.router_tuning_inputs", std::sqrt(3.0f));  // uniform, unit variance
  const __nv_bfloat16* run_x = b_.x;
  b_.x = x.get();
  stream_ = 0;
  marks_ = nullptr;
  blas_->set_stream(0);
  double us[2] = {0, 0};  // [separate, one kernel]
  for (const bool one : {false, true}) {
    one_kernel_router_ = one;
    us[one] = 1e6 * gpu::fastest_seconds([&] { route(); });
  }
  b_.x = run_x;
  DSLAB_CUDA(cudaDeviceSynchronize());
  one_kernel_router_ = chosen[{device, key}] = us[1] <= us[0];
  cache.record(
      "moe_router", key,
      nlohmann::json{
          {"one_kernel", one_kernel_router_}, {"us", us[one_kernel_router_]}, {"rule", rule}, {"rule_us", us[rule]}});
}

void MoeOp::route() {
  gpu::NvtxRange range("moe.route");
  const int32_t* ids = b_.topk_ids ? b_.topk_ids : topk_ids_.get();  // given, or the router's
  const ScanArgs a{counts_.get(),    int(experts_),     tile_rows_,     ids,
                   int(rows_),       int(topk_),        offsets_.get(), tiles_.get(),
                   num_tiles_.get(), perm_token_.get(), slot_.get()};
  if (b_.topk_ids) {
    launch_pdl(count_kernel, dim3(unsigned((rows_ + 255) / 256)), dim3(256), 0, stream_, b_.topk_ids, int(rows_),
               counts_.get());
    DSLAB_CHECK_LAUNCH();
  } else {
    const size_t per_warp = router_smem_per_token();
    if (one_kernel_router_) {
      RouterParams p{nullptr,
                     w_->bias.get(),
                     int(tokens_),
                     int(m_.n_routed_experts),
                     int(topk_),
                     int(m_.n_group),
                     int(m_.topk_group),
                     m_.scoring_func == "sigmoid",
                     m_.topk_method != "greedy",
                     m_.topk_method == "noaux_tc",
                     m_.norm_topk_prob,
                     float(m_.routed_scaling_factor),
                     topk_ids_.get(),
                     topk_weights_.get(),
                     counts_.get()};
      launch_pdl(gate_route_scan_kernel,
                 dim3(unsigned(tokens_), unsigned((m_.n_routed_experts + kGateRouteExperts - 1) / kGateRouteExperts)),
                 dim3(kScanThreads), gate_route_smem(), stream_, b_.x, w_->gate.get(), int(hidden_), logits_.get(),
                 gate_blocks_done_.get(), p, a);
      DSLAB_CHECK_LAUNCH();
      mark("route");
      return;
    }
    if (tokens_ <= kGateKernelTokens) {
      launch_pdl(gate_logits_kernel, dim3(unsigned(tokens_), unsigned((m_.n_routed_experts + 7) / 8)),
                 dim3(kGateThreads), 0, stream_, b_.x, w_->gate.get(), int(hidden_), int(m_.n_routed_experts),
                 logits_.get());
      DSLAB_CHECK_LAUNCH();
    } else {
      linear(*blas_, b_.x, tokens_, hidden_, w_->gate.get(), m_.n_routed_experts, logits_.get(), CUDA_R_32F);
    }
    mark("gate");
    RouterParams p{logits_.get(),
                   w_->bias.get(),
                   int(tokens_),
                   int(m_.n_routed_experts),
                   int(topk_),
                   int(m_.n_group),
                   int(m_.topk_group),
                   m_.scoring_func == "sigmoid",
                   m_.topk_method != "greedy",
                   m_.topk_method == "noaux_tc",
                   m_.norm_topk_prob,
                   float(m_.routed_scaling_factor),
                   topk_ids_.get(),
                   topk_weights_.get(),
                   counts_.get()};
    if (tokens_ <= kFusedRouteTokens && size_t(tokens_) * per_warp <= kMaxRouterSmem) {
      launch_pdl(route_scan_scatter_kernel, dim3(1), dim3(kScanThreads), size_t(tokens_) * per_warp, stream_, p, a);
      DSLAB_CHECK_LAUNCH();
      mark("route");
      return;
    }
    launch_pdl(router_kernel, dim3(unsigned((tokens_ + kRouterWarps - 1) / kRouterWarps)), dim3(32 * kRouterWarps),
               kRouterWarps * per_warp, stream_, p);
    DSLAB_CHECK_LAUNCH();
  }
  launch_pdl(scan_scatter_kernel, dim3(1), dim3(kScanThreads), 0, stream_, a);
  DSLAB_CHECK_LAUNCH();
  mark("route");
}

void MoeOp::forward(cudaStream_t stream, gpu::OpMarks* marks) {
  stream_ = stream;
  marks_ = marks;
  const bool shared = w_->shared.intermediate > 0;
  if (shared && side_) {  // the shared experts need nothing of the routing: run them beside it, on their own stream
    DSLAB_CUDA(cudaEventRecord(side_->forked, stream));
    DSLAB_CUDA(cudaStreamWaitEvent(side_->stream, side_->forked, 0));
    side_->blas->set_stream(side_->stream);
    // They are launched without programmatic dependent launch (pdl.cuh): launched with it (the first of them right
    // behind the fork's event wait), the layer's step faulted with an illegal address in 7 of 32 runs at 2 tokens with
    // the experts' GEMV form, none of 25 launched plainly, and the batch-1 step was 4% longer (moe-gpu.md).
    const ProgrammaticLaunchScope plain(false);
    shared_.forward(*side_->blas, b_.x, b_.out, 0.0f, side_->stream);
  }
  blas_->set_stream(stream);
  route();
  {
    gpu::NvtxRange range("moe.experts");
    experts();
    mark("experts");
  }
  gpu::NvtxRange range("moe.shared_combine");
  if (shared && !side_) {  // (blas_ is on `stream` since route())
    shared_.forward(*blas_, b_.x, b_.out, 0.0f, stream);
    mark("shared_experts");
  }
  if (shared && side_) {  // the shared experts ran beside the routed ones: join them
    DSLAB_CUDA(cudaEventRecord(side_->joined, side_->stream));
    DSLAB_CUDA(cudaStreamWaitEvent(stream, side_->joined, 0));
    mark("shared_experts_join");
  }
  const dim3 grid(unsigned(tokens_), unsigned((hidden_ + kCombineColumns - 1) / kCombineColumns)),
      block(kCombineColumns / 4);
  const int32_t* slot = combine_slot_ ? combine_slot_ : slot_.get();
  const float* weights = b_.topk_weights ? b_.topk_weights : topk_weights_.get();
  const int topk = combined_by_experts_ ? 0 : int(topk_);
  if (b_.resid) {  // the residual add and the next norm in the combine (MoeBuffers::resid)
    const dim3 fused_block(fused_combine_threads(hidden_));
    if (bf16_rows())
      launch_pdl(combine_add_norm_kernel<__nv_bfloat16>, dim3(unsigned(tokens_)), fused_block, 0, stream_,
                 static_cast<const __nv_bfloat16*>(y16_.get()), slot, weights, topk, int(hidden_), shared, experts_sum_,
                 b_.out, b_.resid, b_.norm_weight, b_.norm_eps, b_.norm_out);
    else
      launch_pdl(combine_add_norm_kernel<float>, dim3(unsigned(tokens_)), fused_block, 0, stream_,
                 static_cast<const float*>(y_.get()), slot, weights, topk, int(hidden_), shared, experts_sum_, b_.out,
                 b_.resid, b_.norm_weight, b_.norm_eps, b_.norm_out);
    DSLAB_CHECK_LAUNCH();
    mark("moe_combine");
    marks_ = nullptr;
    return;
  }
  if (bf16_rows())
    launch_pdl(combine_kernel<__nv_bfloat16>, grid, block, 0, stream_, static_cast<const __nv_bfloat16*>(y16_.get()),
               slot, weights, topk, int(hidden_), shared, experts_sum_, b_.out);
  else
    launch_pdl(combine_kernel<float>, grid, block, 0, stream_, static_cast<const float*>(y_.get()), slot, weights, topk,
               int(hidden_), shared, experts_sum_, b_.out);
  DSLAB_CHECK_LAUNCH();
  mark("moe_combine");  // (not "combine": in a layer's breakdown that is the attention's split merge)
  marks_ = nullptr;
}

std::vector<int64_t> MoeOp::profiled_counts(int64_t tokens, uint64_t seed) {
  const int64_t E = m_.n_routed_experts;
  DeviceArray<__nv_bfloat16> x(size_t(tokens * hidden_));
  fill_random_bf16(x.get(), x.size(), seed, "moe.profile_inputs", std::sqrt(3.0f));  // uniform, unit variance
  DeviceArray<float> logits(size_t(tokens * E)), weights(size_t(tokens * topk_));
  DeviceArray<int32_t> ids{size_t(tokens * topk_)}, counts{size_t(E)};
  counts.zero();
  blas_->set_stream(0);
  linear(*blas_, x.get(), tokens, hidden_, w_->gate.get(), E, logits.get(), CUDA_R_32F);
  const RouterParams p{logits.get(),
                       w_->bias.get(),
                       int(tokens),
                       int(E),
                       int(topk_),
                       int(m_.n_group),
                       int(m_.topk_group),
                       m_.scoring_func == "sigmoid",
                       m_.topk_method != "greedy",
                       m_.topk_method == "noaux_tc",
                       m_.norm_topk_prob,
                       float(m_.routed_scaling_factor),
                       ids.get(),
                       weights.get(),
                       counts.get()};
  launch_pdl(router_kernel, dim3(unsigned((tokens + kRouterWarps - 1) / kRouterWarps)), dim3(32 * kRouterWarps),
             kRouterWarps * 2 * size_t(E) * 4, cudaStream_t(0), p);
  DSLAB_CHECK_LAUNCH();
  std::vector<int32_t> host(static_cast<size_t>(E));
  DSLAB_CUDA(cudaMemcpy(host.data(), counts.get(), size_t(E) * 4, cudaMemcpyDeviceToHost));
  return std::vector<int64_t>(host.begin(), host.end());
}

void MoeOp::routing(std::vector<int32_t>* ids, std::vector<float>* weights) const {
  DSLAB_CUDA(cudaDeviceSynchronize());
  // (every verification passes here: gate_route_scan_kernel's last block must have left its counter at zero, or the
  // next step's routing would never run and keep this one's - invisible to a check that replays the same inputs)
  unsigned pending = 0;
  if (gate_blocks_done_.get())
    DSLAB_CUDA(cudaMemcpy(&pending, gate_blocks_done_.get(), sizeof(pending), cudaMemcpyDeviceToHost));
  if (pending != 0)
    throw std::logic_error("MoE router: " + std::to_string(pending) + " blocks left counted after a step (expected 0)");
  ids->resize(size_t(rows_));
  weights->resize(size_t(rows_));
  DSLAB_CUDA(
      cudaMemcpy(ids->data(), b_.topk_ids ? b_.topk_ids : topk_ids_.get(), size_t(rows_) * 4, cudaMemcpyDeviceToHost));
  DSLAB_CUDA(cudaMemcpy(weights->data(), b_.topk_weights ? b_.topk_weights : topk_weights_.get(), size_t(rows_) * 4,
                        cudaMemcpyDeviceToHost));
}

// ---- the registry ----------------------------------------------------------------------------------------

bool register_moe_op(const char* name, const char* summary, MoeOpFactory make) {
  return register_op_and_variant<MoeOp, GpuMoeVariant>(name, summary, make);
}

std::unique_ptr<MoeOp> make_moe_op(const std::string& name) { return OpRegistry<MoeOp>::instance().make(name); }
std::vector<std::string> moe_op_names() { return OpRegistry<MoeOp>::instance().names(); }

// ---- cost ------------------------------------------------------------------------------------------------

Cost moe_layer_cost(const ModelConfig& m, int64_t tokens, double active_experts) {
  const double T = double(tokens), H = double(m.hidden_size), I = double(m.moe_intermediate_size),
               E = double(m.n_routed_experts);
  const double K = double(m.num_experts_per_tok), Is = I * double(m.n_shared_experts);
  Cost c;
  c.flops = 2 * T * E * H + T * K * 6 * H * I + T * 6 * H * Is;
  c.bytes = 2 * E * H + active_experts * 3 * H * I * 2 + 3 * H * Is * 2 + T * H * 2 + T * H * 4;
  return c;
}

}  // namespace dslab::moe::cuda
