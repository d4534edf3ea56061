// mla/fused/cuda's kernel with fixed warpgroup roles (see namespace roles below): every case the two-warpgroup and
// narrow kernels do not take - 16 heads bf16, 128 heads quantised, pages smaller than a block, a token selector's keys.
#include <type_traits>

#include "harness/errors.h"
#include "variants/mla/cuda/fused/common.cuh"

namespace dslab::mla::cuda::fused_decode {

// ---- PTX wrappers --------------------------------------------------------------------------------------

// Q and K tiles in shared memory are in the layout Hopper's warpgroup MMA reads (variants/common/cuda/wgmma.cuh: swz,
// wgmma_desc): the 576 columns are 9 blocks of 64. The 8 rows an ldmatrix reads fall in 8 different bank groups, and
// a wgmma descriptor can address any 8-row x 64-column atom.

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
// keys or four of 32 (block j in stage j % stages), Q and the stages fill the shared memory. A CTA walks its segments
// as one flat run of blocks, so the pipeline does not drain where a request ends. An int8 / fp8 block (half the bytes
// of a bf16 one, plus a scale per 64 values) lands in the upper half of its stage; its scorer expands it to fp16 in
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
// softmax and P V before its next copy can start, the copy's latency the longest link (measured on the H100): four
// 32-key stages release a stage half a block sooner (16 heads: -1 to -3% at batch 64-128, and the first block's
// softmax no longer waits behind the second block's Q K^T), but a 64 x 32 Q K^T reads all of Q for half the keys,
// and at 128 heads, where the tensor cores are busy, it made the kernel 20% slower (H100). So 32-key
// stages for a bf16 64-row tile of at most 32 real rows, 64-key stages otherwise (block_keys_for). cp.async copies take
// a block 4 threads a key, kHalfKeys keys a pass; tensor copies take it in KEYS-key boxes, one per 64-column block
// (where a page holds whole blocks).
constexpr int kRows = 64, kThreads = 512, kHalfKeys = 32;
// 512 threads start with 128 registers each; the scorers give up 40 so that each accumulator thread can hold its
// 128 floats of O. (setmaxnreg.inc takes only what a .dec in the same CTA gave back: counts adding up to more than
// the CTA launched with deadlock it - a 384-thread variant with Q in one scorer's registers did.)
constexpr int kScorerRegisters = 88, kAccumulatorRegisters = 168;
static_assert(2 * kScorerRegisters + 2 * kAccumulatorRegisters <= 4 * (65536 / kThreads), "what the CTA launched with");
constexpr int kReadyThreads = 384;  // one scorer arrives, both accumulators wait
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
  static constexpr int kRawOffset = int(kStageBytes) - kGroups * kRawBlockBytes - kScaleBytes,
                       kScalesOffset = int(kStageBytes) - kScaleBytes;
  static_assert(kRawOffset % 16 == 0 && kScalesOffset % 16 == 0, "bulk copies land 16-byte aligned");
  static constexpr int kBarMax = kBarReady + kStages, kBarAccumulators = kBarMax + 2,
                       kBarCleared = kBarAccumulators + 1;
  static_assert(kBarCleared + 1 < 16, "16 named barriers");
};

