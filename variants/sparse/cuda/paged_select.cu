// The GPU page and token selectors (paged_select.h) that feed mla/fused/cuda the keys to attend: Quest and InfLLM
// over page summaries (page_summaries.cu), the token selectors' top-k (topk.cu).
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

using gpu::DeviceArray;

// Every page of every request with its cached keys before the first step (pages past a request's keys: -1); entry i
// is summary row i.
__global__ void all_pages_kernel(const int32_t* lengths, const int32_t* page_table, int pages_per_request,
                                 int page_size, int batch, int32_t* pages, int32_t* rows, int32_t* counts) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(batch) * pages_per_request) return;
  const int r = int(i / pages_per_request), p = int(i % pages_per_request);
  const int count = min(page_size, max(0, lengths[r] - p * page_size));
  pages[i] = count > 0 ? page_table[i] : -1;
  rows[i] = int32_t(i);
  counts[i] = count;
}

class BlockSelector final : public mla::cuda::PageSelector {
 public:
  BlockSelector(Summary kind, const char* name) : kind_(kind), name_(name) {}
  std::string name() const override { return name_; }
  std::string unsupported(const ModelConfig& m, const mla::Shape& s) const override {
    return sparse_unsupported(name_, m, s, false);
  }
  int64_t kept_keys(int64_t keys, int64_t page_size, const mla::Shape& s) const override {
    return paged_sparse_length(keys, page_size, sparse_budget(s, page_size));
  }
  Cost cost(const ModelConfig& m, const mla::Shape& s, int64_t page_size) const override {
    // Per request: every page's summary read (bf16) and scored against every head's and new token's query (a GEMM;
    // Quest's query split by sign first, written and read), its products written and read back for the best row;
    // the chosen page table written. The remade summaries of the step's pages are small beside them.
    const double pages = double((s.keys() + page_size - 1) / page_size),
                 width = double(m.kv_lora_rank + m.qk_rope_head_dim);
    const double rows = double(s.q_len * s.heads), k = double(summary_width(kind_, int64_t(width)));
    Cost c;
    c.flops = double(s.batch) * pages * rows * k * 2;
    c.bytes = double(s.batch) * (pages * (k * 2 + rows * 4 * 2 + 4 * 3) +
                                 rows * (width * 2 + (kind_ == Summary::quest_bounds ? k * 2 * 2 : 0)));
    return c;
  }
  void prepare(const ModelConfig& m, const mla::Shape& s, const mla::cuda::PagedLatentCache& cache,
               const int32_t* lengths, gpu::ScratchArena*) override {
    if (s.q_len > cache.page_size)
      throw BadInput(name_ + ": q_len " + std::to_string(s.q_len) + " above page_size " +
                     std::to_string(cache.page_size) + " (a step's keys must reach at most two pages)");
    s_ = s;
    cache_ = &cache;
    lengths_in_ = lengths;
    width_ = m.kv_lora_rank + m.qk_rope_head_dim;
    budget_ = sparse_budget(s, cache.page_size);
    const int64_t P = cache.page_size, ppr = cache.pages_per_request, rows = s.q_len * s.heads;
    // The most pages select_pages keeps: the budget's, or the sinks' and the window's (an unaligned window spans one
    // more).
    max_pages_ = std::min<int64_t>(
        ppr, std::max<int64_t>(budget_.tokens / P, (kSinkTokens + P - 1) / P + budget_.local / P + 2) + 1);
    summaries_.resize(size_t(s.batch * ppr * summary_width(kind_, width_)));
    summaries_.zero();  // (rows past a request's keys are multiplied but never ranked)
    q_split_.resize(kind_ == Summary::quest_bounds ? size_t(s.batch * rows * 2 * width_) : 0);
    products_.resize(size_t(s.batch * ppr * rows));
    scores_.resize(size_t(s.batch * ppr));
    physical_.resize(size_t(s.batch * max_pages_));
    logical_.resize(size_t(s.batch * max_pages_));
    kept_.resize(size_t(s.batch));
    lengths_.resize(size_t(s.batch));
    keys_.resize(size_t(s.batch));
    // Every page's summary, once (the cache as prepared: the cached keys before the first step).
    const int64_t n = s.batch * ppr;
    DeviceArray<int32_t> pages{size_t(n)}, rows_of{size_t(n)}, counts{size_t(n)};
    all_pages_kernel<<<unsigned((n + 255) / 256), 256>>>(lengths, page_table_of(cache), int(ppr), int(P), int(s.batch),
                                                         pages.get(), rows_of.get(), counts.get());
    DSLAB_CHECK_LAUNCH();
    page_summaries(kind_, bf16_values(cache), P, width_, pages.get(), rows_of.get(), counts.get(), int(n),
                   summaries_.get(), 0);
    DSLAB_CUDA(cudaDeviceSynchronize());
  }
  void select(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t blas, const Mark& mark) override {
    const int64_t P = cache_->page_size, ppr = cache_->pages_per_request, B = s_.batch;
    step_page_summaries(kind_, bf16_values(*cache_), P, width_, lengths_in_, s_.q_len, page_table_of(*cache_), ppr, B,
                        keys_.get(), summaries_.get(), stream);
    mark("select_summaries");
    page_scores(kind_, blas, q_cat, B, s_.q_len, s_.heads, width_, summaries_.get(), ppr, keys_.get(), P,
                q_split_.get(), products_.get(), scores_.get(), stream);
    mark("select_scores");
    compact_pages(scores_.get(), page_table_of(*cache_), ppr, keys_.get(), P, budget_, B, max_pages_, s_.q_len,
                  physical_.get(), logical_.get(), kept_.get(), lengths_.get(), stream);
    mark("select_pages");
  }
  const int32_t* page_table() const override { return physical_.get(); }
  int64_t pages_per_request() const override { return max_pages_; }
  const int32_t* lengths() const override { return lengths_.get(); }
  std::vector<std::vector<int64_t>> key_indices() const override {
    DSLAB_CUDA(cudaDeviceSynchronize());
    const size_t B = size_t(s_.batch);
    const std::vector<int32_t> logical = to_host(logical_, B * size_t(max_pages_)), kept = to_host(kept_, B),
                               keys = to_host(keys_, B);
    const int64_t P = cache_->page_size;
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(s_.batch));
    for (int64_t r = 0; r < s_.batch; ++r) {
      const int64_t k = keys[size_t(r)], pages = (k + P - 1) / P, last = k - (pages - 1) * P;
      PageSelection sel;
      sel.length = kept[size_t(r)];
      for (int64_t i = 0; i < (sel.length - last) / P + 1; ++i)
        sel.pages.push_back(logical[size_t(r * max_pages_ + i)]);
      out[size_t(r)] = keys_of(sel, k, P);
    }
    return out;
  }

 private:
  Summary kind_;
  std::string name_;
  mla::Shape s_;
  const mla::cuda::PagedLatentCache* cache_ = nullptr;
  const int32_t* lengths_in_ = nullptr;
  int64_t width_ = 0, max_pages_ = 0;
  Budget budget_;
  DeviceArray<__nv_bfloat16> summaries_,
      q_split_;                           // [batch][pages per request][summary_width], [tokens * heads][q⁺ ‖ q⁻]
  DeviceArray<float> products_, scores_;  // [batch][pages per request][q_len * heads], [batch][pages per request]
  DeviceArray<int32_t> physical_, logical_, kept_, lengths_, keys_;
};

}  // namespace

