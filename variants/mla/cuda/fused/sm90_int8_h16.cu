// mla/fused/cuda's kernel for int8 caches at up to 32 rows (16 heads) and fp8 at 32 (with an MTP token; 16 rows of
// fp8 take sm90_fp8_h16.cu's): see namespace narrow below.
#include <type_traits>

#include "harness/errors.h"
#include "variants/mla/cuda/fused/common.cuh"

namespace dslab::mla::cuda::fused_decode {

// ---- Quantised caches at up to 32 rows: producers expand, consumers multiply --------------------------------------
// At 16 heads (32 with an MTP token) the keys are the MMA's rows: S^T = K Q^T (the block's 64 keys are M, the N = 16
// or 32 query rows N) and O^T = V^T P^T (the 512 latent columns are M), so Q and P are read at their real size. An
// earlier form of this kernel had every warpgroup expand a quarter of each block into its own MMA registers and run
// its quarter of both products in lockstep, three CTA-wide barriers a block: it ran ~2.3 us a 64-key block where
// the bytes alone take ~1.75 (H100), and Nsight Compute found it latency-bound (issue slots 43% busy,
// 518 instructions a warp a block, the barriers, the register spills of a 128-register thread and its expansion
// each 14-20% of the stall samples). Here the roles are fixed (their registers set by setmaxnreg) and
// hand over through mbarriers (tiles) and named barriers (P^T):
//  - producers (warpgroups 2-3): wait for a raw half-block (32 keys) in the ring, expand it - fp8/int8 times its
//    per-64-column scale, fp16 - into one of two fp16 tiles [9 column blocks][64 keys][64] (the 128-byte swizzle
//    both products read: K-major for Q K^T, MN-major for P V), keys past the segment's end as zeros (0 x NaN would
//    reach O), and refill the slot; a tile is announced full once both halves are in;
//  - the scorer (warpgroup 0): Q K^T from the tile (36 MMAs, A and B from shared memory), the softmax (the running
//    max moves only where some score passes it by kLazyRescale, which a barrier's OR decides), P^T and the factors
//    into shared memory, then its half of P V (latent columns 0-255), left in flight under the next block's Q K^T;
//  - the second accumulator (warpgroup 1): the other half of P V (columns 256-511) once P^T is announced.
// No barrier spans the CTA inside the walk, and the expansion of block j + 1 runs beside the products of block j.
// Measured (H100, V3 16 heads batch 64 fp8): 2.23-2.25 us a block against the lockstep form's 2.32-2.35,
// the expansion ~1.56 us a block of the producers' time; one consumer warpgroup with three producer warpgroups (P V
// whole, 128-240 registers) ran 2.29 - the expansion no faster with 384 threads than with 256. What bounds it is
// shared memory the roles share: handing tiles back sooner changed nothing (the expansion only ran slower
// beside the products), while halving Q K^T's reads took a block from 2.30 to 2.11 us; fp8 at 16 rows has its own
// kernel since (sm90_fp8_h16.cu). The producers' wait for a free tile under their first loads and store addresses
// computed once: 0.5-1% (H100).
// The raw half-blocks land by tensor copies (a page holds whole 64-key blocks; the map's boxes are 32 keys x 64
// bytes: kv_map from FusedCuda::prepare) plus one bulk copy of their scales; the plan, partial outputs and
// combine are the other kernels'.
namespace narrow {

constexpr int kKeys = 64, kHalfKeys = kNarrowBoxKeys, kThreads = 512;
// Named barriers: the scorer's 128 threads, the producers' 256; P^T's buffers ready (the scorer arrives, the second
// accumulator waits) and free again (the other way round), 256 threads each. (The hand-over between the two consumer
// warpgroups was on mbarriers first: correct, but compute-sanitizer's racecheck does not follow an mbarrier's
// ordering between two warpgroups' ordinary loads and stores - 790 reports on the factors and sums - while it follows
// a named barrier's arrive and sync: H100.)
constexpr int kBarProducers = 2, kBarReady = 3, kBarFree = 5;
// Registers a thread (setmaxnreg; the kernel starts at 65536 / 512 = 128): the consumers' O^T and scores take what
// the producers do not need (at 32 rows O^T alone is 64 a thread).
constexpr int kConsumerRegisters = 168, kProducerRegisters = 88;
static_assert(256 * kConsumerRegisters + 256 * kProducerRegisters <= 65536, "one SM's register file");
constexpr int kHalfBoxBytes = kHalfKeys * 64, kHalfScaleBytes = kHalfKeys * kGroups * 4;
constexpr int kHalfRawBytes =
    kGroups * kHalfBoxBytes + kHalfScaleBytes;  // 9 boxes [key][64 bytes], then the scales [key][group]
static_assert(kHalfRawBytes % 128 == 0, "each ring slot's boxes land 128-byte aligned");
constexpr int kTileElems = kKeys * kWidth;  // fp16: 9 column blocks [key][64]

// Shared memory: two tiles, Q [N][576] (fp16, K-major swizzled), P^T [N][64 keys] (fp16; two at 16 rows, so the
// scorer writes block j + 1's while the second accumulator still reads block j's), the ring of raw half-blocks
// (three at 16 rows, two at 32: 32 rows' Q and accumulators leave no room), then the mbarriers and the softmax's
// floats: maxima [4 warps][N], sums [P^T buffer][4 warps][N], factors [P^T buffer][N], moved [P^T buffer].
template <int N>
struct Layout {
  static constexpr int kRing = N == 16 ? 3 : 2, kPBufs = N == 16 ? 2 : 1;
  static constexpr size_t kQ = size_t(2) * kTileElems * 2, kP = kQ + size_t(N) * kWidth * 2;
  static constexpr size_t kRingAt = kP + size_t(kPBufs) * N * kKeys * 2;
  static constexpr size_t kBarriers = kRingAt + size_t(kRing) * kHalfRawBytes;
  static constexpr int kBarrierCount = kRing + 4;  // landed, tile full / free
  static constexpr size_t kFloats = kBarriers + size_t(kBarrierCount) * 8;
  static constexpr size_t kSmemBytes = kFloats + size_t(4 * N + kPBufs * 5 * N + kPBufs) * 4 + 1024;
  static_assert(kQ % 1024 == 0 && kP % 1024 == 0 && kRingAt % 1024 == 0, "swizzled tiles 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
};

template <KvDtype KV, int N>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ Params p) {
  static_assert(N == 16 || N == 32, "16 or 32 query rows");
  using L = Layout<N>;
  constexpr int kRing = L::kRing, kPBufs = L::kPBufs;
  const int t = int(threadIdx.x), lane = t % 32, q4 = lane % 4;
  const int warpgroup =
      __shfl_sync(0xffffffffu, t / 128, 0);      // (warp-uniform for the compiler: descriptors stay uniform)
  const int g = (t % 128 / 32) * 16 + lane / 4;  // this thread's fragment rows g and g + 8
  if (p.phases && t == 0) record(p, kTimerEntry, global_timer()), record_clock(p, kEntry);
  if (!p.early_loads) {
    pdl_wait();
    pdl_launch_dependents();
    if (t == 0) record_clock(p, kWaited);
  }
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  __half* const tiles = reinterpret_cast<__half*>(smem);
  __half* const sq = reinterpret_cast<__half*>(smem + L::kQ);
  __half* const sp = reinterpret_cast<__half*>(smem + L::kP);
  uint8_t* const ring = smem + L::kRingAt;
  uint64_t* const landed = reinterpret_cast<uint64_t*>(smem + L::kBarriers);  // [kRing]: a raw half-block's copies
  uint64_t* const tile_full = landed + kRing;  // [2]: both halves expanded (the producers' 8 warps)
  uint64_t* const tile_free = tile_full + 2;   // [2]: both accumulators' P V of it done (their 8 warps)
  float* const maxima = reinterpret_cast<float*>(smem + L::kFloats);  // [4][N]
  float* const sums = maxima + 4 * N;                                 // [kPBufs][4][N]
  float* const factors = sums + kPBufs * 4 * N;                       // [kPBufs][N]
  int* const moved = reinterpret_cast<int*>(factors + kPBufs * N);    // [kPBufs]
  const SoftmaxShared softmax_shared{maxima, sums, factors, moved, sp};
  if (t == 0) {
    for (int r = 0; r < kRing; ++r) mbarrier_init(&landed[r], 1);
    for (int b = 0; b < 2; ++b) mbarrier_init(&tile_full[b], 8), mbarrier_init(&tile_free[b], 8);
  }
  __syncthreads();

  const int2 mine = p.part_segments[blockIdx.y];
  int total = 0;
  for (int seg = mine.x; seg < mine.x + mine.y; ++seg)
    total += (p.segments[seg].z - p.segments[seg].y + kKeys - 1) / kKeys;
  if (t == 0) record(p, kBlocks, (unsigned long long)total);

  // ---- The copies: half-block h of the walk into ring slot h % kRing, by the first lanes of the producers' eight
  // warps (box w by warp w; warp 0 also box 8 and announces the bytes, warp 1 copies the scales), the page-table
  // entry looked up when the block before was copied.
  const int producer = t - 256, issuer = producer >= 0 && lane == 0 ? producer / 32 : -1;
  Cursor<kKeys> lookup_at(p, mine);
  int32_t entry = 0;
  int in_page = 0, next_half = 0;
  auto look_up = [&]() {
    if (!lookup_at.valid()) return;
    const int key = lookup_at.key0;
    const int32_t* page_table = p.cache.page_table + int64_t(lookup_at.s.x) * p.cache.pages_per_request;
    const int page_size = int(p.cache.page_size);
    entry = page_table[p.page_shift >= 0 ? key >> p.page_shift : key / page_size];
    in_page = p.page_shift >= 0 ? key & (page_size - 1) : key % page_size;
  };
  auto load_next = [&]() {
    if (next_half >= 2 * total) return;
    const int half = next_half & 1;
    const int64_t slot = int64_t(entry) * p.cache.page_size + in_page + kHalfKeys * half;
    uint8_t* const dst = ring + (next_half % kRing) * kHalfRawBytes;
    uint64_t* const bar = &landed[next_half % kRing];
    // (a copy may land before the bytes are announced: the phase cannot complete while warp 0's arrival is pending)
    if (issuer == 0)
      mbarrier_expect_bytes(bar, uint32_t(kHalfRawBytes)),
          tma_load(dst + 8 * kHalfBoxBytes, &p.kv_map, 8 * 64, int(slot), bar);
    tma_load(dst + issuer * kHalfBoxBytes, &p.kv_map, issuer * 64, int(slot), bar);
    // A block lies in one page (page_size % 64 == 0): its keys' scales are one contiguous run.
    if (issuer == 1) bulk_load(dst + kGroups * kHalfBoxBytes, p.cache.scales + slot * kGroups, kHalfScaleBytes, bar);
    if (++next_half % 2 == 0) lookup_at.next(p), look_up();
  };
  if (issuer >= 0) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.kv_map) : "memory");
    look_up();
    for (int i = 0; i < kRing; ++i) load_next();
  }
  if (t == 256) record_clock(p, kLoadsIssued);
  if (p.early_loads) {  // Q comes from the kernels before
    pdl_wait();
    pdl_launch_dependents();
    if (t == 0) record_clock(p, kWaited);
  }

  if (warpgroup >= 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters) : "memory");
    // ---- Producers: thread `producer` expands key producer / 8 of each half-block, 8 columns (16 bytes of the
    // tile) of each of the 9 column blocks: a warp reads 4 keys' 64-byte box rows (256 contiguous bytes) and writes
    // 4 whole 128-byte tile rows a column block.
    const int key_in_half = producer / 8, sub = producer % 8;
    // This thread's 16 bytes of a tile row in column block 0 of half 0: swz(key, 64 c + 8 sub, kKeys) for column
    // block c is kKeys * 64 c further, half 1's key kHalfKeys * 64 (key mod 8 = key_in_half mod 8 either way).
    const int store_at = key_in_half * 64 + ((sub ^ (key_in_half & 7)) << 3);
    uint32_t landing_wait = 0, free_wait = 0, expanding = 0;  // thread 256's clocks (p.phases)
    Cursor<kKeys> walk(p, mine);
