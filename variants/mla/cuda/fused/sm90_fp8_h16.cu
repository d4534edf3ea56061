// mla/fused/cuda's kernel for fp8 caches at 16 rows (16 heads, one new token): see namespace fp8 below.
#include "harness/errors.h"
#include "variants/mla/cuda/fused/common.cuh"

namespace dslab::mla::cuda::fused_decode {

// ---- fp8 caches at 16 rows: Q K^T on FP8 tensor cores from the block as it lands, P V from registers --------------
// The narrow kernel (sm90_int8_h16.cu) expands each block into an fp16 tile that both products read from shared
// memory: ~326 KB of shared-memory traffic a 64-key block (the copy, the expansion's reads and writes, Q K^T's and
// P V's operand reads) for 39 KB from HBM, and its pieces slow each other down - halving Q K^T's reads alone took
// its blocks from 2.30 to 2.11 us, the expansion running faster beside it (H100). Here nothing is
// expanded into shared memory:
//  - the scorer (warpgroup 0) runs Q K^T as e4m3 x e4m3 MMAs straight from the landed block (64-byte-swizzled boxes,
//    one per 64-column group) against Q in two e4m3 parts (one scale per query row, set when the segment starts): one
//    fp32 accumulator per group, summed times the keys' group scales, then the softmax as the narrow kernel's (lazy
//    rescale, P^T and the factors handed over on named barriers);
//  - two accumulator warpgroups (1-2) read their 256 latent columns of the block's keys into registers, expand them
//    there (e4m3 pairs of two keys to fp16, times the keys' scales) straight into the MMA's A fragments, and run
//    O^T += V^T P^T with A from registers. Their O^T rows are latent columns in an order of our choosing: thread
//    (warp w, lane / 4 = r) of warpgroup v holds latent columns 256 v + 64 w + 8 r + 0..7 (row 2 c + h of its
//    fragments' tile c, h = 0 / 1 for rows r / r + 8), so its reads are 8 contiguous bytes a key and its writes
//    8 contiguous outputs a query row;
//  - one copying warp keeps a ring of four raw blocks full (a slot is free again once the scorer's MMAs and every
//    accumulator warp's reads of it are done).
// Shared-memory traffic a block: ~180 KB (the copy 39, Q K^T 92, the accumulators' reads 33, P^T 16). Measured (H100,
// V3 16 heads batch 64): 1.74-1.79 us a block against the narrow kernel's 2.24-2.29. A block is 39 KB a
// SM, which the host's calibrated HBM read rate (2.99 TB/s) delivers to 132 SMs in 1.73 us: the walk runs at the
// floor, the scorer's chain (Q K^T 0.9, the softmax 0.7) and the accumulators' (expansion 0.8-1.0, P V 0.7-0.8) fit
// under it.
namespace fp8 {

constexpr int kKeys = 64, kRows = 16, kRing = 4, kPBufs = 2;
// (a whole fourth warpgroup for the copying warp: setmaxnreg takes warpgroups, and ptxas gives 13 warps no more
// registers than 16 - four warps share each scheduler's register file)
constexpr int kScorers = 128, kAccumulators = 256, kThreads = kScorers + kAccumulators + 128;
// Registers a thread (setmaxnreg; the kernel starts at 65536 / 512 = 128): the copying warpgroup needs few.
constexpr int kScorerRegisters = 160, kAccumulatorRegisters = 152, kCopierRegisters = 48;
static_assert(128 * (kScorerRegisters + 2 * kAccumulatorRegisters + kCopierRegisters) <= 65536,
              "one SM's register file");
constexpr int kBoxBytes = kKeys * 64;             // one 64-column group of a block: [64 keys][64 bytes]
constexpr int kScaleBytes = kKeys * kGroups * 4;  // fp32 [key][group]
constexpr int kSlotBytes = (kGroups * kBoxBytes + kScaleBytes + 1023) / 1024 * 1024;
// Q in two e4m3 parts, [part][group][row][64 bytes]: Q / scale = high + low, low the high part's rounding error (so
// Q K^T = K high + K low, two MMAs into one accumulator). One part alone (e4m3's 2^-4 relative rounding on every Q
// value) took the output's error from ~3.5e-2 to 5-9e-2 against the 8e-2 threshold (H100); the low part
// leaves ~2^-8.
constexpr int kQ8GroupBytes = kRows * 64, kQ8PartBytes = kGroups * kQ8GroupBytes, kQ8Bytes = 2 * kQ8PartBytes;
// Named barriers: the scorer's 128 threads; P^T's buffers ready (the scorer arrives, the accumulators wait) and free
// again (the other way round), 384 threads each.
constexpr int kBarReady = 2, kBarFree = 4, kHandOver = kScorers + kAccumulators;
constexpr int kReaders = 4 + 8;  // a slot's readers: the scorer's warps and the accumulators'

// Shared memory: the ring, Q (e4m3), P^T [buffer][16 rows][64 keys] (fp16, 128-byte swizzle), the mbarriers, then
// floats: Q's row scales [16], maxima [4 warps][16], sums [buffer][4 warps][16], factors [buffer][16], moved [buffer].
struct Layout {
  static constexpr size_t kQ8 = size_t(kRing) * kSlotBytes, kP = kQ8 + kQ8Bytes;
  static constexpr size_t kBarriers = kP + size_t(kPBufs) * kRows * kKeys * 2;
  static constexpr size_t kFloats = kBarriers + size_t(2 * kRing) * 8;  // landed, free
  static constexpr size_t kSmemBytes = kFloats + size_t(kRows + 4 * kRows + kPBufs * 5 * kRows + kPBufs) * 4 + 1024;
  static_assert(kSlotBytes % 1024 == 0 && kQ8 % 1024 == 0 && kP % 1024 == 0, "swizzled operands 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
};

// Byte offset of (row, byte) in a [rows][64 bytes] box in the 64-byte swizzle (as the tensor copies land it).
__device__ __forceinline__ int swz64_byte(int row, int byte) {
  return row * 64 + ((((byte >> 4) ^ (row >> 1)) & 3) << 4) + (byte & 15);
}

__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ Params p) {
  const int t = int(threadIdx.x), lane = t % 32, q4 = lane % 4, r = lane / 4;
  const int warp = __shfl_sync(0xffffffffu, t / 32, 0);  // (warp-uniform for the compiler)
  if (p.phases && t == 0) record(p, kTimerEntry, global_timer()), record_clock(p, kEntry);
  if (!p.early_loads) {
    pdl_wait();
    pdl_launch_dependents();
    if (t == 0) record_clock(p, kWaited);
  }
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* const ring = smem;
  uint8_t* const q8 = smem + Layout::kQ8;
  __half* const sp = reinterpret_cast<__half*>(smem + Layout::kP);
  uint64_t* const landed = reinterpret_cast<uint64_t*>(smem + Layout::kBarriers);  // [kRing]: a block's copies
  uint64_t* const slot_free = landed + kRing;                                      // [kRing]: its readers done
  float* const q_scales = reinterpret_cast<float*>(smem + Layout::kFloats);        // [16]
  float* const maxima = q_scales + kRows;                                          // [4][16]
  float* const sums = maxima + 4 * kRows;                                          // [kPBufs][4][16]
  float* const factors = sums + kPBufs * 4 * kRows;                                // [kPBufs][16]
  int* const moved = reinterpret_cast<int*>(factors + kPBufs * kRows);             // [kPBufs]
  const SoftmaxShared softmax_shared{maxima, sums, factors, moved, sp};
  if (t == 0) {
    for (int s = 0; s < kRing; ++s) mbarrier_init(&landed[s], 1), mbarrier_init(&slot_free[s], kReaders);
  }
  __syncthreads();

  const int2 mine = p.part_segments[blockIdx.y];
  int total = 0;
  for (int seg = mine.x; seg < mine.x + mine.y; ++seg)
    total += (p.segments[seg].z - p.segments[seg].y + kKeys - 1) / kKeys;
  if (t == 0) record(p, kBlocks, (unsigned long long)total);

  // ---- The copying warp's lane 0: block j of the walk into slot j % kRing - nine 64 x 64-byte boxes and one bulk
  // copy of the keys' scales (a block lies in one page: page_size % 64 == 0).
  const bool copier = t == kScorers + kAccumulators;
  Cursor<kKeys> copy_at(p, mine);
  auto issue = [&](int j) {
    const int key = copy_at.key0;
    const int32_t* page_table = p.cache.page_table + int64_t(copy_at.s.x) * p.cache.pages_per_request;
    const int page_size = int(p.cache.page_size);
    const int32_t entry = page_table[p.page_shift >= 0 ? key >> p.page_shift : key / page_size];
    const int64_t slot = int64_t(entry) * page_size + (p.page_shift >= 0 ? key & (page_size - 1) : key % page_size);
    uint8_t* const dst = ring + (j % kRing) * kSlotBytes;
    uint64_t* const bar = &landed[j % kRing];
    mbarrier_expect_bytes(bar, uint32_t(kGroups * kBoxBytes + kScaleBytes));
    for (int c = 0; c < kGroups; ++c) tma_load(dst + c * kBoxBytes, &p.kv_map, c * 64, int(slot), bar);
    bulk_load(dst + kGroups * kBoxBytes, p.cache.scales + slot * kGroups, kScaleBytes, bar);
    copy_at.next(p);
  };
  if (copier) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(&p.kv_map) : "memory");
    for (int j = 0; j < kRing && j < total; ++j) issue(j);
    record_clock(p, kLoadsIssued);
  }
  if (p.early_loads) {  // Q comes from the kernels before
    pdl_wait();
    pdl_launch_dependents();
    if (t == 0) record_clock(p, kWaited);
  }
  if (warp >= (kScorers + kAccumulators) / 32) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCopierRegisters) : "memory");
    if (copier)
