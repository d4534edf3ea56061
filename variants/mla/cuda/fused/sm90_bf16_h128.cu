// mla/fused/cuda's two-warpgroup kernel (FlashMLA's Hopper decode structure): see namespace seesaw below.
#include "harness/errors.h"
#include "variants/mla/cuda/fused/common.cuh"

namespace dslab::mla::cuda::fused_decode {

// ---- 64-row tiles on two warpgroups that trade roles (FlashMLA's Hopper decode structure) ------------------------
// The fixed roles above cannot shorten a 64-key stage's cycle at 128 heads, where the tensor cores are busy: a
// stage is refilled only after both accumulators' P V products, and its copy's latency then stands between them
// and the next block's Q K^T (Q in registers, per-box and two-half barriers all left the cycle as it
// was). Here, as in deepseek-ai/FlashMLA's sm90 dense decode (read, not copied), two warpgroups take a pair of
// blocks at a time: warpgroup 0 scores block 2i (stage 0), warpgroup 1 block 2i + 1 (stage 1), each runs its own
// softmax (1 after 0: the running max passes through shared memory), and each holds half of O's columns and
// multiplies both blocks' P into it - its own P from registers, the other's from shared memory. Each of a stage's
// nine 64-column tiles has its own mbarrier, and the next block's tiles are copied as soon as their last reader is
// done (tiles 0-3, warpgroup 0's half of V, after warpgroup 0's products; 4-8 after warpgroup 1's), while the
// other products still run; Q K^T then waits tile by tile. Shared memory: Q (72 KB), two stages (72 KB each), P of
// block 2i (8 KB); P of block 2i + 1 goes where Q's rope tile was, which each warpgroup keeps in registers; a whole
// request's outputs leave through stage 1.
// bf16 caches with whole 64-key blocks in a page (tensor copies) and more than 32 rows a tile (use_seesaw).
namespace seesaw {

constexpr int kRows = 64, kKeys = 64, kThreads = 256, kTiles = kWidth / 64;
constexpr int kTileElems = kKeys * 64;  // a 64-key x 64-column tile (and a 64-row one of Q)
constexpr size_t kTileBytes = size_t(kTileElems) * 2, kQBytes = size_t(kRows) * kWidth * 2,
                 kStageBytes = kTiles * kTileBytes;
constexpr float kMaxInit =
    -1e30f;  // finite: a max that saw only masked (-inf) scores stays finite, exp2(old - new) = 1
// Page-table entries are fetched (cp.async, by each warpgroup's first thread) two pairs before their blocks are
// copied, so no copy waits for one: blocks 2i + 6 and 2i + 7 during pair i.
constexpr int kAhead = 8;
struct Meta {
  float m[kRows];            // the running max (scaled, log2 units) after the last block scored
  float scale0[kRows];       // exp2(max before block 2i - max after it)
  float scale1[kRows];       // exp2(max after block 2i - max after block 2i + 1)
  float sums[2][kRows];      // each warpgroup's row sums, at a segment's end
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
constexpr int kBarScale0 = 1,  // 0 -> 1: block 2i's max and scale0 are there
    kBarScale1 = 2,            // 1 -> 0: block 2i + 1's max and scale1 are there
    kBarP0 = 3,                // 0 -> 1: block 2i's P (rescaled to the pair's max) is in its buffer
    kBarRemoteIssued = 4,      // 1 -> 0: block 2i + 1's P is in its buffer (and warpgroup 1's products issued)
    kBarOwn = 5;               // + warpgroup: that warpgroup's 128 threads

__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The per-thread view of a warpgroup's 64-row tile: rows r_lo and r_hi, columns (lane % 4) * 2 (+ 1) of each 8.
struct Lane {
  int t, lane, r_lo, r_hi;
  __device__ explicit Lane(int thread)
      : t(thread % 128), lane(thread % 32), r_lo((t / 32) * 16 + lane / 4), r_hi(r_lo + 8) {}
  __device__ int col(int n) const { return n * 8 + (lane % 4) * 2; }
};

// A tensor copy of the box at (x, y) of `map`; kEvictFirst: its lines leave L2 first (launch_seesaw's evict_first).
template <bool kEvictFirst>
__device__ __forceinline__ void copy_box(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  if constexpr (kEvictFirst)
    tma_load(dst, map, x, y, bar, l2_evict_first());
  else
    tma_load(dst, map, x, y, bar);
}

// Copies tiles [kFirst, kEnd) of the block whose first key sits in `slot` into `stage`, each counted on its own
// mbarrier. (One thread.)
template <int kFirst, int kEnd, bool kEvictFirst>
__device__ __forceinline__ void copy_tiles(const Params& p, __nv_bfloat16* stage, uint64_t* landed, int slot) {
#pragma unroll
  for (int c = kFirst; c < kEnd; ++c) {
    mbarrier_expect_bytes(&landed[c], uint32_t(kTileBytes));
    copy_box<kEvictFirst>(stage + c * kTileElems, &p.kv_map, c * 64, slot, &landed[c]);
  }
}

// S (+)= Q K^T over tiles kFirst .. kEnd - 1 (taken mod 9), each once its copy has landed; one commit group a tile,
// a fence after each wait (a wait loop between MMAs otherwise made ptxas serialise them: C7520). Q's
// rope tile (8) comes from registers.
template <int kFirst, int kEnd>
__device__ __forceinline__ void score_tiles(float (&s)[8][4], uint64_t q_desc, uint64_t k_desc,
                                            const uint32_t (&q_rope)[4][4], uint64_t* landed, int parity,
                                            bool zero_first) {
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
      if (c == kTiles - 1)
        wgmma_m64nNk16_rs<64>(s, q_rope[ks], b, accumulate);
      else
        wgmma_m64nNk16<64>(s, q_desc + (c * kTileElems + ks * 16) * 2 / 16, b, accumulate);
    }
    wgmma_commit();
  }
}

// -inf where a key lies past the segment's end or after the row's own position (MTP tokens are causal).
__device__ __forceinline__ void mask_scores(float (&s)[8][4], const Lane& l, int key0, int k_end, int last_lo,
                                            int last_hi) {
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
// (2^x by fast_exp2, the SFU alone: exp2f's range reduction for denormal results took 4 instructions an element, 8%
// of the pairs' loop; without it the kernel is 2.4-4.4% faster at 128 heads, H100.)
__device__ __forceinline__ float exponentiate(float (&s)[8][4], int half, float scale_log2, float max) {
  float sum = 0;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s[n][2 * half + e] = fast_exp2(s[n][2 * half + e] * scale_log2 - max);
      sum += s[n][2 * half + e];
    }
  return sum;
}
__device__ __forceinline__ void p_fragments(const float (&s)[8][4], uint32_t (&a)[4][4], float scale_lo,
                                            float scale_hi) {
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

// A segment is walked in whole pairs: an odd count of blocks gets one more, whose slot is kPaddingSlot - its
// tensor-copy box lies wholly before slot 0 and lands as zeros - and whose scores are masked whole. So every segment
// ends in the same last pair: the kernel has one tail instance, not three (7808 instructions an instance, not 12600),
// and a CTA's switch between requests fetches less code for the first time: 0.6-2.0% faster at 128 heads batch 128
// (4K-8K keys: segments of 65 blocks walked as 66), 1.0-1.3% at batch 64 (H100). The extra block
// is the segment's first, not one past its end: then the last pair holds two real blocks, and the first pair needs
// one block from memory, not two, when every CTA starts (or switches) at once - 0.5-1.7% faster at 128 heads, 4K-8K
// keys, in three interleaved rounds (H100). (Cutting the padded last pair's products to its real keys
// instead gained 0.2%: that pair's time is its chain of hand-overs, not its MMAs.)
constexpr int kPaddingSlot = -kKeys;
// What both warpgroups know about the segment being walked.
struct Segment {
  // key0: block 0's first key (the segment's, or one block before it: the padding block); k_end: past its last key;
  // blocks: n real (n >= 1: split_kv plans no empty segment), walked in n + 1 when n is odd - then held as n + 2, odd,
  // which marks the padding block and leaves the pairs' loop bound (2i + 4 <= blocks) as for n + 1;
  // last_*: this thread's rows' last key
  int key0, k_end, blocks, last_lo, last_hi;
  const int32_t* page_table;
  __device__ void cover(int first_key, int end_key) {
    const int n = (end_key - first_key + kKeys - 1) / kKeys;
    key0 = n & 1 ? first_key - kKeys : first_key, k_end = end_key;
    blocks = n & 1 ? n + 2 : n;
  }
  __device__ bool padded() const { return blocks & 1; }  // block 0 is the padding block
  __device__ int walked() const { return blocks & ~1; }  // the blocks the pairs walk (the padding block among them)
  __device__ bool padding(int b) const { return b == 0 && padded(); }
  // The page-table entry of block b's first key, and the slot of that key given the entry (a block lies in one page).
  __device__ const int32_t* entry_of(const Params& p, int b) const {
    const int key = key0 + b * kKeys;
    return page_table + (p.page_shift >= 0 ? key >> p.page_shift : key / int(p.cache.page_size));
  }
  __device__ int slot_at(const Params& p, int b, int32_t entry) const {
    const int key = key0 + b * kKeys;
    return int(int64_t(entry) * p.cache.page_size +
               (p.page_shift >= 0 ? key & (int(p.cache.page_size) - 1) : key % int(p.cache.page_size)));
  }
  __device__ int slot_of(const Params& p, int b) const {
    return padding(b) ? kPaddingSlot : slot_at(p, b, *entry_of(p, b));
  }
  // From the warpgroup's ring (fetched by fetch_ahead at least a pair ago; its own first thread only).
  __device__ int slot_ahead(const Params& p, const Meta* meta, int warpgroup, int b) const {
    return slot_at(p, b, meta->ahead[warpgroup][b % kAhead]);
  }
  // (b >= 2: never the padding block; past the walk nothing is fetched - no pair copies a block beyond it)
  __device__ void fetch_ahead(const Params& p, Meta* meta, int warpgroup, int b) const {
    if (b < walked()) cp_async4(&meta->ahead[warpgroup][b % kAhead], entry_of(p, b), true);
  }
};

// Pair i's bookkeeping of the blocks ahead, by a warpgroup's first thread: the slots of blocks 2i + 2 and 2i + 3
// (this pair's copies), and the entries of blocks 2i + 6 and 2i + 7. (Copying the next blocks' rope tiles at the
// pair's start, their only reader done, and an L2 prefetch of blocks 2i + 4 and 2i + 5 both made the kernel
// slower: 5-10% and a further 5-10%; an L2 prefetch of blocks 2i + 2 and 2i + 3 alone 14-23%; H100.)
template <bool kNext>
__device__ __forceinline__ void look_ahead(const Params& p, const Segment& g, int i, Meta* meta, int warpgroup,
                                           int& next0, int& next1) {
  cp_async_wait<0>();  // (this thread's entries fetched during the last pair)
  if (kNext) next0 = g.slot_ahead(p, meta, warpgroup, 2 * i + 2), next1 = g.slot_ahead(p, meta, warpgroup, 2 * i + 3);
  g.fetch_ahead(p, meta, warpgroup, 2 * i + 6);
  g.fetch_ahead(p, meta, warpgroup, 2 * i + 7);
  cp_async_commit();
}

// A segment's last blocks are followed in their stages by the next segment's blocks 0 (stage 0) and 1 (stage 1),
// copied by the same warpgroups and tiles as within a segment once the last pair's products are done (before the
// segment's output is written and the next Q loaded), so that the CTA's copies run on across segments rather than
// start after each segment's output. (At V3's roofline-v3 points, two whole requests a CTA, this measured the same
// as copying at each segment's start, 0.98-1.07 both ways, H100; it spares a drain per segment where a
// CTA walks many short ones.) Warpgroup w's first thread copies its tiles of stage `st`: 0-3 (warpgroup 0) or 4-8
// (warpgroup 1).
template <bool kEvictFirst>
__device__ __forceinline__ void copy_onward(const Params& p, const Meta* meta, int warpgroup, int st,
                                            __nv_bfloat16* stage) {
  const int slot = meta->onward[warpgroup][st];
  if (slot == -1) return;  // (no next segment; a padding block, kPaddingSlot, is copied like any)
  if (warpgroup == 0)
    copy_tiles<0, 4, kEvictFirst>(p, stage, const_cast<Meta*>(meta)->tile[st], slot);
  else
    copy_tiles<4, kTiles, kEvictFirst>(p, stage, const_cast<Meta*>(meta)->tile[st], slot);
}

// The next segment's Q, by warpgroup 0's first thread while this segment ends (q_row: its first row in p.q, -1 where
// this is the CTA's last segment): tiles 0-7 (the latent part) once both warpgroups' last Q K^T is done, announced
// without an arrival so that the phase cannot complete on them alone; tile 8 (rope, where block 2i + 1's P sits until
// the last P V) once warpgroup 0's last P V is done, with the arrival. So the next Q lands while the last products,
// the row sums and the output stores run rather than after them. (Copied after the outputs, 16 bytes a thread, a
// later segment's Q landed ~5 us after the stores and ~16 us after the last pair: the other SMs keep the memory
// system saturated; 128 heads, batch 128, H100.)
template <int kFirst, int kEnd, bool kEvictFirst>
__device__ __forceinline__ void copy_next_q(const Params& p, const Smem& sm, int q_row) {
  if (q_row < 0) return;
  if constexpr (kEnd == kTiles)
    mbarrier_expect_bytes(&sm.meta->q_landed, uint32_t((kEnd - kFirst) * kTileBytes));
  else
    mbarrier_expect_tx(&sm.meta->q_landed, uint32_t((kEnd - kFirst) * kTileBytes));
#pragma unroll
  for (int c = kFirst; c < kEnd; ++c)
    copy_box<kEvictFirst>(sm.q + c * kTileElems, &p.q_map, c * 64, q_row, &sm.meta->q_landed);
}

// One pair of blocks (2i in stage 0, 2i + 1 in stage 1) for warpgroup 0, whose S of block 2i is in `s`. kNext:
// blocks 2i + 2 and 2i + 3 exist (copied here, 2i + 2 scored here); without them this is the segment's last pair, which
// starts the next segment's Q copies (next_q_row: copy_next_q).
template <bool kEvictFirst, bool kNext>
__device__ __forceinline__ void pair_wg0(const Params& p, const Segment& g, int i, float (&s)[8][4], float (&o)[32][4],
                                         float (&sum)[2], const Lane& l, const Smem& sm, const uint32_t (&q_rope)[4][4],
                                         int& parity0, int next_q_row) {
  Meta* const meta = sm.meta;
  __nv_bfloat16 *const sq = sm.q, *const stage0 = sm.stage0, *const stage1 = sm.stage1, *const sp0 = sm.p0;
  const int key0 = g.key0 + 2 * i * kKeys;
  int next0 = 0, next1 = 0;  // the slots of blocks 2i + 2 and 2i + 3 (thread 0)
  if (l.t == 0) look_ahead<kNext>(p, g, i, meta, 0, next0, next1);
  const int k_end = i == 0 && g.padded() ? key0 : g.k_end;  // (the padding block: every key masked)
  mask_scores(s, l, key0, k_end, g.last_lo, g.last_hi);
  if (key0 + kKeys > k_end && key0 < k_end) clear_rows_past(stage0, k_end - key0, l.t, kBarOwn);
  float scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? l.r_hi : l.r_lo;
    // (lazy: the reference max moves only when a block's exceeds it by more than kLazyRescale, so the factors are
    // exactly 1 on almost every block and the rescales of O are skipped; P <= 2^kLazyRescale)
    const float old = meta->m[r], block_max = row_max(s, h, p.scale_log2),
                now = block_max > old + kLazyRescale ? block_max : old;
    scale[h] = fast_exp2(old - now);
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
  // (V's left half and Q K^T are done with stage 0's tiles 0-3: block 2i + 2's are copied before the hand-over's
  // barrier, not after it - every microsecond of a copy's lead counts at 128 heads: issued after P's hand-over the
  // kernel was 1.2-1.9% slower, before the barrier 0.3-1.6% faster at batch 128, H100)
  if (kNext && l.t == 0) copy_tiles<0, 4, kEvictFirst>(p, stage0, meta->tile[0], next0);
  bar_sync(kBarScale1, 256);
  if (!kNext && l.t == 0)
    copy_next_q<0, kTiles - 1, kEvictFirst>(p, sm, next_q_row);  // (warpgroup 1's last S is done: it has scaled)
  const float scale1_lo = meta->scale1[l.r_lo], scale1_hi = meta->scale1[l.r_hi];
  p_fragments(s, a, scale1_lo, scale1_hi);
  store_p(sp0, a, l);
  fence_proxy_async();
  bar_arrive(kBarP0, 256);
  bar_sync(kBarRemoteIssued, 256);
  scale_rows(o, scale1_lo, scale1_hi);
  sum[0] *= scale1_lo, sum[1] *= scale1_hi;
  multiply_other<false>(o, wgmma_desc(sq + (kTiles - 1) * kTileElems), wgmma_desc_mn(stage1, kKeys));
  const uint64_t q_desc = wgmma_desc(sq), k_desc = wgmma_desc(stage0);
  if constexpr (kNext) {
    score_tiles<0, 4>(s, q_desc, k_desc, q_rope, meta->tile[0], parity0, true);
    wgmma_wait<4>();  // (block 2i + 1's left half multiplied; S of block 2i + 2 still in flight)
    if (l.t == 0) copy_tiles<0, 4, kEvictFirst>(p, stage1, meta->tile[1], next1);
    score_tiles<4, kTiles>(s, q_desc, k_desc, q_rope, meta->tile[0], parity0, false);
    parity0 ^= 1;
  }
  wait_pinned<0>(o, s);  // (outside the branches: see FlashMLA's note on nvcc serialising the MMAs otherwise)
  if (!kNext && l.t == 0)
    copy_next_q<kTiles - 1, kTiles, kEvictFirst>(p, sm, next_q_row);  // (its last P V, over Q's rope tile, is done)
}

// The same pair for warpgroup 1, whose S of block 2i + 1 is in `s`.
template <bool kEvictFirst, bool kNext>
__device__ __forceinline__ void pair_wg1(const Params& p, const Segment& g, int i, float (&s)[8][4], float (&o)[32][4],
                                         float (&sum)[2], const Lane& l, const Smem& sm, const uint32_t (&q_rope)[4][4],
                                         int& parity1) {
  Meta* const meta = sm.meta;
  __nv_bfloat16 *const sq = sm.q, *const stage0 = sm.stage0, *const stage1 = sm.stage1, *const sp0 = sm.p0;
  const int key0 = g.key0 + (2 * i + 1) * kKeys;
  int next0 = 0, next1 = 0;
  if (l.t == 0) look_ahead<kNext>(p, g, i, meta, 1, next0, next1);
  __nv_bfloat16* const sp1 = sq + (kTiles - 1) * kTileElems;  // (over Q's rope tile: kept in registers)
  mask_scores(s, l, key0, g.k_end, g.last_lo, g.last_hi);
  if (key0 + kKeys > g.k_end)
    clear_rows_past(stage1, g.k_end - key0, l.t, kBarOwn + 1);  // (an odd block: never the padding one)
  bar_sync(kBarScale0, 256);
  float scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? l.r_hi : l.r_lo;
    const float old = meta->m[r], block_max = row_max(s, h, p.scale_log2);
    const float now = block_max > old + kLazyRescale ? block_max : old;  // (lazy, as in pair_wg0)
    const float scale1 = fast_exp2(old - now);
    scale[h] = scale1 * meta->scale0[r];
    __syncwarp();
    if (l.lane % 4 == 0) meta->m[r] = now, meta->scale1[r] = scale1;
    sum[h] = sum[h] * scale[h] + exponentiate(s, h, p.scale_log2, now);
  }
  bar_arrive(kBarScale1, 256);
  scale_rows(o, scale[0], scale[1]);
  uint32_t a[4][4];
  p_fragments(s, a, 1.0f, 1.0f);
  store_p(sp1, a, l);
  multiply_own(o, a, wgmma_desc_mn(stage1 + 4 * kTileElems, kKeys));
  fence_proxy_async();  // (P of block 2i + 1, for warpgroup 0)
  bar_sync(kBarP0, 256);
  multiply_other<true>(o, wgmma_desc(sp0), wgmma_desc_mn(stage0 + 4 * kTileElems, kKeys));
  bar_arrive(kBarRemoteIssued, 256);
  if constexpr (kNext) {
    wgmma_wait<1>();  // (block 2i + 1's right half multiplied; its rope tile was scored)
    if (l.t == 0) copy_tiles<4, kTiles, kEvictFirst>(p, stage1, meta->tile[1], next1);
    wait_pinned<0>(o, s);  // (block 2i's right half multiplied)
    if (l.t == 0) copy_tiles<4, kTiles, kEvictFirst>(p, stage0, meta->tile[0], next0);
    const uint64_t q_desc = wgmma_desc(sq), k_desc = wgmma_desc(stage1);
    score_tiles<4, kTiles + 4>(s, q_desc, k_desc, q_rope, meta->tile[1], parity1, true);
    parity1 ^= 1;
  }
  wait_pinned<0>(o, s);
}

// Launched with launch_pdl like roles::decode_kernel (its early_loads contract holds here too). kEvictFirst:
// launch_seesaw's evict_first (an instance each: chosen at run time inside, the policy's selects grew the pairs' loop
// by 236 instructions and made the kernel 5% slower at 8K-16K keys, H100).
template <bool kEvictFirst>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ Params p) {
  if (p.phases && threadIdx.x == 0) record(p, kTimerEntry, global_timer()), record_clock(p, kEntry);
  if (!p.early_loads) {
    pdl_wait();
    pdl_launch_dependents();
    if (threadIdx.x == 0) record_clock(p, kWaited);
  }
  if (threadIdx.x == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.kv_map) : "memory");
  if (threadIdx.x == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.o_map) : "memory");
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
  int parity = 0;       // the mbarrier phase of this warpgroup's own stage (the one it scores)
  int q_parity = 0;     // meta->q_landed's
  int next_q_row = -1;  // the next segment's first Q row (thread 0)
  bool waited = !p.early_loads;