#pragma unroll 1
    for (int j = 0; j < total; ++j) {
      const int buf = j & 1;
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const int h = 2 * j + half;
        const uint8_t* const raw = ring + (h % kRing) * kHalfRawBytes;
        const uint32_t before = phase_clock(p);
        mbarrier_wait(&landed[h % kRing], (h / kRing) & 1);
        const uint32_t landed_at = phase_clock(p);
        uint32_t tile_wait = 0;
        if (j == 0 && half == 0 && t == 256) record_clock(p, kFirstLanded);
        const float* const scales =
            reinterpret_cast<const float*>(raw + kGroups * kHalfBoxBytes) + key_in_half * kGroups;
        // Every load before the first store: the compiler cannot tell the tile's stores from the ring's bytes, and
        // interleaved it kept each column block's loads behind the store before them (nine round trips a half-block).
        uint2 w[kGroups];
        float scale[kGroups];
#pragma unroll
        for (int c = 0; c < kGroups; ++c)
          w[c] = *reinterpret_cast<const uint2*>(raw + c * kHalfBoxBytes + key_in_half * 64 + sub * 8),
          scale[c] = scales[c];
        if (half == 0 && j >= 2) {  // the tile's readers of block j - 2 are done (awaited under the loads)
          const uint32_t waiting = phase_clock(p);
          mbarrier_wait(&tile_free[buf], ((j >> 1) - 1) & 1);
          if (p.phases) tile_wait = phase_clock(p) - waiting;
        }
        // Keys past the segment's end as zeros (0 x NaN would reach O): only a segment's last half-blocks have any,
        // and the branch around them is the same for the whole CTA.
        const int first_key = walk.key0 + kHalfKeys * half;
        if (first_key + kHalfKeys > walk.s.z && first_key + key_in_half >= walk.s.z)
#pragma unroll
          for (int c = 0; c < kGroups; ++c) w[c] = make_uint2(0, 0), scale[c] = 0.0f;
        __half* const dst = tiles + buf * kTileElems + half * kHalfKeys * 64 + store_at;
#pragma unroll
        for (int c = 0; c < kGroups; ++c) {
          const __half2 factor = __float2half2_rn(scale[c]);
          uint4 v;
          dequantise4<KV>(w[c].x, factor, v.x, v.y);
          dequantise4<KV>(w[c].y, factor, v.z, v.w);
          *reinterpret_cast<uint4*>(dst + c * kKeys * 64) = v;
        }
        bar_sync(kBarProducers, 256);  // every producer has read the slot
        if (issuer >= 0) load_next();  // half-block h + kRing into it
        if (p.phases && t == 256)
          landing_wait += landed_at - before, free_wait += tile_wait,
              expanding += phase_clock(p) - landed_at - tile_wait;
      }
      fence_proxy_async();  // the tile is read by the tensor cores
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&tile_full[buf]);
      walk.next(p);
    }
    if (t == 256)
      record(p, kSpentLandingWait, landing_wait), record(p, kSpentTileFreeWait, free_wait),
          record(p, kSpentExpanding, expanding);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters) : "memory");
  // ---- Consumers. O^T: this warpgroup's four 64-row tiles (latent columns 256 warpgroup + 64 c + g / g + 8); a
  // thread's N / 4 columns (query rows) in slots i = 2 n + e of its fragments: column_of(i).
  constexpr int kCols = N / 4;
  auto column_of = [&](int i) { return 8 * (i / 2) + 2 * q4 + i % 2; };
  float o[4][N / 8][4];