#pragma unroll 1
      for (int j = kRing; j < total; ++j) {
        mbarrier_wait(&slot_free[j % kRing], (j / kRing - 1) & 1);
        issue(j);
      }
    return;
  }

  // A query row's slot i (0-3) in this thread's accumulator columns (the m64n16 layout's 8 (i / 2) + 2 q4 + i % 2).
  auto column_of = [&](int i) { return 8 * (i / 2) + 2 * q4 + i % 2; };
  auto inverse_sums = [&](int pb, float(&inverse)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = column_of(i);
      const float* const s = sums + pb * 4 * kRows;
      const float sum = s[col] + s[kRows + col] + s[2 * kRows + col] + s[3 * kRows + col];
      inverse[i] = sum > 0 ? 1.0f / sum : 0.0f;
    }
  };
  Cursor<kKeys> at(p, mine);

  if (warp >= kScorers / 32) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kAccumulatorRegisters) : "memory");
    // ---- An accumulator: warpgroup v's latent columns 256 v + 64 w + 8 r + (2 c + h), group 4 v + w of the block.
    const int v = (t - kScorers) / 128, w = warp % 4, group = 4 * v + w;
    const int first_latent = 256 * v + 64 * w + 8 * r;
    float o[4][2][4];  // O^T tiles c: [n][e] row r, [n][2 + e] row r + 8; column (query row) 8 n + 2 q4 + e