#pragma unroll 1
  for (int seg = mine.x; seg < mine.x + mine.y; ++seg) {
    Segment g;
    const int4 sv = p.segments[seg];
    g.cover(sv.y, sv.z);
    g.page_table = p.cache.page_table + int64_t(sv.x) * p.cache.pages_per_request;
    // The first two blocks: the CTA's first segment copies them now, a later one's were copied by the segment
    // before (copy_onward).
    if (seg == mine.x && l.t == 0 && warpgroup == 0)
      copy_tiles<0, kTiles, kEvictFirst>(p, stage0, meta->tile[0], g.slot_of(p, 0));
    if (seg == mine.x && l.t == 0 && warpgroup == 1)
      copy_tiles<0, kTiles, kEvictFirst>(p, stage1, meta->tile[1], g.slot_of(p, 1));
    if (l.t == 0) {  // (committed below as one group, which look_ahead awaits before its first use of the entries)
      for (int b = 2; b < kAhead; ++b) g.fetch_ahead(p, meta, warpgroup, b);
      // The next segment's first two blocks, for copy_onward (its Q into L2 too: it is loaded once this segment ends;
      // a hint only, so before griddepcontrol.wait too: L2 keeps lines the kernel before still writes coherent).
      meta->onward[warpgroup][0] = meta->onward[warpgroup][1] = -1;
      if (seg + 1 < mine.x + mine.y) {
        Segment n;
        const int4 nv = p.segments[seg + 1];
        n.cover(nv.y, nv.z);
        n.page_table = p.cache.page_table + int64_t(nv.x) * p.cache.pages_per_request;
        meta->onward[warpgroup][0] = n.slot_of(p, 0);
        meta->onward[warpgroup][1] = n.slot_of(p, 1);
        if (warpgroup == 0) {
          next_q_row = nv.x * p.rows + row0;
          const __nv_bfloat16* next_q = p.q + int64_t(next_q_row) * kWidth;
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(next_q),
                       "r"(uint32_t(min(kRows, p.rows - row0) * kWidth * 2))
                       : "memory");
        }
      } else if (warpgroup == 0) {
        next_q_row = -1;
      }
      cp_async_commit();  // (uncommitted, look_ahead's wait would not cover them: Q, copied by cp.async, used to commit
                          // them)
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
    if (seg == mine.x && threadIdx.x == 0) copy_next_q<0, kTiles, kEvictFirst>(p, sm, sv.x * p.rows + row0);
    mbarrier_wait(&meta->q_landed, q_parity);
    q_parity ^= 1;
    __syncthreads();  // (the running max's reset too)
    if (seg == mine.x && threadIdx.x == 0) record_clock(p, kQLanded);
    if (seg == mine.x + 1 && threadIdx.x == 0) record_clock(p, kSecondQLanded);
    uint32_t q_rope[4][4];  // (its tile's place in shared memory takes block 2i + 1's P)
    {
      // (the lane's row and column through an opaque move: else their 16 addresses were held through the kernel)
      int r_lo = l.r_lo, pair = (l.lane % 4) * 2;
      asm volatile("mov.b32 %0, %0;\nmov.b32 %1, %1;\n" : "+r"(r_lo), "+r"(pair));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int col = kLatent + ks * 16 + h * 8 + pair;
          q_rope[ks][2 * h] = *reinterpret_cast<const uint32_t*>(sq + swz(r_lo, col, kRows));
          q_rope[ks][2 * h + 1] = *reinterpret_cast<const uint32_t*>(sq + swz(r_lo + 8, col, kRows));
        }
    }
    float o[32][4];  // this warpgroup's 256 columns of O
