// Block-level sparse decode on the GPU, its selection half: Quest's page bounds or InfLLM's
// representative keys kept beside the paged latent cache, every page's score for the step's queries, and the
// selection as sparse::select_pages makes it (whole pages: the sinks' and window's, then the best-scored; ascending)
// written as a compact page table and a key count per request, which the fused decode kernel walks as it walks the
// whole cache. The CPU functions of
// variants/sparse/sparse.h are the reference each of these is tested against (tests/test_sparse_cuda.cc).
#pragma once
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/sparse.h"

namespace dslab::sparse::cuda {

// What a block selector keeps per page (its blocks are the cache's pages), in row r * pages_per_request + p of a
// [rows][summary_width] bf16 array for request r's logical page p:
//   quest_bounds: the element-wise max, then min, of the page's keys (the keys' own bf16 values, so exact);
//   infllm_mean: InfLLM's representative key, the plain mean of the page's keys (fp32 sums, rounded to bf16).
enum class Summary { quest_bounds, infllm_mean };
inline int64_t summary_width(Summary s, int64_t width) { return s == Summary::quest_bounds ? 2 * width : width; }

// The summaries of listed pages: each of the n entries names the physical page to read (-1: skipped), the row to
// write and how many keys it holds (prepare lists every page).
void page_summaries(Summary kind, const __nv_bfloat16* cache, int64_t page_size, int64_t width, const int32_t* pages,
                    const int32_t* rows, const int32_t* counts, int n, __nv_bfloat16* summaries, cudaStream_t stream);

// Before a decode step's selection: each request's keys after the step's q_len tokens (keys [batch]), and the
// summaries of the pages those tokens went to (at most two, as q_len <= page_size) remade. A block per request.
void step_page_summaries(Summary kind, const __nv_bfloat16* cache, int64_t page_size, int64_t width,
                         const int32_t* lengths, int64_t q_len, const int32_t* page_table, int64_t pages_per_request,
                         int64_t batch, int32_t* keys, __nv_bfloat16* summaries, cudaStream_t stream);

// Page scores: for request r and its logical page p (p < pages of its keys[r] keys; -inf beyond), the best over heads
// and the request's q_len queries of
//   quest_bounds: sum_d max(q_d min_d, q_d max_d), the upper bound of any of its keys' scores. As max_d >= min_d that
//     sum is exactly q⁺·max + q⁻·min (q⁺ = max(q, 0), q⁻ = min(q, 0)): the query rows are split by sign first;
//   infllm_mean: q · mean, the representative key's score.
// Either way one GEMM per request scores every (query row, page) on the tensor cores (bf16 products, fp32 sums) and
// a reduction keeps each page's best row. q: [batch * q_len][heads][width] bf16 (the absorbed latent query, then
// rope); scores: [batch][pages_per_request]. Scratch: q_split [batch * q_len * heads][2 * width] bf16 (quest_bounds
// only) and products [batch][pages_per_request][q_len * heads] fp32. `blas` must queue on `stream`.
void page_scores(Summary kind, cublasHandle_t blas, const __nv_bfloat16* q, int64_t batch, int64_t q_len, int64_t heads,
                 int64_t width, const __nv_bfloat16* summaries, int64_t pages_per_request, const int32_t* keys,
                 int64_t page_size, __nv_bfloat16* q_split, float* products, float* scores, cudaStream_t stream);

// select_pages on every request from its scores (ties to the lower page, as the CPU's stable ranking): the chosen
// pages ascending as physical ids [batch][max_pages] (page_table's entries) and as logical ones (for verification),
// the keys the decode kernel attends through them (select_pages's length) and, where `before` is given, that length
// less the step's q_len (the decode kernel's lengths count the keys before the step's). max_pages: at least the most
// pages select_pages keeps (max(budget pages, the sinks' and window's pages)); at most 65536 pages per request. The
// budget's best pages are found by a radix select over the scores' bits, a byte at a time.
void compact_pages(const float* scores, const int32_t* page_table, int64_t pages_per_request, const int32_t* keys,
                   int64_t page_size, const Budget& budget, int64_t batch, int64_t max_pages, int64_t q_len,
                   int32_t* physical, int32_t* logical, int32_t* length, int32_t* before, cudaStream_t stream);

// The token-level selection of sparse::select_tokens on every request from its per-key scores ([batch]
// [scores_per_request]): the chosen keys ascending as cache slots [batch][max_tokens] (page_table's page * page_size +
// offset: the decode kernel walks them as pages of one key) and as logical indices, their count, and that count less
// q_len (`before`, if given). max_tokens: at least max(budget, n_init + local). A block per request, or a cluster
// per request past 16K keys (topk_launch).
void compact_tokens(const float* scores, int64_t scores_per_request, const int32_t* page_table,
                    int64_t pages_per_request, const int32_t* keys, int64_t page_size, const Budget& budget,
                    int64_t batch, int64_t max_tokens, int64_t q_len, int32_t* slots, int32_t* logical, int32_t* length,
                    int32_t* before, cudaStream_t stream);

// How compact_tokens runs `batch` requests of `scores_per_request` keys: CTAs per request (1: one block; 4-8: a
// thread-block cluster), whether the cluster reads its scores again at each pass (more keys than its registers hold),
// and how many such clusters this GPU holds at once (cudaOccupancyMaxActiveClusters: a cluster needs all of its CTAs'
// SMs in one GPC, which a wave count over SMs does not see: a 132-SM H100 holds 15 clusters of 8, so 16 requests ran
// in two rounds) and so in how many rounds the batch runs. The cluster size is the one with the least work on the
// slowest SM: rounds x keys a CTA, a streaming pass counted kStreamingCost times a register pass.
struct TopkLaunch {
  int ctas_per_request = 1;
  bool streaming = false;
  int max_active_clusters = 0;  // 0 for one block
  int rounds = 1;
};
TopkLaunch topk_launch(int64_t scores_per_request, int64_t batch);
// The launch measured on this GPU for these shapes (tuning family "topk_ctas": one block or each cluster size, timed
// on random scores; kept in the tuning cache), or topk_launch's estimate with DSLAB_TUNE=off; one block below 16K
// keys. What a selector's prepare() uses.
TopkLaunch tuned_topk_launch(int64_t scores_per_request, int64_t batch, int64_t page_size, const Budget& budget,
                             int64_t max_tokens, int64_t q_len);
// The same choice given `max_active(ctas, streaming)`, the clusters of each size a GPU holds at once (host logic:
// tested in CI with a GPU's measured answers).
TopkLaunch topk_launch_given(int64_t scores_per_request, int64_t batch,
                             const std::function<int(int, bool)>& max_active);
TopkLaunch topk_cluster_launch_given(int64_t scores_per_request, int64_t batch, int ctas,
                                     const std::function<int(int, bool)>& max_active);
// The same with the cluster size given (4..8; tests run every size): streaming as the keys require.
TopkLaunch topk_cluster_launch(int64_t scores_per_request, int64_t batch, int ctas);
// compact_tokens on a given launch (tests: every cluster size on the same requests).
void compact_tokens_as(const TopkLaunch& launch, const float* scores, int64_t scores_per_request,
                       const int32_t* page_table, int64_t pages_per_request, const int32_t* keys, int64_t page_size,
                       const Budget& budget, int64_t batch, int64_t max_tokens, int64_t q_len, int32_t* slots,
                       int32_t* logical, int32_t* length, int32_t* before, cudaStream_t stream);

// What every GPU sparse decode keeps besides its choice: the first kSinkTokens keys (attention sinks) and the `local`
// window; the budget counts both.
constexpr int64_t kSinkTokens = 4;
Budget sparse_budget(const mla::Shape& s, int64_t block);
// The oracle's scores (sparse/oracle/cuda): every key's softmax probability summed over the heads, mass [batch]
// [max_keys] for keys < keys[r] = lengths[r] + q_len (written too): the keys gathered into [batch][max_keys][width],
// one GEMM against the query q [batch][heads][width] (q_len 1) into head_scores [batch][heads][max_keys] fp32, each
// head's max and sum of exp(scale * score) over the keys (row_max, row_sum [batch][heads]), then the mass.
void attention_mass(cublasHandle_t blas, const __nv_bfloat16* cache, int64_t width, const int32_t* lengths,
                    int64_t q_len, const int32_t* page_table, int64_t pages_per_request, int64_t page_size,
                    int64_t batch, const __nv_bfloat16* q, int64_t heads, float scale, int64_t max_keys,
                    __nv_bfloat16* gathered, float* head_scores, float* row_max, float* row_sum, int32_t* keys,
                    float* mass, cudaStream_t stream);

// Why a sparse decode cannot run these shapes, or "": the checks every GPU selector makes (budget and local set, a
// bf16 cache, 16-byte key rows; one_query: decode steps of one token only).
std::string sparse_unsupported(const std::string& name, const ModelConfig& m, const mla::Shape& s, bool one_query);
std::vector<int32_t> to_host(const gpu::DeviceArray<int32_t>& a, size_t n);
// The cache's rows as bf16 (the selectors read bf16 caches only) and the page table its requests use.
inline const __nv_bfloat16* bf16_values(const mla::cuda::PagedLatentCache& c) {
  return reinterpret_cast<const __nv_bfloat16*>(c.values.get());
}
inline const int32_t* page_table_of(const mla::cuda::PagedLatentCache& c) {
  return c.shared_page_table ? c.shared_page_table : c.page_table.get();
}

// What the token selectors (sparse/dsa/cuda, sparse/oracle/cuda) share: per-key scores of one query per request
// ranked by compact_tokens into the chosen keys' slots, which the decode kernel walks as pages of one key. A subclass
// sizes its own buffers in prepare_scores() and fills scores() ([batch][scores_per_request()]) in score().
class TokenSelector : public mla::cuda::PageSelector {
 public:
  explicit TokenSelector(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string unsupported(const ModelConfig& m, const mla::Shape& s) const override {
    return sparse_unsupported(name_, m, s, true);
  }
  int64_t kept_keys(int64_t keys, int64_t, const mla::Shape& s) const override {
    return token_sparse_length(keys, sparse_budget(s, 1));
  }
  int64_t keys_per_entry(int64_t) const override { return 1; }
  void prepare(const ModelConfig& m, const mla::Shape& s, const mla::cuda::PagedLatentCache& cache,
               const int32_t* lengths, gpu::ScratchArena* arena) final;
  void select(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t blas, const Mark& mark) final;
  const int32_t* page_table() const final { return slots_.get(); }
  int64_t pages_per_request() const final { return max_tokens_; }
  const int32_t* lengths() const final { return lengths_.get(); }
  std::vector<std::vector<int64_t>> key_indices() const final;
  // topk_ctas_per_request, and with a cluster topk_max_active_clusters, topk_cluster_rounds (batch over them,
  // rounded up: more than 1, and the batch's top-k takes that many rounds of the cluster kernel) and topk_streaming
  std::map<std::string, double> launch_counters() const final;

 protected:
  virtual void prepare_scores(const ModelConfig& m) = 0;
  // Queues the scores of request r's keys 0 .. keys[r] - 1 and keys[r] = cached + q_len (the keys after the step).
  virtual void score(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t blas, const Mark& mark) = 0;
  int64_t scores_per_request() const { return cache_->pages_per_request * cache_->page_size; }

  std::string name_;
  mla::Shape s_;
  const mla::cuda::PagedLatentCache* cache_ = nullptr;
  const int32_t* lengths_in_ = nullptr;  // [batch] cached keys before the step
  int64_t width_ = 0;
  gpu::DeviceArray<float> scores_;
  gpu::DeviceArray<int32_t> keys_;

 private:
  Budget budget_;
  int64_t max_tokens_ = 0;
  TopkLaunch topk_;  // how every step's top-k launches (chosen at prepare)
  gpu::DeviceArray<int32_t> slots_, logical_, kept_, lengths_;
};

// A block selector for mla/fused/cuda's kernel (sparse/quest/cuda, sparse/infllm/cuda): the summaries of every
// page made at prepare and the step's pages remade inside run(), the pages scored, select_pages's pages kept (n_init
// 4 sink tokens, the `local` and `budget` axes) as a compact page table and lengths.
std::unique_ptr<mla::cuda::PageSelector> make_block_selector(Summary kind, const char* name);

}  // namespace dslab::sparse::cuda
