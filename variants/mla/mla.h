// The MLA family: shapes, the analytic cost of each form, the shared generated problem (weights, caches,
// reference output) and the CPU base class that all four CPU forms build on.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "harness/variant.h"
#include "variants/common/model_config.h"
#include "variants/common/onednn.h"
#include "variants/reference/reference.h"

namespace dslab::mla {

// cd = CacheDecompressed, cc = CacheCompressed, a_cc = Absorbed_CacheCompressed,
// a_cc_me = Absorbed_CacheCompressed_MoveElision.
enum class Algo { cd, cc, a_cc, a_cc_me };

// Latent-cache element type (kv_dtype axis). int8 and fp8_e4m3 store each token's 576 values in groups
// of kQuantGroup with one fp32 scale per group, as PPL's KeyValueCache quant groups do.
enum class KvDtype { bf16, int8, fp8_e4m3 };
constexpr int64_t kQuantGroup = 64;
KvDtype parse_kv_dtype(const std::string& text);    // BadInput for anything else
int64_t parse_kv_splits(const std::string& text);   // "auto" -> 0, else 1..4096; BadInput for anything else
int64_t parse_block_keys(const std::string& text);  // "auto" -> 0, "32", "64"; BadInput for anything else
// The fused kernel's L2 hint for its cache blocks: auto (the two-warpgroup kernel evict_first on short segments, the
// fixed-roles kernel none), first (evict_first in both), normal (no hint).
enum class L2Evict { automatic, first, normal };
L2Evict parse_l2_evict(const std::string& text);  // "auto", "first", "normal"; BadInput for anything else
// How the fused kernel cuts a step's keys among its CTAs (see split_kv and split_kv_per_request): auto (per_request
// where every request can have CTAs of its own, else packed), packed (one run of blocks cut into equal parts, a part
// may end one request and begin the next), per_request (each request's blocks cut among CTAs of its own).
enum class SplitPlan { automatic, packed, per_request };
SplitPlan parse_split_plan(const std::string& text);  // "auto", "packed", "per_request"; BadInput for anything else
const char* kv_dtype_name(KvDtype d);
bool parse_on_off(const std::string& axis, const std::string& text);  // "on" / "off"; BadInput naming the axis else

struct Shape {
  int64_t heads = 0, batch = 0, q_len = 0, kv_len = 0;
  KvDtype kv_dtype = KvDtype::bf16;  // the latent cache's (cd caches bf16 K/V)
  int64_t kv_splits = 0;             // the fused kernel's CTAs per row tile (split-KV parts); 0: auto (auto_kv_splits)
  int64_t block_keys = 0;            // the fused kernel's keys a block (32 | 64); 0: auto (block_keys_for)
  L2Evict l2_evict = L2Evict::automatic;
  SplitPlan split_plan = SplitPlan::automatic;
  // The fused decode's absorbs folded into the kernels beside them (fused_absorbs axis): W_UK into the latent norm's
  // launch (models without q_lora_rank, 1-2 tokens) and W_UV into the split merge (any token count up to 32 a CTA);
  // off: each absorb its own batched GEMV or GEMM.
  bool fused_absorbs = true;
  // Not an axis: the split count a tuner times (the fused kernel's CTAs given keys, of its one-per-SM grid, in place
  // of the tuned or the rule's count); 0: none.
  int64_t measured_splits = 0;
  int64_t budget = 0,
          local = 0;  // sparse attention: keys attended per request and the local window within them; 0: dense
  int64_t tokens() const { return batch * q_len; }
  int64_t keys() const { return kv_len + q_len; }  // per request, after this step's tokens are written
};
Shape shape_of(const ModelConfig& m, const Point& p);

// Work of one step: projections, cache writes, attention, o_proj. Bytes: weights, cache and activations once.
Cost cost(const ModelConfig& m, Algo algo, const Shape& s);
// The pieces of cost(), for the layer's op cost model (variants/layer/ops.h): the attention module's weight
// elements at H heads; cache bytes per cached token; FLOPs of one (query, key) pair over all heads; FLOPs of
// decompressing one latent into H heads' K and V (kv_b_proj).
double weight_elements(const ModelConfig& m, int64_t H);
double cache_bytes_per_token(const ModelConfig& m, Algo algo, int64_t H, KvDtype kv = KvDtype::bf16);
double pair_flops(const ModelConfig& m, Algo algo, int64_t H);
double decompress_flops(const ModelConfig& m, int64_t H);
// The attention kernel's own work at these request lengths (the issue-18 kernel metrics): the fused kernel (decode +
// split merge: scores and weighted sum over the cache, q_cat in, the latent output out) or an unfused form's whole
// attention core (its kv_b_proj use included: absorbs, decompression).
Cost attention_kernel_cost(const ModelConfig& m, Algo algo, const Shape& s, const std::vector<int64_t>& lengths,
                           bool fused);
// What one cached token costs a decode query (the per-token figures the MADSys benchmark publishes).
Cost cost_per_cached_token(const ModelConfig& m, Algo algo, int64_t heads);
// Bytes of the attention module's bf16 weights at `heads` heads.
double weight_bytes(const ModelConfig& m, int64_t heads);
// Device memory one mla/<form>/cuda op allocates beyond its weights and the paged cache, keys padded to
// kGpuKeyAlign, in two parts. Forward scratch lives only inside one forward() (the projections' outputs, scores,
// the fused kernel's query, latent output and split partials): a model's layers take it from one arena
// (gpu::ScratchArena). Owned buffers keep something from step to step (cd's decompressed K/V pages, the
// gathered latent and K/V whose padding must stay zero). The ops size their buffers by these; the layer and the
// offload planner count them. kFusedMaxSms bounds the fused kernel's split-KV parts (one CTA per SM and row tile).
constexpr int64_t kGpuKeyAlign = 8;
constexpr int64_t kFusedMaxSms = 160;  // (H100 and H200: 132; B200: 148)
double gpu_forward_scratch_bytes(const ModelConfig& m, Algo algo, const Shape& s, int64_t max_keys, bool fused);
double gpu_owned_scratch_bytes(const ModelConfig& m, Algo algo, const Shape& s, int64_t max_keys, bool fused);
inline double gpu_scratch_bytes(const ModelConfig& m, Algo algo, const Shape& s, int64_t max_keys, bool fused) {
  return gpu_forward_scratch_bytes(m, algo, s, max_keys, fused) + gpu_owned_scratch_bytes(m, algo, s, max_keys, fused);
}
// Peak host memory of a CPU implementation, for supports().
double cpu_memory_bytes(const ModelConfig& m, Algo algo, const Shape& s);

// Weights and inputs of one point, generated once and shared by every variant run at that point.
struct Problem {
  ModelConfig model;
  Shape shape;
  uint64_t seed = 0;
  std::string weights;  // the checkpoint the params came from (layer 0's attention), or empty: made from the seed
  ref::MlaParams params;
  ref::MlaInputs inputs;
  // The fp64 reference output [tokens][hidden] (absorbed_split form: the identity test shows all forms agree).
  const std::vector<double>& reference() const;

