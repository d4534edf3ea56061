// The selection half of the GPU's block-sparse decode (paged_select.h). Three small kernels: a block per listed page
// for its bounds, a warp per page for its score, a block per request for its selection.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "harness/cuda_check.h"
#include "variants/sparse/cuda/paged_select.h"

namespace dslab::sparse::cuda {
namespace {

constexpr int kBoundsThreads = 256;
__global__ void __launch_bounds__(kBoundsThreads) page_bounds_kernel(const __nv_bfloat16* __restrict__ cache, int page_size, int width,
                                                                     const int32_t* __restrict__ pages, const int32_t* __restrict__ counts,
                                                                     float* __restrict__ min, float* __restrict__ max) {
  const int64_t page = pages[blockIdx.x];
  const int count = counts[blockIdx.x];
  if (page < 0) return;  // (an entry a step does not need: see page_bounds)
  const __nv_bfloat16* rows = cache + page * page_size * width;
  for (int d = int(threadIdx.x); d < width; d += kBoundsThreads) {
    float lo = INFINITY, hi = -INFINITY;
    for (int k = 0; k < count; ++k) {
      const float v = __bfloat162float(rows[int64_t(k) * width + d]);
      lo = fminf(lo, v), hi = fmaxf(hi, v);
    }
    min[page * width + d] = lo;
    max[page * width + d] = hi;
  }
}

// A warp per (request, logical page): its bounds held by the lanes (width / 32 columns each), every head's and
// query's bound reduced across the warp, the best kept.
constexpr int kScoreWarps = 8, kMaxColumnsPerLane = 32;  // widths up to 1024
__global__ void __launch_bounds__(kScoreWarps * 32) quest_scores_kernel(const __nv_bfloat16* __restrict__ q, int q_len, int heads, int width,
                                                                        const float* __restrict__ min, const float* __restrict__ max,
                                                                        const int32_t* __restrict__ page_table, int pages_per_request,
                                                                        const int32_t* __restrict__ keys, int page_size, float* __restrict__ scores) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int r = int(blockIdx.y), p = int(blockIdx.x) * kScoreWarps + warp;
  if (p >= pages_per_request) return;
  const int pages = (keys[r] + page_size - 1) / page_size;
  if (p >= pages) {
    if (lane == 0) scores[int64_t(r) * pages_per_request + p] = -INFINITY;
    return;
  }
  const int64_t physical = page_table[int64_t(r) * pages_per_request + p];
  float lo[kMaxColumnsPerLane], hi[kMaxColumnsPerLane];
  const int columns = (width + 31) / 32;
#pragma unroll
  for (int i = 0; i < kMaxColumnsPerLane; ++i) {
    const int d = lane + 32 * i;
    const bool in = i < columns && d < width;
    lo[i] = in ? min[physical * width + d] : 0.0f;
    hi[i] = in ? max[physical * width + d] : 0.0f;
  }
  float best = -INFINITY;
  for (int s = 0; s < q_len; ++s)
    for (int h = 0; h < heads; ++h) {
      const __nv_bfloat16* qh = q + ((int64_t(r) * q_len + s) * heads + h) * width;
      float bound = 0;
#pragma unroll
      for (int i = 0; i < kMaxColumnsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (i < columns && d < width) {
          const float qd = __bfloat162float(qh[d]);
          bound += fmaxf(qd * lo[i], qd * hi[i]);
        }
      }
      for (int o = 16; o; o >>= 1) bound += __shfl_xor_sync(0xffffffffu, bound, o);
      best = fmaxf(best, bound);
    }
  if (lane == 0) scores[int64_t(r) * pages_per_request + p] = best;
}

// Floats as unsigned integers in the same order (larger float, larger key); 0 is below every float's key.
__device__ inline uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kSelectThreads = 1024, kMaxPages = 16384;
struct SelectArgs {
  const float* scores;
  const int32_t* page_table;
  int pages_per_request;
  const int32_t* keys;
  int page_size, tokens, n_init, local, max_pages;
  int32_t *physical, *logical, *length;
};

// A block per request: the pages always kept, the `need` best others (the need-th largest score found bit by bit
// from the top, then those above it and the lowest-indexed ones equal to it), and the chosen pages written in order.
__global__ void __launch_bounds__(kSelectThreads) compact_pages_kernel(SelectArgs a) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int counted;
  const int r = int(blockIdx.x), tid = int(threadIdx.x);
  const int keys = a.keys[r], P = a.page_size;
  const int pages = (keys + P - 1) / P;
  const int sink_end = (min(a.n_init, keys) + P - 1) / P;   // pages [0, sink_end)
  const int window_first = max(0, keys - a.local) / P;      // pages [window_first, pages)
  auto fixed = [&](int p) { return p < sink_end || p >= window_first; };
  const int fixed_count = min(sink_end, window_first) + (pages - window_first);
  const int budget = max(1, a.tokens / P);
  const int need = max(0, min(pages, budget) - fixed_count);
  const float* score = a.scores + int64_t(r) * a.pages_per_request;
  auto key = [&](int p) { return fixed(p) ? 0u : order_key(score[p]); };
  // Each thread's contiguous run of pages (so that scans over threads are scans over pages in order).
  const int per = (pages + kSelectThreads - 1) / kSelectThreads, first = tid * per, last = min(pages, first + per);
  uint32_t threshold = 0xffffffffu;  // (need 0: nothing is chosen by score)
  if (need > 0) {
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t candidate = prefix | (1u << bit);
      if (tid == 0) counted = 0;
      __syncthreads();
      int mine = 0;
      for (int p = first; p < last; ++p) mine += key(p) >= candidate;
      if (mine) atomicAdd(&counted, mine);
      __syncthreads();
      if (counted >= need) prefix = candidate;
      __syncthreads();
    }
    threshold = prefix;  // the need-th largest key
  }
  // Above the threshold: all; equal to it: the lowest-indexed, as many as are still needed.
  int above = 0, equal = 0;
  for (int p = first; p < last; ++p) {
    const uint32_t k = key(p);
    above += k > threshold && need > 0;
    equal += k == threshold && need > 0;
  }
  int above_before = 0, above_total = 0, equal_before = 0, equal_total = 0;
  Scan(temp).ExclusiveSum(above, above_before, above_total);
  __syncthreads();
  Scan(temp).ExclusiveSum(equal, equal_before, equal_total);
  __syncthreads();
  const int equal_taken = need - above_total;
  // Whether page p is chosen; eq counts the equal-to-threshold pages seen so far (this thread's run walked in order).
  auto take = [&](int p, int& eq) {
    if (fixed(p)) return true;
    if (need == 0) return false;
    const uint32_t k = key(p);
    return k > threshold || (k == threshold && eq++ < equal_taken);
  };
  int chosen = 0;
  int eq = equal_before;
  for (int p = first; p < last; ++p) chosen += take(p, eq);
  int position = 0, total = 0;
  Scan(temp).ExclusiveSum(chosen, position, total);
  eq = equal_before;
  for (int p = first; p < last; ++p) {
    if (take(p, eq) && position < a.max_pages) {
      a.physical[int64_t(r) * a.max_pages + position] = a.page_table[int64_t(r) * a.pages_per_request + p];
      a.logical[int64_t(r) * a.max_pages + position] = p;
      ++position;
    }
  }
  if (tid == 0) a.length[r] = (total - 1) * P + (keys - (pages - 1) * P);
}

}  // namespace

