// Block-level sparse decode on the GPU, its selection half (issue 16): Quest's page bounds kept beside the paged
// latent cache, every page's score for the step's queries, and the selection as sparse::select_pages makes it (whole
// pages: the sinks' and window's, then the best-scored; ascending) written as a compact page table and a key count
// per request, which the fused decode kernel can walk as it walks the whole cache. The CPU functions of
// variants/sparse/sparse.h are the reference each of these is tested against (tests/test_sparse_cuda.cc).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "variants/sparse/sparse.h"

namespace dslab::sparse::cuda {

// Quest's bounds of the listed physical pages of a [pages][page_size][width] bf16 cache: the element-wise min and max
// of their first counts[i] keys, into min / max [pages][width] fp32 (the other pages' rows untouched). A decode step
// lists the pages its new keys went to (a page listed as -1 is skipped); prepare lists them all.
void page_bounds(const __nv_bfloat16* cache, int64_t page_size, int64_t width, const int32_t* pages, const int32_t* counts, int n,
                 float* min, float* max, cudaStream_t stream);

// Quest's page scores: for request r and its logical page p (p < pages of its keys[r] keys; -inf beyond), the best over
// heads and the request's q_len queries of sum_d max(q_d min_d, q_d max_d) over the page's bounds (the upper bound of
// any of its keys' scores). q: [batch * q_len][heads][width] bf16 (the absorbed latent query, then rope); page_table:
// [batch][pages_per_request]; scores: [batch][pages_per_request].
void quest_scores(const __nv_bfloat16* q, int64_t batch, int64_t q_len, int64_t heads, int64_t width, const float* min, const float* max,
                  const int32_t* page_table, int64_t pages_per_request, const int32_t* keys, int64_t page_size, float* scores,
                  cudaStream_t stream);

// select_pages on every request from its scores (ties to the lower page, as the CPU's stable ranking): the chosen
// pages ascending as physical ids [batch][max_pages] (page_table's entries) and as logical ones (for verification),
// and the keys the decode kernel attends through them (select_pages's length). max_pages: at least the most pages
// select_pages keeps (max(budget pages, the sinks' and window's pages)); at most 16384 pages per request.
void compact_pages(const float* scores, const int32_t* page_table, int64_t pages_per_request, const int32_t* keys, int64_t page_size,
                   const Budget& budget, int64_t batch, int64_t max_pages, int32_t* physical, int32_t* logical, int32_t* length,
                   cudaStream_t stream);

}  // namespace dslab::sparse::cuda