 private:
  mutable std::vector<double> reference_;
};
// A problem's weights (Hugging Face names, "q_proj.weight"), hidden states and caches as tensors (--dump, the peers'
// inputs); they point into the problem.
std::vector<DumpTensor> input_tensors(const Problem& problem);
// weights: a Hugging Face checkpoint folder (dslab run --weights) whose first layer's attention weights the point
// uses (inputs and cache stay made from the seed), or empty.
std::shared_ptr<const Problem> problem(const ModelConfig& m, const Shape& s, uint64_t seed,
                                       const std::string& weights = "");

// Per-request cached lengths for the len_dist axis: uniform (all kv_len) or mixed (log-normal, a few long
// requests and many short ones, the same total as uniform so the point's cost is unchanged); BadInput otherwise.
std::vector<int64_t> request_lengths(const std::string& len_dist, int64_t batch, int64_t kv_len, uint64_t seed);

// The fused decode kernel's split-KV schedule (FlashMLA's): every request's keys, in blocks of block_keys,
// laid end to end in request order and cut into `parts` equal runs, one per CTA; a run may end one request
// and begin the next. Each (run, request) piece is a segment with its own partial output, merged per request.
// With whole_requests, where whole requests packed in order fit the parts with at most 1/kWholeSlack more
// blocks than the equal runs (large batches), none is split: one segment per request, and no merge.
struct SplitKv {
  struct Segment {
    int32_t request, first_key, end_key;  // keys [first_key, end_key) of request
  };
  struct Range {
    int32_t first, count;  // segments
  };
  std::vector<Segment> segments;  // in request order
  std::vector<Range> parts;       // per CTA
  std::vector<Range> requests;    // per request
};
constexpr int64_t kWholeSlack = 32;
// The parts the split uses when kv_splits is auto, of `grid_parts` CTAs (one per SM): about kAutoBlocksPerPart
// blocks each, but never fewer than kAutoMinParts. Below a few blocks per CTA each CTA's fixed cost (its launch,
// Q, the first copies; ~15 us at batch 1 on an H100) and the merge of many partials outweigh the parallelism
// (kv-splits-v3 sweep, H100: batch 1 / 4K 75.1 -> 72.9 us per step at 16 heads, batch 4 / 4K 87.2 -> 79.8 us;
// equal where every SM has 4+ blocks).
constexpr int64_t kAutoBlocksPerPart = 4, kAutoMinParts = 32;
int auto_kv_splits(const std::vector<int64_t>& lengths, int64_t q_len, int64_t block_keys, int grid_parts);
SplitKv split_kv(const std::vector<int64_t>& lengths, int64_t q_len, int64_t block_keys, int parts,
                 bool whole_requests);
// Each request's blocks on CTAs of its own (no CTA walks two requests: a segment switch costs a Q load and an output
// store, more than a 64-key block at 16 heads on the H200): the fewest parts that reach the smallest possible
// longest part, each request's blocks cut evenly among its parts. Empty where the batch exceeds `parts`.
std::optional<SplitKv> split_kv_per_request(const std::vector<int64_t>& lengths, int64_t q_len, int64_t block_keys,
                                            int parts);
// A plan's blocks (of block_keys, a part-filled one counted whole) per segment, on average; 0 without segments.
double mean_segment_blocks(const SplitKv& plan, int64_t block_keys);

// Axes every MLA variant reads.
std::vector<std::pair<std::string, std::string>> axes();

// The CPU forms share everything but attention: bf16 weights and caches, fp32 accumulation, oneDNN
// matmuls (AMX where present). run() = projections + cache write + attend() + o_proj.
class CpuVariant : public Variant {
 public:
  explicit CpuVariant(Algo algo) : algo_(algo) {}
  std::vector<std::pair<std::string, std::string>> axes() const override { return mla::axes(); }
  bool reads_weights() const override { return true; }
  Support supports(const ModelFile& model, const Point& point) const override;
  Cost cost(const ModelFile& model, const Point& point) const override;
  double host_memory_bytes(const ModelFile& model, const Point& point) const override;
  std::string compute_ceiling() const override;
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override;
  void run() override;
  Verification verify() override;
  std::vector<DumpTensor> tensors() const override;