#pragma unroll
  for (auto& tile_o : o)
#pragma unroll
    for (auto& x : tile_o) x[0] = x[1] = x[2] = x[3] = 0;
  auto accumulate = [&](int buf, int pb) {  // O^T += V^T P^T, this warpgroup's latent columns
    const __half* const tile = tiles + buf * kTileElems + 4 * warpgroup * kKeys * 64;
    const uint64_t p_desc = wgmma_desc(sp + pb * N * kKeys), v_desc = wgmma_desc_mn(tile, kKeys);
#pragma unroll
    for (int c = 0; c < 4; ++c) pin(o[c]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
      for (int c = 0; c < 4; ++c)  // (the four tiles' chains interleaved)
        wgmma_m64nNk16<N, true, true>(o[c], v_desc + (c * kKeys * 64 + ks * 16 * 64) * 2 / 16,
                                      p_desc + ks * 16 * 2 / 16, 1);
    wgmma_commit();
  };
  // A segment's outputs (row = query row, transposed from O^T), each normalised by its sum (`inverse`, by column
  // slot); O^T restarts.
  auto write_outputs = [&](const Cursor<kKeys>& at, const float(&inverse)[kCols]) {
    auto write = [&](auto* out) {
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int n = i / 2, e = i % 2, col = column_of(i);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int column = 256 * warpgroup + 64 * c + g;
          using T = std::remove_pointer_t<decltype(out)>;
          if constexpr (std::is_same_v<T, float>) {
            out[col * kLatent + column] = o[c][n][e] * inverse[i];
            out[col * kLatent + column + 8] = o[c][n][2 + e] * inverse[i];
          } else {
            out[col * kLatent + column] = __float2bfloat16_rn(o[c][n][e] * inverse[i]);
            out[col * kLatent + column + 8] = __float2bfloat16_rn(o[c][n][2 + e] * inverse[i]);
          }
          o[c][n][e] = o[c][n][2 + e] = 0;
        }
      }
    };
    if (at.s.w)
      write(p.o_lat + int64_t(at.s.x) * p.rows * kLatent);  // whole: final
    else
      write(p.o_partial + int64_t(at.seg) * p.partial_rows * kLatent);  // merged by combine
  };
  auto inverse_sums = [&](int pb, float(&inverse)[kCols]) {
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int col = column_of(i);
      const float* const s = sums + pb * 4 * N;
      const float sum = s[col] + s[N + col] + s[2 * N + col] + s[3 * N + col];
      inverse[i] = sum > 0 ? 1.0f / sum : 0.0f;
    }
  };
  Cursor<kKeys> at(p, mine);

  if (warpgroup == 1) {
    // ---- The second accumulator: block j's P V once the scorer has announced P^T, awaited at once (its O^T is
    // rescaled before the next).
#pragma unroll 1
    for (int j = 0; j < total; ++j) {
      const int buf = j & 1, pb = kPBufs == 2 ? j & 1 : 0;
      bar_sync(kBarReady + pb, 256);  // P^T, the factors (and a segment's sums) are there
      if (moved[pb])
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const float alpha = factors[pb * N + column_of(i)];
#pragma unroll
          for (int c = 0; c < 4; ++c) o[c][i / 2][i % 2] *= alpha, o[c][i / 2][2 + i % 2] *= alpha;
        }
      accumulate(buf, pb);
      wgmma_wait<0>();
      float inverse[kCols];
      const bool last = at.last();
      if (last) inverse_sums(pb, inverse);  // (read before P^T's buffer - and these sums - are handed back)
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&tile_free[buf]);
      bar_arrive(kBarFree + pb, 256);  // P^T's buffer, the factors and sums may be written again
      if (last) write_outputs(at, inverse);
      at.next(p);
    }
    return;
  }

  // ---- The scorer (warpgroup 0): Q K^T, the softmax, and P V of latent columns 0-255.
  int token_of[kCols];  // the column's token among the step's new ones (causal among them)