#pragma unroll
    for (auto& tile : o)
#pragma unroll
      for (auto& x : tile) x[0] = x[1] = x[2] = x[3] = 0;
    PartClocks<4> clocks(p.phases && t == kScorers);  // landing wait, expanding, P^T wait, accumulating
#pragma unroll 1
    for (int j = 0; j < total; ++j) {
      const int slot = j % kRing, pb = j & 1;
      clocks.begin();
      mbarrier_wait(&landed[slot], (j / kRing) & 1);
      clocks.done(0);
      // This thread's keys: 16 ks + 2 q4 + {0, 1, 8, 9} of each 16-key step ks (its fragments' columns), 8 bytes each.
      const uint8_t* const box = ring + slot * kSlotBytes + group * kBoxBytes;
      const float* const key_scales = reinterpret_cast<const float*>(ring + slot * kSlotBytes + kGroups * kBoxBytes);
      uint2 raw[4][4];
      float scale[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int key = 16 * ks + 2 * q4 + (kk & 1) + 8 * (kk >> 1);
          raw[ks][kk] = *reinterpret_cast<const uint2*>(box + swz64_byte(key, 8 * r));
          scale[ks][kk] = key_scales[key * kGroups + group];
        }
      if (at.key0 + kKeys >
          at.s.z)  // keys past the segment's end as zeros (0 x NaN would reach O): its last block only
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
          for (int kk = 0; kk < 4; ++kk)
            if (at.key0 + 16 * ks + 2 * q4 + (kk & 1) + 8 * (kk >> 1) >= at.s.z)
              raw[ks][kk] = make_uint2(0, 0), scale[ks][kk] = 0.0f;
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&slot_free[slot]);  // (the values are in registers)
      // The A fragments: a[c][ks] = {rows r, r + 8} x {keys 2 q4, 2 q4 + 1} and x {+ 8, + 9}: byte 2 c + h of two
      // keys' words side by side, one e4m3 pair to fp16 each, times the two keys' scales.
      uint32_t a[4][4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const __half2 lo_scales = __floats2half2_rn(scale[ks][0], scale[ks][1]),
                      hi_scales = __floats2half2_rn(scale[ks][2], scale[ks][3]);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const uint32_t sel = c % 2 == 0 ? 0x5140u : 0x7362u;  // bytes 2c, 2c+1 of key k and k + 1, interleaved
          const uint32_t lo_pair =
              __byte_perm(c < 2 ? raw[ks][0].x : raw[ks][0].y, c < 2 ? raw[ks][1].x : raw[ks][1].y, sel);
          const uint32_t hi_pair =
              __byte_perm(c < 2 ? raw[ks][2].x : raw[ks][2].y, c < 2 ? raw[ks][3].x : raw[ks][3].y, sel);
          const __half2 a0 = __hmul2(
              __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(lo_pair & 0xFFFFu), __NV_E4M3)), lo_scales);
          const __half2 a1 =
              __hmul2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(lo_pair >> 16), __NV_E4M3)), lo_scales);
          const __half2 a2 = __hmul2(
              __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(hi_pair & 0xFFFFu), __NV_E4M3)), hi_scales);
          const __half2 a3 =
              __hmul2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(hi_pair >> 16), __NV_E4M3)), hi_scales);
          a[c][ks][0] = *reinterpret_cast<const uint32_t*>(&a0);
          a[c][ks][1] = *reinterpret_cast<const uint32_t*>(&a1);
          a[c][ks][2] = *reinterpret_cast<const uint32_t*>(&a2);
          a[c][ks][3] = *reinterpret_cast<const uint32_t*>(&a3);
        }
      }
      clocks.done(1);
      bar_sync(kBarReady + pb, kHandOver);  // P^T, the factors (and a segment's sums) are there
      clocks.done(2);
      if (moved[pb])
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float alpha = factors[pb * kRows + column_of(i)];
#pragma unroll
          for (int c = 0; c < 4; ++c) o[c][i / 2][i % 2] *= alpha, o[c][i / 2][2 + i % 2] *= alpha;
        }
      const uint64_t p_desc = wgmma_desc(sp + pb * kRows * kKeys);
