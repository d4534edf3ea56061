// mla/fused/cuda: FlashMLA-style decode attention over the paged latent cache. All q heads (and the MTP
// token) of a request are rows of one MQA against the request's shared [c_kv ‖ k_pe] keys; the keys are split
// across SMs (split-KV, a balanced run of key blocks per CTA), each split runs an online softmax on the tensor
// cores, and a combine kernel merges the splits by their log-sum-exp. Two kernels over 64-row tiles (16 or 32 rows
// padded to 64): a bf16 cache with more than 32 rows a tile (128 heads) and whole 64-key blocks in a page takes
// two warpgroups that trade the scoring and multiplying of a pair of blocks (namespace seesaw, FlashMLA's Hopper
// structure); an int8 / fp8 cache at up to 32 rows from tensor copies (16 heads) a kernel with the products
// transposed, the keys along the MMA's rows and each block expanded once into the registers Q K^T reads (namespace
// narrow); every other case (16 heads bf16, 128 heads quantised, small pages, a token selector's keys) warpgroups
// with fixed roles that overlap the softmax with the products (namespace roles), int8 / fp8 blocks landing raw
// and dequantised to fp16 in shared memory by the warpgroup about to score them. The projections around it are
// the shared GPU ones (cuBLAS, or own GEMVs: the proj axis).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "harness/errors.h"
#include "harness/host.h"
#include "variants/common/pdl.cuh"
#include "variants/common/tensor_map.h"
#include "variants/common/tma.cuh"
#include "variants/common/wgmma.cuh"
#include "variants/mla/cuda/kernels.cuh"
#include "variants/mla/cuda/mla_cuda.h"

namespace dslab::mla::cuda {
namespace {

constexpr int kWidth = 576;                // latent 512 ‖ rope 64: every DeepSeek config
constexpr int kLatent = 512;
constexpr int kChunks = kWidth / 8;        // 16-byte chunks per key row
constexpr int kGroups = kWidth / kQuantGroup;

// ---- PTX wrappers --------------------------------------------------------------------------------------

// Q and K tiles in shared memory are in the layout Hopper's warpgroup MMA reads (variants/common/wgmma.cuh: swz,
// wgmma_desc): the 576 columns are 9 blocks of 64. The 8 rows an ldmatrix reads fall in 8 different bank groups, and
// a wgmma descriptor can address any 8-row x 64-column atom.

// The transposed-B wrapper below takes bf16 or (kHalf) fp16 operands: one asm body, the element type T its only
// difference. (Both operands K-major: wgmma_m64nNk16, variants/common/wgmma.cuh.)
#define DSLAB_WGMMA_M64N128K16_VT(T) \
  asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " " \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 1;\n}\n" \
      : "+f"(d[16 * H + 0][0]), "+f"(d[16 * H + 0][1]), "+f"(d[16 * H + 0][2]), "+f"(d[16 * H + 0][3]), "+f"(d[16 * H + 1][0]), "+f"(d[16 * H + 1][1]), "+f"(d[16 * H + 1][2]), "+f"(d[16 * H + 1][3]), "+f"(d[16 * H + 2][0]), "+f"(d[16 * H + 2][1]), "+f"(d[16 * H + 2][2]), "+f"(d[16 * H + 2][3]), "+f"(d[16 * H + 3][0]), "+f"(d[16 * H + 3][1]), "+f"(d[16 * H + 3][2]), "+f"(d[16 * H + 3][3]), "+f"(d[16 * H + 4][0]), "+f"(d[16 * H + 4][1]), "+f"(d[16 * H + 4][2]), "+f"(d[16 * H + 4][3]), "+f"(d[16 * H + 5][0]), "+f"(d[16 * H + 5][1]), "+f"(d[16 * H + 5][2]), "+f"(d[16 * H + 5][3]), "+f"(d[16 * H + 6][0]), "+f"(d[16 * H + 6][1]), "+f"(d[16 * H + 6][2]), "+f"(d[16 * H + 6][3]), "+f"(d[16 * H + 7][0]), "+f"(d[16 * H + 7][1]), "+f"(d[16 * H + 7][2]), "+f"(d[16 * H + 7][3]), "+f"(d[16 * H + 8][0]), "+f"(d[16 * H + 8][1]), "+f"(d[16 * H + 8][2]), "+f"(d[16 * H + 8][3]), "+f"(d[16 * H + 9][0]), "+f"(d[16 * H + 9][1]), "+f"(d[16 * H + 9][2]), "+f"(d[16 * H + 9][3]), "+f"(d[16 * H + 10][0]), "+f"(d[16 * H + 10][1]), "+f"(d[16 * H + 10][2]), "+f"(d[16 * H + 10][3]), "+f"(d[16 * H + 11][0]), "+f"(d[16 * H + 11][1]), "+f"(d[16 * H + 11][2]), "+f"(d[16 * H + 11][3]), "+f"(d[16 * H + 12][0]), "+f"(d[16 * H + 12][1]), "+f"(d[16 * H + 12][2]), "+f"(d[16 * H + 12][3]), "+f"(d[16 * H + 13][0]), "+f"(d[16 * H + 13][1]), "+f"(d[16 * H + 13][2]), "+f"(d[16 * H + 13][3]), "+f"(d[16 * H + 14][0]), "+f"(d[16 * H + 14][1]), "+f"(d[16 * H + 14][2]), "+f"(d[16 * H + 14][3]), "+f"(d[16 * H + 15][0]), "+f"(d[16 * H + 15][1]), "+f"(d[16 * H + 15][2]), "+f"(d[16 * H + 15][3]) \
      : "l"(a), "l"(b))

// O[64 x 128] (+)= P[64 x 16] · V[16 x 128] with V MN-major (transposed B), into d[16 H .. 16 H + 15]: a 64-register
// accumulator, which ptxas compiles in a kernel whose threads start with 128 registers (it refuses the 256-column
// form there, even where setmaxnreg has raised the count).
template <int H, bool kHalf>
__device__ inline void wgmma_m64n128k16_vt(float (&d)[32][4], uint64_t a, uint64_t b) {
  if constexpr (kHalf) DSLAB_WGMMA_M64N128K16_VT("f16");
  else DSLAB_WGMMA_M64N128K16_VT("bf16");
}
#undef DSLAB_WGMMA_M64N128K16_VT
// Pins registers an MMA is about to read or accumulate into: values computed before wgmma.fence must be there
// before it (the compiler otherwise sank O's rescale past the fence and ptxas inserted its own, serialising
// warpgroup.arrive: C7519 / C7520).
template <typename T, int N, int M>
__device__ __forceinline__ void pin(T (&r)[N][M]) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint32_t>, "accumulators or register operands");
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < M; ++j) {
      if constexpr (std::is_same_v<T, float>) asm volatile("" : "+f"(r[i][j])::"memory");
      else asm volatile("" : "+r"(r[i][j])::"memory");
    }
}

struct Params {
  CUtensorMap kv_map;      // the cache as a [slots][576] tensor, 64 x 64 boxes (when tma)
  CUtensorMap q_map;       // q as a [tokens x heads][576] tensor, 64 x 64 boxes (the two-warpgroup kernel's Q tiles)
  bool tma;                // page_size a multiple of 64: blocks copied by the tensor memory accelerator
  const __nv_bfloat16* q;  // [tokens][heads][576]: [q_nope·W_UK ‖ q_pe]
  CacheView cache;
  const int32_t* lengths;
  const int4* segments;       // request, first key, end key, 1 if the request's only segment: pieces of requests
  const int2* part_segments;  // per CTA column: first segment, count
  float* o_partial;           // [segments][rows][512], each normalised by its own sum
  float* lse_partial;         // [segments][rows], log2 domain
  int rows, heads, q_len;  // rows = q_len * heads
  float scale_log2;        // softmax scale * log2(e)
  int page_shift;          // log2(page_size) when it is a power of two, else -1
  int partial_rows;        // rows of o_partial / lse_partial per segment: row tiles x tile rows (a 64-row tile may pad)
  __nv_bfloat16* o_lat;    // a segment that is its request's only one (w = 1) is written here, final,
                           // instead of as a partial to merge
  unsigned long long* phases;  // null, or kPhaseSlots clocks per CTA (y-major): see Phase
  // The page table and lengths were written before the step (by the host), not by the kernel just before this one:
  // the first blocks' lookups and copies may start before griddepcontrol.wait (see decode_kernel).
  bool early_loads;
};

// Where a CTA's time goes (FusedCuda::phase_counters): the SM's clock64 at each phase, by one thread of the role that
// reaches it; the global timer at entry and exit (across SMs, and the clock's rate); the CTA's block count.
enum Phase : int {
  kTimerEntry, kTimerExit, kBlocks,
  kEntry,            // thread 0, before griddepcontrol.wait
  kWaited,           // thread 0 (accumulator 0), after it (the kernels before have finished; with early_loads, after
                     // the first copies are queued)
  kLoadsIssued,      // accumulator 0: its first two stages' page lookups and copies queued
  kQLanded,          // scorer 0: Q in shared memory (its first block)
  kFirstLanded,      // scorer 0: block 0's keys in its stage
  kFirstScored,      // scorer 0: block 0's Q K^T done
  kFirstMaxed,       // scorer 0: block 0's row maxima found (masked, reduced across the quad)
  kFirstHandedOver,  // scorer 0: block 0's P and factors handed to the accumulators
  kFirstAccumulated, // accumulator 0: block 0's P V done
  kLastAccumulated,  // accumulator 0: the last block's P V done
  kDone,             // accumulator 0: its outputs written, leaving
  // Where a CTA walks more than one segment (two-warpgroup kernel only): thread 0 at the end of the first segment's
  // last pair, when its outputs are written, when the second segment's Q has landed, and at the end of its first
  // pair - what a switch costs.
  kFirstSegmentAccumulated, kFirstSegmentWritten, kSecondQLanded, kSecondFirstAccumulated,
  // The narrow kernel: thread 0's clocks summed over the CTA's blocks, per part of a block's step - the partial
  // products summed and masked (sum); the barrier's OR through P^T's barrier (softmax); P V issued and the next
  // block's Q, landing and expansion (expand); its Q K^T issued and both products awaited, a segment's writes
  // (score); the tile and partial products stored and their barrier (publish).
  kSpentSumming, kSpentSoftmax, kSpentExpanding, kSpentScoring, kSpentPublishing,
  kPhaseSlots
};
__device__ __forceinline__ unsigned long long global_timer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void record(const Params& p, int phase, unsigned long long value) {
  if (p.phases) p.phases[(size_t(blockIdx.y) * gridDim.x + blockIdx.x) * kPhaseSlots + phase] = value;
}
__device__ __forceinline__ void record_clock(const Params& p, int phase) {
  if (p.phases) record(p, phase, (unsigned long long)clock64());
}

// The unit in which auto_kv_splits counts a step's keys (its blocks-per-CTA threshold). The split itself (split_kv)
// is in the kernel's own blocks (block_keys_for: 32 or 64 keys), so that a segment starts on a block boundary and a
// tensor copy's block lies in one page (page_size % block keys == 0).
constexpr int kBlockKeys = 64;

// Merge a request's segments: o = sum_i 2^(lse_i - max) o_i / sum_i 2^(lse_i - max). One block per (row, request):
// the weights first (every segment's lse loaded at once), then each warp sums every kCombineWarps-th segment's
// partial rows (16-byte loads, several segments in flight: at batch 1 one row merges 65 partials, and a serial walk
// waited out each load's latency in turn), and the warps' sums are added in shared memory.
constexpr int kCombineWarps = 4, kCombineThreads = 32 * kCombineWarps, kCombineMaxSegments = 1024;
__global__ void __launch_bounds__(kCombineThreads) merge_splits_kernel(const float* __restrict__ o_partial, const float* __restrict__ lse_partial,
                                                                  int partial_rows, const int2* __restrict__ request_segments, int rows,
                                                                  __nv_bfloat16* __restrict__ o_lat) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/pdl.cuh)
  pdl_launch_dependents();
  __shared__ float weight[kCombineMaxSegments];
  __shared__ float4 warp_sums[kCombineWarps][kLatent / 4];
  __shared__ float reduce[kCombineWarps];
  const int row = blockIdx.x, b = blockIdx.y, tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int2 range = request_segments[b];  // first segment, count (<= kCombineMaxSegments: checked by the host)
  if (range.y == 1) return;                // the decode kernel wrote it
  auto lse_of = [&](int i) { return lse_partial[int64_t(range.x + i) * partial_rows + row]; };
  auto block_reduce = [&](float v, bool max) {
    for (int o = 16; o; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, v, o);
      v = max ? fmaxf(v, other) : v + other;
    }
    if (lane == 0) reduce[warp] = v;
    __syncthreads();
    float r = reduce[0];
    for (int w = 1; w < kCombineWarps; ++w) r = max ? fmaxf(r, reduce[w]) : r + reduce[w];
    __syncthreads();
    return r;
  };
  float mx = -INFINITY;
  for (int i = tid; i < range.y; i += kCombineThreads) mx = fmaxf(mx, lse_of(i));
  mx = block_reduce(mx, true);
  float total = 0;
  for (int i = tid; i < range.y; i += kCombineThreads) {
    const float lse = lse_of(i), w = lse == -INFINITY ? 0.0f : exp2f(lse - mx);
    weight[i] = w;
    total += w;
  }
  total = block_reduce(total, false);  // (its barrier also publishes the weights)
  constexpr int kVectors = kLatent / 4 / 32;  // float4 columns per lane: lane + 32 c
  float4 acc[kVectors] = {};
#pragma unroll 4
  for (int i = warp; i < range.y; i += kCombineWarps) {
    const float w = weight[i];  // (0 for a segment that saw no key: the decode kernel wrote its partial as zeros)
    const float4* src = reinterpret_cast<const float4*>(o_partial + (int64_t(range.x + i) * partial_rows + row) * kLatent);
    float4 v[kVectors];
#pragma unroll
    for (int c = 0; c < kVectors; ++c) v[c] = src[lane + 32 * c];
#pragma unroll
    for (int c = 0; c < kVectors; ++c) acc[c].x += w * v[c].x, acc[c].y += w * v[c].y, acc[c].z += w * v[c].z, acc[c].w += w * v[c].w;
  }
#pragma unroll
  for (int c = 0; c < kVectors; ++c) warp_sums[warp][lane + 32 * c] = acc[c];
  __syncthreads();
  const float inv = 1.0f / total;
  __nv_bfloat16* dst = o_lat + (int64_t(b) * rows + row) * kLatent;
  for (int v = tid; v < kLatent / 4; v += kCombineThreads) {
    float4 sum = warp_sums[0][v];
    for (int w = 1; w < kCombineWarps; ++w) sum.x += warp_sums[w][v].x, sum.y += warp_sums[w][v].y, sum.z += warp_sums[w][v].z, sum.w += warp_sums[w][v].w;
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(dst + 4 * v);
    out[0] = __floats2bfloat162_rn(sum.x * inv, sum.y * inv);
    out[1] = __floats2bfloat162_rn(sum.z * inv, sum.w * inv);
  }
}