#pragma unroll
    for (auto& x : o) x[0] = x[1] = x[2] = x[3] = 0;
    pin(o);         // (zeroed before the first MMAs, not among them)
    float s[8][4];  // S, then P, of this warpgroup's block
#pragma unroll
    for (auto& x : s) x[0] = x[1] = x[2] = x[3] = 0;
    pin(s);  // (else the last segment's P flows into the first Q K^T's accumulators: ptxas serialised every MMA, C7515)
    float sum[2] = {0, 0};
    const uint64_t q_desc = wgmma_desc(sq);
    if (g.k_end >
        g.key0) {  // (always: but without the branch ptxas spilled 225 words and de-uniformed Q K^T's descriptors)
      score_tiles<0, kTiles>(s, q_desc, wgmma_desc(warpgroup ? stage1 : stage0), q_rope, meta->tile[warpgroup], parity,
                             true);
      parity ^= 1;
    }
    wait_pinned<0>(o, s);
    if (seg == mine.x && threadIdx.x == 0) record_clock(p, kFirstScored);
    if (seg == mine.x + 1 && threadIdx.x == 0) record_clock(p, kSecondScored);
      // Whole pairs with both next blocks in one loop, the segment's last pair after it (as in FlashMLA).
      // (What runs once a segment - the last pair's instance, the outputs, the next segment's top - is slow the first
      // time a CTA runs it: its instructions are fetched then, by every CTA at once. Run twice in a row, the outputs'
      // staging took 2.2-2.7 us, then 0.32-0.35; the last blocks took 13.6-16.0 us at the first segment, 5.4 at the
      // last; 128 heads, batch 128, H100.)
