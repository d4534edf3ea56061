// The fused MLA decode's shared pieces (mla/fused/cuda, host.cu): the kernels' parameters and phase clocks, the
// device helpers more than one of its kernels uses, and the launchers each kernel's unit defines - sm90_bf16_h16.cu
// (warpgroups with fixed roles: every case the others do not take), sm90_bf16_h128.cu (two warpgroups trading a pair
// of blocks: bf16 at 128 heads), sm90_fp8_h16.cu (fp8 at 16 rows: FP8 Q K^T from the landed block, P V from registers),
// sm90_int8_h16.cu (int8 at 16 heads, int8 / fp8 with an MTP token: producers expand, consumers multiply). The
// split-KV plan, the combine kernel and the op are host.cu's.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "harness/errors.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/cuda/tma.cuh"
#include "variants/common/cuda/wgmma.cuh"
#include "variants/mla/cuda/kernels.cuh"
#include "variants/mla/cuda/mla_cuda.h"

namespace dslab::mla::cuda::fused_decode {

constexpr int kWidth = 576;  // latent 512 ‖ rope 64: every DeepSeek config
constexpr int kLatent = 512;
constexpr int kChunks = kWidth / 8;  // 16-byte chunks per key row
constexpr int kGroups = kWidth / kQuantGroup;
constexpr int kTileRows = 64;  // the fixed-role and two-warpgroup kernels' row tile (16 or 32 rows padded)
// The lazy rescale (fixed-role and narrow kernels): a row's running max moves only when a block's exceeds it by more
// than this (log2 units), so P stays <= 2^8 and the rescale of O is skipped on almost every block.
constexpr float kLazyRescale = 8.0f;

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
      if constexpr (std::is_same_v<T, float>)
        asm volatile("" : "+f"(r[i][j])::"memory");
      else
        asm volatile("" : "+r"(r[i][j])::"memory");
    }
}

struct Params {
  CUtensorMap kv_map;  // the cache as a [slots][576] tensor, 64 x 64 boxes (when tma)
  CUtensorMap q_map;   // q as a [tokens x heads][576] tensor, 64 x 64 boxes (the two-warpgroup kernel's Q tiles)
  CUtensorMap o_map;   // o_lat as a [tokens x heads][512] tensor, 64 x 64 boxes (the two-warpgroup kernel's outputs)
  bool tma;            // page_size a multiple of 64: blocks copied by the tensor memory accelerator
  const __nv_bfloat16* q;  // [tokens][heads][576]: [q_nope·W_UK ‖ q_pe]
  CacheView cache;
  const int32_t* lengths;
  const int4* segments;       // request, first key, end key, 1 if the request's only segment: pieces of requests
  const int2* part_segments;  // per CTA column: first segment, count
  float* o_partial;           // [segments][rows][512], each normalised by its own sum
  float* lse_partial;         // [segments][rows], log2 domain
  int rows, heads, q_len;     // rows = q_len * heads
  float scale_log2;           // softmax scale * log2(e)
  int page_shift;             // log2(page_size) when it is a power of two, else -1
  int partial_rows;      // rows of o_partial / lse_partial per segment: row tiles x tile rows (a 64-row tile may pad)
  __nv_bfloat16* o_lat;  // a segment that is its request's only one (w = 1) is written here, final,
                         // instead of as a partial to merge
  unsigned long long* phases;  // null, or kPhaseSlots clocks per CTA (y-major): see Phase
  // The page table and lengths were written before the step (by the host), not by the kernel just before this one:
  // the first blocks' lookups and copies may start before griddepcontrol.wait (see decode_kernel).
  bool early_loads;
  bool evict_first = false;  // the fixed-roles kernel's bf16 tensor copies of blocks: L2 evict_first (l2_evict axis)
};