// ---- 64-row tiles on warpgroups with fixed roles -------------------------------------------------------------
// As in FlashMLA, the softmax overlaps the products (a kernel running both products and the softmax in lockstep
// idled the tensor cores during the softmax: 0.36-0.40 of the roofline at 128 heads). Two scorer warpgroups (2
// and 3) take alternate blocks of 64 or 32 keys (roles::Geometry): each computes S = Q K^T (wgmma m64n64k16 or
// m64n32k16) and the online softmax of its block, handing the running max on to the other (so block j + 1's
// Q K^T runs while block j's softmax does), and leaves P (bf16) and each row's rescale factor for the two
// accumulator warpgroups (0 and 1). Each of those holds half of O (64 x 256 fp32), runs O = alpha O + P V
// (wgmma m64n128k16, twice) and, once both products are done, refills the block's stage, each with its own columns
// (tensor-memory-accelerator boxes, or cp.async where pages are smaller than a block; an mbarrier per stage).
// P needs no buffer of its own: it overwrites the block's rope columns, which only Q K^T reads. Two stages of 64
// keys or four of 32 (block j in stage j % stages), Q and the stages fill the shared memory. A CTA walks its segments as one
// flat run of blocks, so the pipeline does not drain where a request ends. An int8 / fp8 block (half the bytes of
// a bf16 one, plus a scale per 64 values) lands in the upper half of its stage; its scorer expands it to fp16 in
// place before scoring it (dequantise_stage), so both products read a tile laid out as a bf16 cache's (fp16 values,
// Q and P fp16 with them).
// A request's Q rows row0 .. row0 + kRows - 1 into sq in the MMA layout (swz), rows past the last (fewer than
// kRows rows) as zeros: cp.async chunks first, first + kStride, ..., then until they have landed (this thread's).
template <int kRows, int kStride>
__device__ __forceinline__ void copy_q_tile(const Params& p, __nv_bfloat16* sq, int request, int row0, int first) {
  const __nv_bfloat16* q = p.q + (int64_t(request) * p.rows + row0) * kWidth;
  for (int c = first; c < kRows * kChunks; c += kStride) {
    const int row = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = row0 + row < p.rows;
    cp_async16(sq + swz(row, col, kRows), q + (valid ? int64_t(row) * kWidth + col : 0), valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

namespace roles {

// A stage holds a block of KEYS keys: 64 (two stages) or 32 (four stages). Each stage cycles through its copy, Q K^T,
// softmax and P V before its next copy can start, the copy's latency the longest link (the session 21 report): four
// 32-key stages release a stage half a block sooner (16 heads: -1 to -3% at batch 64-128, and the first block's
// softmax no longer waits behind the second block's Q K^T), but a 64 x 32 Q K^T reads all of Q for half the keys,
// and at 128 heads, where the tensor cores are busy, it made the kernel 20% slower (H100, session 21). So 32-key
// stages for a bf16 64-row tile of at most 32 real rows, 64-key stages otherwise (block_keys_for). cp.async copies take
// a block 4 threads a key, kHalfKeys keys a pass; tensor copies take it in KEYS-key boxes, one per 64-column block
// (where a page holds whole blocks).
constexpr int kRows = 64, kThreads = 512, kHalfKeys = 32;
// 512 threads start with 128 registers each; the scorers give up 40 so that each accumulator thread can hold its
// 128 floats of O. (setmaxnreg.inc takes only what a .dec in the same CTA gave back: counts adding up to more than
// the CTA launched with deadlock it - a 384-thread variant with Q in one scorer's registers did, session 22.)
constexpr int kScorerRegisters = 88, kAccumulatorRegisters = 168;
static_assert(2 * kScorerRegisters + 2 * kAccumulatorRegisters <= 4 * (65536 / kThreads), "what the CTA launched with");
constexpr int kReadyThreads = 384;  // one scorer arrives, both accumulators wait
constexpr float kLazyRescale = 8.0f;
constexpr size_t kQBytes = size_t(kRows) * kWidth * 2;
constexpr int kRopeBlock = kLatent / 64;  // the 64-column block of the rope columns, where P goes
static_assert(kRows == 64, "P (kRows x KEYS) takes the place of a rope block (KEYS x 64)");
static_assert(kGroups == kWidth / 64, "one scale per 64-column block");
// Named barriers (0 is __syncthreads): each scorer's own (+ 0 or 1); per stage "ready" (scorer -> accumulators:
// P and the rescale factors are there); per j % 2 "max" (scorer of block j -> scorer of block j + 1: the running
// max after block j is there); the two accumulators'; each accumulator's own (+ 0 or 1).
constexpr int kBarScorer = 1, kBarReady = 3;

template <int KEYS>
struct Geometry {
  static_assert(KEYS == 32 || KEYS == 64, "32- or 64-key blocks");
  static constexpr int kKeys = KEYS, kStages = 128 / KEYS, kPasses = KEYS / kHalfKeys;
  static constexpr size_t kStageBytes = size_t(KEYS) * kWidth * 2;
  // Per stage each row's rescale factor and 1 / sum; the scorers' hand-over (two running maxima and a row sum per
  // row); an mbarrier per stage.
  static constexpr size_t kMetaBytes = size_t(kStages) * 2 * kRows * 4 + size_t(3) * kRows * 4 + kStages * 8;
  static constexpr size_t kSmemBytes = kQBytes + kStages * kStageBytes + kMetaBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
  // A quantised block as it lands, in the top of its stage: raw block c (KEYS keys x 64 one-byte values of column
  // block c, [key][value]) at kRawOffset + c kRawBlockBytes, then the scales, [key][group] (group = column block).
  static constexpr int kRawBlockBytes = KEYS * 64, kScaleBytes = KEYS * kGroups * 4;
  static constexpr int kRawOffset = int(kStageBytes) - kGroups * kRawBlockBytes - kScaleBytes, kScalesOffset = int(kStageBytes) - kScaleBytes;
  static_assert(kRawOffset % 16 == 0 && kScalesOffset % 16 == 0, "bulk copies land 16-byte aligned");
  static constexpr int kBarMax = kBarReady + kStages, kBarAccumulators = kBarMax + 2, kBarCleared = kBarAccumulators + 1;
  static_assert(kBarCleared + 1 < 16, "16 named barriers");
};

// P [kRows][KEYS] bf16 (or fp16) as the P V product's K-major A operand: 64 keys, 128-byte rows in the 128-byte
// swizzle (as every tile here); 32 keys, 64-byte rows in the 64-byte swizzle (wgmma.cuh). Element offset of
// (row, col), and the descriptor.
template <int KEYS>
__device__ __forceinline__ int p_offset(int row, int col) {
  if constexpr (KEYS == 64) return swz(row, col, KEYS);
  else return swz64(row, col);
}
template <int KEYS>
__device__ __forceinline__ uint64_t p_desc_of(const void* p) {
  if constexpr (KEYS == 64) return wgmma_desc(p);
  else return wgmma_desc_sw64(p);
}
__device__ inline void bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
__device__ inline void bar_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
// Eight bf16 values to fp16 in place, saturated to +-65504 rather than infinite (a quantised cache's Q).
__device__ inline void bf16_chunk_to_half(uint4* chunk) {
  uint4 v = *chunk;
  uint32_t* const w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(w[i]) : "f"(f.y), "f"(f.x));  // (the first operand to the high half)
  }
  *chunk = v;
}

// Four quantised values (column order, the first in the low byte) times their scale, as two fp16 pairs: e4m3 pairs
// to fp16 pairs exactly in one conversion each, int8 as 1152 + q in fp16's bits (exact) less 1152; then one fp16
// multiply a pair. Expanded to bf16 through fp32 this took eight conversions per four values, which run at a
// sixteenth of the FMA rate: a scorer spent ~2.5 of the ~3 us a block on it at 16 heads, and fp8 ran barely
// faster than bf16 (H100, V3 batch 64: 851 against 875 us at 32K keys, session 21). fp16 holds every expanded
// value to 2^-11 where the scale (amax / 448, or / 127) is at least 2^-14 (a group's largest |value| >= 0.027 for
// fp8, 0.0078 for int8; DeepSeek's normalised latents are far above) and below 65504; smaller scales round to
// fp16's subnormal steps of 2^-24.
template <KvDtype KV>
__device__ __forceinline__ void dequantise4(uint32_t word, __half2 scale, uint32_t& lo, uint32_t& hi) {
  __half2 h01, h23;
  if constexpr (KV == KvDtype::int8) {
    const uint32_t biased = word ^ 0x80808080u;  // q + 128, a byte each
    const uint32_t raw01 = __byte_perm(biased, 0x64646464u, 0x4140), raw23 = __byte_perm(biased, 0x64646464u, 0x4342);
    const __half2 bias = __half2half2(__ushort_as_half(0x6480));  // 1152
    h01 = __hsub2(*reinterpret_cast<const __half2*>(&raw01), bias);
    h23 = __hsub2(*reinterpret_cast<const __half2*>(&raw23), bias);
  } else {
    h01 = __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word & 0xFFFFu), __NV_E4M3));
    h23 = __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(word >> 16), __NV_E4M3));
  }
  h01 = __hmul2(h01, scale);
  h23 = __hmul2(h23, scale);
  lo = *reinterpret_cast<const uint32_t*>(&h01);
  hi = *reinterpret_cast<const uint32_t*>(&h23);
}

// Expands the quantised block in `stage` (as it landed, see kRawOffset) in place into the fp16 tile both products
// read (fp16): column block c takes bytes [8 KB c, 8 KB (c + 1)). Run by the 128 threads of one scorer, two per key.
// Blocks 0-3 land below the raw bytes; 4 and 5 over raw blocks 0-3, which every thread has read by the first
// barrier; 6-8 over raw blocks 4-8 and the scales, which every thread has read (6-8 into registers) by the second.
template <KvDtype KV>
__device__ __forceinline__ void dequantise_stage(uint8_t* stage, int t, int barrier) {
  using G = Geometry<64>;  // (quantised blocks: 64 keys)
  constexpr int kKeys = G::kKeys, kRawOffset = G::kRawOffset, kScalesOffset = G::kScalesOffset, kRawBlockBytes = G::kRawBlockBytes;
  const int key = t / 2, half = t % 2;  // this thread's 32 values of each of its key's column blocks
  const uint8_t* raw = stage + kRawOffset + key * 64 + half * 32;
  const float* scales = reinterpret_cast<const float*>(stage + kScalesOffset) + key * kGroups;
  __half* const tile = reinterpret_cast<__half*>(stage);
  auto load = [&](int c, uint4 (&v)[2]) {
    v[0] = *reinterpret_cast<const uint4*>(raw + c * kRawBlockBytes);
    v[1] = *reinterpret_cast<const uint4*>(raw + c * kRawBlockBytes + 16);
  };
  auto expand = [&](int c, const uint4 (&v)[2], __half2 scale) {  // 4 chunks of 8 fp16 values, swizzled as the MMAs read
    const uint32_t words[8] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t packed[4];
      dequantise4<KV>(words[2 * i], scale, packed[0], packed[1]);
      dequantise4<KV>(words[2 * i + 1], scale, packed[2], packed[3]);
      *reinterpret_cast<uint4*>(tile + swz(key, c * 64 + half * 32 + i * 8, kKeys)) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  };
  uint4 v[2];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    load(c, v);
    expand(c, v, __float2half2_rn(scales[c]));
  }
  bar_sync(barrier, 128);
  uint4 kept[3][2];
  __half2 kept_scale[3];
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    load(6 + c, kept[c]);
    kept_scale[c] = __float2half2_rn(scales[6 + c]);
  }
#pragma unroll
  for (int c = 4; c < 6; ++c) {
    load(c, v);
    expand(c, v, __float2half2_rn(scales[c]));
  }
  bar_sync(barrier, 128);
#pragma unroll
  for (int c = 0; c < 3; ++c) expand(6 + c, kept[c], kept_scale[c]);
}

// S = Q K^T for the block whose keys start at k_desc. Descriptors advance by constant offsets (their address field
// counts 16 bytes), so the 36 MMAs need no address arithmetic between them.
// (Two 64-key stages: K's descriptor is Q's plus a constant, kStage the scorer's own stage; a runtime one cost the
// scorers, at 88 registers, more spills.)
template <bool kHalf, int KEYS>
__device__ __forceinline__ void score_block(float (&s)[KEYS / 8][4], uint64_t q_desc, uint64_t k_desc) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kWidth / 16; ++ks) {
    const int block = ks >> 2, column = (ks & 3) * 16;
    const uint64_t a = q_desc + (block * kRows * 64 + column) * 2 / 16, b = k_desc + (block * KEYS * 64 + column) * 2 / 16;
    wgmma_m64nNk16<KEYS, kHalf>(s, a, b, ks > 0);
  }
  wgmma_commit_and_wait();
}
template <bool kHalf, int KEYS, int kStage>
__device__ __forceinline__ void score_block_in(float (&s)[KEYS / 8][4], uint64_t q_desc) {
  score_block<kHalf, KEYS>(s, q_desc, q_desc + (kQBytes + kStage * Geometry<KEYS>::kStageBytes) / 16);
}

// Two adjacent output values, fp32 (a partial) or bf16 (final), where `real` (a padding row's are not stored). A
// predicated store rather than a branch: a branch around the stores made ptxas serialise the warpgroup MMAs.
__device__ inline void store_pair(bool real, float* dst, float a, float b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p st.global.v2.f32 [%1], {%2, %3};\n}\n" ::"r"(int(real)), "l"(dst), "f"(a), "f"(b) : "memory");
}
__device__ inline void store_pair(bool real, __nv_bfloat16* dst, float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p st.global.b32 [%1], %2;\n}\n" ::"r"(int(real)), "l"(dst),
               "r"(*reinterpret_cast<const uint32_t*>(&v)) : "memory");
}
// Four 32-bit words, 16 contiguous bytes, where `real`.
__device__ inline void store_quad(bool real, void* dst, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p st.global.v4.b32 [%1], {%2, %3, %4, %5};\n}\n" ::"r"(int(real)), "l"(dst), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}
// a[i] of i < 4, by selects (an index held in a register would put the array in local memory).
__device__ __forceinline__ uint32_t pick(const uint32_t (&a)[4], int i) { return i < 2 ? (i == 0 ? a[0] : a[1]) : (i == 2 ? a[2] : a[3]); }
// A 4 x 4 transpose of 32-bit words across a quad (lanes 4k .. 4k + 3, q = lane % 4): afterwards lane q's a[j] is what
// lane j's a[q] was. In round r lane q hands lane q ^ r its a[q ^ r] and takes lane q ^ r's a[q].
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4], int q) {
  uint32_t got[4];
  got[0] = pick(a, q);
#pragma unroll
  for (int r = 1; r < 4; ++r) got[r] = __shfl_xor_sync(0xffffffffu, pick(a, q ^ r), r);
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = pick(got, q ^ j);
}
// A warpgroup MMA accumulator's 64 x (8 x N) tile (o[n][0..1]: row r_lo, columns 8 n + 2 (lane % 4) and + 1;
// o[n][2..3]: row r_hi), times each row's factor, into row-major bf16 `out` (row stride kLatent), 16 bytes a store:
// each quad first trades its words (quad_transpose) so that lane q holds whole 8-column groups. (Stored as they sat,
// 4 bytes a lane, a CTA's 64 KB took 16384 stores, 8 rows a warp instruction: ~11 us to issue while the other SMs
// kept the memory system busy; 128 heads, batch 128, H100, session 27.)
template <int N>
__device__ __forceinline__ void store_rows(bool real, __nv_bfloat16* out, const float (&o)[N][4], int r_lo, int r_hi, float f_lo, float f_hi, int lane) {
  static_assert(N % 4 == 0, "whole groups of four 8-column blocks");
  const int q = lane % 4;
#pragma unroll
  for (int k = 0; k < N / 4; ++k)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float f = h ? f_hi : f_lo;
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(o[4 * k + j][2 * h] * f, o[4 * k + j][2 * h + 1] * f);
        w[j] = *reinterpret_cast<const uint32_t*>(&v);
      }
      quad_transpose(w, q);
      store_quad(real, out + (h ? r_hi : r_lo) * kLatent + (4 * k + q) * 8, w[0], w[1], w[2], w[3]);
    }
}
// Walks a CTA's blocks in order: its segments (request, first key, end key) cut into kKeys-key blocks.
template <int kKeys>
struct Cursor {
  int seg, end_seg;
  int4 s;    // the current segment
  int key0;  // the current block's first key
  __device__ Cursor(const Params& p, int2 mine) : seg(mine.x), end_seg(mine.x + mine.y), s{}, key0(0) {
    if (seg < end_seg) s = p.segments[seg], key0 = s.y;
  }
  __device__ bool valid() const { return seg < end_seg; }
  __device__ bool first() const { return key0 == s.y; }
  __device__ bool last() const { return key0 + kKeys >= s.z; }
  __device__ void next(const Params& p) {
    key0 += kKeys;
    if (key0 >= s.z && ++seg < end_seg) s = p.segments[seg], key0 = s.y;
  }
};

