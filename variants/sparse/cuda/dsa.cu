// sparse/dsa/cuda: DeepSeek-V3.2's sparse attention (DSA) over the paged latent cache (issue 16). The lightning indexer
// (indexer.h: 64 index heads x 128 dims, an e4m3 index key with one scale per cached key, kept beside the latent cache:
// every key's made at prepare, the step's new keys' inside run()) scores every key, score_k = sum_j ReLU(q_j · key_k)
// / 64; the sinks (4 keys), the `local` window and the best-scored others up to the `budget` are kept, one selection
// per request shared by all heads (they share the latent), and mla/fused/cuda's kernel attends exactly those keys: its
// page table becomes their cache slots, walked as pages of one key (FlashMLA's sparse decode gathers top-k token
// indices through the page table the same way).
#include <algorithm>
#include <string>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/errors.h"
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/indexer.h"
#include "variants/sparse/cuda/paged_select.h"
#include "variants/sparse/sparse.h"

namespace dslab::sparse::cuda {
namespace {

using mla::cuda::DeviceArray;

constexpr int64_t kIndexChunk = 65536;  // cache rows per GEMM of the prepare's index keys (32 MB of fp32 scratch)

class DsaSelector final : public mla::cuda::PageSelector {
 public:
  std::string name() const override { return "sparse/dsa/cuda"; }
  std::string unsupported(const ModelConfig& m, const mla::Shape& s) const override {
    if (s.budget < 1) return "sparse/dsa/cuda: the budget axis (keys attended per request) must be set";
    if (s.local < 1) return "sparse/dsa/cuda: the local axis (the window every step attends) must be set";
    if (s.kv_dtype != mla::KvDtype::bf16) return "sparse/dsa/cuda: the index keys are made from a bf16 cache";
    if (s.q_len != 1) return "sparse/dsa/cuda: one index query per request (decode steps of one token)";
    if ((m.kv_lora_rank + m.qk_rope_head_dim) % 8) return "sparse/dsa/cuda: keys of a multiple of 8 values";
    return "";
  }
  int64_t kept_keys(int64_t keys, int64_t, const mla::Shape& s) const override { return token_sparse_length(keys, sparse_budget(s, 1)); }
  int64_t keys_per_entry(int64_t) const override { return 1; }
  Cost cost(const ModelConfig& m, const mla::Shape& s, int64_t) const override {
    // Per request: every key's index key and scale read and multiplied by the 64 index queries, its score written and
    // read back by the top-k's passes (six: four radix bytes, a count, the emit); the index queries and the new key's
    // index key projected (width x 128 each); the chosen slots written.
    const double keys = double(s.keys()), width = double(m.kv_lora_rank + m.qk_rope_head_dim), B = double(s.batch);
    Cost c;
    c.flops = B * (keys * kIndexHeads * kIndexDim * 2 + double(kIndexHeads + s.q_len) * width * kIndexDim * 2);
    c.bytes = B * (keys * (kIndexDim + 4 + 4 * 7) + double(kIndexHeads + s.q_len) * width * 2 + width * kIndexDim * 2 +
                   double(kept_keys(s.keys(), 0, s)) * 8);
    return c;
  }
  void prepare(const ModelConfig& m, const mla::Shape& s, const mla::cuda::PagedLatentCache& cache, const int32_t* lengths,
               mla::cuda::ScratchArena*) override {
    s_ = s;
    cache_ = &cache;
    lengths_in_ = lengths;
    width_ = m.kv_lora_rank + m.qk_rope_head_dim;
    budget_ = sparse_budget(s, 1);
    const Indexer ix;
    if (ix.heads != kIndexHeads || ix.dim != kIndexDim) throw std::logic_error("sparse/dsa/cuda: the kernels' indexer is not sparse::Indexer's");
    const std::vector<float> projection = indexer_projection(ix, width_);  // (bf16 values)
    std::vector<bf16> projection_bf16(projection.size());
    for (size_t i = 0; i < projection.size(); ++i) projection_bf16[i] = to_bf16(projection[i]);
    projection_.upload(projection_bf16);
    const int64_t P = cache.page_size, ppr = cache.pages_per_request, slots = int64_t(cache.values.size()) / (width_ * 2);
    scores_per_request_ = ppr * P;
    max_tokens_ = std::min(scores_per_request_, std::max<int64_t>(s.budget, kSinkTokens + s.local) + 1);
    index_keys_.resize(size_t(slots * kIndexDim));
    index_scales_.resize(size_t(slots));
    queries_.resize(size_t(s.tokens() * kIndexHeads * kIndexDim));
    scores_.resize(size_t(s.batch * scores_per_request_));
    slots_.resize(size_t(s.batch * max_tokens_));
    logical_.resize(size_t(s.batch * max_tokens_));
    kept_.resize(size_t(s.batch));
    lengths_.resize(size_t(s.batch));
    keys_.resize(size_t(s.batch));
    int device = 0;
    DSLAB_CUDA(cudaGetDevice(&device));
    DSLAB_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    // Every slot's index key, once (slots past a request's keys hold whatever the cache holds there; a step remakes
    // its new keys' before they are scored).
    mla::cuda::BlasHandle blas;
    blas.set_stream(0);
    DeviceArray<float> scratch{size_t(std::min(kIndexChunk, slots) * kIndexDim)};
    index_all_keys(blas.get(), reinterpret_cast<const __nv_bfloat16*>(cache.values.get()), slots, width_, projection_.get(), scratch.get(),
                   std::min(kIndexChunk, slots), index_keys_.get(), index_scales_.get(), 0);
    DSLAB_CUDA(cudaDeviceSynchronize());
  }
  void select(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t, const Mark& mark) override {
    const int64_t P = cache_->page_size, ppr = cache_->pages_per_request, B = s_.batch;
    const int32_t* table = page_table_of(*cache_);
    index_step_keys(reinterpret_cast<const __nv_bfloat16*>(cache_->values.get()), width_, lengths_in_, s_.q_len, table, ppr, P, B,
                    projection_.get(), index_keys_.get(), index_scales_.get(), keys_.get(), stream);
    mark("select_index_keys");
    index_queries(q_cat, s_.tokens(), s_.heads, width_, projection_.get(), queries_.get(), stream);
    indexer_scores(queries_.get(), index_keys_.get(), index_scales_.get(), table, ppr, P, keys_.get(), B, scores_per_request_, sms_, scores_.get(),
                   stream);
    mark("select_scores");
    compact_tokens(scores_.get(), scores_per_request_, table, ppr, keys_.get(), P, budget_, B, max_tokens_, s_.q_len, slots_.get(), logical_.get(),
                   kept_.get(), lengths_.get(), stream);
    mark("select_tokens");
  }
  const int32_t* page_table() const override { return slots_.get(); }
  int64_t pages_per_request() const override { return max_tokens_; }
  const int32_t* lengths() const override { return lengths_.get(); }
  std::vector<std::vector<int64_t>> key_indices() const override { return chosen_keys(logical_, kept_, s_.batch, max_tokens_); }