// Where a CTA's time goes (FusedCuda::phase_counters): the SM's clock64 at each phase, by one thread of the role that
// reaches it; the global timer at entry and exit (across SMs, and the clock's rate); the CTA's block count.
enum Phase : int {
  kTimerEntry,
  kTimerExit,
  kBlocks,
  kEntry,             // thread 0, before griddepcontrol.wait
  kWaited,            // thread 0 (accumulator 0), after it (the kernels before have finished; with early_loads, after
                      // the first copies are queued)
  kLoadsIssued,       // accumulator 0: its first two stages' page lookups and copies queued
  kQLanded,           // scorer 0: Q in shared memory (its first block)
  kFirstLanded,       // scorer 0: block 0's keys in its stage
  kFirstScored,       // scorer 0: block 0's Q K^T done
  kFirstMaxed,        // scorer 0: block 0's row maxima found (masked, reduced across the quad)
  kFirstHandedOver,   // scorer 0: block 0's P and factors handed to the accumulators
  kFirstAccumulated,  // accumulator 0: block 0's P V done
  kLastAccumulated,   // accumulator 0: the last block's P V done
  kDone,              // accumulator 0: its outputs written, leaving
  // Where a CTA walks more than one segment (two-warpgroup kernel only): thread 0 at the end of the first segment's
  // last pair, when its outputs are written, when the second segment's Q has landed, and at the end of its first
  // pair - what a switch costs; and between them: entering the first segment's last pair, its end, its row sums
  // exchanged, its outputs' stores issued (by thread 0's warp), the second segment's first two blocks scored.
  kFirstSegmentAccumulated,
  kFirstSegmentWritten,
  kSecondQLanded,
  kSecondFirstAccumulated,
  kFirstSegmentLastPairs,
  kFirstSegmentSummed,
  kFirstSegmentStored,
  kSecondScored,
  kFirstSegmentLastPair,
  kLastSegmentLastPairs,
  // The narrow kernel: clocks summed over the CTA's blocks, per part of a block's step - the scorer's thread 0
  // waiting for the tile, Q K^T issued and awaited, the softmax through P^T's hand-over, P V issued and a segment's
  // writes; the first producer's thread waiting for a half-block's copies, for a tile to be free, and expanding it.
  // The fp8 kernel: the scorer's thread 0 waiting for the block, Q K^T (and its scales), the softmax through P^T's
  // hand-over; the first accumulator thread waiting for the block (landing_wait), reading and expanding its part
  // (expand), waiting for P^T (p_wait), and P V with a segment's writes (accumulate).
  kSpentTileWait,
  kSpentScoring,
  kSpentSoftmax,
  kSpentAccumulating,
  kSpentLandingWait,
  kSpentTileFreeWait,
  kSpentExpanding,
  kSpentPWait,
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
// This SM's clock where the step records phases (p.phases: the one switch every kernel's clocks go through), else 0.
__device__ __forceinline__ uint32_t phase_clock(const Params& p) { return p.phases ? uint32_t(clock64()) : 0; }

// ---- Helpers more than one kernel uses ------------------------------------------------------------------------
__device__ inline void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ inline void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// Eight bf16 values to fp16 in place, saturated to +-65504 rather than infinite (a quantised cache's Q).
__device__ inline void bf16_chunk_to_half(uint4* chunk) {
  uint4 v = *chunk;
  uint32_t* const w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n"
        : "=r"(w[i])
        : "f"(f.y), "f"(f.x));  // (the first operand to the high half)
  }
  *chunk = v;
}

// The OR of `pred` over the `count` threads of named barrier `id` (all of them arrive).
__device__ __forceinline__ bool bar_or(int id, int count, bool pred) {
  uint32_t out;
  asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
               : "=r"(out)
               : "r"(uint32_t(pred)), "r"(id), "r"(count)
               : "memory");
  return out != 0;
}

// 2^x on the special-function unit alone (exp2f adds a range reduction for denormal results): the narrow, fp8 and
// two-warpgroup kernels round P to fp16 / bf16 and scale fp32 sums by the factors, all far coarser than its 2^-22
// error.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Four quantised values (column order, the first in the low byte) times their scale, as two fp16 pairs: e4m3 pairs
// to fp16 pairs exactly in one conversion each, int8 as 1152 + q in fp16's bits (exact) less 1152; then one fp16
// multiply a pair. Expanded to bf16 through fp32 this took eight conversions per four values, which run at a
// sixteenth of the FMA rate: a scorer spent ~2.5 of the ~3 us a block on it at 16 heads, and fp8 ran barely
// faster than bf16 (H100, V3 batch 64: 851 against 875 us at 32K keys). fp16 holds every expanded
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