// Launched with launch_pdl (variants/common/pdl.cuh), it may start while the kernel before it runs. With early_loads
// the accumulators look up and copy the CTA's first two blocks before griddepcontrol.wait, so that a CTA's longest
// wait (page table, then the keys: ~3 us, where a batch-1 CTA's whole walk is ~13 us) overlaps that kernel's tail.
// This reads only what the host wrote before the step (the schedule, the page table) and the cache, which the kernel
// before this one does not write: every kernel of the step triggers its dependents after its own wait (pdl.cuh), so
// when this one starts, the one before it has passed its wait and every earlier one - the cache write among them -
// has finished. (A selector's page table comes from the kernel just before: no early loads there.) Q comes from
// that kernel: the scorers wait before loading it. (Measured with the MoE down GEMM's early copies: the V2-Lite
// batch-1 graph step 3.6% faster, H100, session 20.)
template <KvDtype KV, int KEYS>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ Params p) {
  static_assert(KV == KvDtype::bf16 || KEYS == 64, "quantised blocks are 64 keys (block_keys_for)");
  using G = Geometry<KEYS>;
  constexpr int kKeys = G::kKeys, kStages = G::kStages, kPasses = G::kPasses;
  constexpr size_t kStageBytes = G::kStageBytes;
  constexpr int kRawBlockBytes = G::kRawBlockBytes, kScaleBytes = G::kScaleBytes, kRawOffset = G::kRawOffset, kScalesOffset = G::kScalesOffset;
  constexpr int kBarMax = G::kBarMax, kBarAccumulators = G::kBarAccumulators, kBarCleared = G::kBarCleared;
  // Quantised blocks expand to fp16 (dequantise4), so Q and P are fp16 there too, every product fp16 x fp16.
  constexpr bool kHalfTiles = KV != KvDtype::bf16;
  using Pair = std::conditional_t<kHalfTiles, __half2, __nv_bfloat162>;
  auto to_pair = [](float a, float b) {
    if constexpr (kHalfTiles) return __floats2half2_rn(a, b);
    else return __floats2bfloat162_rn(a, b);
  };
  if (p.phases && threadIdx.x == 0) record(p, kTimerEntry, global_timer()), record_clock(p, kEntry);
  if (!p.early_loads) {
    pdl_wait();
    pdl_launch_dependents();
    if (threadIdx.x == 0) record_clock(p, kWaited);
  }
  if (p.tma && threadIdx.x == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.kv_map) : "memory");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  __nv_bfloat16* const sq = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* const sk = reinterpret_cast<__nv_bfloat16*>(smem + kQBytes);
  float* const meta = reinterpret_cast<float*>(smem + kQBytes + kStages * kStageBytes);  // [stage][alpha | inv][row]
  float* const handover = meta + kStages * 2 * kRows;  // [2][row]: the running max after block j, in [j % 2]; [row]: a row sum
  uint64_t* const landed = reinterpret_cast<uint64_t*>(handover + 3 * kRows);  // [stage]
  if (threadIdx.x == 0)  // arrivals per phase: one per accumulator thread (cp.async), or per warpgroup (tensor copies)
    for (int st = 0; st < kStages; ++st) mbarrier_init(&landed[st], p.tma ? 2 : 256);
  __syncthreads();
  // (Each role reads its own copy of these after setting its register count: values live across the change
  // went to the stack.)
  auto blocks_of = [&](int2 mine) {
    int total = 0;
    for (int seg = mine.x; seg < mine.x + mine.y; ++seg) total += (p.segments[seg].z - p.segments[seg].y + kKeys - 1) / kKeys;
    return total;
  };
  const int warpgroup = threadIdx.x / 128;

  if (warpgroup >= 2) {  // ---- a scorer: blocks j with j % 2 == scorer, in stage j % kStages
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kScorerRegisters));
    const int2 mine = p.part_segments[blockIdx.y];
    const int total = blocks_of(mine), row0 = int(blockIdx.x) * kRows;
    const int t = threadIdx.x % 128, lane = t % 32;
    const int r_lo = (t / 32) * 16 + lane / 4, r_hi = r_lo + 8;  // the two rows this thread holds in a 64-row wgmma tile
    const int scorer = warpgroup - 2;
    auto load_q = [&](int request) {
      copy_q_tile<kRows, 128>(p, sq, request, row0, t);
      if constexpr (kHalfTiles) {  // each thread's own chunks of the real rows, bf16 -> fp16 in place
        for (int c = t; c < kRows * kChunks && row0 + c / kChunks < p.rows; c += 128)
          bf16_chunk_to_half(reinterpret_cast<uint4*>(sq + swz(c / kChunks, (c % kChunks) * 8, kRows)));
      }
    };
    // The running max as the other scorer left it after block j - 1 (barrier (j - 1) % 2 says it is there).
    auto wait_for_max = [&](int j) { bar_sync(kBarMax + (j - 1) % 2, 256); };
    Cursor<kKeys> at(p, mine);
    if (scorer == 1) at.next(p);
    const uint64_t q_desc = wgmma_desc(sq);
    // m_lo/m_hi: the running max when this scorer last moved, to which its partial row sums l_lo/l_hi refer.
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0, l_hi = 0;
    int last_lo = 0, last_hi = 0, my_seg = -1;
    if (p.early_loads) {  // Q (and a selector's lengths) come from the kernels before
      pdl_wait();
      pdl_launch_dependents();
    }
#pragma unroll 1
    for (int j = scorer; j < total; j += 2) {
      const bool first = at.first(), last = at.last();
      const bool second = !first && at.key0 - kKeys == at.s.y;           // block j - 1 opened this segment
      const bool next_is_last = !last && at.key0 + 2 * kKeys >= at.s.z;  // block j + 1 closes it
      const int seg = at.seg, request = at.s.x, key0 = at.key0, k_end = at.s.z;
      if (seg != my_seg) {  // this scorer's first block of the segment: its own sums start over
        my_seg = seg;
        m_lo = m_hi = -INFINITY;
        l_lo = l_hi = 0;
        const int length = p.lengths[request];
        last_lo = length + (row0 + r_lo) / p.heads;  // causal among the new tokens
        last_hi = length + (row0 + r_hi) / p.heads;
      }
      // Q changes where a segment opens: the scorer of that block waits until block j - 1's product with the old
      // Q is done, and the scorer of the block after it until the new Q has landed (both through block j - 1's
      // max hand-over, which comes after its Q K^T). Elsewhere the hand-over is awaited after this block's Q K^T.
      const bool waited = j > 0 && (first || second);
      if (waited) wait_for_max(j);
      if (first) {
        if (j >= 2) bar_sync(kBarScorer + scorer, 128);  // every warp of this scorer is done with the old Q
        load_q(request);
        fence_proxy_async();  // the copies are read by the tensor cores
        if (j == 0 && t == 0) record_clock(p, kQLanded);
      }
      const int stage = kStages == 2 ? scorer : j % kStages;  // (two stages: the scorer's own)
      __nv_bfloat16* const keys = sk + stage * kKeys * kWidth;
      __nv_bfloat16* const sp = keys + kRopeBlock * kKeys * 64;  // P: over the rope columns
      float* const alpha = meta + stage * 2 * kRows;
      mbarrier_wait(&landed[stage], (j / kStages) & 1);
      if (j == 0 && t == 0) record_clock(p, kFirstLanded);
      if constexpr (KV != KvDtype::bf16) {
        dequantise_stage<KV>(reinterpret_cast<uint8_t*>(keys), t, kBarScorer + scorer);
        fence_proxy_async();                 // the fp16 tile, written just now, is read by the tensor cores
        bar_sync(kBarScorer + scorer, 128);  // every thread's part of it (and of Q) is there
      } else {
        if (!p.tma) fence_proxy_async();  // cp.async copies (generic proxy) are read by the tensor cores (async proxy)
        if (first) bar_sync(kBarScorer + scorer, 128);  // every thread's part of Q has landed
      }
      float s[kKeys / 8][4];
      if constexpr (kStages == 2) {
        if (scorer == 0) score_block_in<kHalfTiles, kKeys, 0>(s, q_desc);
        else score_block_in<kHalfTiles, kKeys, 1>(s, q_desc);
      } else {
        score_block<kHalfTiles, kKeys>(s, q_desc, wgmma_desc(keys));
      }
      if (j == 0 && t == 0) record_clock(p, kFirstScored);
      // Mask, then the online softmax. A row lives in one quad of one warp: no exchange across warps.
      if (key0 + kKeys > min(k_end, min(last_lo, last_hi) + 1)) {  // (a block inside the segment and before every
#pragma unroll                                                       //  row's own position needs no mask)
        for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = key0 + n * 8 + (lane % 4) * 2 + e;
            if (key >= k_end || key > last_lo) s[n][e] = -INFINITY;
            if (key >= k_end || key > last_hi) s[n][2 + e] = -INFINITY;
          }
      }
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
      }
      for (int off = 1; off < 4; off <<= 1) {
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
      }
      if (j == 0 && t == 0) record_clock(p, kFirstMaxed);
      // The running max before this block, as the other scorer left it (-inf where a segment opens).
      if (j > 0 && !waited) wait_for_max(j);
      const float* before = handover + ((j - 1) % 2) * kRows;
      const float prev_lo = first ? -INFINITY : before[r_lo], prev_hi = first ? -INFINITY : before[r_hi];
      float other_lo = 0, other_hi = 0;
      if (last && !first) {  // block j - 1's row sums (handed over with its max), read before this block's own
        other_lo = handover[2 * kRows + r_lo];  // hand-over lets the other scorer write the next ones
        other_hi = handover[2 * kRows + r_hi];
      }
      // The running max moves only when a block's exceeds it by more than kLazyRescale (log2 units): P then stays
      // <= 2^kLazyRescale, well inside bf16 and fp32, the sums use the same max, and the accumulators skip their
      // rescale on almost every block. A row that has seen no key yet keeps m = -inf (NaN compares false): its
      // probabilities are 0 and its rescale factor 0 (O is 0).
      const float new_lo = (fmaxf(prev_lo, mx_lo) - prev_lo) * p.scale_log2 > kLazyRescale ? fmaxf(prev_lo, mx_lo) : prev_lo;
      const float new_hi = (fmaxf(prev_hi, mx_hi) - prev_hi) * p.scale_log2 > kLazyRescale ? fmaxf(prev_hi, mx_hi) : prev_hi;
      const bool hand_over = j + 1 < total;
      if (hand_over && lane % 4 == 0) {  // the other scorer's block j + 1 continues from here
        handover[(j % 2) * kRows + r_lo] = new_lo;
        handover[(j % 2) * kRows + r_hi] = new_hi;
      }
      if (hand_over && !next_is_last) bar_arrive(kBarMax + j % 2, 256);
      const float base_lo = new_lo == -INFINITY ? 0.0f : new_lo * p.scale_log2;
      const float base_hi = new_hi == -INFINITY ? 0.0f : new_hi * p.scale_log2;
      // Exactly 1 when the max stays (exp2 of a fused m * scale - base would leave a rounding residue): for O
      // from the max before this block, for this scorer's sums from the max it last saw.
      const float alpha_lo = new_lo == prev_lo ? 1.0f : exp2f(prev_lo * p.scale_log2 - base_lo);
      const float alpha_hi = new_hi == prev_hi ? 1.0f : exp2f(prev_hi * p.scale_log2 - base_hi);
      l_lo *= new_lo == m_lo ? 1.0f : exp2f(m_lo * p.scale_log2 - base_lo);
      l_hi *= new_hi == m_hi ? 1.0f : exp2f(m_hi * p.scale_log2 - base_hi);
      m_lo = new_lo;
      m_hi = new_hi;
      // P over the block's rope columns (its Q K^T, the only reader, is done).
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        const Pair lo = to_pair(exp2f(s[n][0] * p.scale_log2 - base_lo), exp2f(s[n][1] * p.scale_log2 - base_lo));
        const Pair hi = to_pair(exp2f(s[n][2] * p.scale_log2 - base_hi), exp2f(s[n][3] * p.scale_log2 - base_hi));
        // The sums use the rounded probabilities the P V product will use.
        l_lo += __low2float(lo) + __high2float(lo);
        l_hi += __low2float(hi) + __high2float(hi);
        const int col = n * 8 + (lane % 4) * 2;
        *reinterpret_cast<Pair*>(sp + p_offset<kKeys>(r_lo, col)) = lo;
        *reinterpret_cast<Pair*>(sp + p_offset<kKeys>(r_hi, col)) = hi;
      }
      if (hand_over && next_is_last) {  // the other scorer closes the segment: it adds this scorer's sums
        float sum_lo = l_lo, sum_hi = l_hi;
        for (int off = 1; off < 4; off <<= 1) {
          sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, off);
          sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, off);
        }
        if (lane % 4 == 0) {
          handover[2 * kRows + r_lo] = sum_lo;
          handover[2 * kRows + r_hi] = sum_hi;
        }
        bar_arrive(kBarMax + j % 2, 256);
      }
      if (last) {  // the segment's row sums (across the quad, and the other scorer's) and log-sum-exp
        float sum_lo = l_lo, sum_hi = l_hi;
        for (int off = 1; off < 4; off <<= 1) {
          sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, off);
          sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, off);
        }
        sum_lo += other_lo * alpha_lo;  // the other scorer's sums refer to the max before this block
        sum_hi += other_hi * alpha_hi;
        if (lane % 4 == 0) {
          alpha[kRows + r_lo] = sum_lo > 0 ? 1.0f / sum_lo : 0.0f;
          alpha[kRows + r_hi] = sum_hi > 0 ? 1.0f / sum_hi : 0.0f;
          float* lse = p.lse_partial + int64_t(seg) * p.partial_rows + row0;
          lse[r_lo] = sum_lo > 0 ? m_lo * p.scale_log2 + log2f(sum_lo) : -INFINITY;
          lse[r_hi] = sum_hi > 0 ? m_hi * p.scale_log2 + log2f(sum_hi) : -INFINITY;
        }
      }
      if (lane % 4 == 0) {
        alpha[r_lo] = alpha_lo;
        alpha[r_hi] = alpha_hi;
      }
      fence_proxy_async();  // P is read by the tensor cores
      bar_arrive(kBarReady + stage, kReadyThreads);
      if (j == 0 && t == 0) record_clock(p, kFirstHandedOver);
      at.next(p);
      at.next(p);
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kAccumulatorRegisters));
  const int2 mine = p.part_segments[blockIdx.y];
  const int total = blocks_of(mine), row0 = int(blockIdx.x) * kRows;
  const int t = threadIdx.x % 128, lane = t % 32;
  const int r_lo = (t / 32) * 16 + lane / 4, r_hi = r_lo + 8;

  // ---- the accumulators: warpgroup g owns latent columns 256 g .. 256 g + 255 of O and copies them into each
  // stage, warpgroup 0 also the rope columns. Tensor copies: kKeys-key x 64-column boxes (a page holds whole blocks).
  // cp.async: half of a key row's 72 16-byte chunks, 4 threads per key, 9 chunks each (c0 + 4u for u < 8, then
  // one rope chunk), at offsets fixed per thread, for key my_key (+ kHalfKeys a pass).
  const int cbase = warpgroup * 256;
  const int my_key = t / 4, my_part = t % 4;
  const int c0 = warpgroup * 32 + my_part, c_rope = 64 + warpgroup * 4 + my_part;
  auto swizzled = [&](int c) { return swz(my_key, c * 8, kKeys); };  // element offset of chunk c of my key in a stage
  const int dst_even = swizzled(c0), dst_odd = swizzled(c0 + 4), dst_rope = swizzled(c_rope);  // u even / odd: +4096 u/2
  Cursor<kKeys> lookup_at(p, mine);
  // The next block's page-table entries are fetched a block ahead (look_up, after a block's copies are queued) and
  // turned into slots only when that block's copies are (resolve): consumed at once, the entry's load stalled the
  // accumulators ~1 us a block where every thread looks one up (a token selector's keys: 15% of the DSA decode's
  // warp samples, ncu, H100, V3 batch 16 128K, session 21).
  int32_t entry[kPasses] = {};    // page-table entry of my key in each pass of the next block (tensor copies: [0], the block's first key)
  int in_page[kPasses] = {};      // the key's offset in its page
  bool has[kPasses] = {};         // whether that key exists
  int64_t slot[kPasses];          // their slots, once resolved; -1: none