#define DSLAB_PAIR(NEXT)                                                                           \
  do {                                                                                             \
    if (warpgroup == 0)                                                                            \
      pair_wg0<kEvictFirst, NEXT>(p, g, i, s, o, sum, l, sm, q_rope, parity, next_q_row);          \
    else                                                                                           \
      pair_wg1<kEvictFirst, NEXT>(p, g, i, s, o, sum, l, sm, q_rope, parity);                      \
    if (seg == mine.x && i == 0 && threadIdx.x == 0) record_clock(p, kFirstAccumulated);           \
    if (seg == mine.x + 1 && i == 0 && threadIdx.x == 0) record_clock(p, kSecondFirstAccumulated); \
    ++i;                                                                                           \
  } while (0)
    int i = 0;
#pragma unroll 1
    while (2 * i + 4 <= g.blocks) DSLAB_PAIR(true);
    if (seg == mine.x && mine.y > 1 && threadIdx.x == 0) record_clock(p, kFirstSegmentLastPairs);
    if (seg + 1 == mine.x + mine.y && threadIdx.x == 0) record_clock(p, kLastSegmentLastPairs);
    DSLAB_PAIR(false);  // (blocks 2i and 2i + 1: the last pair)
    if (seg == mine.x && mine.y > 1 && threadIdx.x == 0) record_clock(p, kFirstSegmentLastPair);
