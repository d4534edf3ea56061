// sparse/quest/cuda: Quest's block-sparse decode over the paged latent cache (issue 16). A block is a cache page:
// each page keeps the element-wise min and max of its [latent ‖ rope] keys (made for every page at prepare; in each
// step only the pages this step's keys went to are remade, inside run()); a page's score is the best over heads and
// new tokens of sum_d max(q_d min_d, q_d max_d) with the absorbed query, an upper bound of any of its keys' scores,
// computed as one GEMM per request (paged_select.h)
// (one selection per request, shared by all heads as they share the latent: a page any head needs is kept); the
// sinks' and window's pages are always kept, the best-scored others fill the budget. mla/fused/cuda's kernel then
// walks the chosen pages through a compact page table, as it walks the whole cache (PageSelector).
#include <algorithm>
#include <string>

#include "harness/cuda_check.h"
#include "harness/errors.h"
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/paged_select.h"
#include "variants/sparse/sparse.h"

namespace dslab::sparse::cuda {
namespace {

using mla::cuda::DeviceArray;

std::vector<int32_t> download(const DeviceArray<int32_t>& a, size_t n) {
  std::vector<int32_t> h(n);
  DSLAB_CUDA(cudaMemcpy(h.data(), a.get(), n * 4, cudaMemcpyDeviceToHost));
  return h;
}
const __nv_bfloat16* bf16_values(const mla::cuda::PagedLatentCache& c) { return reinterpret_cast<const __nv_bfloat16*>(c.values.get()); }

constexpr int kSinkTokens = 4;  // n_init: the first keys every step attends (attention sinks)

// Every page of every request with its cached keys before the first step (pages past a request's keys: -1); entry i
// is bounds row i.
__global__ void all_pages_kernel(const int32_t* lengths, const int32_t* page_table, int pages_per_request, int page_size, int batch,
                                 int32_t* pages, int32_t* rows, int32_t* counts) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(batch) * pages_per_request) return;
  const int r = int(i / pages_per_request), p = int(i % pages_per_request);
  const int count = min(page_size, max(0, lengths[r] - p * page_size));
  pages[i] = count > 0 ? page_table[i] : -1;
  rows[i] = int32_t(i);
  counts[i] = count;
}