#pragma unroll
  for (auto& x : slot) x = -1;
  auto look_up = [&]() {
    if (p.tma && t != 0) return;
#pragma unroll
    for (int half = 0; half < kPasses; ++half) {
      if (p.tma && half) break;
      const int key = lookup_at.key0 + half * kHalfKeys + (p.tma ? 0 : my_key);
      has[half] = lookup_at.valid() && key < lookup_at.s.z;
      if (has[half]) {
        const int32_t* page_table = p.cache.page_table + int64_t(lookup_at.s.x) * p.cache.pages_per_request;
        const int page_size = int(p.cache.page_size);
        entry[half] = page_table[p.page_shift >= 0 ? key >> p.page_shift : key / page_size];
        in_page[half] = p.page_shift >= 0 ? key & (page_size - 1) : key % page_size;
      }
    }
  };
  auto resolve = [&]() {
#pragma unroll
    for (int half = 0; half < kPasses; ++half)
      slot[half] = has[half] ? int64_t(entry[half]) * p.cache.page_size + in_page[half] : -1;
  };
  int next_load = 0;
  auto load_next = [&]() {  // block next_load into its stage, then the next block's page lookup
    if (next_load >= total) return;
    resolve();
    __nv_bfloat16* dst = sk + (next_load % kStages) * kKeys * kWidth;
    uint64_t* bar = &landed[next_load % kStages];
    if constexpr (KV != KvDtype::bf16) {
      uint8_t* const stage = reinterpret_cast<uint8_t*>(dst);
      if (p.tma) {  // raw blocks 0-4 and the scales (warpgroup 0), 5-8 (warpgroup 1)
        if (t == 0) {
          const int first_block = warpgroup == 0 ? 0 : 5, boxes = warpgroup == 0 ? 5 : 4;
          mbarrier_expect_bytes(bar, uint32_t(boxes * kRawBlockBytes + (warpgroup == 0 ? kScaleBytes : 0)));
          for (int b = first_block; b < first_block + boxes; ++b)
            tma_load(stage + kRawOffset + b * kRawBlockBytes, &p.kv_map, b * 64, int(slot[0]), bar);
          // A block lies in one page (page_size % kKeys == 0): its keys' scales are one contiguous run.
          if (warpgroup == 0) bulk_load(stage + kScalesOffset, p.cache.scales + slot[0] * kGroups, kScaleBytes, bar);
        }
      } else {  // one key a thread (the lookup's pass `warpgroup`): a 16-byte piece of each raw block, every 4th scale
        const int64_t my_slot = warpgroup == 0 ? slot[0] : slot[kPasses - 1];
        const bool valid = my_slot >= 0;
        const uint8_t* src = p.cache.values + (valid ? my_slot : 0) * kWidth;
        const float* scales = p.cache.scales + (valid ? my_slot : 0) * kGroups;
        const int key = warpgroup * kHalfKeys + my_key;
#pragma unroll
        for (int c = 0; c < kGroups; ++c)
          cp_async16(stage + kRawOffset + c * kRawBlockBytes + key * 64 + my_part * 16, src + c * 64 + my_part * 16, valid);
        for (int g = my_part; g < kGroups; g += 4) cp_async4(stage + kScalesOffset + (key * kGroups + g) * 4, scales + g, valid);
        mbarrier_arrive_on_copies(bar);
      }
    } else if (p.tma) {
      if (t == 0) {
        const int boxes = warpgroup == 0 ? 5 : 4;  // warpgroup 0: latent blocks 0-3 and the rope block; 1: blocks 4-7
        mbarrier_expect_bytes(bar, uint32_t(boxes * kKeys * 128));
        for (int b = 0; b < boxes; ++b) {  // (keys past the segment's end are read but masked)
          const int block = warpgroup == 0 ? (b < 4 ? b : kRopeBlock) : 4 + b;
          tma_load(dst + block * kKeys * 64, &p.kv_map, block * 64, int(slot[0]), bar);
        }
      }
    } else {
#pragma unroll
      for (int half = 0; half < kPasses; ++half) {
        const __nv_bfloat16* src = reinterpret_cast<const __nv_bfloat16*>(p.cache.values) + (slot[half] < 0 ? 0 : slot[half]) * kWidth;
        __nv_bfloat16* row = dst + half * kHalfKeys * 64;
#pragma unroll
        for (int u = 0; u < 8; ++u)
          cp_async16(row + (u % 2 ? dst_odd : dst_even) + (u / 2) * kKeys * 64, src + (c0 + 4 * u) * 8, slot[half] >= 0);
        cp_async16(row + dst_rope, src + c_rope * 8, slot[half] >= 0);
      }
      mbarrier_arrive_on_copies(bar);
    }
    ++next_load;
    lookup_at.next(p);
    look_up();
  };
  look_up();
  for (int i = 0; i < kStages; ++i) load_next();
  if (warpgroup == 0 && t == 0) record(p, kBlocks, (unsigned long long)total), record_clock(p, kLoadsIssued);
  if (p.early_loads) {
    pdl_wait();
    pdl_launch_dependents();
    if (warpgroup == 0 && t == 0) record_clock(p, kWaited);
  }
  const uint64_t v_desc0 = wgmma_desc_mn(sk + (cbase / 64) * kKeys * 64, kKeys);
  const uint64_t p_desc0 = p_desc_of<kKeys>(sk + kRopeBlock * kKeys * 64);
  float o[32][4];
#pragma unroll
  for (auto& x : o) x[0] = x[1] = x[2] = x[3] = 0;
  Cursor<kKeys> at(p, mine);
#pragma unroll 1
  for (int j = 0; j < total; ++j, at.next(p)) {
    const int stage = j % kStages;
    bar_sync(kBarReady + stage, kReadyThreads);
    if (!p.tma) fence_proxy_async();  // (as in the scorer: V came by cp.async)
    const float* alpha = meta + stage * 2 * kRows;
    const float a_lo = alpha[r_lo], a_hi = alpha[r_hi];
    if (__any_sync(0xffffffffu, a_lo != 1.0f || a_hi != 1.0f)) {  // most blocks leave every row's max alone
#pragma unroll
      for (auto& x : o) {
        x[0] *= a_lo;
        x[1] *= a_lo;
        x[2] *= a_hi;
        x[3] *= a_hi;
      }
    }
    if (p.tma && at.key0 + kKeys > at.s.z) {  // the tensor copy brought keys past the segment's end too: P is 0
      // there, but 0 x V is not 0 where V is NaN (a slot never written), so this warpgroup's columns of their V rows
      // become zeros. Thread t clears 16-byte chunk t % 32 of rows s.z - key0 + t / 32, + 4, ... (whole rows: no swizzle).
      uint4* const chunk = reinterpret_cast<uint4*>(sk + stage * kKeys * kWidth + (cbase / 64 + t % 32 / 8) * kKeys * 64 + (t % 8) * 8);
#pragma unroll 1
      for (int row = at.s.z - at.key0 + t / 32; row < kKeys; row += 4) chunk[row * 8] = make_uint4(0, 0, 0, 0);
      fence_proxy_async();
      bar_sync(kBarCleared + warpgroup, 128);
    }
    const uint64_t v_desc = v_desc0 + stage * kStageBytes / 16, p_desc = p_desc0 + stage * kStageBytes / 16;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {  // columns cbase .. + 127, then + 128 .. + 255 (two 64-column blocks on)
      wgmma_m64n128k16_vt<0, kHalfTiles>(o, p_desc + ks * 16 * 2 / 16, v_desc + ks * 16 * 64 * 2 / 16);
      wgmma_m64n128k16_vt<1, kHalfTiles>(o, p_desc + ks * 16 * 2 / 16, v_desc + (2 * kKeys * 64 + ks * 16 * 64) * 2 / 16);
    }
    wgmma_commit_and_wait();
    if (warpgroup == 0 && t == 0 && (j == 0 || j == total - 1)) record_clock(p, j == 0 ? kFirstAccumulated : kLastAccumulated);
    if (at.last()) {  // normalise and write the segment's output; the next segment starts from zero
      const float inv_lo = alpha[kRows + r_lo], inv_hi = alpha[kRows + r_hi];
      // A warp holds 16 rows and rows come in multiples of 16: a warp of padding rows (16 or 32 heads) stores
      // nothing (it wrote segment 0's padding rows until session 20: 3/4 of a 16-head CTA's 128 KB of stores, ~2.5 us
      // of a batch-1 CTA's ~13).
      const bool real_rows = row0 + (t / 32) * 16 < p.rows;
      auto write = [&](auto* out) {  // this thread's two rows of its 256 columns, then O starts from zero
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          const int col = n * 8 + (lane % 4) * 2;
          store_pair(real_rows, out + r_lo * kLatent + col, o[n][0] * inv_lo, o[n][1] * inv_lo);
          store_pair(real_rows, out + r_hi * kLatent + col, o[n][2] * inv_hi, o[n][3] * inv_hi);
          o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0;
        }
      };
      if (at.s.w) write(p.o_lat + (int64_t(at.s.x) * p.rows + row0) * kLatent + cbase);  // whole: final
      else write(p.o_partial + (int64_t(at.seg) * p.partial_rows + row0) * kLatent + cbase);  // merged by combine
    }
    // Once both products are done (and every thread has read the block's factors) the stage takes block j + 2:
    // both warpgroups read P from the rope columns, which warpgroup 0's boxes (and both warpgroups' cp.async
    // chunks) refill, so neither may load before the other's product is done. (The scorer finished with the
    // stage before handing over P.)
    bar_sync(kBarAccumulators, 256);
    load_next();
  }
  if (warpgroup == 0 && t == 0) record_clock(p, kDone), record(p, kTimerExit, global_timer());
}

}  // namespace roles

// ---- Quantised caches at up to 32 rows: the keys along the MMA's 64 rows ----------------------------------------
// At 16 heads (32 with an MTP token) a 64-row tile is three quarters padding, and the fixed-role kernel above pays
// for it with a quantised cache: every Q K^T reads a 64-row Q from shared memory, and each block's two bf16-sized
// stages cycle through copy, expansion, both products and the softmax before the next copy may start: fp8 ran only
// 1.07-1.13x faster than bf16 while moving half the bytes (H100, sessions 21 and 28). Here the products are
// transposed: S^T = K Q^T (the block's 64 keys are the MMA's rows, the N = 16 or 32 query rows its columns) and
// O^T = V^T P^T (the 512 latent columns are rows: four warpgroups x two 64-row tiles, 16 accumulators a thread at
// 16 rows). Each value is expanded once (expanding the latent twice, once for each product, took ~1.2 us of a
// ~2.9 us block, H100, session 28), by the thread whose Q K^T fragment holds it, straight into the registers that
// MMA reads (A from registers); the latent columns also go, fp16, into the tile that P V reads (V^T as an MN-major
// A from shared memory). For a thread to find its fragment in 16 contiguous raw bytes a row, Q K^T's K dimension is
// permuted within each 64-column block: physical column 16 q + 4 s + j (j < 4) is k-step s's column
// 2 q + (j < 2 ? j : j + 6) (q = lane % 4), and Q is stored in that order (logical_column).
// Each warpgroup expands two latent column blocks (the two its own P V reads) and one k-step of the rope block -
// nine k-steps of Q K^T each, the partial products added in shared memory. A block's step: the softmax, every
// warpgroup for a quarter of the columns | P V, left in flight while the next block is expanded and its Q K^T issued
// | the next block's tile columns and partial products stored (each warpgroup once its own P V is done). The
// running max moves only where some score exceeds it by kLazyRescale (roles' lazy rescale), which a barrier's OR
// decides, so most blocks exchange no maxima across warps. The raw blocks land in a ring of their own (kRing in
// flight, each refilled once its block is expanded). Measured per 64-key block at 16 heads (H100, session 28):
// ~2.3 us against ~2.9 for the fixed-role kernel and ~1.6 for a bf16 block, where memory alone would take ~0.9.
// Tensor copies only (a page holds whole 64-key blocks); the plan, partial outputs and combine are the other kernels'.
namespace narrow {

using roles::bar_sync;
using roles::bf16_chunk_to_half;
using roles::Cursor;
using roles::dequantise4;

constexpr int kKeys = 64, kThreads = 512;
constexpr int kBarOwn = 1;  // + warpgroup: its 128 threads
constexpr int kRawBlockBytes = kKeys * 64, kScaleBytes = kKeys * kGroups * 4;
constexpr int kRawBytes = kGroups * kRawBlockBytes + kScaleBytes;  // a raw block: 9 boxes [key][64 bytes], then the scales [key][group]
static_assert(kRawBytes % 128 == 0, "each ring slot's boxes land 128-byte aligned");
constexpr size_t kTileBytes = size_t(kKeys) * kLatent * 2;  // the latent columns, fp16: 8 blocks [key][64]
constexpr float kLazyRescale = 8.0f;  // (as roles::kLazyRescale)

// The logical position (k-step s, column within it) of physical column `col` of a 64-column block (see above).
__device__ __forceinline__ int logical_column(int col) {
  const int q = col / 16, s = col % 16 / 4, j = col % 4;
  return 16 * s + 2 * q + (j < 2 ? j : j + 6);
}

// Shared memory: the latent tile, Q [N][576] (fp16, K-major swizzled, columns in logical order), P^T [N][64 keys]
// (fp16), the ring (three raw blocks at 16 rows, two at 32), the partial products ([4 warpgroups][N / 2 fragment
// values][128 threads]), then the mbarriers, the column maxima [4 warps][N], the sums [4][N] and the factors [N].
template <int N>
struct Layout {
  static constexpr int kRing = N == 16 ? 3 : 2;
  static constexpr size_t kQ = kTileBytes, kP = kQ + size_t(N) * kWidth * 2, kRingAt = kP + size_t(N) * 64 * 2;
  static constexpr size_t kPartials = kRingAt + size_t(kRing) * kRawBytes, kBarriers = kPartials + size_t(4) * 128 * (N / 2) * 4;
  static constexpr size_t kFloats = kBarriers + kRing * 8;
  static constexpr size_t kSmemBytes = kFloats + size_t(9) * N * 4 + 1024;
  static_assert(kQ % 1024 == 0 && kRingAt % 1024 == 0 && kP % 1024 == 0, "swizzled tiles 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
};

template <KvDtype KV, int N>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ Params p) {
  static_assert(N == 16 || N == 32, "16 or 32 query rows");
  using L = Layout<N>;
  constexpr int kRing = L::kRing;
  const int t = int(threadIdx.x), warpgroup = t / 128, lane = t % 32, q4 = lane % 4;
  const int g = (t % 128 / 32) * 16 + lane / 4;  // this thread's fragment rows g and g + 8
  if (p.phases && t == 0) record(p, kTimerEntry, global_timer()), record_clock(p, kEntry);
  if (!p.early_loads) {
    pdl_wait();
    pdl_launch_dependents();
    if (t == 0) record_clock(p, kWaited);
  }
  // A block's copies are issued by the first lane of warps 0-9, one each (box c by warp c, the scales by warp 9;
  // warp 0 also announces the bytes): issued all ten from one thread, they held that thread's warpgroup back ~0.4 us a
  // block (a copy's operands pass through uniform registers, one issuing thread at a time; H100, session 28).
  const int issuer = lane == 0 && t / 32 <= kGroups ? t / 32 : -1;
  if (issuer >= 0 && issuer < kGroups) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.kv_map) : "memory");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  __half* const tile = reinterpret_cast<__half*>(smem);
  __half* const sq = reinterpret_cast<__half*>(smem + L::kQ);
  uint8_t* const ring = smem + L::kRingAt;
  float* const partials = reinterpret_cast<float*>(smem + L::kPartials);
  __half* const sp = reinterpret_cast<__half*>(smem + L::kP);
  uint64_t* const landed = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  float* const maxima = reinterpret_cast<float*>(smem + L::kFloats);
  float* const sums = maxima + 4 * N;
  float* const factor = sums + 4 * N;
  if (t == 0)
    for (int r = 0; r < kRing; ++r) mbarrier_init(&landed[r], 1);
  __syncthreads();

  const int2 mine = p.part_segments[blockIdx.y];
  int total = 0;
  for (int seg = mine.x; seg < mine.x + mine.y; ++seg) total += (p.segments[seg].z - p.segments[seg].y + kKeys - 1) / kKeys;

  // The issuers copy block b into ring slot b % kRing, its page-table entry looked up when block b - 1 was copied.
  Cursor<kKeys> lookup_at(p, mine);
  int32_t entry = 0;
  int in_page = 0;
  auto look_up = [&]() {
    if (!lookup_at.valid()) return;
    const int key = lookup_at.key0;
    const int32_t* page_table = p.cache.page_table + int64_t(lookup_at.s.x) * p.cache.pages_per_request;
    const int page_size = int(p.cache.page_size);
    entry = page_table[p.page_shift >= 0 ? key >> p.page_shift : key / page_size];
    in_page = p.page_shift >= 0 ? key & (page_size - 1) : key % page_size;
  };
  int next_load = 0;
  auto load_next = [&]() {
    if (next_load >= total) return;
    const int64_t slot = int64_t(entry) * p.cache.page_size + in_page;
    uint8_t* const dst = ring + (next_load % kRing) * kRawBytes;
    uint64_t* const bar = &landed[next_load % kRing];
    // (a copy may land before the bytes are announced: the phase cannot complete while warp 0's arrival is pending)
    if (issuer == 0) mbarrier_expect_bytes(bar, uint32_t(kRawBytes));
    if (issuer < kGroups) tma_load(dst + issuer * kRawBlockBytes, &p.kv_map, issuer * 64, int(slot), bar);
    // A block lies in one page (page_size % 64 == 0): its keys' scales are one contiguous run.
    else bulk_load(dst + kGroups * kRawBlockBytes, p.cache.scales + slot * kGroups, kScaleBytes, bar);
    ++next_load;
    lookup_at.next(p);
    look_up();
  };
  if (issuer >= 0) {
    look_up();
    for (int i = 0; i < kRing; ++i) load_next();
  }
  if (t == 0) record(p, kBlocks, (unsigned long long)total), record_clock(p, kLoadsIssued);
  if (p.early_loads) {  // Q comes from the kernels before
    pdl_wait();
    pdl_launch_dependents();
    if (t == 0) record_clock(p, kWaited);
  }

  // The softmax of a block runs on every warpgroup, each for its own N / 16 of this thread's N / 4 fragment
  // columns (column slot cs: fragment index 2 n + e = kCols warpgroup + cs).
  constexpr int kCols = N / 16;
  auto column_of = [&](int cs) {
    const int index = kCols * warpgroup + cs;
    return 8 * (index / 2) + 2 * q4 + index % 2;
  };
  float m[kCols], l[kCols];  // each of this thread's softmax columns: running max, this thread's part of its sum
  float o[2][N / 8][4];      // O^T, two 64-row tiles: latent columns 128 warpgroup + 64 tile + g / g + 8
#pragma unroll
  for (auto& tile_o : o)
