// The selection half of the GPU's block-sparse decode (paged_select.h): a block per listed page for its bounds, the
// page scores as a cuBLAS GEMM between two small kernels, a block per request for its selection.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "harness/cuda_check.h"
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/paged_select.h"

namespace dslab::sparse::cuda {
namespace {

constexpr int kBoundsThreads = 256;
// One page's bounds by the block: the max, then the min, of its first `count` keys into `row`.
__device__ void bounds_of_page(const __nv_bfloat16* __restrict__ keys, int count, int width, __nv_bfloat16* __restrict__ row) {
  for (int d = int(threadIdx.x); d < width; d += int(blockDim.x)) {
    float lo = INFINITY, hi = -INFINITY;
    for (int k = 0; k < count; ++k) {
      const float v = __bfloat162float(keys[int64_t(k) * width + d]);
      lo = fminf(lo, v), hi = fmaxf(hi, v);
    }
    row[d] = __float2bfloat16(hi);  // (bf16 values: exact)
    row[width + d] = __float2bfloat16(lo);
  }
}

__global__ void __launch_bounds__(kBoundsThreads) page_bounds_kernel(const __nv_bfloat16* __restrict__ cache, int page_size, int width,
                                                                     const int32_t* __restrict__ pages, const int32_t* __restrict__ rows,
                                                                     const int32_t* __restrict__ counts, __nv_bfloat16* __restrict__ bounds) {
  const int64_t page = pages[blockIdx.x];
  if (page < 0) return;  // (an entry a step does not need: see page_bounds)
  bounds_of_page(cache + page * page_size * width, counts[blockIdx.x], width, bounds + int64_t(rows[blockIdx.x]) * 2 * width);
}

__global__ void __launch_bounds__(kBoundsThreads) step_page_bounds_kernel(const __nv_bfloat16* __restrict__ cache, int page_size, int width,
                                                                          const int32_t* __restrict__ lengths, int q_len,
                                                                          const int32_t* __restrict__ page_table, int pages_per_request,
                                                                          int32_t* __restrict__ keys, __nv_bfloat16* __restrict__ bounds) {
  const int r = int(blockIdx.x);
  const int k = lengths[r] + q_len, first = lengths[r] / page_size, last = (k - 1) / page_size;
  const int64_t at = int64_t(r) * pages_per_request;
  if (threadIdx.x == 0) keys[r] = k;
  for (int p = first; p <= last; ++p)
    bounds_of_page(cache + int64_t(page_table[at + p]) * page_size * width, min(page_size, k - p * page_size), width,
                   bounds + (at + p) * 2 * width);
}

// [q⁺ ‖ q⁻] per query row, the GEMM's left operand (signs split exactly in bf16).
__global__ void split_signs_kernel(const __nv_bfloat162* __restrict__ q, int64_t rows, int half_width, __nv_bfloat162* __restrict__ out) {
  const __nv_bfloat162 zero = __float2bfloat162_rn(0.0f);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * half_width; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / half_width, d = i % half_width;
    const __nv_bfloat162 v = q[i];
    out[row * 2 * half_width + d] = __hmax2(v, zero);
    out[row * 2 * half_width + half_width + d] = __hmin2(v, zero);
  }
}

// A warp per (request, logical page): the best of its query rows' products.
constexpr int kReduceWarps = 8;
__global__ void __launch_bounds__(kReduceWarps * 32) best_row_kernel(const float* __restrict__ products, int rows, int pages_per_request,
                                                                     const int32_t* __restrict__ keys, int page_size, float* __restrict__ scores) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int r = int(blockIdx.y), p = int(blockIdx.x) * kReduceWarps + warp;
  if (p >= pages_per_request) return;
  const int64_t at = int64_t(r) * pages_per_request + p;
  float best = -INFINITY;
  if (p < (keys[r] + page_size - 1) / page_size)
    for (int m = lane; m < rows; m += 32) best = fmaxf(best, products[at * rows + m]);
  for (int o = 16; o; o >>= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, o));
  if (lane == 0) scores[at] = best;
}

// Floats as unsigned integers in the same order (larger float, larger key); 0 is below every float's key.
__device__ inline uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kSelectThreads = 1024, kMaxPages = 65536;
struct SelectArgs {
  const float* scores;
  const int32_t* page_table;
  int pages_per_request;
  const int32_t* keys;
  int page_size, tokens, n_init, local, max_pages, q_len;
  int32_t *physical, *logical, *length, *before;
};