#pragma unroll
      for (int c = 0; c < 4; ++c) pin(o[c]), pin(a[c]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int c = 0; c < 4; ++c) wgmma_m64nNk16_rs<kRows, true>(o[c], a[c][ks], p_desc + ks * 16 * 2 / 16, 1);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int c = 0; c < 4; ++c) pin(o[c]), pin(a[c]);  // (the fragments stay untouched until the MMAs are done)
      float inverse[4];
      const bool last = at.last();
      if (last) inverse_sums(pb, inverse);   // (read before P^T's buffer - and these sums - are handed back)
      bar_arrive(kBarFree + pb, kHandOver);  // P^T's buffer, the factors and sums may be written again
      if (j == 0 && t == kScorers) record_clock(p, kFirstAccumulated);
      if (j == total - 1 && t == kScorers) record_clock(p, kLastAccumulated);
      if (last) {  // the segment's outputs: 8 contiguous latent columns a query row
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = i / 2, e = i % 2, col = column_of(i);
          float x[8];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            x[2 * c] = o[c][n][e] * inverse[i], x[2 * c + 1] = o[c][n][2 + e] * inverse[i];
            o[c][n][e] = o[c][n][2 + e] = 0;
          }
          if (at.s.w) {  // whole: final
            __nv_bfloat16* const out = p.o_lat + int64_t(at.s.x) * p.rows * kLatent + col * kLatent + first_latent;
            uint4 packed;
            uint32_t* const words = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const __nv_bfloat162 pair = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
              words[k] = *reinterpret_cast<const uint32_t*>(&pair);
            }
            *reinterpret_cast<uint4*>(out) = packed;
          } else {  // merged by combine
            float* const out = p.o_partial + int64_t(at.seg) * p.partial_rows * kLatent + col * kLatent + first_latent;
            *reinterpret_cast<float4*>(out) = make_float4(x[0], x[1], x[2], x[3]);
            *reinterpret_cast<float4*>(out + 4) = make_float4(x[4], x[5], x[6], x[7]);
          }
        }
      }
      clocks.done(3);
      at.next(p);
    }
    if (t == kScorers) {
      clocks.record_into(p, {kSpentLandingWait, kSpentExpanding, kSpentPWait, kSpentAccumulating});
      record_clock(p, kDone), record(p, kTimerExit, global_timer());
    }
    return;
  }

  // ---- The scorer (warpgroup 0): Q K^T, the softmax, P^T.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kScorerRegisters) : "memory");
  const int g = warp * 16 + r;  // this thread's keys g and g + 8 (the accumulators' rows)
  int token_of[4];              // the column's token among the step's new ones (causal among them)