#pragma unroll
    for (auto& x : tile_o) x[0] = x[1] = x[2] = x[3] = 0;
  int length = 0;
  // Thread 0's clock at the start of the current part of a block's step, and the parts' totals (p.phases only).
  uint32_t part_start = 0, spent[5] = {};  // (32 bits: a CTA's walk is far below 2^32 clocks; registers are scarce here)
  auto part_done = [&](int part) {
    if (p.phases && t == 0) {
      const uint32_t now = uint32_t(clock64());
      spent[part] += now - part_start;
      part_start = now;
    }
  };

  // ---- Expansion and S^T = K Q^T of block b (the cursor `ahead`): warpgroup w takes latent column blocks 2 w and
  // 2 w + 1 (rows g and g + 8 into registers: the tile blocks its own P V reads) and k-step w of the rope block -
  // nine k-steps each (the same for every warpgroup: a warpgroup-dependent count made ptxas serialise the MMAs).
  // The MMAs are left in flight; the latent fragments stay in `a` for publish. b == total: the ring's stale bytes,
  // nothing waited for (the results are not used; every thread runs the same MMAs).
  float s[N / 8][4];
  uint32_t a[3][4][4];  // [block][k-step][fragment]; block 2: the rope block's k-step w only, in a[2][0]
  Cursor<kKeys> ahead(p, mine);
  auto prepare = [&](int b) {
    if (b < total && ahead.first()) {  // the segment's Q, fp16, columns in logical order (its last Q K^T is done)
      const __nv_bfloat16* q = p.q + int64_t(ahead.s.x) * p.rows * kWidth;
      for (int c = t; c < N * kChunks; c += kThreads) {
        const int row = c / kChunks, col = (c % kChunks) * 8;  // physical columns col .. col + 7: four pairs
        uint4 v = *reinterpret_cast<const uint4*>(q + row * kWidth + col);
        bf16_chunk_to_half(&v);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          *reinterpret_cast<uint32_t*>(sq + swz(row, col / 64 * 64 + logical_column(col % 64 + 2 * i), N)) = words[i];
      }
      length = p.lengths[ahead.s.x];  // (the block before has had its softmax: the state starts over)
#pragma unroll
      for (int cs = 0; cs < kCols; ++cs) m[cs] = -INFINITY, l[cs] = 0;
      fence_proxy_async();  // Q is read by the tensor cores, every warpgroup's MMAs the whole of it
      __syncthreads();
      if (b == 0 && t == 0) record_clock(p, kQLanded);
    }
    const uint8_t* const raw = ring + (b % kRing) * kRawBytes;
    const float* const scales = reinterpret_cast<const float*>(raw + kGroups * kRawBlockBytes);
    if (b < total) mbarrier_wait(&landed[b % kRing], (b / kRing) & 1);
    if (b == 0 && t == 0) record_clock(p, kFirstLanded);
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      const int c = 2 * warpgroup + blk;
      const uint4 lo = *reinterpret_cast<const uint4*>(raw + c * kRawBlockBytes + g * 64 + 16 * q4);
      const uint4 hi = *reinterpret_cast<const uint4*>(raw + c * kRawBlockBytes + (g + 8) * 64 + 16 * q4);
      const __half2 scale_lo = __float2half2_rn(scales[g * kGroups + c]), scale_hi = __float2half2_rn(scales[(g + 8) * kGroups + c]);
      const uint32_t wlo[4] = {lo.x, lo.y, lo.z, lo.w}, whi[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        dequantise4<KV>(wlo[ks], scale_lo, a[blk][ks][0], a[blk][ks][2]);
        dequantise4<KV>(whi[ks], scale_hi, a[blk][ks][1], a[blk][ks][3]);
      }
    }
    {
      constexpr int c = kGroups - 1;
      const uint32_t lo = *reinterpret_cast<const uint32_t*>(raw + c * kRawBlockBytes + g * 64 + 16 * q4 + 4 * warpgroup);
      const uint32_t hi = *reinterpret_cast<const uint32_t*>(raw + c * kRawBlockBytes + (g + 8) * 64 + 16 * q4 + 4 * warpgroup);
      dequantise4<KV>(lo, __float2half2_rn(scales[g * kGroups + c]), a[2][0][0], a[2][0][2]);
      dequantise4<KV>(hi, __float2half2_rn(scales[(g + 8) * kGroups + c]), a[2][0][1], a[2][0][3]);
    }
    // The whole expansion before the one fence: it overlaps the P V still in flight, which a fence waits for (a
    // fence per MMA, or ptxas's own where it sank the expansion past one, serialised the two: 2.58 against 2.47 us
    // a block, H100, session 28).
    pin(a[0]);
    pin(a[1]);
    pin(a[2]);
    part_done(2);
    const uint64_t q_desc = wgmma_desc(sq);
    wgmma_fence();
#pragma unroll
    for (int blk = 0; blk < 2; ++blk)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_m64nNk16_rs<N, true>(s, a[blk][ks], q_desc + ((2 * warpgroup + blk) * N * 64 + ks * 16) * 2 / 16, blk > 0 || ks > 0);
    wgmma_m64nNk16_rs<N, true>(s, a[2][0], q_desc + ((kGroups - 1) * N * 64 + warpgroup * 16) * 2 / 16, 1);
    wgmma_commit();
  };
  // Once this warpgroup's products are done (its P V of the block before read these tile blocks): block `ahead`'s
  // latent columns fp16 into the tile (keys past the segment's end as zeros: 0 x NaN would reach O) and this
  // warpgroup's partial product into shared memory ([warpgroup][fragment value][thread]: one column a load later).
  auto publish = [&]() {
    const bool real_lo = ahead.key0 + g < ahead.s.z, real_hi = ahead.key0 + g + 8 < ahead.s.z;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {  // physical columns 16 q4 .. + 15: k-step s's words 0, 2 (row g), 1, 3 (g + 8)
      uint4* const rows = reinterpret_cast<uint4*>(tile + (2 * warpgroup + blk) * kKeys * 64);
      rows[swz(g, 16 * q4, kKeys) / 8] = real_lo ? make_uint4(a[blk][0][0], a[blk][0][2], a[blk][1][0], a[blk][1][2]) : zero;
      rows[swz(g, 16 * q4 + 8, kKeys) / 8] = real_lo ? make_uint4(a[blk][2][0], a[blk][2][2], a[blk][3][0], a[blk][3][2]) : zero;
      rows[swz(g + 8, 16 * q4, kKeys) / 8] = real_hi ? make_uint4(a[blk][0][1], a[blk][0][3], a[blk][1][1], a[blk][1][3]) : zero;
      rows[swz(g + 8, 16 * q4 + 8, kKeys) / 8] = real_hi ? make_uint4(a[blk][2][1], a[blk][2][3], a[blk][3][1], a[blk][3][3]) : zero;
    }
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) partials[(warpgroup * (N / 2) + 4 * n + i) * 128 + t % 128] = s[n][i];
    fence_proxy_async();  // the tile is read by the tensor cores
  };

  Cursor<kKeys> at(p, mine);
  if (total > 0) {  // the first block's expansion and Q K^T
    prepare(0);
    wgmma_wait<0>();
    publish();
    __syncthreads();
    if (issuer >= 0) load_next();  // block kRing into the slot block 0 left
    spent[2] = 0;  // (counted per block of the walk)
  }
#pragma unroll 1
  for (int j = 0; j < total; ++j) {
    if (p.phases && t == 0) part_start = uint32_t(clock64());
    // ---- The softmax of block j, each warpgroup its columns: the partial products summed and masked; whether
    // any score passes its column's running max by kLazyRescale (log2 units), across the CTA in the barrier's OR;
    // only then the column maxima across the warps.
    const bool last_block = at.last();
    const int key0 = at.key0, k_end = at.s.z, key_lo = key0 + g, key_hi = key0 + g + 8;
    float x_lo[kCols], x_hi[kCols];  // this thread's two scores in each of its columns
    int move = 0;
#pragma unroll
    for (int cs = 0; cs < kCols; ++cs) {
      const int index = kCols * warpgroup + cs, n = index / 2, e = index % 2;
      float lo = 0, hi = 0;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        lo += partials[(w * (N / 2) + 4 * n + e) * 128 + t % 128];
        hi += partials[(w * (N / 2) + 4 * n + 2 + e) * 128 + t % 128];
      }
      const int last = length + column_of(cs) / p.heads;  // causal among the new tokens
      x_lo[cs] = key_lo >= k_end || key_lo > last ? -INFINITY : lo;
      x_hi[cs] = key_hi >= k_end || key_hi > last ? -INFINITY : hi;
      // (-inf - -inf is NaN, which compares false: a column that has seen no key keeps its -inf max)
      move |= (fmaxf(x_lo[cs], x_hi[cs]) - m[cs]) * p.scale_log2 > kLazyRescale;
    }
    part_done(0);
    const bool any_move = __syncthreads_or(move);
    if (any_move) {
#pragma unroll
      for (int cs = 0; cs < kCols; ++cs) {
        float v = fmaxf(x_lo[cs], x_hi[cs]);
        for (int off = 4; off < 32; off <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (lane < 4) maxima[(t % 128 / 32) * N + column_of(cs)] = v;
      }
      __syncthreads();
    }
#pragma unroll
    for (int cs = 0; cs < kCols; ++cs) {  // P^T, the factors; a segment's sums
      const int col = column_of(cs);
      const float prev = m[cs];
      float next = prev;
      if (any_move) {
        const float block_max = fmaxf(fmaxf(maxima[col], maxima[N + col]), fmaxf(maxima[2 * N + col], maxima[3 * N + col]));
        next = (fmaxf(prev, block_max) - prev) * p.scale_log2 > kLazyRescale ? fmaxf(prev, block_max) : prev;
      }
      const float base = next == -INFINITY ? 0.0f : next * p.scale_log2;
      const float alpha = next == prev ? 1.0f : exp2f(prev * p.scale_log2 - base);
      m[cs] = next;
      const __half pr_lo = __float2half_rn(exp2f(x_lo[cs] * p.scale_log2 - base));
      const __half pr_hi = __float2half_rn(exp2f(x_hi[cs] * p.scale_log2 - base));
      l[cs] = l[cs] * alpha + __half2float(pr_lo) + __half2float(pr_hi);  // the rounded values P V uses
      sp[swz(col, g, N)] = pr_lo;
      sp[swz(col, g + 8, N)] = pr_hi;
      if (any_move && t % 128 < 4) factor[col] = alpha;
      if (last_block) {
        float v = l[cs];
        for (int off = 4; off < 32; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane < 4) sums[(t % 128 / 32) * N + col] = v;
      }
    }
    fence_proxy_async();  // P^T is read by the tensor cores
    __syncthreads();
    part_done(1);
    if (last_block && t % 128 < 4)  // the segment's log-sum-exp, each warpgroup its columns
#pragma unroll
      for (int cs = 0; cs < kCols; ++cs) {
        const int col = column_of(cs);
        const float sum = sums[col] + sums[N + col] + sums[2 * N + col] + sums[3 * N + col];
        p.lse_partial[int64_t(at.seg) * p.partial_rows + col] = sum > 0 ? m[cs] * p.scale_log2 + log2f(sum) : -INFINITY;
      }

    // ---- O^T = alpha O^T + V^T P^T (this warpgroup's latent columns 128 warpgroup .. + 127), left in flight while
    // the next block is expanded and its Q K^T issued
    if (any_move)
#pragma unroll
      for (int n = 0; n < N / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float alpha = factor[8 * n + 2 * q4 + e];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) o[mt][n][e] *= alpha, o[mt][n][2 + e] *= alpha;
        }
    {
      const uint64_t p_desc = wgmma_desc(sp), v_desc = wgmma_desc_mn(tile + 2 * warpgroup * kKeys * 64, kKeys);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)  // (the two tiles' chains interleaved)
          wgmma_m64nNk16<N, true, true>(o[mt], v_desc + (mt * kKeys * 64 + ks * 16 * 64) * 2 / 16, p_desc + ks * 16 * 2 / 16, 1);
      wgmma_commit();
    }
    ahead.next(p);
    prepare(j + 1);
    wgmma_wait<0>();
    if (t == 0 && (j == 0 || j == total - 1)) record_clock(p, j == 0 ? kFirstAccumulated : kLastAccumulated);
    if (last_block) {  // normalise and write the segment's output (row = query row, transposed from O^T); O^T restarts
      auto write = [&](auto* out) {
#pragma unroll
        for (int n = 0; n < N / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = 8 * n + 2 * q4 + e;
            const float sum = sums[col] + sums[N + col] + sums[2 * N + col] + sums[3 * N + col];
            const float f = sum > 0 ? 1.0f / sum : 0.0f;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              const int column = 128 * warpgroup + 64 * mt + g;
              using T = std::remove_pointer_t<decltype(out)>;
              if constexpr (std::is_same_v<T, float>) {
                out[col * kLatent + column] = o[mt][n][e] * f;
                out[col * kLatent + column + 8] = o[mt][n][2 + e] * f;
              } else {
                out[col * kLatent + column] = __float2bfloat16_rn(o[mt][n][e] * f);
                out[col * kLatent + column + 8] = __float2bfloat16_rn(o[mt][n][2 + e] * f);
              }
              o[mt][n][e] = o[mt][n][2 + e] = 0;
            }
          }
      };
      if (at.s.w) write(p.o_lat + int64_t(at.s.x) * p.rows * kLatent);  // whole: final
      else write(p.o_partial + int64_t(at.seg) * p.partial_rows * kLatent);  // merged by combine
    }
    part_done(3);
    bar_sync(kBarOwn + warpgroup, 128);  // this warpgroup's P V is done: the tile blocks it read are free
    publish();
    __syncthreads();  // the tile and the partial products are there; P^T is free; block j + 1's raw bytes are read
    if (issuer >= 0) load_next();  // block j + 1 + kRing into its slot
    part_done(4);
    at.next(p);
  }
  if (t == 0) {
    for (int part = 0; part < 5; ++part) record(p, kSpentSumming + part, spent[part]);
    record_clock(p, kDone), record(p, kTimerExit, global_timer());
  }
}

}  // namespace narrow

// ---- 64-row tiles on two warpgroups that trade roles (FlashMLA's Hopper decode structure) ------------------------
// The fixed roles above cannot shorten a 64-key stage's cycle at 128 heads, where the tensor cores are busy: a
// stage is refilled only after both accumulators' P V products, and its copy's latency then stands between them
// and the next block's Q K^T (session 22: Q in registers, per-box and two-half barriers all left the cycle as it
// was). Here, as in deepseek-ai/FlashMLA's sm90 dense decode (read, not copied), two warpgroups take a pair of
// blocks at a time: warpgroup 0 scores block 2i (stage 0), warpgroup 1 block 2i + 1 (stage 1), each runs its own
// softmax (1 after 0: the running max passes through shared memory), and each holds half of O's columns and
// multiplies both blocks' P into it - its own P from registers, the other's from shared memory. Each of a stage's
// nine 64-column tiles has its own mbarrier, and the next block's tiles are copied as soon as their last reader is
// done (tiles 0-3, warpgroup 0's half of V, after warpgroup 0's products; 4-8 after warpgroup 1's), while the
// other products still run; Q K^T then waits tile by tile. Shared memory: Q (72 KB), two stages (72 KB each), P of
// block 2i (8 KB); P of block 2i + 1 goes where Q's rope tile was, which each warpgroup keeps in registers.
// bf16 caches with whole 64-key blocks in a page (tensor copies) and more than 32 rows a tile (use_seesaw).
namespace seesaw {

using roles::bar_arrive;
using roles::bar_sync;
using roles::store_pair;
using roles::store_rows;

constexpr int kRows = 64, kKeys = 64, kThreads = 256, kTiles = kWidth / 64;
constexpr int kTileElems = kKeys * 64;  // a 64-key x 64-column tile (and a 64-row one of Q)
constexpr size_t kTileBytes = size_t(kTileElems) * 2, kQBytes = size_t(kRows) * kWidth * 2, kStageBytes = kTiles * kTileBytes;
constexpr float kMaxInit = -1e30f;  // finite: a max that saw only masked (-inf) scores stays finite, exp2(old - new) = 1
// Page-table entries are fetched (cp.async, by each warpgroup's first thread) two pairs before their blocks are
// copied, so no copy waits for one: blocks 2i + 6 and 2i + 7 during pair i.
constexpr int kAhead = 8;
struct Meta {
  float m[kRows];          // the running max (scaled, log2 units) after the last block scored
  float scale0[kRows];     // exp2(max before block 2i - max after it)
  float scale1[kRows];     // exp2(max after block 2i - max after block 2i + 1)
  float sums[2][kRows];    // each warpgroup's row sums, at a segment's end
  uint64_t tile[2][kTiles];  // [stage][tile] landed
  int32_t ahead[2][kAhead];  // each warpgroup's page-table entries of the blocks ahead: block b's at [b % kAhead]
  int32_t onward[2][2];      // each warpgroup's slots of the next segment's blocks 0 and 1 (-1: none)
  uint64_t q_landed;         // the segment's Q tiles landed (see copy_next_q)
};
// Where the CTA's shared memory holds Q, the two stages, block 2i's P and the warpgroups' exchange.
struct Smem {
  __nv_bfloat16 *q, *stage0, *stage1, *p0;
  Meta* meta;
};
constexpr size_t kSmemBytes = kQBytes + 2 * kStageBytes + kTileBytes + sizeof(Meta) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
// Named barriers (0 is __syncthreads), 256 threads each: one warpgroup arrives, the other waits.
constexpr int kBarScale0 = 1,   // 0 -> 1: block 2i's max and scale0 are there
    kBarScale1 = 2,             // 1 -> 0: block 2i + 1's max and scale1 are there
    kBarP0 = 3,                 // 0 -> 1: block 2i's P (rescaled to the pair's max) is in its buffer
    kBarRemoteIssued = 4,       // 1 -> 0: block 2i + 1's P is in its buffer (and warpgroup 1's products issued)
    kBarOwn = 5;                // + warpgroup: that warpgroup's 128 threads

#define DSLAB_WGMMA_M64N64K16_RS(T) \
 asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
   "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " " \
   "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n" \
   : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) \
   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))

// S[64 x 64] (+)= A[64 x 16] (registers: this thread's fragment) · B[64 x 16]^T: Q's rope tile against K's.
__device__ inline void wgmma_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  DSLAB_WGMMA_M64N64K16_RS("bf16");
}
#define DSLAB_WGMMA_M64N256K16_RS_VT(T) \
 asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n" \
   "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " " \
   "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
   : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3]) \
   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