// Two adjacent output values, fp32 (a partial) or bf16 (final), where `real` (a padding row's are not stored). A
// predicated store rather than a branch: a branch around the stores made ptxas serialise the warpgroup MMAs.
__device__ inline void store_pair(bool real, float* dst, float a, float b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p st.global.v2.f32 [%1], {%2, %3};\n}\n" ::"r"(int(real)),
               "l"(dst), "f"(a), "f"(b)
               : "memory");
}
__device__ inline void store_pair(bool real, __nv_bfloat16* dst, float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p st.global.b32 [%1], %2;\n}\n" ::"r"(int(real)), "l"(dst),
               "r"(*reinterpret_cast<const uint32_t*>(&v))
               : "memory");
}
// Clocks one thread sums over a CTA's blocks, one per part of a block's step (the narrow and fp8 kernels' phase
// counters): begin() where a block's step starts, done(part) where each part ends, record_into() the phase slots.
template <int kParts>
struct PartClocks {
  bool on;  // phase counters asked for, and this the thread that keeps them
  uint32_t spent[kParts] = {};
  uint32_t start = 0;
  __device__ explicit PartClocks(bool keeper) : on(keeper) {}
  __device__ __forceinline__ void begin() {
    if (on) start = uint32_t(clock64());
  }
  __device__ __forceinline__ void done(int part) {
    if (on) {
      const uint32_t now = uint32_t(clock64());
      spent[part] += now - start;
      start = now;
    }
  }
  __device__ void record_into(const Params& p, const Phase (&slots)[kParts]) const {
    if (on)
      for (int i = 0; i < kParts; ++i) record(p, slots[i], spent[i]);
  }
};

// The scorer's softmax over one block (the narrow and fp8 kernels; their scorer is warpgroup 0). S^T's fragments
// in `s`: key rows g and g + 8; this thread's kCols query rows column_of(i) = 8 (i / 2) + 2 q4 + i % 2, in slots
// [i / 2][i % 2] (key g) and [i / 2][2 + i % 2] (key g + 8). Masks keys past the segment's end and past a row's causal
// last key; moves a row's running max only where the block's passes it by kLazyRescale (log2 units) - asked across the
// warpgroup in one barrier OR, the column maxima gathered only then; waits for P^T buffer pb to be handed back
// (`reuse`: it has been handed over before); writes P^T (fp16, swizzled: the P V MMAs' B), the rescale factors where a
// max moved, a segment's sums at its last block; hands the buffer over. `alpha` gets the factors and the result says
// whether any max moved (the narrow scorer rescales its own O by them).
struct SoftmaxShared {
  float* maxima;   // [4 warps][N]
  float* sums;     // [P^T buffer][4 warps][N]
  float* factors;  // [P^T buffer][N]
  int* moved;      // [P^T buffer]: whether any factor is not 1
  __half* pt;      // [P^T buffer][N x kKeys]
};
struct SoftmaxHandOver {
  int pb;                            // the P^T buffer
  bool reuse;                        // it was handed over before: wait for `free_bar` first
  int free_bar, ready_bar, threads;  // named barriers (the buffer's) and the threads on them (scorer + accumulators)
};
constexpr int kBarScorer = 1;  // the scorer warpgroup's own named barrier (both kernels)

template <int N, int kKeys, int kCols>
__device__ __forceinline__ bool softmax_to_pt(float (&s)[kCols / 2][4], float (&m)[kCols], float (&l)[kCols],
                                              float (&alpha)[kCols], const int (&token_of)[kCols], int key_lo,
                                              int k_end, int length, bool last, float scale_log2,
                                              const SoftmaxShared& shared, const SoftmaxHandOver& h) {
  const int t = int(threadIdx.x), lane = t % 32, warp = t / 32, q4 = lane % 4, g = warp * 16 + lane / 4;
  auto column_of = [&](int i) { return 8 * (i / 2) + 2 * q4 + i % 2; };
  const int key_hi = key_lo + 8;
  int move = 0;
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int n = i / 2, e = i % 2, last_key = length + token_of[i];
    s[n][e] = key_lo >= k_end || key_lo > last_key ? -INFINITY : s[n][e];
    s[n][2 + e] = key_hi >= k_end || key_hi > last_key ? -INFINITY : s[n][2 + e];
    // (-inf - -inf is NaN, which compares false: a column that has seen no key keeps its -inf max)
    move |= (fmaxf(s[n][e], s[n][2 + e]) - m[i]) * scale_log2 > kLazyRescale;
  }
  const bool any_move = bar_or(kBarScorer, 128, move);
  if (any_move) {
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      float x = fmaxf(s[i / 2][i % 2], s[i / 2][2 + i % 2]);
      for (int off = 4; off < 32; off <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
      if (lane < 4) shared.maxima[warp * N + column_of(i)] = x;
    }
    bar_sync(kBarScorer, 128);
  }
  if (h.reuse) bar_sync(h.free_bar, h.threads);  // the accumulators are done with this buffer
  __half* const pt = shared.pt + h.pb * N * kKeys;
  const float* const maxima = shared.maxima;
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const int n = i / 2, e = i % 2, col = column_of(i);
    const float prev = m[i];
    float next = prev;
    if (any_move) {
      const float block_max =
          fmaxf(fmaxf(maxima[col], maxima[N + col]), fmaxf(maxima[2 * N + col], maxima[3 * N + col]));
      next = (fmaxf(prev, block_max) - prev) * scale_log2 > kLazyRescale ? fmaxf(prev, block_max) : prev;
    }
    const float base = next == -INFINITY ? 0.0f : next * scale_log2;
    alpha[i] = next == prev ? 1.0f : fast_exp2(prev * scale_log2 - base);
    m[i] = next;
    const __half pr_lo = __float2half_rn(fast_exp2(s[n][e] * scale_log2 - base));
    const __half pr_hi = __float2half_rn(fast_exp2(s[n][2 + e] * scale_log2 - base));
    l[i] = l[i] * alpha[i] + __half2float(pr_lo) + __half2float(pr_hi);  // the rounded values P V uses
    pt[swz(col, g, N)] = pr_lo;
    pt[swz(col, g + 8, N)] = pr_hi;
    if (any_move && t < 4) shared.factors[h.pb * N + col] = alpha[i];
    if (last) {
      float x = l[i];
      for (int off = 4; off < 32; off <<= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
      if (lane < 4) shared.sums[h.pb * 4 * N + warp * N + col] = x;
    }
  }
  if (t == 0) shared.moved[h.pb] = any_move;
  fence_proxy_async();  // P^T is read by the tensor cores
  bar_sync(kBarScorer, 128);
  bar_arrive(h.ready_bar, h.threads);
  return any_move;
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