// P [kRows][KEYS] bf16 (or fp16) as the P V product's K-major A operand: 64 keys, 128-byte rows in the 128-byte
// swizzle (as every tile here); 32 keys, 64-byte rows in the 64-byte swizzle (wgmma.cuh). Element offset of
// (row, col), and the descriptor.
template <int KEYS>
__device__ __forceinline__ int p_offset(int row, int col) {
  if constexpr (KEYS == 64)
    return swz(row, col, KEYS);
  else
    return swz64(row, col);
}
template <int KEYS>
__device__ __forceinline__ uint64_t p_desc_of(const void* p) {
  if constexpr (KEYS == 64)
    return wgmma_desc(p);
  else
    return wgmma_desc_sw64(p);
}
// Expands the quantised block in `stage` (as it landed, see kRawOffset) in place into the fp16 tile both products
// read (fp16): column block c takes bytes [8 KB c, 8 KB (c + 1)). Run by the 128 threads of one scorer, two per key.
// Blocks 0-3 land below the raw bytes; 4 and 5 over raw blocks 0-3, which every thread has read by the first
// barrier; 6-8 over raw blocks 4-8 and the scales, which every thread has read (6-8 into registers) by the second.
template <KvDtype KV>
__device__ __forceinline__ void dequantise_stage(uint8_t* stage, int t, int barrier) {
  using G = Geometry<64>;  // (quantised blocks: 64 keys)
  constexpr int kKeys = G::kKeys, kRawOffset = G::kRawOffset, kScalesOffset = G::kScalesOffset,
                kRawBlockBytes = G::kRawBlockBytes;
  const int key = t / 2, half = t % 2;  // this thread's 32 values of each of its key's column blocks
  const uint8_t* raw = stage + kRawOffset + key * 64 + half * 32;
  const float* scales = reinterpret_cast<const float*>(stage + kScalesOffset) + key * kGroups;
  __half* const tile = reinterpret_cast<__half*>(stage);
  auto load = [&](int c, uint4(&v)[2]) {
    v[0] = *reinterpret_cast<const uint4*>(raw + c * kRawBlockBytes);
    v[1] = *reinterpret_cast<const uint4*>(raw + c * kRawBlockBytes + 16);
  };
  auto expand = [&](int c, const uint4(&v)[2], __half2 scale) {  // 4 chunks of 8 fp16 values, swizzled as the MMAs read
    const uint32_t words[8] = {v[0].x, v[0].y, v[0].z, v[0].w, v[1].x, v[1].y, v[1].z, v[1].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t packed[4];
      dequantise4<KV>(words[2 * i], scale, packed[0], packed[1]);
      dequantise4<KV>(words[2 * i + 1], scale, packed[2], packed[3]);
      *reinterpret_cast<uint4*>(tile + swz(key, c * 64 + half * 32 + i * 8, kKeys)) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
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
    const uint64_t a = q_desc + (block * kRows * 64 + column) * 2 / 16,
                   b = k_desc + (block * KEYS * 64 + column) * 2 / 16;
    wgmma_m64nNk16<KEYS, kHalf>(s, a, b, ks > 0);
  }
  wgmma_commit_and_wait();
}
template <bool kHalf, int KEYS, int kStage>
__device__ __forceinline__ void score_block_in(float (&s)[KEYS / 8][4], uint64_t q_desc) {
  score_block<kHalf, KEYS>(s, q_desc, q_desc + (kQBytes + kStage * Geometry<KEYS>::kStageBytes) / 16);
}

// Launched with launch_pdl (variants/common/cuda/pdl.cuh), it may start while the kernel before it runs. With
// early_loads the accumulators look up and copy the CTA's first two blocks before griddepcontrol.wait, so that a CTA's
// longest wait (page table, then the keys: ~3 us, where a batch-1 CTA's whole walk is ~13 us) overlaps that kernel's
// tail. This reads only what the host wrote before the step (the schedule, the page table) and the cache, where the
// kernel before this one does not write it: every kernel of the step triggers its dependents after its own wait
// (pdl.cuh), so when this one starts, the one before it has passed its wait and every earlier one - the cache write
// among them - has finished. Where the cache write is the kernel just before (the latent norm's launch with the W_UK
// absorb, at 1-2 tokens) and where a selector's page table is, the host turns early loads off: a first block holding
// this step's key was read before it was written (an illegal address in the engine's first step, where lengths are 0;
// mla-fused.md). Q comes from that kernel: the scorers wait before loading it. (Measured with the MoE down GEMM's early
// copies: the V2-Lite batch-1 graph step 3.6% faster, H100.)
template <KvDtype KV, int KEYS>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ Params p) {
  static_assert(KV == KvDtype::bf16 || KEYS == 64, "quantised blocks are 64 keys (block_keys_for)");
  using G = Geometry<KEYS>;
  constexpr int kKeys = G::kKeys, kStages = G::kStages, kPasses = G::kPasses;
  constexpr size_t kStageBytes = G::kStageBytes;
  constexpr int kRawBlockBytes = G::kRawBlockBytes, kScaleBytes = G::kScaleBytes, kRawOffset = G::kRawOffset,
                kScalesOffset = G::kScalesOffset;
  constexpr int kBarMax = G::kBarMax, kBarAccumulators = G::kBarAccumulators, kBarCleared = G::kBarCleared;
  // Quantised blocks expand to fp16 (dequantise4), so Q and P are fp16 there too, every product fp16 x fp16.
  constexpr bool kHalfTiles = KV != KvDtype::bf16;
  using Pair = std::conditional_t<kHalfTiles, __half2, __nv_bfloat162>;
  auto to_pair = [](float a, float b) {
    if constexpr (kHalfTiles)
      return __floats2half2_rn(a, b);
    else
      return __floats2bfloat162_rn(a, b);
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
  float* const handover =
      meta + kStages * 2 * kRows;  // [2][row]: the running max after block j, in [j % 2]; [row]: a row sum
  uint64_t* const landed = reinterpret_cast<uint64_t*>(handover + 3 * kRows);  // [stage]
  if (threadIdx.x == 0)  // arrivals per phase: one per accumulator thread (cp.async), or per warpgroup (tensor copies)
    for (int st = 0; st < kStages; ++st) mbarrier_init(&landed[st], p.tma ? 2 : 256);
  __syncthreads();
  // (Each role reads its own copy of these after setting its register count: values live across the change
  // went to the stack.)
  auto blocks_of = [&](int2 mine) {
    int total = 0;
    for (int seg = mine.x; seg < mine.x + mine.y; ++seg)
      total += (p.segments[seg].z - p.segments[seg].y + kKeys - 1) / kKeys;
    return total;
  };
  const int warpgroup = threadIdx.x / 128;

  if (warpgroup >= 2) {  // ---- a scorer: blocks j with j % 2 == scorer, in stage j % kStages
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kScorerRegisters));
    const int2 mine = p.part_segments[blockIdx.y];
    const int total = blocks_of(mine), row0 = int(blockIdx.x) * kRows;
    const int t = threadIdx.x % 128, lane = t % 32;
    const int r_lo = (t / 32) * 16 + lane / 4,
              r_hi = r_lo + 8;  // the two rows this thread holds in a 64-row wgmma tile
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
        if (scorer == 0)
          score_block_in<kHalfTiles, kKeys, 0>(s, q_desc);
        else
          score_block_in<kHalfTiles, kKeys, 1>(s, q_desc);
      } else {
        score_block<kHalfTiles, kKeys>(s, q_desc, wgmma_desc(keys));
      }
      if (j == 0 && t == 0) record_clock(p, kFirstScored);
      // Mask, then the online softmax. A row lives in one quad of one warp: no exchange across warps.
      if (key0 + kKeys > min(k_end, min(last_lo, last_hi) + 1)) {  // (a block inside the segment and before every
#pragma unroll                                                     //  row's own position needs no mask)
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
      const float new_lo =
          (fmaxf(prev_lo, mx_lo) - prev_lo) * p.scale_log2 > kLazyRescale ? fmaxf(prev_lo, mx_lo) : prev_lo;
      const float new_hi =
          (fmaxf(prev_hi, mx_hi) - prev_hi) * p.scale_log2 > kLazyRescale ? fmaxf(prev_hi, mx_hi) : prev_hi;
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
  const int dst_even = swizzled(c0), dst_odd = swizzled(c0 + 4),
            dst_rope = swizzled(c_rope);  // u even / odd: +4096 u/2
  Cursor<kKeys> lookup_at(p, mine);
  // The next block's page-table entries are fetched a block ahead (look_up, after a block's copies are queued) and
  // turned into slots only when that block's copies are (resolve): consumed at once, the entry's load stalled the
  // accumulators ~1 us a block where every thread looks one up (a token selector's keys: 15% of the DSA decode's
  // warp samples, ncu, H100, V3 batch 16 128K).
  int32_t entry[kPasses] =
      {};  // page-table entry of my key in each pass of the next block (tensor copies: [0], the block's first key)
  int in_page[kPasses] = {};  // the key's offset in its page
  bool has[kPasses] = {};     // whether that key exists
  int64_t slot[kPasses];      // their slots, once resolved; -1: none
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
          cp_async16(stage + kRawOffset + c * kRawBlockBytes + key * 64 + my_part * 16, src + c * 64 + my_part * 16,
                     valid);
        for (int g = my_part; g < kGroups; g += 4)
          cp_async4(stage + kScalesOffset + (key * kGroups + g) * 4, scales + g, valid);
        mbarrier_arrive_on_copies(bar);
      }
    } else if (p.tma) {
      if (t == 0) {
        const int boxes = warpgroup == 0 ? 5 : 4;  // warpgroup 0: latent blocks 0-3 and the rope block; 1: blocks 4-7
        mbarrier_expect_bytes(bar, uint32_t(boxes * kKeys * 128));
        for (int b = 0; b < boxes; ++b) {  // (keys past the segment's end are read but masked)
          const int block = warpgroup == 0 ? (b < 4 ? b : kRopeBlock) : 4 + b;
          if (p.evict_first)
            tma_load(dst + block * kKeys * 64, &p.kv_map, block * 64, int(slot[0]), bar, l2_evict_first());
          else
            tma_load(dst + block * kKeys * 64, &p.kv_map, block * 64, int(slot[0]), bar);
        }
      }
    } else {
#pragma unroll
      for (int half = 0; half < kPasses; ++half) {
        const __nv_bfloat16* src =
            reinterpret_cast<const __nv_bfloat16*>(p.cache.values) + (slot[half] < 0 ? 0 : slot[half]) * kWidth;
        __nv_bfloat16* row = dst + half * kHalfKeys * 64;
#pragma unroll
        for (int u = 0; u < 8; ++u)
          cp_async16(row + (u % 2 ? dst_odd : dst_even) + (u / 2) * kKeys * 64, src + (c0 + 4 * u) * 8,
                     slot[half] >= 0);
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
      // become zeros. Thread t clears 16-byte chunk t % 32 of rows s.z - key0 + t / 32, + 4, ... (whole rows: no
      // swizzle).
      uint4* const chunk =
          reinterpret_cast<uint4*>(sk + stage * kKeys * kWidth + (cbase / 64 + t % 32 / 8) * kKeys * 64 + (t % 8) * 8);
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
      wgmma_m64n128k16_vt<1, kHalfTiles>(o, p_desc + ks * 16 * 2 / 16,
                                         v_desc + (2 * kKeys * 64 + ks * 16 * 64) * 2 / 16);
    }
    wgmma_commit_and_wait();
    if (warpgroup == 0 && t == 0 && (j == 0 || j == total - 1))
      record_clock(p, j == 0 ? kFirstAccumulated : kLastAccumulated);
    if (at.last()) {  // normalise and write the segment's output; the next segment starts from zero
      const float inv_lo = alpha[kRows + r_lo], inv_hi = alpha[kRows + r_hi];
      // A warp holds 16 rows and rows come in multiples of 16: a warp of padding rows (16 or 32 heads) stores
      // nothing (it wrote segment 0's padding rows until 3/4 of a 16-head CTA's 128 KB of stores, ~2.5 us
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
      if (at.s.w)
        write(p.o_lat + (int64_t(at.s.x) * p.rows + row0) * kLatent + cbase);  // whole: final
      else
        write(p.o_partial + (int64_t(at.seg) * p.partial_rows + row0) * kLatent + cbase);  // merged by combine
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

// One CTA per (part, row tile), blocks of KEYS keys; the kernel's shared-memory allowance raised on its first launch.
// The grid is (row tiles, parts): a part's row tiles (128 heads: two) are adjacent in launch order, so they run in the
// same wave and the second CTA to copy a block finds it in L2. (With (parts, row tiles) and more CTAs than SMs, every
// tile-0 CTA ran in the first wave and every tile-1 CTA in the second, each block read from memory twice: 3.0 us a
// block against 2.0, 128 heads, batch 128, kv_splits 128, H100.)
template <KvDtype KV, int KEYS>
void launch_decode_geometry(const Params& params, dim3 grid, cudaStream_t stream) {
  launch_decode<roles::decode_kernel<KV, KEYS>>(grid, dim3(roles::kThreads), roles::Geometry<KEYS>::kSmemBytes, stream,
                                                params);
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

void launch_roles(const Params& params, KvDtype kv, int parts, int row_tiles, int block_keys, cudaStream_t stream) {
  switch (kv) {
    case KvDtype::bf16:
      return launch_decode_kernel<KvDtype::bf16>(params, parts, row_tiles, block_keys, stream);
    case KvDtype::int8:
      return launch_decode_kernel<KvDtype::int8>(params, parts, row_tiles, block_keys, stream);
    case KvDtype::fp8_e4m3:
      return launch_decode_kernel<KvDtype::fp8_e4m3>(params, parts, row_tiles, block_keys, stream);
  }
}

}  // namespace dslab::mla::cuda::fused_decode