#define DSLAB_WGMMA_M64N256K16_SS_VT(T) \
 asm volatile("{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n" \
   "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " " \
   "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n" \
   : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3]) \
   : "l"(a), "l"(b))
// O[:, 0 .. 255] += P[64 x 16] (registers, or a K-major shared tile) · V[16 x 256] (MN-major): one MMA a k16 step
// for a warpgroup's half of O (FlashMLA's shape; the threads of this 256-thread kernel may hold its 128 floats).
__device__ inline void wgmma_m64n256k16_rs_vt(float (&d)[32][4], const uint32_t (&a)[4], uint64_t b) { DSLAB_WGMMA_M64N256K16_RS_VT("bf16"); }
__device__ inline void wgmma_m64n256k16_ss_vt(float (&d)[32][4], uint64_t a, uint64_t b) { DSLAB_WGMMA_M64N256K16_SS_VT("bf16"); }
#undef DSLAB_WGMMA_M64N64K16_RS
#undef DSLAB_WGMMA_M64N256K16_RS_VT
#undef DSLAB_WGMMA_M64N256K16_SS_VT

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The per-thread view of a warpgroup's 64-row tile: rows r_lo and r_hi, columns (lane % 4) * 2 (+ 1) of each 8.
struct Lane {
  int t, lane, r_lo, r_hi;
  __device__ explicit Lane(int thread) : t(thread % 128), lane(thread % 32), r_lo((t / 32) * 16 + lane / 4), r_hi(r_lo + 8) {}
  __device__ int col(int n) const { return n * 8 + (lane % 4) * 2; }
};

// Copies tiles [kFirst, kEnd) of the block whose first key sits in `slot` into `stage`, each counted on its own
// mbarrier. (One thread.)
template <int kFirst, int kEnd>
__device__ __forceinline__ void copy_tiles(const Params& p, __nv_bfloat16* stage, uint64_t* landed, int slot) {
#pragma unroll
  for (int c = kFirst; c < kEnd; ++c) {
    mbarrier_expect_bytes(&landed[c], uint32_t(kTileBytes));
    tma_load(stage + c * kTileElems, &p.kv_map, c * 64, slot, &landed[c]);
  }
}

// S (+)= Q K^T over tiles kFirst .. kEnd - 1 (taken mod 9), each once its copy has landed; one commit group a tile,
// a fence after each wait (a wait loop between MMAs otherwise made ptxas serialise them: C7520, session 22). Q's
// rope tile (8) comes from registers.
template <int kFirst, int kEnd>
__device__ __forceinline__ void score_tiles(float (&s)[8][4], uint64_t q_desc, uint64_t k_desc, const uint32_t (&q_rope)[4][4],
                                            uint64_t* landed, int parity, bool zero_first) {
#pragma unroll
  for (int i = kFirst; i < kEnd; ++i) {
    const int c = i % kTiles;
    mbarrier_wait(&landed[c], parity);
    if (i == kFirst) pin(s);  // (later tiles accumulate into S in flight: no other instruction may touch it)
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int accumulate = i == kFirst && ks == 0 && zero_first ? 0 : 1;
      const uint64_t b = k_desc + (c * kTileElems + ks * 16) * 2 / 16;
      if (c == kTiles - 1) wgmma_m64n64k16_rs(s, q_rope[ks], b, accumulate);
      else wgmma_m64nNk16<64>(s, q_desc + (c * kTileElems + ks * 16) * 2 / 16, b, accumulate);
    }
    wgmma_commit();
  }
}

// -inf where a key lies past the segment's end or after the row's own position (MTP tokens are causal).
__device__ __forceinline__ void mask_scores(float (&s)[8][4], const Lane& l, int key0, int k_end, int last_lo, int last_hi) {
  if (key0 + kKeys <= min(k_end, min(last_lo, last_hi) + 1)) return;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = key0 + l.col(n) + e;
      if (key >= k_end || key > last_lo) s[n][e] = -INFINITY;
      if (key >= k_end || key > last_hi) s[n][2 + e] = -INFINITY;
    }
}

// A block's V rows past the segment's end become zeros (P is 0 there, but 0 x V is not 0 where V is NaN: a slot
// never written), by the 128 threads of the warpgroup that scored it, before anyone multiplies by it.
__device__ __forceinline__ void clear_rows_past(__nv_bfloat16* stage, int valid_keys, int t, int barrier) {
#pragma unroll 1
  for (int c = 0; c < kTiles - 1; ++c) {
    uint4* const rows = reinterpret_cast<uint4*>(stage + c * kTileElems);
    for (int row = valid_keys + t / 8; row < kKeys; row += 16) rows[row * 8 + t % 8] = make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async();
  bar_sync(barrier, 128);
}

// Row max of S (this thread's quad), scaled; with it and the running max, this block's scale for what came before.
__device__ __forceinline__ float row_max(const float (&s)[8][4], int half, float scale_log2) {
  float mx = -INFINITY;
#pragma unroll
  for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  return mx * scale_log2;
}
// S -> exp2(S scale - max) in place, their sum; the A fragments of P for the P V product (k16 step ks: keys 16 ks..).
__device__ __forceinline__ float exponentiate(float (&s)[8][4], int half, float scale_log2, float max) {
  float sum = 0;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[n][2 * half + e] = exp2f(s[n][2 * half + e] * scale_log2 - max);
      sum += s[n][2 * half + e];
    }
  return sum;
}
__device__ __forceinline__ void p_fragments(const float (&s)[8][4], uint32_t (&a)[4][4], float scale_lo, float scale_hi) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    a[ks][0] = pack_bf16(s[2 * ks][0] * scale_lo, s[2 * ks][1] * scale_lo);
    a[ks][1] = pack_bf16(s[2 * ks][2] * scale_hi, s[2 * ks][3] * scale_hi);
    a[ks][2] = pack_bf16(s[2 * ks + 1][0] * scale_lo, s[2 * ks + 1][1] * scale_lo);
    a[ks][3] = pack_bf16(s[2 * ks + 1][2] * scale_hi, s[2 * ks + 1][3] * scale_hi);
  }
}
// The same fragments into a 64 x 64 K-major tile (the other warpgroup's A operand).
__device__ __forceinline__ void store_p(__nv_bfloat16* sp, const uint32_t (&a)[4][4], const Lane& l) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = l.col(2 * ks + h);
      *reinterpret_cast<uint32_t*>(sp + swz(l.r_lo, col, kRows)) = a[ks][2 * h];
      *reinterpret_cast<uint32_t*>(sp + swz(l.r_hi, col, kRows)) = a[ks][2 * h + 1];
    }
}
__device__ __forceinline__ void scale_rows(float (&o)[32][4], float lo, float hi) {
  // (a warp's 16 rows mostly keep their max once a few blocks are in: exactly 1 then, nothing to multiply)
  if (!__any_sync(0xffffffffu, lo != 1.0f || hi != 1.0f)) return;
#pragma unroll
  for (int n = 0; n < 32; ++n) {  // (an index, not a range: the range loop stayed a loop, O in local memory)
    o[n][0] *= lo;
    o[n][1] *= lo;
    o[n][2] *= hi;
    o[n][3] *= hi;
  }
}
// Until none of this warpgroup's MMAs is in flight; O and S are read only after it.
template <int N>
__device__ __forceinline__ void wait_pinned(float (&o)[32][4], float (&s)[8][4]) {
  wgmma_wait<N>();
  pin(o);
  pin(s);
}
// O += P V over this warpgroup's 256 columns of the block in `v_desc` (its first column tile), P from registers
// or from shared memory.
__device__ __forceinline__ void multiply_own(float (&o)[32][4], uint32_t (&a)[4][4], uint64_t v_desc) {
  pin(o);
  pin(a);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_m64n256k16_rs_vt(o, a[ks], v_desc + ks * 16 * 64 * 2 / 16);
  wgmma_commit();
}
// (kChained: an MMA into O is still in flight, O must not be touched, not even pinned: C7515)
template <bool kChained>
__device__ __forceinline__ void multiply_other(float (&o)[32][4], uint64_t p_desc, uint64_t v_desc) {
  if constexpr (!kChained) pin(o);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_m64n256k16_ss_vt(o, p_desc + ks * 16 * 2 / 16, v_desc + ks * 16 * 64 * 2 / 16);
  wgmma_commit();
}

// What both warpgroups know about the segment being walked.
struct Segment {
  int key0, k_end, blocks, last_lo, last_hi;  // key0: its first key; last_*: this thread's rows' last key
  const int32_t* page_table;
  // The page-table entry of block b's first key, and the slot of that key given the entry (a block lies in one page).
  __device__ const int32_t* entry_of(const Params& p, int b) const {
    const int key = key0 + b * kKeys;
    return page_table + (p.page_shift >= 0 ? key >> p.page_shift : key / int(p.cache.page_size));
  }
  __device__ int slot_at(const Params& p, int b, int32_t entry) const {
    const int key = key0 + b * kKeys;
    return int(int64_t(entry) * p.cache.page_size + (p.page_shift >= 0 ? key & (int(p.cache.page_size) - 1) : key % int(p.cache.page_size)));
  }
  __device__ int slot_of(const Params& p, int b) const { return slot_at(p, b, *entry_of(p, b)); }
  // From the warpgroup's ring (fetched by fetch_ahead at least a pair ago; its own first thread only).
  __device__ int slot_ahead(const Params& p, const Meta* meta, int warpgroup, int b) const {
    return slot_at(p, b, meta->ahead[warpgroup][b % kAhead]);
  }
  __device__ void fetch_ahead(const Params& p, Meta* meta, int warpgroup, int b) const {
    if (b < blocks) cp_async4(&meta->ahead[warpgroup][b % kAhead], entry_of(p, b), true);
  }
};

// Pair i's bookkeeping of the blocks ahead, by a warpgroup's first thread: the slots of blocks 2i + 2 and 2i + 3
// (this pair's copies), and the entries of blocks 2i + 6 and 2i + 7. (Copying the next blocks' rope tiles at the
// pair's start, their only reader done, and an L2 prefetch of blocks 2i + 4 and 2i + 5 both made the kernel
// slower: 5-10% and a further 5-10%; an L2 prefetch of blocks 2i + 2 and 2i + 3 alone 14-23%; H100, session 23.)
template <bool kNext0, bool kNext1>
__device__ __forceinline__ void look_ahead(const Params& p, const Segment& g, int i, Meta* meta, int warpgroup, int& next0, int& next1) {
  cp_async_wait<0>();  // (this thread's entries fetched during the last pair)
  if (kNext0) next0 = g.slot_ahead(p, meta, warpgroup, 2 * i + 2);
  if (kNext1) next1 = g.slot_ahead(p, meta, warpgroup, 2 * i + 3);
  g.fetch_ahead(p, meta, warpgroup, 2 * i + 6);
  g.fetch_ahead(p, meta, warpgroup, 2 * i + 7);
  cp_async_commit();
}

// A segment's last blocks are followed in their stages by the next segment's blocks 0 (stage 0) and 1 (stage 1),
// copied by the same warpgroups and tiles as within a segment once the last pair's products are done (before the
// segment's output is written and the next Q loaded), so that the CTA's copies run on across segments rather than
// start after each segment's output. (At V3's roofline-v3 points, two whole requests a CTA, this measured the same
// as copying at each segment's start, 0.98-1.07 both ways, H100, session 23; it spares a drain per segment where a
// CTA walks many short ones.) Warpgroup w's first thread copies its tiles of stage `st`: 0-3 (warpgroup 0) or 4-8
// (warpgroup 1).
__device__ __forceinline__ void copy_onward(const Params& p, const Meta* meta, int warpgroup, int st, __nv_bfloat16* stage) {
  const int slot = meta->onward[warpgroup][st];
  if (slot < 0) return;
  if (warpgroup == 0) copy_tiles<0, 4>(p, stage, const_cast<Meta*>(meta)->tile[st], slot);
  else copy_tiles<4, kTiles>(p, stage, const_cast<Meta*>(meta)->tile[st], slot);
}

// The next segment's Q, by warpgroup 0's first thread while this segment ends (q_row: its first row in p.q, -1 where
// this is the CTA's last segment): tiles 0-7 (the latent part) once both warpgroups' last Q K^T is done, announced
// without an arrival so that the phase cannot complete on them alone; tile 8 (rope, where block 2i + 1's P sits until
// the last P V) once warpgroup 0's last P V is done, with the arrival. So the next Q lands while the last products,
// the row sums and the output stores run rather than after them. (Copied after the outputs, 16 bytes a thread, a
// later segment's Q landed ~5 us after the stores and ~16 us after the last pair: the other SMs keep the memory
// system saturated; 128 heads, batch 128, H100, session 26.)
template <int kFirst, int kEnd>
__device__ __forceinline__ void copy_next_q(const Params& p, const Smem& sm, int q_row) {
  if (q_row < 0) return;
  if constexpr (kEnd == kTiles) mbarrier_expect_bytes(&sm.meta->q_landed, uint32_t((kEnd - kFirst) * kTileBytes));
  else mbarrier_expect_tx(&sm.meta->q_landed, uint32_t((kEnd - kFirst) * kTileBytes));
#pragma unroll
  for (int c = kFirst; c < kEnd; ++c) tma_load(sm.q + c * kTileElems, &p.q_map, c * 64, q_row, &sm.meta->q_landed);
}

// One pair of blocks (2i in stage 0, 2i + 1 in stage 1) for warpgroup 0, whose S of block 2i is in `s`. kSecond:
// block 2i + 1 exists; kNext0 / kNext1: blocks 2i + 2 / 2i + 3 exist (copied here, 2i + 2 scored here); without
// block 2i + 2 this is the segment's last pair, which starts the next segment's Q copies (next_q_row: copy_next_q).
template <bool kSecond, bool kNext0, bool kNext1>
__device__ __forceinline__ void pair_wg0(const Params& p, const Segment& g, int i, float (&s)[8][4], float (&o)[32][4], float (&sum)[2],
                                         const Lane& l, const Smem& sm, const uint32_t (&q_rope)[4][4], int& parity0, int next_q_row) {
  Meta* const meta = sm.meta;
  __nv_bfloat16 *const sq = sm.q, *const stage0 = sm.stage0, *const stage1 = sm.stage1, *const sp0 = sm.p0;
  const int key0 = g.key0 + 2 * i * kKeys;
  int next0 = 0, next1 = 0;  // the slots of blocks 2i + 2 and 2i + 3 (thread 0)
  if (l.t == 0) look_ahead<kNext0, kNext1>(p, g, i, meta, 0, next0, next1);
  mask_scores(s, l, key0, g.k_end, g.last_lo, g.last_hi);
  if (key0 + kKeys > g.k_end) clear_rows_past(stage0, g.k_end - key0, l.t, kBarOwn);
  float scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? l.r_hi : l.r_lo;
    const float old = meta->m[r], now = fmaxf(old, row_max(s, h, p.scale_log2));
    scale[h] = exp2f(old - now);
    __syncwarp();
    if (l.lane % 4 == 0) meta->m[r] = now, meta->scale0[r] = scale[h];
    sum[h] = sum[h] * scale[h] + exponentiate(s, h, p.scale_log2, now);
  }
  bar_arrive(kBarScale0, 256);
  scale_rows(o, scale[0], scale[1]);
  uint32_t a[4][4];
  p_fragments(s, a, 1.0f, 1.0f);
  multiply_own(o, a, wgmma_desc_mn(stage0, kKeys));
  wait_pinned<0>(o, s);
  bar_sync(kBarScale1, 256);
  if (kNext0 && l.t == 0) copy_tiles<0, 4>(p, stage0, meta->tile[0], next0);  // (V's left half and Q K^T are done with them)
  if (!kNext0 && l.t == 0) copy_next_q<0, kTiles - 1>(p, sm, next_q_row);  // (warpgroup 1's last S is done: it has scaled)
  const float scale1_lo = meta->scale1[l.r_lo], scale1_hi = meta->scale1[l.r_hi];
  p_fragments(s, a, scale1_lo, scale1_hi);
  store_p(sp0, a, l);
  fence_proxy_async();
  bar_arrive(kBarP0, 256);
  if constexpr (kSecond) {
    bar_sync(kBarRemoteIssued, 256);
    scale_rows(o, scale1_lo, scale1_hi);
    sum[0] *= scale1_lo, sum[1] *= scale1_hi;
    multiply_other<false>(o, wgmma_desc(sq + (kTiles - 1) * kTileElems), wgmma_desc_mn(stage1, kKeys));
  }
  const uint64_t q_desc = wgmma_desc(sq), k_desc = wgmma_desc(stage0);
  if constexpr (kNext0) score_tiles<0, 4>(s, q_desc, k_desc, q_rope, meta->tile[0], parity0, true);
  if constexpr (kNext1) {
    wgmma_wait<4>();  // (block 2i + 1's left half multiplied; S of block 2i + 2 still in flight)
    if (l.t == 0) copy_tiles<0, 4>(p, stage1, meta->tile[1], next1);
  }
  if constexpr (kNext0) {
    score_tiles<4, kTiles>(s, q_desc, k_desc, q_rope, meta->tile[0], parity0, false);
    parity0 ^= 1;
  }
  wait_pinned<0>(o, s);  // (outside the branches: see FlashMLA's note on nvcc serialising the MMAs otherwise)
  if (!kNext0 && l.t == 0) copy_next_q<kTiles - 1, kTiles>(p, sm, next_q_row);  // (its last P V, over Q's rope tile, is done)
}