#pragma unroll
  for (int i = 0; i < 4; ++i) token_of[i] = column_of(i) / p.heads;
  float m[4], l[4], q_scale[4];  // running max, this thread's part of the sum, the column's Q scale
  int length = 0;
  PartClocks<3> clocks(p.phases && t == 0);  // block wait, scoring, softmax
#pragma unroll 1
  for (int j = 0; j < total; ++j) {
    const int slot = j % kRing, pb = j & 1;
    clocks.begin();
    if (at.first()) {
      // The segment's Q in its two e4m3 parts, a scale per query row (its largest |value| / 448): row t / 8,
      // 64-column group i's bytes 8 (t % 8) .. + 7 from each of the thread's nine chunks (every load before the
      // first store).
      const int row = t / 8, part = t % 8;
      const __nv_bfloat16* q = p.q + (int64_t(at.s.x) * p.rows + row) * kWidth + 8 * part;
      length = p.lengths[at.s.x];
      uint4 chunk[kGroups];
#pragma unroll
      for (int i = 0; i < kGroups; ++i) chunk[i] = *reinterpret_cast<const uint4*>(q + 64 * i);
      float amax = 0;
#pragma unroll
      for (int i = 0; i < kGroups; ++i) {
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&chunk[i]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __bfloat1622float2(pairs[k]);
          amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
      }
#pragma unroll
      for (int off = 1; off < 8; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      const float inverse_scale = amax > 0 ? 448.0f / amax : 1.0f;
      // A pair of scaled values to e4m3, and the pair of what that rounding left (e4m3 again).
      auto split = [](float2 x, uint32_t& high, uint32_t& low) {
        const __nv_fp8x2_storage_t h = __nv_cvt_float2_to_fp8x2(x, __NV_SATFINITE, __NV_E4M3);
        const float2 back = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(h, __NV_E4M3)));
        high = h, low = __nv_cvt_float2_to_fp8x2(make_float2(x.x - back.x, x.y - back.y), __NV_SATFINITE, __NV_E4M3);
      };
#pragma unroll
      for (int i = 0; i < kGroups; ++i) {
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&chunk[i]);
        uint32_t high[4], low[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __bfloat1622float2(pairs[k]);
          split(make_float2(f.x * inverse_scale, f.y * inverse_scale), high[k], low[k]);
        }
        uint8_t* const at_bytes = q8 + i * kQ8GroupBytes + swz64_byte(row, 8 * part);
        *reinterpret_cast<uint2*>(at_bytes) = make_uint2(high[0] | high[1] << 16, high[2] | high[3] << 16);
        *reinterpret_cast<uint2*>(at_bytes + kQ8PartBytes) = make_uint2(low[0] | low[1] << 16, low[2] | low[3] << 16);
      }
      if (part == 0) q_scales[row] = amax > 0 ? amax / 448.0f : 1.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) m[i] = -INFINITY, l[i] = 0;
      fence_proxy_async();  // Q is read by the tensor cores
      bar_sync(kBarScorer, 128);