Budget sparse_budget(const mla::Shape& s, int64_t block) {
  Budget b;
  b.tokens = s.budget;
  b.block = block;
  b.n_init = kSinkTokens;
  b.local = s.local;
  return b;
}

std::vector<int32_t> to_host(const gpu::DeviceArray<int32_t>& a, size_t n) {
  std::vector<int32_t> h(n);
  DSLAB_CUDA(cudaMemcpy(h.data(), a.get(), n * 4, cudaMemcpyDeviceToHost));
  return h;
}

std::string sparse_unsupported(const std::string& name, const ModelConfig& m, const mla::Shape& s, bool one_query) {
  if (s.budget < 1) return name + ": the budget axis (keys attended per request) must be set";
  if (s.local < 1) return name + ": the local axis (the window every step attends) must be set";
  if (s.kv_dtype != mla::KvDtype::bf16) return name + ": the selection reads a bf16 cache";
  if ((m.kv_lora_rank + m.qk_rope_head_dim) % 8) return name + ": keys of a multiple of 8 values";
  if (one_query && s.q_len != 1) return name + ": one query per request (decode steps of one token)";
  return "";
}

void TokenSelector::prepare(const ModelConfig& m, const mla::Shape& s, const mla::cuda::PagedLatentCache& cache,
                            const int32_t* lengths, gpu::ScratchArena*) {
  s_ = s;
  cache_ = &cache;
  lengths_in_ = lengths;
  width_ = m.kv_lora_rank + m.qk_rope_head_dim;
  budget_ = sparse_budget(s, 1);
  max_tokens_ = std::min(scores_per_request(), std::max<int64_t>(s.budget, kSinkTokens + s.local) + 1);
  scores_.resize(size_t(s.batch * scores_per_request()));
  keys_.resize(size_t(s.batch));
  for (auto* a : {&slots_, &logical_}) a->resize(size_t(s.batch * max_tokens_));
  for (auto* a : {&kept_, &lengths_}) a->resize(size_t(s.batch));
  // (the shapes are fixed from here: every step launches the same)
  topk_ = tuned_topk_launch(scores_per_request(), s.batch, cache.page_size, budget_, max_tokens_, s.q_len);
  prepare_scores(m);
}

void TokenSelector::select(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t blas, const Mark& mark) {
  score(q_cat, stream, blas, mark);
  compact_tokens_as(topk_, scores_.get(), scores_per_request(), page_table_of(*cache_), cache_->pages_per_request,
                    keys_.get(), cache_->page_size, budget_, s_.batch, max_tokens_, s_.q_len, slots_.get(),
                    logical_.get(), kept_.get(), lengths_.get(), stream);
  mark("select_tokens");
}

std::vector<std::vector<int64_t>> TokenSelector::key_indices() const {
  DSLAB_CUDA(cudaDeviceSynchronize());
  const size_t B = size_t(s_.batch), T = size_t(max_tokens_);
  const std::vector<int32_t> all = to_host(logical_, B * T), count = to_host(kept_, B);
  std::vector<std::vector<int64_t>> out(B);
  for (size_t r = 0; r < B; ++r)
    out[r].assign(all.begin() + ptrdiff_t(r * T), all.begin() + ptrdiff_t(r * T + size_t(count[r])));
  return out;
}

std::map<std::string, double> TokenSelector::launch_counters() const {
  std::map<std::string, double> c{{"topk_ctas_per_request", double(topk_.ctas_per_request)}};
  if (topk_.ctas_per_request > 1) {
    c["topk_max_active_clusters"] = double(topk_.max_active_clusters);
    c["topk_cluster_rounds"] = double(topk_.rounds);
    c["topk_streaming"] = topk_.streaming ? 1.0 : 0.0;
  }
  return c;
}

std::unique_ptr<mla::cuda::PageSelector> make_block_selector(Summary kind, const char* name) {
  return std::make_unique<BlockSelector>(kind, name);
}

}  // namespace dslab::sparse::cuda