// The same pair for warpgroup 1, whose S of block 2i + 1 is in `s` (when kSecond).
template <bool kSecond, bool kNext0, bool kNext1>
__device__ __forceinline__ void pair_wg1(const Params& p, const Segment& g, int i, float (&s)[8][4], float (&o)[32][4], float (&sum)[2],
                                         const Lane& l, const Smem& sm, const uint32_t (&q_rope)[4][4], int& parity1) {
  Meta* const meta = sm.meta;
  __nv_bfloat16 *const sq = sm.q, *const stage0 = sm.stage0, *const stage1 = sm.stage1, *const sp0 = sm.p0;
  const int key0 = g.key0 + (2 * i + 1) * kKeys;
  int next0 = 0, next1 = 0;
  if (l.t == 0) look_ahead<kNext0, kNext1>(p, g, i, meta, 1, next0, next1);
  __nv_bfloat16* const sp1 = sq + (kTiles - 1) * kTileElems;  // (over Q's rope tile: kept in registers)
  if constexpr (kSecond) {
    mask_scores(s, l, key0, g.k_end, g.last_lo, g.last_hi);
    if (key0 + kKeys > g.k_end) clear_rows_past(stage1, g.k_end - key0, l.t, kBarOwn + 1);
  }
  bar_sync(kBarScale0, 256);
  float scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? l.r_hi : l.r_lo;
    const float old = meta->m[r], now = kSecond ? fmaxf(old, row_max(s, h, p.scale_log2)) : old;  // (no block: S is not there)
    const float scale1 = exp2f(old - now);
    scale[h] = scale1 * meta->scale0[r];
    __syncwarp();
    if (l.lane % 4 == 0) meta->m[r] = now, meta->scale1[r] = scale1;
    sum[h] = sum[h] * scale[h] + (kSecond ? exponentiate(s, h, p.scale_log2, now) : 0.0f);
  }
  bar_arrive(kBarScale1, 256);
  scale_rows(o, scale[0], scale[1]);
  if constexpr (kSecond) {
    uint32_t a[4][4];
    p_fragments(s, a, 1.0f, 1.0f);
    store_p(sp1, a, l);
    multiply_own(o, a, wgmma_desc_mn(stage1 + 4 * kTileElems, kKeys));
    fence_proxy_async();  // (P of block 2i + 1, for warpgroup 0)
  }
  bar_sync(kBarP0, 256);
  multiply_other<kSecond>(o, wgmma_desc(sp0), wgmma_desc_mn(stage0 + 4 * kTileElems, kKeys));
  if constexpr (kSecond) bar_arrive(kBarRemoteIssued, 256);
  if constexpr (kNext1) {
    wgmma_wait<1>();  // (block 2i + 1's right half multiplied; its rope tile was scored)
    if (l.t == 0) copy_tiles<4, kTiles>(p, stage1, meta->tile[1], next1);
  }
  if constexpr (kNext0) {
    wait_pinned<0>(o, s);  // (block 2i's right half multiplied)
    if (l.t == 0) copy_tiles<4, kTiles>(p, stage0, meta->tile[0], next0);
  }
  if constexpr (kNext1) {
    const uint64_t q_desc = wgmma_desc(sq), k_desc = wgmma_desc(stage1);
    score_tiles<4, kTiles + 4>(s, q_desc, k_desc, q_rope, meta->tile[1], parity1, true);
    parity1 ^= 1;
  }
  wait_pinned<0>(o, s);
}

// Launched with launch_pdl like roles::decode_kernel (its early_loads contract holds here too).
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ Params p) {
  if (p.phases && threadIdx.x == 0) record(p, kTimerEntry, global_timer()), record_clock(p, kEntry);
  if (!p.early_loads) {
    pdl_wait();
    pdl_launch_dependents();
    if (threadIdx.x == 0) record_clock(p, kWaited);
  }
  if (threadIdx.x == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.kv_map) : "memory");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  __nv_bfloat16* const sq = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* const stage0 = reinterpret_cast<__nv_bfloat16*>(smem + kQBytes);
  __nv_bfloat16* const stage1 = reinterpret_cast<__nv_bfloat16*>(smem + kQBytes + kStageBytes);
  __nv_bfloat16* const sp0 = reinterpret_cast<__nv_bfloat16*>(smem + kQBytes + 2 * kStageBytes);
  Meta* const meta = reinterpret_cast<Meta*>(smem + kQBytes + 2 * kStageBytes + kTileBytes);
  const Smem sm{sq, stage0, stage1, sp0, meta};
  if (threadIdx.x == 0) {
    for (int st = 0; st < 2; ++st)
      for (int c = 0; c < kTiles; ++c) mbarrier_init(&meta->tile[st][c], 1);
    mbarrier_init(&meta->q_landed, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int warpgroup = int(threadIdx.x) / 128;
  const Lane l(int(threadIdx.x));
  const int2 mine = p.part_segments[blockIdx.y];
  const int row0 = int(blockIdx.x) * kRows;
  int parity = 0;  // the mbarrier phase of this warpgroup's own stage (the one it scores)
  int q_parity = 0;  // meta->q_landed's
  int next_q_row = -1;  // the next segment's first Q row (thread 0)
  int blocks_walked = 0;
  bool waited = !p.early_loads;
#pragma unroll 1
  for (int seg = mine.x; seg < mine.x + mine.y; ++seg) {
    Segment g;
    const int4 sv = p.segments[seg];
    g.key0 = sv.y, g.k_end = sv.z;
    g.blocks = (sv.z - sv.y + kKeys - 1) / kKeys;
    g.page_table = p.cache.page_table + int64_t(sv.x) * p.cache.pages_per_request;
    // The first two blocks: the CTA's first segment copies them now, a later one's were copied by the segment
    // before (copy_onward).
    if (seg == mine.x && l.t == 0 && warpgroup == 0) copy_tiles<0, kTiles>(p, stage0, meta->tile[0], g.slot_of(p, 0));
    if (seg == mine.x && l.t == 0 && warpgroup == 1 && g.blocks > 1) copy_tiles<0, kTiles>(p, stage1, meta->tile[1], g.slot_of(p, 1));
    if (l.t == 0) {  // (committed below as one group, which look_ahead awaits before its first use of the entries)
      for (int b = 2; b < kAhead; ++b) g.fetch_ahead(p, meta, warpgroup, b);
      // The next segment's first two blocks, for copy_onward (its Q into L2 too: it is loaded once this segment ends;
      // a hint only, so before griddepcontrol.wait too: L2 keeps lines the kernel before still writes coherent).
      meta->onward[warpgroup][0] = meta->onward[warpgroup][1] = -1;
      if (seg + 1 < mine.x + mine.y) {
        Segment n;
        const int4 nv = p.segments[seg + 1];
        n.key0 = nv.y, n.blocks = (nv.z - nv.y + kKeys - 1) / kKeys;
        n.page_table = p.cache.page_table + int64_t(nv.x) * p.cache.pages_per_request;
        meta->onward[warpgroup][0] = n.slot_of(p, 0);
        if (n.blocks > 1) meta->onward[warpgroup][1] = n.slot_of(p, 1);
        if (warpgroup == 0) {
          next_q_row = nv.x * p.rows + row0;
          const __nv_bfloat16* next_q = p.q + int64_t(next_q_row) * kWidth;
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(next_q), "r"(uint32_t(min(kRows, p.rows - row0) * kWidth * 2)) : "memory");
        }
      } else if (warpgroup == 0) {
        next_q_row = -1;
      }
      cp_async_commit();  // (uncommitted, look_ahead's wait would not cover them: Q, copied by cp.async, used to commit them)
    }
    if (seg == mine.x && threadIdx.x == 0) record_clock(p, kLoadsIssued);
    if (!waited) {  // (Q, and a selector's lengths, come from the kernels before)
      pdl_wait();
      pdl_launch_dependents();
      waited = true;
      if (threadIdx.x == 0) record_clock(p, kWaited);
    }
    const int length = p.lengths[sv.x];
    g.last_lo = length + (row0 + l.r_lo) / p.heads;  // causal among the new tokens
    g.last_hi = length + (row0 + l.r_hi) / p.heads;
    if (threadIdx.x < kRows) meta->m[threadIdx.x] = kMaxInit;
    // Q by tensor copies: the CTA's first segment's now (after griddepcontrol.wait: Q comes from the kernels before),
    // a later one's were started as the segment before ended (copy_next_q). (In a 64-row box past the request's rows,
    // the next request's rows, whose outputs are not stored; past the last token's, zeros.)
    if (seg == mine.x && threadIdx.x == 0) copy_next_q<0, kTiles>(p, sm, sv.x * p.rows + row0);
    mbarrier_wait(&meta->q_landed, q_parity);
    q_parity ^= 1;
    __syncthreads();  // (the running max's reset too)
    if (seg == mine.x && threadIdx.x == 0) record_clock(p, kQLanded);
    if (seg == mine.x + 1 && threadIdx.x == 0) record_clock(p, kSecondQLanded);
    uint32_t q_rope[4][4];  // (its tile's place in shared memory takes block 2i + 1's P)
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = kLatent + ks * 16 + h * 8 + (l.lane % 4) * 2;
        q_rope[ks][2 * h] = *reinterpret_cast<const uint32_t*>(sq + swz(l.r_lo, col, kRows));
        q_rope[ks][2 * h + 1] = *reinterpret_cast<const uint32_t*>(sq + swz(l.r_hi, col, kRows));
      }
    float o[32][4];  // this warpgroup's 256 columns of O
#pragma unroll
    for (auto& x : o) x[0] = x[1] = x[2] = x[3] = 0;
    pin(o);  // (zeroed before the first MMAs, not among them)
    float s[8][4];  // S, then P, of this warpgroup's block
#pragma unroll
    for (auto& x : s) x[0] = x[1] = x[2] = x[3] = 0;
    pin(s);  // (else the last segment's P flows into the first Q K^T's accumulators: ptxas serialised every MMA, C7515)
    float sum[2] = {0, 0};
    const uint64_t q_desc = wgmma_desc(sq);
    if (warpgroup == 0 || g.blocks > 1) {  // (one call site: accumulators merged from two made ptxas serialise, C7515)
      score_tiles<0, kTiles>(s, q_desc, wgmma_desc(warpgroup ? stage1 : stage0), q_rope, meta->tile[warpgroup], parity, true);
      parity ^= 1;
    }
    wait_pinned<0>(o, s);
    if (seg == mine.x && threadIdx.x == 0) record_clock(p, kFirstScored);
    // Whole pairs with both next blocks in one loop, the segment's last two or three blocks after it (as in FlashMLA).
#define DSLAB_PAIR(SECOND, NEXT0, NEXT1)                                                                              \
  do {                                                                                                                \
    if (warpgroup == 0) pair_wg0<SECOND, NEXT0, NEXT1>(p, g, i, s, o, sum, l, sm, q_rope, parity, next_q_row);        \
    else pair_wg1<SECOND, NEXT0, NEXT1>(p, g, i, s, o, sum, l, sm, q_rope, parity);                                   \
    if (seg == mine.x && i == 0 && threadIdx.x == 0) record_clock(p, kFirstAccumulated);                              \
    if (seg == mine.x + 1 && i == 0 && threadIdx.x == 0) record_clock(p, kSecondFirstAccumulated);                    \
    ++i;                                                                                                              \
  } while (0)
    int i = 0;
#pragma unroll 1
    while (2 * i + 4 <= g.blocks) DSLAB_PAIR(true, true, true);
    if (g.blocks - 2 * i == 3) {
      DSLAB_PAIR(true, true, false);
      DSLAB_PAIR(false, false, false);
    } else if (g.blocks - 2 * i == 2) {
      DSLAB_PAIR(true, false, false);
    } else {
      DSLAB_PAIR(false, false, false);
    }
#undef DSLAB_PAIR
    if (l.t == 0) {  // (each warpgroup's products over both stages are done: its last pair ended with a wait)
      copy_onward(p, meta, warpgroup, 0, stage0);
      copy_onward(p, meta, warpgroup, 1, stage1);
    }
    blocks_walked += g.blocks;
    if (threadIdx.x == 0 && seg + 1 == mine.x + mine.y) record_clock(p, kLastAccumulated);
    if (threadIdx.x == 0 && seg == mine.x && mine.y > 1) record_clock(p, kFirstSegmentAccumulated);
    // The segment's row sums (both warpgroups'), then this warpgroup's 256 columns of O and the log-sum-exp.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    }
    if (l.lane % 4 == 0) meta->sums[warpgroup][l.r_lo] = sum[0], meta->sums[warpgroup][l.r_hi] = sum[1];
    __syncthreads();
    const float total_lo = meta->sums[0][l.r_lo] + meta->sums[1][l.r_lo], total_hi = meta->sums[0][l.r_hi] + meta->sums[1][l.r_hi];
    const float inv_lo = total_lo > 0 ? 1.0f / total_lo : 0.0f, inv_hi = total_hi > 0 ? 1.0f / total_hi : 0.0f;
    const bool real_rows = row0 + (l.t / 32) * 16 < p.rows;  // (a warp holds 16 rows; rows come in multiples of 16)
    auto write = [&](auto* out) {
      if constexpr (std::is_same_v<decltype(out), __nv_bfloat16*>) {
        store_rows(real_rows, out, o, l.r_lo, l.r_hi, inv_lo, inv_hi, l.lane);
      } else {  // (a partial, fp32: traded between neighbours for 16-byte stores, it spilled registers here)
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          store_pair(real_rows, out + l.r_lo * kLatent + l.col(n), o[n][0] * inv_lo, o[n][1] * inv_lo);
          store_pair(real_rows, out + l.r_hi * kLatent + l.col(n), o[n][2] * inv_hi, o[n][3] * inv_hi);
        }
      }
    };
    const int cbase = warpgroup * 256;
    const int4 done = p.segments[seg];  // (read again rather than held through the segment)
    if (done.w) {
      write(p.o_lat + (int64_t(done.x) * p.rows + row0) * kLatent + cbase);
    } else {
      write(p.o_partial + (int64_t(seg) * p.partial_rows + row0) * kLatent + cbase);
      if (warpgroup == 0 && l.lane % 4 == 0) {
        float* lse = p.lse_partial + int64_t(seg) * p.partial_rows + row0;
        lse[l.r_lo] = total_lo > 0 ? meta->m[l.r_lo] + log2f(total_lo) : -INFINITY;
        lse[l.r_hi] = total_hi > 0 ? meta->m[l.r_hi] + log2f(total_hi) : -INFINITY;
      }
    }
    __syncthreads();  // (the running max and the sums are read; Q and the stages are free)
    if (threadIdx.x == 0 && seg == mine.x && mine.y > 1) record_clock(p, kFirstSegmentWritten);
  }
  if (!waited) {
    pdl_wait();
    pdl_launch_dependents();
  }
  if (threadIdx.x == 0) record(p, kBlocks, (unsigned long long)blocks_walked), record_clock(p, kDone), record(p, kTimerExit, global_timer());
}

}  // namespace seesaw