class QuestSelector final : public mla::cuda::PageSelector {
 public:
  std::string name() const override { return "sparse/quest/cuda"; }
  std::string unsupported(const ModelConfig& m, const mla::Shape& s) const override {
    if (s.budget < 1) return "sparse/quest/cuda: the budget axis (keys attended per request) must be set";
    if (s.local < 1) return "sparse/quest/cuda: the local axis (the window every step attends) must be set";
    if (s.kv_dtype != mla::KvDtype::bf16) return "sparse/quest/cuda: the page bounds read a bf16 cache";
    if (m.kv_lora_rank + m.qk_rope_head_dim > 1024) return "sparse/quest/cuda: keys wider than 1024";
    return "";
  }
  int64_t kept_keys(int64_t keys, int64_t page_size, const mla::Shape& s) const override {
    return paged_sparse_length(keys, page_size, budget_of(s, page_size));
  }
  Cost cost(const ModelConfig& m, const mla::Shape& s, int64_t page_size) const override {
    // Per request: every page's bounds read (max and min, bf16) and scored against every head's and new token's
    // split query (a GEMM), its products written and read back for the best row; the chosen page table written.
    // The remade bounds of the step's pages are small beside them.
    const double pages = double((s.keys() + page_size - 1) / page_size), width = double(m.kv_lora_rank + m.qk_rope_head_dim);
    const double rows = double(s.q_len * s.heads);
    Cost c;
    c.flops = double(s.batch) * pages * rows * 2 * width * 2;
    c.bytes = double(s.batch) * (pages * (2 * width * 2 + rows * 4 * 2 + 4 * 3) + rows * 2 * width * 2 * 2);
    return c;
  }
  void prepare(const ModelConfig& m, const mla::Shape& s, const mla::cuda::PagedLatentCache& cache, const int32_t* lengths,
               mla::cuda::ScratchArena*) override {
    if (s.q_len > cache.page_size)
      throw BadInput("sparse/quest/cuda: q_len " + std::to_string(s.q_len) + " above page_size " + std::to_string(cache.page_size) +
                     " (a step's keys must reach at most two pages)");
    s_ = s;
    cache_ = &cache;
    lengths_in_ = lengths;
    width_ = m.kv_lora_rank + m.qk_rope_head_dim;
    budget_ = budget_of(s, cache.page_size);
    const int64_t P = cache.page_size, ppr = cache.pages_per_request, rows = s.q_len * s.heads;
    // The most pages select_pages keeps: the budget's, or the sinks' and the window's (an unaligned window spans one more).
    max_pages_ = std::min<int64_t>(ppr, std::max<int64_t>(budget_.tokens / P, (kSinkTokens + P - 1) / P + budget_.local / P + 2) + 1);
    bounds_.resize(size_t(s.batch * ppr * 2 * width_));
    bounds_.zero();  // (rows past a request's keys are multiplied but never ranked)
    q_split_.resize(size_t(s.batch * rows * 2 * width_));
    products_.resize(size_t(s.batch * ppr * rows));
    scores_.resize(size_t(s.batch * ppr));
    physical_.resize(size_t(s.batch * max_pages_));
    logical_.resize(size_t(s.batch * max_pages_));
    kept_.resize(size_t(s.batch));
    lengths_.resize(size_t(s.batch));
    keys_.resize(size_t(s.batch));
    // Every page's bounds, once (the cache as prepared: the cached keys before the first step).
    const int64_t n = s.batch * ppr;
    DeviceArray<int32_t> pages{size_t(n)}, rows_of{size_t(n)}, counts{size_t(n)};
    all_pages_kernel<<<unsigned((n + 255) / 256), 256>>>(lengths, page_table(cache), int(ppr), int(P), int(s.batch), pages.get(), rows_of.get(),
                                                         counts.get());
    DSLAB_CHECK_LAUNCH();
    page_bounds(bf16_values(cache), P, width_, pages.get(), rows_of.get(), counts.get(), int(n), bounds_.get(), 0);
    DSLAB_CUDA(cudaDeviceSynchronize());
  }
  void select(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t blas, const Mark& mark) override {
    const int64_t P = cache_->page_size, ppr = cache_->pages_per_request, B = s_.batch;
    step_page_bounds(bf16_values(*cache_), P, width_, lengths_in_, s_.q_len, page_table(*cache_), ppr, B, keys_.get(), bounds_.get(), stream);
    mark("select_bounds");
    quest_scores(blas, q_cat, B, s_.q_len, s_.heads, width_, bounds_.get(), ppr, keys_.get(), P, q_split_.get(), products_.get(), scores_.get(),
                 stream);
    mark("select_scores");
    compact_pages(scores_.get(), page_table(*cache_), ppr, keys_.get(), P, budget_, B, max_pages_, s_.q_len, physical_.get(), logical_.get(),
                  kept_.get(), lengths_.get(), stream);
    mark("select_pages");
  }
  const int32_t* page_table() const override { return physical_.get(); }
  int64_t pages_per_request() const override { return max_pages_; }
  const int32_t* lengths() const override { return lengths_.get(); }
  std::vector<std::vector<int64_t>> key_indices() const override {
    DSLAB_CUDA(cudaDeviceSynchronize());
    const size_t B = size_t(s_.batch);
    const std::vector<int32_t> logical = download(logical_, B * size_t(max_pages_)), kept = download(kept_, B), keys = download(keys_, B);
    const int64_t P = cache_->page_size;
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(s_.batch));
    for (int64_t r = 0; r < s_.batch; ++r) {
      const int64_t k = keys[size_t(r)], pages = (k + P - 1) / P, last = k - (pages - 1) * P;
      PageSelection sel;
      sel.length = kept[size_t(r)];
      for (int64_t i = 0; i < (sel.length - last) / P + 1; ++i) sel.pages.push_back(logical[size_t(r * max_pages_ + i)]);
      out[size_t(r)] = keys_of(sel, k, P);
    }
    return out;
  }

 private:
  static Budget budget_of(const mla::Shape& s, int64_t page_size) {
    Budget b;
    b.tokens = s.budget;
    b.block = page_size;
    b.n_init = kSinkTokens;
    b.local = s.local;
    return b;
  }
  static const int32_t* page_table(const mla::cuda::PagedLatentCache& c) { return c.shared_page_table ? c.shared_page_table : c.page_table.get(); }

  mla::Shape s_;
  const mla::cuda::PagedLatentCache* cache_ = nullptr;
  const int32_t* lengths_in_ = nullptr;
  int64_t width_ = 0, max_pages_ = 0;
  Budget budget_;
  DeviceArray<__nv_bfloat16> bounds_, q_split_;  // [batch][pages per request][max ‖ min], [tokens * heads][q⁺ ‖ q⁻]
  DeviceArray<float> products_, scores_;         // [batch][pages per request][q_len * heads], [batch][pages per request]
  DeviceArray<int32_t> physical_, logical_, kept_, lengths_, keys_;
};

const bool registered = mla::cuda::register_mla_op(
    "sparse/quest/cuda",
    "Quest block-sparse decode: per-page min/max bounds of the latent keys (remade for the step's pages in run()), pages "
    "scored by the best head's upper bound, sinks + window + best pages within the budget, walked by mla/fused/cuda's kernel",
    [] { return mla::cuda::make_fused_op(std::make_unique<QuestSelector>()); });

}  // namespace
}  // namespace dslab::sparse::cuda
