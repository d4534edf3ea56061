// Page summaries for the block selectors (paged_select.h): a block per listed page for its bounds (Quest) or mean
// (InfLLM), and the page scores as a cuBLAS GEMM between two small kernels.
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/errors.h"
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/paged_select.h"

namespace dslab::sparse::cuda {

namespace {

constexpr int kSummaryThreads = 256;
// One page's summary by the block, from its first `count` keys into `row`.
__device__ void summarise_page(Summary kind, const __nv_bfloat16* __restrict__ keys, int count, int width,
                               __nv_bfloat16* __restrict__ row) {
  for (int d = int(threadIdx.x); d < width; d += int(blockDim.x)) {
    float lo = INFINITY, hi = -INFINITY, sum = 0;
    for (int k = 0; k < count; ++k) {
      const float v = __bfloat162float(keys[int64_t(k) * width + d]);
      lo = fminf(lo, v), hi = fmaxf(hi, v), sum += v;
    }
    if (kind == Summary::quest_bounds) {
      row[d] = __float2bfloat16(hi);  // (bf16 values: exact)
      row[width + d] = __float2bfloat16(lo);
    } else {
      row[d] = __float2bfloat16(sum / float(max(count, 1)));
    }
  }
}

__global__ void __launch_bounds__(kSummaryThreads)
    page_summaries_kernel(Summary kind, const __nv_bfloat16* __restrict__ cache, int page_size, int width,
                          const int32_t* __restrict__ pages, const int32_t* __restrict__ rows,
                          const int32_t* __restrict__ counts, __nv_bfloat16* __restrict__ summaries) {
  const int64_t page = pages[blockIdx.x];
  if (page < 0) return;  // (an entry a step does not need: see page_summaries)
  const int64_t row_width = kind == Summary::quest_bounds ? 2 * width : width;
  summarise_page(kind, cache + page * page_size * width, counts[blockIdx.x], width,
                 summaries + int64_t(rows[blockIdx.x]) * row_width);
}

__global__ void __launch_bounds__(kSummaryThreads)
    step_page_summaries_kernel(Summary kind, const __nv_bfloat16* __restrict__ cache, int page_size, int width,
                               const int32_t* __restrict__ lengths, int q_len, const int32_t* __restrict__ page_table,
                               int pages_per_request, int32_t* __restrict__ keys,
                               __nv_bfloat16* __restrict__ summaries) {
  const int r = int(blockIdx.x);
  const int k = lengths[r] + q_len, first = lengths[r] / page_size, last = (k - 1) / page_size;
  const int64_t at = int64_t(r) * pages_per_request, row_width = kind == Summary::quest_bounds ? 2 * width : width;
  if (threadIdx.x == 0) keys[r] = k;
  for (int p = first; p <= last; ++p)
    summarise_page(kind, cache + int64_t(page_table[at + p]) * page_size * width, min(page_size, k - p * page_size),
                   width, summaries + (at + p) * row_width);
}

// [q⁺ ‖ q⁻] per query row, the GEMM's left operand (signs split exactly in bf16).
__global__ void split_signs_kernel(const __nv_bfloat162* __restrict__ q, int64_t rows, int half_width,
                                   __nv_bfloat162* __restrict__ out) {
  const __nv_bfloat162 zero = __float2bfloat162_rn(0.0f);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * half_width;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / half_width, d = i % half_width;
    const __nv_bfloat162 v = q[i];
    out[row * 2 * half_width + d] = __hmax2(v, zero);
    out[row * 2 * half_width + half_width + d] = __hmin2(v, zero);
  }
}

// A warp per (request, logical page): the best of its query rows' products.
constexpr int kReduceWarps = 8;
__global__ void __launch_bounds__(kReduceWarps * 32)
    best_row_kernel(const float* __restrict__ products, int rows, int pages_per_request,
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

}  // namespace

void page_summaries(Summary kind, const __nv_bfloat16* cache, int64_t page_size, int64_t width, const int32_t* pages,
                    const int32_t* rows, const int32_t* counts, int n, __nv_bfloat16* summaries, cudaStream_t stream) {
  if (n <= 0) return;
  page_summaries_kernel<<<unsigned(n), kSummaryThreads, 0, stream>>>(kind, cache, int(page_size), int(width), pages,
                                                                     rows, counts, summaries);
  DSLAB_CHECK_LAUNCH();
}

void step_page_summaries(Summary kind, const __nv_bfloat16* cache, int64_t page_size, int64_t width,
                         const int32_t* lengths, int64_t q_len, const int32_t* page_table, int64_t pages_per_request,
                         int64_t batch, int32_t* keys, __nv_bfloat16* summaries, cudaStream_t stream) {
  if (q_len > page_size) throw std::invalid_argument("sparse step_page_summaries: q_len above page_size");
  step_page_summaries_kernel<<<unsigned(batch), kSummaryThreads, 0, stream>>>(kind, cache, int(page_size), int(width),
                                                                              lengths, int(q_len), page_table,
                                                                              int(pages_per_request), keys, summaries);
  DSLAB_CHECK_LAUNCH();
}

void page_scores(Summary kind, cublasHandle_t blas, const __nv_bfloat16* q, int64_t batch, int64_t q_len, int64_t heads,
                 int64_t width, const __nv_bfloat16* summaries, int64_t pages_per_request, const int32_t* keys,
                 int64_t page_size, __nv_bfloat16* q_split, float* products, float* scores, cudaStream_t stream) {
  if (width % 8)
    throw std::invalid_argument("sparse page_scores: the key width must be a multiple of 8 (16-byte rows)");
  const int64_t rows = q_len * heads, k = summary_width(kind, width);
  const __nv_bfloat16* left = q;
  if (kind == Summary::quest_bounds) {
    const int64_t pairs = batch * rows * (width / 2);
    split_signs_kernel<<<unsigned(std::min<int64_t>((pairs + 255) / 256, 4096)), 256, 0, stream>>>(
        reinterpret_cast<const __nv_bfloat162*>(q), batch * rows, int(width / 2),
        reinterpret_cast<__nv_bfloat162*>(q_split));
    DSLAB_CHECK_LAUNCH();
    left = q_split;
  }
  // Per request, column-major: products (rows x pages) = left^T (rows x k) . summaries (k x pages): row-major
  // [pages][rows], each page's rows side by side for the reduction.
  gpu::gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, pages_per_request, k, left, k, rows * k, summaries, k,
            pages_per_request * k, products, CUDA_R_32F, rows, pages_per_request * rows, batch);
  const dim3 grid(unsigned((pages_per_request + kReduceWarps - 1) / kReduceWarps), unsigned(batch));
  best_row_kernel<<<grid, kReduceWarps * 32, 0, stream>>>(products, int(rows), int(pages_per_request), keys,
                                                          int(page_size), scores);
  DSLAB_CHECK_LAUNCH();
}

}  // namespace dslab::sparse::cuda