// A block per request: the pages always kept, the `need` best others (the need-th largest score found a byte at a
// time from the top: a 256-bin histogram of the candidates' next byte, the byte where the count from the top reaches
// what is still needed; then those above it and the lowest-indexed ones equal to it), the chosen pages in order.
__global__ void __launch_bounds__(kSelectThreads) compact_pages_kernel(SelectArgs a) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int histogram[256];
  __shared__ uint32_t chosen_digit;
  __shared__ int chosen_above;
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
    uint32_t prefix = 0, mask = 0;
    int remaining = need;  // of the keys matching prefix under mask, how many more must be taken from the top
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (tid < 256) histogram[tid] = 0;
      __syncthreads();
      for (int p = first; p < last; ++p) {
        const uint32_t k = key(p);
        if ((k & mask) == prefix) atomicAdd(&histogram[(k >> shift) & 255u], 1);
      }
      __syncthreads();
      if (tid < 32) {  // one warp: lane l holds bins 8l..8l+7; counts from the top by a suffix sum over lanes
        int bins[8], sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) bins[i] = histogram[tid * 8 + i], sum += bins[i];
        int suffix = sum;  // bins 8 * tid .. 255
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_down_sync(0xffffffffu, suffix, o);
          if (tid + o < 32) suffix += v;
        }
        int above = suffix - sum;  // bins above this lane's
#pragma unroll
        for (int i = 7; i >= 0; --i) {
          if (above < remaining && above + bins[i] >= remaining) chosen_digit = uint32_t(tid * 8 + i), chosen_above = above;
          above += bins[i];
        }
      }
      __syncthreads();
      prefix |= chosen_digit << shift, mask |= 255u << shift;
      remaining -= chosen_above;
      __syncthreads();  // (the next pass rewrites the shared answer)
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
  if (tid == 0) {
    const int length = (total - 1) * P + (keys - (pages - 1) * P);
    a.length[r] = length;
    if (a.before) a.before[r] = length - a.q_len;
  }
}

}  // namespace

void page_bounds(const __nv_bfloat16* cache, int64_t page_size, int64_t width, const int32_t* pages, const int32_t* rows, const int32_t* counts,
                 int n, __nv_bfloat16* bounds, cudaStream_t stream) {
  if (n <= 0) return;
  page_bounds_kernel<<<unsigned(n), kBoundsThreads, 0, stream>>>(cache, int(page_size), int(width), pages, rows, counts, bounds);
  DSLAB_CHECK_LAUNCH();
}

void quest_scores(cublasHandle_t blas, const __nv_bfloat16* q, int64_t batch, int64_t q_len, int64_t heads, int64_t width,
                  const __nv_bfloat16* bounds, int64_t pages_per_request, const int32_t* keys, int64_t page_size, __nv_bfloat16* q_split,
                  float* products, float* scores, cudaStream_t stream) {
  if (width % 8) throw std::invalid_argument("sparse quest_scores: the key width must be a multiple of 8 (16-byte rows)");
  const int64_t rows = q_len * heads, k = 2 * width;
  const int64_t pairs = batch * rows * (width / 2);
  split_signs_kernel<<<unsigned(std::min<int64_t>((pairs + 255) / 256, 4096)), 256, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat162*>(q), batch * rows, int(width / 2), reinterpret_cast<__nv_bfloat162*>(q_split));
  DSLAB_CHECK_LAUNCH();
  // Per request, column-major: products (rows x pages) = q_split^T (rows x k) . bounds (k x pages): row-major
  // [pages][rows], each page's rows side by side for the reduction.
  mla::cuda::gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, pages_per_request, k, q_split, k, rows * k, bounds, k, pages_per_request * k, products,
                  CUDA_R_32F, rows, pages_per_request * rows, batch);
  const dim3 grid(unsigned((pages_per_request + kReduceWarps - 1) / kReduceWarps), unsigned(batch));
  best_row_kernel<<<grid, kReduceWarps * 32, 0, stream>>>(products, int(rows), int(pages_per_request), keys, int(page_size), scores);
  DSLAB_CHECK_LAUNCH();
}

void step_page_bounds(const __nv_bfloat16* cache, int64_t page_size, int64_t width, const int32_t* lengths, int64_t q_len,
                      const int32_t* page_table, int64_t pages_per_request, int64_t batch, int32_t* keys, __nv_bfloat16* bounds,
                      cudaStream_t stream) {
  if (q_len > page_size) throw std::invalid_argument("sparse step_page_bounds: q_len above page_size");
  step_page_bounds_kernel<<<unsigned(batch), kBoundsThreads, 0, stream>>>(cache, int(page_size), int(width), lengths, int(q_len), page_table,
                                                                        int(pages_per_request), keys, bounds);
  DSLAB_CHECK_LAUNCH();
}

void compact_pages(const float* scores, const int32_t* page_table, int64_t pages_per_request, const int32_t* keys, int64_t page_size,
                   const Budget& budget, int64_t batch, int64_t max_pages, int64_t q_len, int32_t* physical, int32_t* logical, int32_t* length,
                   int32_t* before, cudaStream_t stream) {
  if (pages_per_request > kMaxPages) throw std::invalid_argument("sparse compact_pages: at most 65536 pages per request");
  const SelectArgs a{scores, page_table, int(pages_per_request), keys, int(page_size), int(budget.tokens), int(budget.n_init),
                     int(budget.local), int(max_pages), int(q_len), physical, logical, length, before};
  compact_pages_kernel<<<unsigned(batch), kSelectThreads, 0, stream>>>(a);
  DSLAB_CHECK_LAUNCH();
}

}  // namespace dslab::sparse::cuda
