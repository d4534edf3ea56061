// sparse/dsa/cuda: DeepSeek-V3.2's sparse attention (DSA) over the paged latent cache. The lightning indexer
// (indexer.h: 64 index heads x 128 dims, an e4m3 index key with one scale per cached key, kept beside the latent cache:
// every key's made at prepare, the step's new keys' inside run(); e4m3 index queries with a scale per head, FP8
// tensor-core products) scores every key, score_k = sum_j ReLU(q_j · key_k) / 64; the sinks (4 keys), the `local`
// window and the best-scored others up to the `budget` are kept, one selection per request shared by all heads (they
// share the latent), and mla/fused/cuda's kernel attends exactly those keys: its page table becomes their cache slots,
// walked as pages of one key (FlashMLA's sparse decode gathers top-k token indices through the page table the same
// way).
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

using gpu::DeviceArray;

constexpr int64_t kIndexChunk = 65536;  // cache rows per GEMM of the prepare's index keys (32 MB of fp32 scratch)

class DsaSelector final : public TokenSelector {
 public:
  DsaSelector() : TokenSelector("sparse/dsa/cuda") {}
  Cost cost(const ModelConfig& m, const mla::Shape& s, int64_t) const override {
    // Per request: every key's index key and scale read and multiplied by the 64 index queries, its score written and
    // read back by the top-k's passes (six: four radix bytes, a count, the emit); every head's query projected
    // (width x 128, fp32 out and read back as e4m3) and the new key's index key; the chosen slots written. The
    // projection (width x 128 bf16) once.
    const double keys = double(s.keys()), width = double(m.kv_lora_rank + m.qk_rope_head_dim), B = double(s.batch);
    const double rows = double(s.q_len * s.heads + s.q_len);
    Cost c;
    c.flops = B * (keys * kIndexHeads * kIndexDim * 2 + rows * width * kIndexDim * 2);
    c.bytes = B * (keys * (kIndexDim + 4 + 4 * 7) + rows * width * 2 + double(s.q_len * s.heads) * kIndexDim * 4 * 2 +
                   double(kept_keys(s.keys(), 0, s)) * 8) +
              width * kIndexDim * 2;
    return c;
  }

 private:
  void prepare_scores(const ModelConfig&) override {
    const Indexer ix;
    if (ix.heads != kIndexHeads || ix.dim != kIndexDim)
      throw std::logic_error("sparse/dsa/cuda: the kernels' indexer is not sparse::Indexer's");
    const std::vector<float> projection = indexer_projection(ix, width_);  // (bf16 values)
    std::vector<bf16> projection_bf16(projection.size());
    for (size_t i = 0; i < projection.size(); ++i) projection_bf16[i] = to_bf16(projection[i]);
    projection_.upload(projection_bf16);
    const int64_t slots = int64_t(cache_->values.size()) / (width_ * 2);
    index_keys_.resize(size_t(slots * kIndexDim));
    index_scales_.resize(size_t(slots));
    index_key_map_ = index_key_map(index_keys_.get(), slots);
    queries_.resize(size_t(s_.tokens() * kIndexHeads * kIndexDim));
    query_scales_.resize(size_t(s_.tokens() * kIndexHeads));
    projected_.resize(size_t(s_.tokens() * s_.heads * kIndexDim));
    // Every slot's index key, once (slots past a request's keys hold whatever the cache holds there; a step remakes
    // its new keys' before they are scored).
    gpu::BlasHandle blas;
    blas.set_stream(0);
    DeviceArray<float> scratch{size_t(std::min(kIndexChunk, slots) * kIndexDim)};
    index_all_keys(blas.get(), bf16_values(*cache_), slots, width_, projection_.get(), scratch.get(),
                   std::min(kIndexChunk, slots), index_keys_.get(), index_scales_.get(), 0);
    DSLAB_CUDA(cudaDeviceSynchronize());
  }
  void score(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t blas, const Mark& mark) override {
    const int64_t P = cache_->page_size, ppr = cache_->pages_per_request;
    index_step_keys(bf16_values(*cache_), width_, lengths_in_, s_.q_len, page_table_of(*cache_), ppr, P, s_.batch,
                    projection_.get(), index_keys_.get(), index_scales_.get(), keys_.get(), stream);
    mark("select_index_keys");
    index_queries(blas, q_cat, s_.tokens(), s_.heads, width_, projection_.get(), projected_.get(), queries_.get(),
                  query_scales_.get(), stream);
    indexer_scores(queries_.get(), query_scales_.get(), index_keys_.get(), &index_key_map_, index_scales_.get(),
                   page_table_of(*cache_), ppr, P, keys_.get(), s_.batch, scores_per_request(), scores_.get(), stream);
    mark("select_scores");
  }

  DeviceArray<__nv_bfloat16> projection_;  // [width][128]
  DeviceArray<uint8_t> index_keys_;        // [cache slots][128] e4m3
  DeviceArray<float> index_scales_;        // [cache slots]
  CUtensorMap index_key_map_{};            // index_keys_ for the scores' tensor copies
  DeviceArray<uint8_t> queries_;           // [tokens][64][128] e4m3
  DeviceArray<float> query_scales_;        // [tokens][64]
  DeviceArray<float> projected_;           // [tokens][heads][128]: every head's query projected, fp32
};

const bool registered =
    mla::cuda::register_mla_op("sparse/dsa/cuda",
                               "DeepSeek-V3.2 sparse attention: the lightning indexer (64 heads x 128, FP8: e4m3 index "
                               "keys beside the latent cache, the "
                               "step's made in run(), e4m3 queries) scores every key, sinks + window + top keys within "
                               "the budget, attended by mla/fused/cuda's kernel through their slots",
                               [] { return mla::cuda::make_fused_op(std::make_unique<DsaSelector>()); });

}  // namespace
}  // namespace dslab::sparse::cuda