// One CTA per (part, row tile), blocks of KEYS keys; the kernel's shared-memory allowance raised on its first launch.
// The grid is (row tiles, parts): a part's row tiles (128 heads: two) are adjacent in launch order, so they run in the
// same wave and the second CTA to copy a block finds it in L2. (With (parts, row tiles) and more CTAs than SMs, every
// tile-0 CTA ran in the first wave and every tile-1 CTA in the second, each block read from memory twice: 3.0 us a
// block against 2.0, 128 heads, batch 128, kv_splits 128, H100, session 26.)
template <KvDtype KV, int KEYS>
void launch_decode_geometry(const Params& params, dim3 grid, cudaStream_t stream) {
  static const bool configured = [] {
    DSLAB_CUDA(cudaFuncSetAttribute(roles::decode_kernel<KV, KEYS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(roles::Geometry<KEYS>::kSmemBytes)));
    return true;
  }();
  (void)configured;
  launch_pdl(roles::decode_kernel<KV, KEYS>, grid, dim3(roles::kThreads), roles::Geometry<KEYS>::kSmemBytes, stream, params);
  DSLAB_CHECK_LAUNCH();
}

// With blocks of `block_keys` (32 or 64) keys.
template <KvDtype KV>
void launch_decode_kernel(const Params& params, int parts, int row_tiles, int block_keys, cudaStream_t stream) {
  const dim3 grid{unsigned(row_tiles), unsigned(parts)};
  if constexpr (KV == KvDtype::bf16)
    if (block_keys == 32) return launch_decode_geometry<KV, 32>(params, grid, stream);
  if (block_keys != 64) throw std::logic_error("mla/fused/cuda: quantised caches take 64-key blocks");
  launch_decode_geometry<KV, 64>(params, grid, stream);
}

// The narrow kernel (see narrow) where it applies: a quantised cache copied in whole 64-key blocks (tensor copies)
// and at most 32 rows (16 or 32: rows come in multiples of 16).
bool use_narrow(bool tma, int64_t rows, KvDtype kv) { return tma && rows <= 32 && kv != KvDtype::bf16; }
template <KvDtype KV, int N>
void launch_narrow_rows(const Params& params, int parts, cudaStream_t stream) {
  static const bool configured = [] {
    DSLAB_CUDA(cudaFuncSetAttribute(narrow::decode_kernel<KV, N>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(narrow::Layout<N>::kSmemBytes)));
    return true;
  }();
  (void)configured;
  launch_pdl(narrow::decode_kernel<KV, N>, dim3(1, unsigned(parts)), dim3(narrow::kThreads), narrow::Layout<N>::kSmemBytes, stream, params);
  DSLAB_CHECK_LAUNCH();
}
template <KvDtype KV>
void launch_narrow(const Params& params, int parts, cudaStream_t stream) {
  if (params.rows == 16) launch_narrow_rows<KV, 16>(params, parts, stream);
  else launch_narrow_rows<KV, 32>(params, parts, stream);
}

// The two-warpgroup kernel (see seesaw) where it applies: a bf16 cache copied in whole 64-key blocks (tensor copies)
// and 64-key blocks chosen (more than 32 rows a tile).
bool use_seesaw(bool tma, int block_keys, KvDtype kv) { return tma && block_keys == 64 && kv == KvDtype::bf16; }
void launch_seesaw(const Params& params, int parts, int row_tiles, cudaStream_t stream) {
  static const bool configured = [] {
    DSLAB_CUDA(cudaFuncSetAttribute(seesaw::decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(seesaw::kSmemBytes)));
    return true;
  }();
  (void)configured;
  launch_pdl(seesaw::decode_kernel, dim3(unsigned(row_tiles), unsigned(parts)), dim3(seesaw::kThreads), seesaw::kSmemBytes, stream, params);
  DSLAB_CHECK_LAUNCH();
}

// Keys a block (see roles): 32 where a 64-row tile holds at most 32 real rows (16 heads, or 16 with an MTP token)
// of a bf16 cache, else 64. (A quantised block expanded in 32-key stages ran 4-7% slower, H100, session 21.)
int block_keys_for(int64_t rows, KvDtype kv) { return rows <= 32 && kv == KvDtype::bf16 ? 32 : 64; }

int page_shift(int64_t page_size) {
  for (int shift = 0; shift < 31; ++shift)
    if (int64_t(1) << shift == page_size) return shift;
  return -1;
}

class FusedCuda final : public MlaOp {
 public:
  FusedCuda() : MlaOp(Algo::a_cc_me, /*fused=*/true) {}
  // Block-sparse: the kernel walks the selector's pages (see PageSelector).
  explicit FusedCuda(std::unique_ptr<PageSelector> selector) : MlaOp(Algo::a_cc_me, /*fused=*/true), selector_(std::move(selector)) {}
  bool sparse() const override { return selector_ != nullptr; }
  int64_t attended_keys(int64_t keys, int64_t page_size, const Shape& s) const override {
    return selector_ ? selector_->kept_keys(keys, page_size, s) : keys;
  }
  Cost selection_cost(const ModelConfig& m, const Shape& s, int64_t page_size) const override {
    return selector_ ? selector_->cost(m, s, page_size) : Cost{};
  }
  std::vector<std::vector<int64_t>> attended_key_indices() const override { return selector_ ? selector_->key_indices() : std::vector<std::vector<int64_t>>{}; }
  std::map<std::string, double> selection_counters() const override { return selector_ ? selector_->launch_counters() : std::map<std::string, double>{}; }
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
  // per_block); the other phases are absent from its results. The narrow kernel (quantised caches at 16 heads)
  // records loads_issued, q_landed, first_block_landed, first_block_scored, first/last_block_accumulated and done,
  // and per block (its totals over the CTA's blocks over their count) block_sum, block_softmax, block_expand,
  // block_score and block_publish: the parts of its step (see Phase). decode_phase_us.last_done: the slowest CTA's
  // done (each phase above is the median over CTAs).
  std::map<std::string, double> phase_counters() override;

 protected:
  bool supports_kv_dtype(KvDtype d) const override { return !selector_ || d == KvDtype::bf16; }  // (the bounds read bf16 pages)
  std::string form_unsupported(const ModelConfig& m, const Shape& s) const override { return selector_ ? selector_->unsupported(m, s) : ""; }
  void prepare_form() override {
    if (selector_) selector_->prepare(m_, s_, *b_.cache, b_.lengths, arena_);
    const int64_t T = s_.tokens(), M = s_.q_len * nh_;
    if (M % 16) throw BadInput("mla/fused/cuda: heads x q_len must be a multiple of 16, got " + std::to_string(M));
    // 64-row tiles always (16 heads pad 16 rows to 64: the spare MMA rows cost less than a lockstep kernel's
    // softmax stalls at 16- or 32-row tiles, measured 0.59-0.90 vs 0.55-0.83 of the roofline on the H200).
    row_tiles_ = int((M + roles::kRows - 1) / roles::kRows);
    parts_ = parts_for(s_);
    // A request split across CTAs crosses at most one run boundary per piece: segments <= batch + parts.
    max_segments_ = int(s_.batch) + parts_;
    if (parts_ + 1 > kCombineMaxSegments) throw std::logic_error("mla/fused/cuda: more splits per request than the combine kernel merges");
    q_cat_buffer_.scratch(arena_, size_t(T * nh_ * width_));
    q_cat_ = q_cat_buffer_.get();
    o_lat_.scratch(arena_, size_t(T * nh_ * r_));
    o_partial_.scratch(arena_, size_t(max_segments_) * size_t(row_tiles_ * roles::kRows) * kLatent);
    lse_partial_.scratch(arena_, size_t(max_segments_) * size_t(row_tiles_ * roles::kRows));
    block_keys_ = block_keys_for(M, s_.kv_dtype);
    tma_ = b_.cache->page_size % block_keys_ == 0;
    if (tma_) kv_map_ = cache_tensor_map(*b_.cache, block_keys_);
    if (use_seesaw(tma_, block_keys_, s_.kv_dtype))  // (its Q tiles; a token selector's steps may still take the fixed roles)
      q_map_ = tensor_map_2d(q_cat_, T * nh_, kWidth, 2, roles::kRows, 64, /*swizzle_128b=*/true);
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
    const int used = s_.kv_splits > 0 ? parts_ : auto_kv_splits(walked, s_.q_len, kBlockKeys, parts_);
    // Cut in the kernel's blocks: in 64-key units the 16-head step's 64 requests of 4K (65 units each, 4160 in all)
    // came to 32 units on each of 130 CTAs, two SMs idle; in 32-key blocks, 63 on each of 132 (1.6% fewer keys a
    // CTA; measured: the kernel the same within noise, the step 0.3% faster; H100, session 26).
    const SplitKv plan = split_kv(walked, s_.q_len, block_keys_, used, /*whole_requests=*/true);
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
    for (size_t i = 0; i < plan.requests.size(); ++i) req[2 * i] = plan.requests[i].first, req[2 * i + 1] = plan.requests[i].count;
    out.segments = int(plan.segments.size());
    out.merges = std::any_of(plan.requests.begin(), plan.requests.end(), [](const auto& r) { return r.count > 1; });
    merges_ = merges_ || out.merges;
    return out;
  }
  // The cache as a 2-D tensor [slots][576] for the tensor memory accelerator, block_keys x 64-column boxes: bf16
  // swizzled as the MMAs read them; int8 / fp8 as they are, for the scorer to expand (see roles::Geometry).
  static CUtensorMap cache_tensor_map(const PagedLatentCache& c, int block_keys) {
    const bool bf16 = c.dtype == KvDtype::bf16;
    const int element_bytes = bf16 ? 2 : 1;
    return tensor_map_2d(c.values.get(), int64_t(c.values.size()) / (kWidth * element_bytes), kWidth, element_bytes, block_keys, 64, bf16);
  }
  void attend() override {
    const int M = int(s_.q_len * nh_);
    concat_query();
    mark("absorb_q");
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
    Params params{kv_map_, q_map_, tma_ && view.page_size % block_keys_ == 0, q_cat_, view, lengths, segments, part_segments,
                  o_partial_.get(), lse_partial_.get(), M, int(nh_), int(s_.q_len), float(scale_ * M_LOG2E),
                  page_shift(view.page_size), row_tiles_ * roles::kRows, o_lat_.get(), record_phases_ ? phases_.get() : nullptr,
                  /*early_loads=*/!selector_};
    if (use_seesaw(params.tma, block_keys_, s_.kv_dtype)) launch_seesaw(params, parts_, row_tiles_, stream_);
    else if (use_narrow(params.tma, M, s_.kv_dtype)) {
      if (s_.kv_dtype == KvDtype::int8) launch_narrow<KvDtype::int8>(params, parts_, stream_);
      else launch_narrow<KvDtype::fp8_e4m3>(params, parts_, stream_);
    } else switch (s_.kv_dtype) {
      case KvDtype::bf16: launch_decode_kernel<KvDtype::bf16>(params, parts_, row_tiles_, block_keys_, stream_); break;
      case KvDtype::int8: launch_decode_kernel<KvDtype::int8>(params, parts_, row_tiles_, block_keys_, stream_); break;
      case KvDtype::fp8_e4m3: launch_decode_kernel<KvDtype::fp8_e4m3>(params, parts_, row_tiles_, block_keys_, stream_); break;
    }
    mark("decode");
    if (merges_ || lengths_vary_) {  // (a step replayed with other lengths may split requests this one did not)
      launch_pdl(merge_splits_kernel, dim3(unsigned(M), unsigned(s_.batch)), dim3(kCombineThreads), 0, stream_, 
          o_partial_.get(), lse_partial_.get(), row_tiles_ * roles::kRows, request_segments, M, o_lat_.get());
      DSLAB_CHECK_LAUNCH();
    }
    mark("combine");
    absorb_output(o_lat_.get());
    mark("absorb_o");
  }

 private:
  // Split-KV, balanced (see mla::split_kv): one CTA per SM and row tile, or the kv_splits axis's count.
  static int parts_for(const Shape& s) {
    const int row_tiles = int((s.q_len * s.heads + roles::kRows - 1) / roles::kRows);
    const int per_sm = std::max(1, gpu_info().sms / row_tiles);
    return s.kv_splits > 0 ? int(std::min<int64_t>(s.kv_splits, kCombineMaxSegments - 1)) : per_sm;
  }
  std::unique_ptr<PageSelector> selector_;
  bool record_phases_ = false;
  DeviceArray<unsigned long long> phases_;
  int row_tiles_ = 1, parts_ = 1, max_segments_ = 0, block_keys_ = 64;
  bool tma_ = false;
  mutable bool merges_ = false;  // a schedule made so far splits a request across CTAs, left to combine
  CUtensorMap kv_map_{}, q_map_{};
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

  const std::pair<Phase, const char*> named[] = {{kLoadsIssued, "loads_issued"},         {kQLanded, "q_landed"},
                                                 {kFirstLanded, "first_block_landed"},   {kFirstScored, "first_block_scored"}, {kFirstMaxed, "first_block_maxed"},
                                                 {kFirstHandedOver, "first_block_handed_over"}, {kFirstAccumulated, "first_block_accumulated"},
                                                 {kLastAccumulated, "last_block_accumulated"},   {kDone, "done"},
                                                 {kFirstSegmentAccumulated, "first_segment_accumulated"}, {kFirstSegmentWritten, "first_segment_written"},
                                                 {kSecondQLanded, "second_segment_q_landed"},
                                                 {kSecondFirstAccumulated, "second_segment_first_accumulated"}};
  std::map<std::string, std::vector<double>> us;
  unsigned long long first_entry = ~0ull, last_exit = 0;
  double last_done = 0;
  for (size_t cta = 0; cta < slots / kPhaseSlots; ++cta) {
    const unsigned long long* c = clocks.data() + cta * kPhaseSlots;
    if (c[kBlocks] == 0 || c[kDone] <= c[kEntry] || c[kTimerExit] <= c[kTimerEntry]) continue;  // (no keys: left at once)
    const double us_per_clock = double(c[kTimerExit] - c[kTimerEntry]) * 1e-3 / double(c[kDone] - c[kEntry]);
    us["sm_ghz"].push_back(1e-3 / us_per_clock);
    auto since_wait = [&](Phase ph) { return double(int64_t(c[ph] - c[kWaited])) * us_per_clock; };
    us["wait"].push_back(double(c[kWaited] - c[kEntry]) * us_per_clock);
    for (const auto& [ph, name] : named)
      if (c[ph]) us[name].push_back(since_wait(ph));  // (the two-warpgroup kernel records fewer phases)
    if (c[kBlocks] > 1) us["per_block"].push_back(double(c[kLastAccumulated] - c[kFirstAccumulated]) * us_per_clock / double(c[kBlocks] - 1));
    const std::pair<Phase, const char*> spent[] = {{kSpentSumming, "block_sum"}, {kSpentSoftmax, "block_softmax"}, {kSpentExpanding, "block_expand"},
                                                   {kSpentScoring, "block_score"}, {kSpentPublishing, "block_publish"}};
    for (const auto& [ph, name] : spent)  // (the narrow kernel's per-block parts: totals over the CTA's blocks)
      if (c[ph]) us[name].push_back(double(c[ph]) * us_per_clock / double(c[kBlocks]));
    us["blocks"].push_back(double(c[kBlocks]));
    last_done = std::max(last_done, since_wait(kDone));
    first_entry = std::min(first_entry, c[kTimerEntry]), last_exit = std::max(last_exit, c[kTimerExit]);
  }
  std::map<std::string, double> out;
  if (us.empty()) return out;
  for (auto& [name, v] : us) {
    std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
    out[(name == "blocks" || name == "sm_ghz" ? "decode_phase." : "decode_phase_us.") + name] = v[v.size() / 2];
  }
  out["decode_phase.working_ctas"] = double(us["blocks"].size());
  out["decode_phase.block_keys"] = double(block_keys_);  // (blocks and per_block count blocks of this many keys)
  out["decode_phase_us.span"] = double(last_exit - first_entry) * 1e-3;
  out["decode_phase_us.last_done"] = last_done;  // (the slowest CTA's done: against the median's, the tail's cost)
  return out;
}

}  // namespace

std::unique_ptr<MlaOp> make_fused_op(std::unique_ptr<PageSelector> selector) { return std::make_unique<FusedCuda>(std::move(selector)); }

DSLAB_REGISTER_MLA_OP(FusedCuda, "mla/fused/cuda",
                       "fused decode: split-KV online-softmax MQA over the paged latent (warpgroup MMAs; 128 heads: FlashMLA's two-warpgroup seesaw; 16 heads int8/fp8: keys along the MMA rows, expanded into registers), bf16/int8/fp8 cache");

}  // namespace dslab::mla::cuda