 private:
  static const int32_t* page_table_of(const mla::cuda::PagedLatentCache& c) { return c.shared_page_table ? c.shared_page_table : c.page_table.get(); }

  mla::Shape s_;
  const mla::cuda::PagedLatentCache* cache_ = nullptr;
  const int32_t* lengths_in_ = nullptr;
  int64_t width_ = 0, scores_per_request_ = 0, max_tokens_ = 0;
  int sms_ = 0;
  Budget budget_;
  DeviceArray<__nv_bfloat16> projection_;  // [width][128]
  DeviceArray<uint8_t> index_keys_;        // [cache slots][128] e4m3
  DeviceArray<float> index_scales_, scores_;  // [cache slots], [batch][pages per request * page size]
  DeviceArray<__half> queries_;             // [tokens][64][128]
  DeviceArray<int32_t> slots_, logical_, kept_, lengths_, keys_;
};

const bool registered = mla::cuda::register_mla_op(
    "sparse/dsa/cuda",
    "DeepSeek-V3.2 sparse attention: the lightning indexer (64 heads x 128, e4m3 index keys beside the latent cache, the step's "
    "made in run()) scores every key, sinks + window + top keys within the budget, attended by mla/fused/cuda's kernel through their slots",
    [] { return mla::cuda::make_fused_op(std::make_unique<DsaSelector>()); });

}  // namespace
}  // namespace dslab::sparse::cuda