 protected:
  // Form-specific set-up after the common buffers exist (cd builds its K/V cache here).
  virtual void prepare_form() {}
  // Reads q_ and the caches (new tokens already written), writes attn_ [tokens][heads][v_head_dim].
  virtual void attend() = 0;

  // Decompression of latent rows into [rows][heads][nope + v] with kv_b_proj (cd in prepare and run, cc in run).
  onednn::Linear decompressor(int64_t rows) const;
  // Row-wise causal softmax of scale*scores: row r is query s = (r / div) % S, which sees keys [0, kv_len + s].
  void softmax(const float* scores, bf16* probs, int64_t rows, int64_t div) const;

  // Multi-head attention for cd and cc: K is [keys][heads][q_head_dim]; V is addressed by its head and
  // token strides so cc can read it straight out of the decompressed rows.
  void prepare_mha(int64_t v_head_stride, int64_t v_token_stride);
  void attend_mha(int64_t request, const bf16* k, const bf16* v);

  // The absorbed forms: q_abs_ [tokens][heads][kv_lora_rank + rope] = [q_nope·W_UK ‖ q_pe], and
  // attn_ = o_lat_·W_UV^T per head, with o_lat_ [tokens][heads][kv_lora_rank].
  void prepare_absorbed();
  void absorb_query();
  void absorb_output();
  std::vector<bf16> q_abs_, o_lat_;

  std::vector<float> scores_;  // one request's scores
  std::vector<bf16> probs_;

  Algo algo_;
  ModelConfig m_;
  Shape s_;
  std::shared_ptr<const Problem> problem_;
  int64_t nh_ = 0, nope_ = 0, rope_ = 0, qhd_ = 0, vd_ = 0, r_ = 0, hid_ = 0;
  float scale_ = 0;
  // Caches with room for this step's tokens: [batch][keys][kv_lora_rank] and [batch][keys][rope].
  std::vector<bf16> ckv_cache_, kpe_cache_;
  std::vector<bf16> q_;     // [tokens][heads][q_head_dim], rope applied
  std::vector<bf16> attn_;  // [tokens][heads][v_head_dim]
  std::vector<float> out_;  // [tokens][hidden]

 private:
  void project();
  onednn::Linear q_a_, q_b_, q_proj_, kv_a_, o_proj_;
  onednn::Matmul mha_qk_, mha_pv_, absorb_q_, absorb_o_;
  std::vector<float> qa_f32_, q_f32_, kv_f32_;
  std::vector<bf16> qa_;
  std::vector<float> cos_, sin_;  // [q_len][rope/2], YaRN-scaled
};

}  // namespace dslab::mla