#pragma unroll
  for (int i = 0; i < kCols; ++i) token_of[i] = column_of(i) / p.heads;
  float m[kCols], l[kCols];                  // running max, this thread's part of the sum
  int length = 0, pending = -1;              // pending: the block whose P V (ours) is still in flight
  PartClocks<4> clocks(p.phases && t == 0);  // tile wait, scoring, softmax, accumulating
  const uint64_t q_desc = wgmma_desc(sq);
#pragma unroll 1
  for (int j = 0; j < total; ++j) {
    const int buf = j & 1, pb = kPBufs == 2 ? j & 1 : 0;
    clocks.begin();
    if (at.first()) {  // the segment's Q, fp16 (the Q K^T before has been awaited)
      const __nv_bfloat16* q = p.q + int64_t(at.s.x) * p.rows * kWidth;
      for (int c = t; c < N * kChunks; c += 128) {
        const int row = c / kChunks, col = (c % kChunks) * 8;
        uint4 v = *reinterpret_cast<const uint4*>(q + row * kWidth + col);
        bf16_chunk_to_half(&v);
        *reinterpret_cast<uint4*>(sq + swz(row, col, N)) = v;
      }
      length = p.lengths[at.s.x];
#pragma unroll
      for (int i = 0; i < kCols; ++i) m[i] = -INFINITY, l[i] = 0;
      fence_proxy_async();  // Q is read by the tensor cores
      bar_sync(kBarScorer, 128);
      if (j == 0 && t == 0) record_clock(p, kQLanded);
    }
    mbarrier_wait(&tile_full[buf], (j >> 1) & 1);
    clocks.done(0);
    float s[N / 8][4];
    {
      const uint64_t k_desc = wgmma_desc(tiles + buf * kTileElems);
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < kGroups; ++c)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma_m64nNk16<N, true>(s, k_desc + (c * kKeys * 64 + ks * 16) * 2 / 16,
                                  q_desc + (c * N * 64 + ks * 16) * 2 / 16, c > 0 || ks > 0);
      wgmma_commit();
      if (pending >= 0) {  // our P V of the block before: its tile goes back to the producers before Q K^T is done
        wgmma_wait<1>();
        __syncwarp();
        if (lane == 0) mbarrier_arrive(&tile_free[pending & 1]);
        if (pending == 0 && t == 0) record_clock(p, kFirstAccumulated);
        pending = -1;
      }
      wgmma_wait<0>();
    }
    if (j == 0 && t == 0) record_clock(p, kFirstScored);
    clocks.done(1);

    // ---- The softmax (softmax_to_pt), P^T handed to the accumulator.
    const bool last = at.last();
    float alpha[kCols];
    const bool any_move =
        softmax_to_pt<N, kKeys, kCols>(s, m, l, alpha, token_of, at.key0 + g, at.s.z, length, last, p.scale_log2,
                                       softmax_shared, {pb, j >= kPBufs, kBarFree + pb, kBarReady + pb, 256});
    if (j == 0 && t == 0) record_clock(p, kFirstHandedOver);
    clocks.done(2);
    float inverse[kCols];
    if (last) {
      inverse_sums(pb, inverse);
      if (t < 4)  // the segment's log-sum-exp
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const float sum = 1.0f / inverse[i];
          p.lse_partial[int64_t(at.seg) * p.partial_rows + column_of(i)] =
              inverse[i] > 0 ? m[i] * p.scale_log2 + log2f(sum) : -INFINITY;
        }
    }

    // ---- O^T = alpha O^T + V^T P^T (latent columns 0-255), left in flight under the next block's Q K^T
    if (any_move)