#undef DSLAB_PAIR
    // A whole request's outputs (bf16, final) leave through stage 1: written there by the threads, then by tensor
    // stores that run on while the next segment starts (a row tile past the request's rows: copied out by the
    // threads), so the next segment's block 1 is copied into stage 1 only once they have read it. (Stored from
    // registers, 16 bytes a lane, the CTAs' stores took 7.9 us at the switch, all CTAs switching at once: the next
    // blocks' and Q's copies in flight; this way 5.5 us and the kernel 0.9-2.7% faster at 128 heads, H100.)
    // A partial (fp32) goes from registers, its log-sum-exp beside it.
    const int4 done = p.segments[seg];  // (read again rather than held through the segment)
    const bool through_stage1 = done.w;
    if (l.t == 0) {  // (each warpgroup's products over both stages are done: its last pair ended with a wait)
      copy_onward<kEvictFirst>(p, meta, warpgroup, 0, stage0);
      if (!through_stage1) copy_onward<kEvictFirst>(p, meta, warpgroup, 1, stage1);
    }
    if (threadIdx.x == 0 && seg + 1 == mine.x + mine.y) record_clock(p, kLastAccumulated);
    if (threadIdx.x == 0 && seg == mine.x && mine.y > 1) record_clock(p, kFirstSegmentAccumulated);
      // The segment's row sums (both warpgroups'), then this warpgroup's 256 columns of O and the log-sum-exp.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    }
    if (l.lane % 4 == 0) {
      int r_lo = l.r_lo;  // (through an opaque move: else its address was computed before the segments and spilled)
      asm volatile("mov.b32 %0, %0;\n" : "+r"(r_lo));
      meta->sums[warpgroup][r_lo] = sum[0], meta->sums[warpgroup][r_lo + 8] = sum[1];
    }
    __syncthreads();
    if (threadIdx.x == 0 && seg == mine.x && mine.y > 1) record_clock(p, kFirstSegmentSummed);
    const float total_lo = meta->sums[0][l.r_lo] + meta->sums[1][l.r_lo],
                total_hi = meta->sums[0][l.r_hi] + meta->sums[1][l.r_hi];
    const float inv_lo = total_lo > 0 ? 1.0f / total_lo : 0.0f, inv_hi = total_hi > 0 ? 1.0f / total_hi : 0.0f;
    if (through_stage1) {  // (bf16 in the tensor copies' 128-byte swizzle: a warp's 4-byte stores hit 32 banks)
      // (swz(row, column, kRows) of the thread's columns, rows r_lo and r_lo + 8 (the same swizzle), from a base taken
      // through an opaque move: else its 64 addresses were computed once, before the pairs, and spilled)
      uint32_t base = smem_addr(stage1) + 2 * uint32_t(l.r_lo * 64 + warpgroup * 4 * kTileElems + (l.lane % 4) * 2),
               chunk = l.r_lo & 7;
      asm volatile("mov.b32 %0, %0;\nmov.b32 %1, %1;\n" : "+r"(base), "+r"(chunk));
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        const uint32_t at = base + 2 * ((n / 8) * kTileElems + (((n % 8) ^ chunk) << 3));
        st_shared_b32(at, pack_bf16(o[n][0] * inv_lo, o[n][1] * inv_lo));
        st_shared_b32(at + 2 * 8 * 64, pack_bf16(o[n][2] * inv_hi, o[n][3] * inv_hi));
      }
      fence_proxy_async();
      __syncthreads();
      if (row0 + kRows <= p.rows) {
        if (threadIdx.x == 0) {
          for (int c = 0; c < kTiles - 1; ++c)
            tma_store(&p.o_map, c * 64, done.x * p.rows + row0, stage1 + c * kTileElems);
          bulk_commit();
          bulk_wait_read<0>();  // (read out of stage 1: the next segment's block 1 may go there once all have passed
                                // the barrier below)
        }
      } else {  // (a tile past the request's rows: its real rows copied out 16 bytes a thread - the box would write the
                // next request's)
        __nv_bfloat16* const out = p.o_lat + (int64_t(done.x) * p.rows + row0) * kLatent;
        for (int at = int(threadIdx.x); at < (p.rows - row0) * (kLatent / 8); at += kThreads) {
          const int row = at / (kLatent / 8), chunk = at % (kLatent / 8);
          const uint4 v = *reinterpret_cast<const uint4*>(stage1 + swz(row, chunk * 8, kRows));
          *reinterpret_cast<uint4*>(out + int64_t(row) * kLatent + chunk * 8) = v;
        }
      }
    } else {  // (fp32, not traded between neighbours for 16-byte stores: that spilled registers here)
      const bool real_rows = row0 + (l.t / 32) * 16 < p.rows;  // (a warp holds 16 rows; rows come in multiples of 16)
      // (the row's start through an opaque move: the 64 stores then differ by constant offsets, not 64 addresses)
      float* at = p.o_partial + (int64_t(seg) * p.partial_rows + row0 + l.r_lo) * kLatent + warpgroup * 256 + l.col(0);
      asm volatile("mov.b64 %0, %0;\n" : "+l"(at));
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        store_pair(real_rows, at + n * 8, o[n][0] * inv_lo, o[n][1] * inv_lo);
        store_pair(real_rows, at + 8 * kLatent + n * 8, o[n][2] * inv_hi, o[n][3] * inv_hi);
      }
      if (warpgroup == 0 && l.lane % 4 == 0) {
        float* lse = p.lse_partial + int64_t(seg) * p.partial_rows + row0;
        lse[l.r_lo] = total_lo > 0 ? meta->m[l.r_lo] + log2f(total_lo) : -INFINITY;
        lse[l.r_hi] = total_hi > 0 ? meta->m[l.r_hi] + log2f(total_hi) : -INFINITY;
      }
    }
    if (threadIdx.x == 0 && seg == mine.x && mine.y > 1) record_clock(p, kFirstSegmentStored);
    __syncthreads();  // (the running max and the sums are read; Q and the stages are free)
    if (threadIdx.x == 0 && seg == mine.x && mine.y > 1) record_clock(p, kFirstSegmentWritten);
    if (through_stage1 && l.t == 0)
      copy_onward<kEvictFirst>(p, meta, warpgroup, 1, stage1);  // (the outputs are out of stage 1)
  }
  if (!waited) {
    pdl_wait();
    pdl_launch_dependents();
  }
  if (threadIdx.x == 0) bulk_wait<0>();  // (the last outputs' tensor stores done before the CTA leaves)
  if (p.phases && threadIdx.x == 0) {    // (counted here: a count held through the segments was spilled)
    unsigned long long blocks_walked = 0;
    for (int seg = mine.x; seg < mine.x + mine.y; ++seg)
      blocks_walked += (p.segments[seg].z - p.segments[seg].y + kKeys - 1) / kKeys;
    record(p, kBlocks, blocks_walked), record_clock(p, kDone), record(p, kTimerExit, global_timer());
  }
}

}  // namespace seesaw

bool use_seesaw(bool tma, int block_keys, KvDtype kv) { return tma && block_keys == 64 && kv == KvDtype::bf16; }
void launch_seesaw(const Params& params, int parts, int row_tiles, bool evict_first, cudaStream_t stream) {
  const dim3 grid{unsigned(row_tiles), unsigned(parts)}, threads{unsigned(seesaw::kThreads)};
  if (evict_first)
    launch_decode<&seesaw::decode_kernel<true>>(grid, threads, seesaw::kSmemBytes, stream, params);
  else
    launch_decode<&seesaw::decode_kernel<false>>(grid, threads, seesaw::kSmemBytes, stream, params);
}

}  // namespace dslab::mla::cuda::fused_decode