// Launches kernel K (launch_pdl: see pdl.cuh), its dynamic shared-memory allowance raised to `smem` on its first
// launch.
template <auto K>
void launch_decode(dim3 grid, dim3 threads, size_t smem, cudaStream_t stream, const Params& params) {
  static const bool configured = [smem] {
    DSLAB_CUDA(cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)configured;
  launch_pdl(K, grid, threads, smem, stream, params);
  DSLAB_CHECK_LAUNCH();
}

// ---- Launchers (each kernel's unit): the kernel for `params`, its shared-memory allowance raised on first use.
// Fixed roles (sm90_bf16_h16.cu): blocks of `block_keys` (32 or 64) keys, a CTA per (row tile, part).
void launch_roles(const Params& params, KvDtype kv, int parts, int row_tiles, int block_keys, cudaStream_t stream);
// The two-warpgroup kernel (sm90_bf16_h128.cu) where it applies: a bf16 cache copied in whole 64-key blocks (tensor
// copies) and 64-key blocks chosen (more than 32 rows a tile).
bool use_seesaw(bool tma, int block_keys, KvDtype kv);
// evict_first: the kernel's block and Q copies leave L2 first (see FusedCuda::schedule: where segments are short, so
// switches are many and the lines they need, other than the stream, are worth keeping).
void launch_seesaw(const Params& params, int parts, int row_tiles, bool evict_first, cudaStream_t stream);
// The narrow kernel (sm90_int8_h16.cu) where it applies: a quantised cache copied in whole 64-key blocks (tensor
// copies) and at most 32 rows (16 or 32: rows come in multiples of 16). Its copies are half-blocks: kv_map's boxes
// are kNarrowBoxKeys keys tall for it.
constexpr int kNarrowBoxKeys = 32;
bool use_narrow(bool tma, int64_t rows, KvDtype kv);
void launch_narrow(const Params& params, KvDtype kv, int parts, cudaStream_t stream);
// The fp8 kernel (sm90_fp8_h16.cu), taken before the narrow one where it applies: an fp8 cache copied in whole 64-key
// blocks (kv_map's boxes 64 keys x 64 bytes, 64-byte swizzle) and exactly 16 rows.
bool use_fp8(bool tma, int64_t rows, KvDtype kv);
void launch_fp8(const Params& params, int parts, cudaStream_t stream);

// ---- Dispatch: which kernel runs a step. host.cu's table, keyed by architecture, rows a tile holds, cache dtype and
// whether the cache's blocks come by tensor copies; its first entry that applies wins, the last applies to all.
enum class DecodeKernel { sm90_bf16_h128, sm90_fp8_h16, sm90_int8_h16, sm90_bf16_h16 };
struct DecodeKey {
  int arch;      // compute capability, major * 10 + minor
  int64_t rows;  // q rows a request has: heads x q_len
  KvDtype kv;
  bool tma;        // whole blocks of the kernel's keys in a page: the cache is copied by the tensor memory accelerator
  int block_keys;  // keys a block (block_keys_for)
};
DecodeKernel pick_decode_kernel(const DecodeKey& key);
const char* decode_kernel_name(DecodeKernel kernel);

}  // namespace dslab::mla::cuda::fused_decode