void page_bounds(const __nv_bfloat16* cache, int64_t page_size, int64_t width, const int32_t* pages, const int32_t* counts, int n,
                 float* min, float* max, cudaStream_t stream) {
  if (n <= 0) return;
  page_bounds_kernel<<<unsigned(n), kBoundsThreads, 0, stream>>>(cache, int(page_size), int(width), pages, counts, min, max);
  DSLAB_CHECK_LAUNCH();
}

void quest_scores(const __nv_bfloat16* q, int64_t batch, int64_t q_len, int64_t heads, int64_t width, const float* min, const float* max,
                  const int32_t* page_table, int64_t pages_per_request, const int32_t* keys, int64_t page_size, float* scores,
                  cudaStream_t stream) {
  if (width > 32 * kMaxColumnsPerLane) throw std::invalid_argument("sparse quest_scores: width above 1024");
  const dim3 grid(unsigned((pages_per_request + kScoreWarps - 1) / kScoreWarps), unsigned(batch));
  quest_scores_kernel<<<grid, kScoreWarps * 32, 0, stream>>>(q, int(q_len), int(heads), int(width), min, max, page_table, int(pages_per_request),
                                                           keys, int(page_size), scores);
  DSLAB_CHECK_LAUNCH();
}

void compact_pages(const float* scores, const int32_t* page_table, int64_t pages_per_request, const int32_t* keys, int64_t page_size,
                   const Budget& budget, int64_t batch, int64_t max_pages, int32_t* physical, int32_t* logical, int32_t* length,
                   cudaStream_t stream) {
  if (pages_per_request > kMaxPages) throw std::invalid_argument("sparse compact_pages: at most 16384 pages per request");
  const SelectArgs a{scores, page_table, int(pages_per_request), keys, int(page_size), int(budget.tokens), int(budget.n_init),
                     int(budget.local), int(max_pages), physical, logical, length};
  compact_pages_kernel<<<unsigned(batch), kSelectThreads, 0, stream>>>(a);
  DSLAB_CHECK_LAUNCH();
}

}  // namespace dslab::sparse::cuda