#pragma unroll
      for (int i = 0; i < 4; ++i) q_scale[i] = q_scales[column_of(i)];
      if (j == 0 && t == 0) record_clock(p, kQLanded);
    }
    mbarrier_wait(&landed[slot], (j / kRing) & 1);
    if (j == 0 && t == 0) record_clock(p, kFirstLanded);
    clocks.done(0);
    // Q K^T a 64-column group at a time (two k32 steps each), every group its own accumulator: the keys' scales
    // differ by group.
    const uint8_t* const block = ring + slot * kSlotBytes;
    float acc[kGroups][2][4];
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < kGroups; ++c) {
      const uint64_t k_desc = wgmma_desc_sw64(block + c * kBoxBytes),
                     high_desc = wgmma_desc_sw64(q8 + c * kQ8GroupBytes);
      const uint64_t low_desc = high_desc + kQ8PartBytes / 16;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        wgmma_m64n16k32_e4m3(acc[c], k_desc + 2 * ks, high_desc + 2 * ks, ks);
        wgmma_m64n16k32_e4m3(acc[c], k_desc + 2 * ks, low_desc + 2 * ks, 1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (auto& group_acc : acc) pin(group_acc);
    const float* const key_scales = reinterpret_cast<const float*>(block + kGroups * kBoxBytes);
    float s[2][4] = {};
#pragma unroll
    for (int c = 0; c < kGroups; ++c) {
      const float lo = key_scales[g * kGroups + c], hi = key_scales[(g + 8) * kGroups + c];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s[n][e] = fmaf(acc[c][n][e], lo, s[n][e]), s[n][2 + e] = fmaf(acc[c][n][2 + e], hi, s[n][2 + e]);
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&slot_free[slot]);  // (its MMAs are done and its scales read)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i / 2][i % 2] *= q_scale[i], s[i / 2][2 + i % 2] *= q_scale[i];
    if (j == 0 && t == 0) record_clock(p, kFirstScored);
    clocks.done(1);

    // ---- The softmax (softmax_to_pt), P^T handed to the accumulators.
    const bool last = at.last();
    float alpha[4];  // (the accumulators read the factors from shared memory)
    softmax_to_pt<kRows, kKeys, 4>(s, m, l, alpha, token_of, at.key0 + g, at.s.z, length, last, p.scale_log2,
                                   softmax_shared, {pb, j >= kPBufs, kBarFree + pb, kBarReady + pb, kHandOver});
    if (j == 0 && t == 0) record_clock(p, kFirstHandedOver);
    if (last && t < 4) {  // the segment's log-sum-exp
      float inverse[4];
      inverse_sums(pb, inverse);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        p.lse_partial[int64_t(at.seg) * p.partial_rows + column_of(i)] =
            inverse[i] > 0 ? m[i] * p.scale_log2 - log2f(inverse[i]) : -INFINITY;
    }
    clocks.done(2);
    at.next(p);
  }
  for (int j = total > kPBufs ? total - kPBufs : 0; j < total; ++j)
    bar_sync(kBarFree + (j & 1), kHandOver);  // (every arrival met)
  clocks.record_into(p, {kSpentTileWait, kSpentScoring, kSpentSoftmax});
}

}  // namespace fp8

bool use_fp8(bool tma, int64_t rows, KvDtype kv) { return tma && rows == fp8::kRows && kv == KvDtype::fp8_e4m3; }
void launch_fp8(const Params& params, int parts, cudaStream_t stream) {
  launch_decode<fp8::decode_kernel>(dim3(1, unsigned(parts)), dim3(fp8::kThreads), fp8::Layout::kSmemBytes, stream,
                                    params);
}

}  // namespace dslab::mla::cuda::fused_decode