#pragma unroll
      for (int i = 0; i < kCols; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[c][i / 2][i % 2] *= alpha[i], o[c][i / 2][2 + i % 2] *= alpha[i];
    accumulate(buf, pb);
    pending = j;
    if (last) {
      wgmma_wait<0>();
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&tile_free[buf]);
      pending = -1;
      if (t == 0 && j == 0) record_clock(p, kFirstAccumulated);
      if (t == 0 && j == total - 1) record_clock(p, kLastAccumulated);
      write_outputs(at, inverse);
    }
    clocks.done(3);
    at.next(p);
  }
  wgmma_wait<0>();  // (nothing is in flight: a walk ends with a segment's last block; this tells the compiler so)
  for (int j = total > kPBufs ? total - kPBufs : 0; j < total; ++j)
    bar_sync(kBarFree + (kPBufs == 2 ? j & 1 : 0), 256);  // (every arrival met)
  if (t == 0) {
    clocks.record_into(p, {kSpentTileWait, kSpentScoring, kSpentSoftmax, kSpentAccumulating});
    record_clock(p, kDone), record(p, kTimerExit, global_timer());
  }
}

}  // namespace narrow

bool use_narrow(bool tma, int64_t rows, KvDtype kv) { return tma && rows <= 32 && kv != KvDtype::bf16; }
template <KvDtype KV, int N>
void launch_narrow_rows(const Params& params, int parts, cudaStream_t stream) {
  launch_decode<narrow::decode_kernel<KV, N>>(dim3(1, unsigned(parts)), dim3(narrow::kThreads),
                                              narrow::Layout<N>::kSmemBytes, stream, params);
}
void launch_narrow(const Params& params, KvDtype kv, int parts, cudaStream_t stream) {
  if (kv == KvDtype::int8) {
    if (params.rows == 16)
      launch_narrow_rows<KvDtype::int8, 16>(params, parts, stream);
    else
      launch_narrow_rows<KvDtype::int8, 32>(params, parts, stream);
  } else {
    if (params.rows == 16)
      launch_narrow_rows<KvDtype::fp8_e4m3, 16>(params, parts, stream);
    else
      launch_narrow_rows<KvDtype::fp8_e4m3, 32>(params, parts, stream);
  }
}

}  // namespace dslab::mla::cuda::fused_decode
