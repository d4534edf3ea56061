// mla/fused/cuda's kernel for int8 / fp8 caches at up to 32 rows (16 heads): see namespace narrow below.
#include <type_traits>

#include "harness/errors.h"
#include "variants/mla/cuda/fused_decode.cuh"

namespace dslab::mla::cuda::fused_decode {

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

constexpr int kKeys = 64, kThreads = 512;
constexpr int kBarOwn = 1;  // + warpgroup: its 128 threads
constexpr int kRawBlockBytes = kKeys * 64, kScaleBytes = kKeys * kGroups * 4;
constexpr int kRawBytes = kGroups * kRawBlockBytes + kScaleBytes;  // a raw block: 9 boxes [key][64 bytes], then the scales [key][group]
static_assert(kRawBytes % 128 == 0, "each ring slot's boxes land 128-byte aligned");
constexpr size_t kTileBytes = size_t(kKeys) * kLatent * 2;  // the latent columns, fp16: 8 blocks [key][64]

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

bool use_narrow(bool tma, int64_t rows, KvDtype kv) { return tma && rows <= 32 && kv != KvDtype::bf16; }
template <KvDtype KV, int N>
void launch_narrow_rows(const Params& params, int parts, cudaStream_t stream) {
  launch_decode<narrow::decode_kernel<KV, N>>(dim3(1, unsigned(parts)), dim3(narrow::kThreads), narrow::Layout<N>::kSmemBytes, stream, params);
}
void launch_narrow(const Params& params, KvDtype kv, int parts, cudaStream_t stream) {
  if (kv == KvDtype::int8) {
    if (params.rows == 16) launch_narrow_rows<KvDtype::int8, 16>(params, parts, stream);
    else launch_narrow_rows<KvDtype::int8, 32>(params, parts, stream);
  } else {
    if (params.rows == 16) launch_narrow_rows<KvDtype::fp8_e4m3, 16>(params, parts, stream);
    else launch_narrow_rows<KvDtype::fp8_e4m3, 32>(params, parts, stream);
  }
}

}  // namespace dslab::mla::cuda::fused_decode
