#include "variants/layer/cuda/deepseek.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "harness/errors.h"
#include "variants/common/cuda/nvtx.h"
#include "harness/host.h"
#include "variants/common/cuda/device_random.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/rng.h"
#include "variants/layer/cuda/norms.h"
#include "variants/layer/cuda/plan.h"
#include "variants/layer/ops.h"
#include "variants/reference/model.h"

namespace dslab::layer::cuda {

// (the ops' names this unit uses unqualified: plan.h)

namespace {

const float kUnitScale = std::sqrt(3.0f);  // unit-variance inputs, as the reference's hidden states
constexpr int64_t kRecordedRows = 8;
constexpr int64_t kVerifiedRows = 64;  // new tokens of a request verified against the reference (all, up to this many)

uint64_t layer_seed(uint64_t seed, int64_t layer) { return splitmix64(seed ^ (0x1a7e5ull + uint64_t(layer))); }
uint64_t moe_set_seed(uint64_t seed, int64_t set) { return splitmix64(seed ^ (0x3e70000ull + uint64_t(set))); }

// Values [first, first + count) of ref::random_bf16(seed, name, ..., scale): rows of a tensor too large to make whole.
std::vector<double> host_random_rows(uint64_t seed, const std::string& name, int64_t first, int64_t count,
                                     float scale) {
  const uint64_t stream = stream_id(seed, name);
  std::vector<double> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    out[size_t(i)] = to_float(to_bf16(scale * uniform_pm1(stream, uint64_t(first + i))));
  return out;
}

int32_t token_id(uint64_t seed, int64_t step, int64_t token, int64_t vocab) {
  return int32_t(splitmix64(stream_id(seed, "token_ids.s" + std::to_string(step)) + uint64_t(token)) % uint64_t(vocab));
}

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }

}  // namespace

void check_op_axis(const std::string& axis, const std::string& value, const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), value) != names.end()) return;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : " | ") + n;
  throw BadInput("axis '" + axis + "': value '" + value + "': expected one of " + list);
}

int64_t batch_bucket(int64_t batch) {
  int64_t b = 1;
  while (b < batch) b *= 2;
  return b;
}

// ---- weights ----------------------------------------------------------------------------------------------------

void make_layer_weights(const ModelConfig& m, int64_t layer, uint64_t seed, LayerWeights* w, bool experts_on_device) {
  const int64_t H = m.hidden_size;
  w->seed = layer_seed(seed, layer);
  w->input_layernorm.resize(size_t(H));
  w->post_attention_layernorm.resize(size_t(H));
  fill_random_bf16(w->input_layernorm.get(), size_t(H), w->seed, "input_layernorm", 0.1f, 1.0f);
  fill_random_bf16(w->post_attention_layernorm.get(), size_t(H), w->seed, "post_attention_layernorm", 0.1f, 1.0f);
  mla::cuda::generate_mla_weights(m, m.num_attention_heads, w->seed, &w->attn);
  if (!m.is_moe_layer(layer)) {
    moe::cuda::generate_mlp_weights(m, m.intermediate_size, w->seed, "mlp", &w->dense);
    return;
  }
  int64_t ordinal = 0;  // the layer's place among the MoE layers: its expert set's seed, as the layer step's
  for (int64_t i = 0; i < layer; ++i) ordinal += m.is_moe_layer(i) ? 1 : 0;
  w->moe_seed = moe_set_seed(seed, ordinal);
  auto mw = std::make_shared<moe::cuda::MoeWeights>();
  moe::cuda::generate_moe_weights(m, m.n_routed_experts, w->moe_seed, mw.get(), experts_on_device);
  w->moe = mw;
}

void load_layer_weights(const Checkpoint& c, int64_t layer, LayerWeights* w, bool experts_on_device) {
  const ModelConfig& m = c.config();
  const int64_t H = m.hidden_size;
  const std::string L = "model.layers." + std::to_string(layer) + ".";
  w->input_layernorm.upload(c.bf16_tensor(L + "input_layernorm.weight", {H}));
  w->post_attention_layernorm.upload(c.bf16_tensor(L + "post_attention_layernorm.weight", {H}));
  mla::cuda::upload_mla_weights(m, ref::load_mla_params(c, layer), &w->attn);
  if (!m.is_moe_layer(layer)) {
    moe::cuda::load_mlp_weights(c, L + "mlp.", m.intermediate_size, &w->dense);
    return;
  }
  auto mw = std::make_shared<moe::cuda::MoeWeights>();
  moe::cuda::load_moe_weights(c, layer, mw.get(), experts_on_device);
  w->moe = mw;
}

void make_model_ends(const ModelConfig& m, uint64_t seed, DeviceArray<__nv_bfloat16>* embed,
                     DeviceArray<__nv_bfloat16>* norm, DeviceArray<__nv_bfloat16>* lm_head) {
  const int64_t H = m.hidden_size, V = m.vocab_size;
  embed->resize(size_t(V * H));
  fill_random_bf16(embed->get(), embed->size(), seed, "embed_tokens", kUnitScale);
  norm->resize(size_t(H));
  fill_random_bf16(norm->get(), size_t(H), seed, "norm", 0.1f, 1.0f);
  lm_head->resize(size_t(V * H));
  fill_random_bf16(lm_head->get(), lm_head->size(), seed, "lm_head", fan_in_scale(H));
}

void load_model_ends(const Checkpoint& c, DeviceArray<__nv_bfloat16>* embed, DeviceArray<__nv_bfloat16>* norm,
                     DeviceArray<__nv_bfloat16>* lm_head) {
  const int64_t H = c.config().hidden_size, V = c.config().vocab_size;
  embed->upload(c.bf16_tensor("model.embed_tokens.weight", {V, H}));
  norm->upload(c.bf16_tensor("model.norm.weight", {H}));
  lm_head->upload(c.bf16_tensor("lm_head.weight", {V, H}));
}

// ---- the variant ---------------------------------------------------------------------------------------------

DeepseekLayerCuda::DeepseekLayerCuda() = default;

DeepseekLayerCuda::~DeepseekLayerCuda() {
  if (graph_) cudaGraphExecDestroy(graph_);
  if (meta_host_) cudaFreeHost(meta_host_);
}

std::vector<std::pair<std::string, std::string>> DeepseekLayerCuda::axes() const {
  return {{"batch", "1"},
          {"q_len", "1"},
          {"kv_len", "4096"},
          {"layers", "1"},
          {"attn", "mla/fused/cuda"},
          {"moe", "moe/grouped_wgmma/cuda"},
          {"executor", "graph"},
          {"steps", "1"},
          {"page_size", "64"},
          {"kv_dtype", "bf16"},
          {"proj", "own"},
          {"kv_splits", "auto"},
          {"split_plan", "auto"},
          {"block_keys", "auto"},
          {"pdl", "on"},
          {"fused_norms", "off"},
          {"fused_absorbs", "on"},
          {"moe_tile", "auto"},
          {"cpu_threads", ""},
          {"gpu_experts", "none"},
          {"gpu_budget", "all"}};
}

Support DeepseekLayerCuda::supports(const ModelFile& model, const Point& point) const {
  const Plan plan(model, point);
  if (!plan.why_not.empty()) return Support::no(plan.why_not);
  const GpuInfo& g = gpu_info();
  if (!g.present) return Support::no(g.why_absent);
  return {};
}

Cost DeepseekLayerCuda::cost(const ModelFile& model, const Point& point) const {
  const Plan plan(model, point);
  const ModelConfig& m = plan.m;
  const auto attn = mla::cuda::make_mla_op(plan.attn);
  const double B = double(plan.batch), S = double(plan.q_len), T = B * S, H = double(m.hidden_size);
  Cost total;
  for (int64_t step = 0; step < plan.steps; ++step) {
    mla::Shape s = plan.attn_shape();
    s.batch = plan.batch;  // the requests' work: bucket padding is overhead, not work
    s.kv_len = plan.kv_len + step * plan.q_len;
    const Cost a = mla::cost(m, attn->algo(), s);
    for (int64_t i = 0; i < plan.layers; ++i) {
      const int64_t layer = plan.first + i;
      total.flops += a.flops;
      total.bytes += a.bytes + 2 * T * H * 10;  // + two norms and residual adds: fp32 stream read and written, bf16 out
      if (plan.dense(layer)) {
        const double I = double(m.intermediate_size);
        total.flops += 6 * T * H * I;
        total.bytes += 3 * H * I * 2 + T * H * 6;
      } else {
        // Experts reached: as this point's routing reached them in prepare() (per MoE layer), else the uniform
        // expectation.
        size_t q = 0;  // this layer's ordinal among the MoE layers
        for (int64_t j = plan.first; j < layer; ++j) q += plan.dense(j) ? 0 : 1;
        const bool measured = prepared_label_ == point.label() + "@" + m.source && q < active_experts_.size();
        const double active = measured ? active_experts_[q]
                                       : moe::cuda::expected_active_experts(m.n_routed_experts, m.num_experts_per_tok,
                                                                            plan.batch * plan.q_len);
        const Cost c = moe::cuda::moe_layer_cost(m, plan.batch * plan.q_len, active);
        total.flops += c.flops;
        total.bytes += c.bytes;
      }
    }
    if (plan.whole) {
      const double V = double(m.vocab_size);
      total.flops += 2 * T * V * H;
      total.bytes += V * H * 2 + T * V * 4 + T * H * 2;  // LM head, logits, embedding rows
    }
  }
  return total;
}

double DeepseekLayerCuda::host_memory_bytes(const ModelFile& model, const Point& point) const {
  const Plan plan(model, point);
  const ModelConfig& m = plan.m;
  const double H = double(m.hidden_size);
  // The reference, one layer at a time: attention and dense weights, the experts it reaches, the caches of the
  // verified requests; the whole model's LM head.
  return mla::weight_bytes(m, m.num_attention_heads) + 3 * H * double(m.intermediate_size) * 2 +
         double(m.num_experts_per_tok + m.n_shared_experts) * double(plan.q_len) * 3 * H *
             double(m.moe_intermediate_size) * 2 +
         2 * double(plan.max_keys()) * 576 * 2 + (plan.whole ? double(m.vocab_size) * H * 2 : 0) +
         double(plan.steps) * double(plan.tokens()) * 2048 * 4 +
         plan.host_expert_bytes;  // (+ experts run from host memory)
}

double DeepseekLayerCuda::device_memory_bytes(const ModelFile& model, const Point& point) const {
  return Plan(model, point).device_bytes();
}

int64_t DeepseekLayerCuda::output_width() const { return plan_->whole ? m_.vocab_size : m_.hidden_size; }

void DeepseekLayerCuda::prepare(const ModelFile& model, const Point& point, uint64_t seed) {
  gpu::NvtxRange range("layer.prepare");
  if (graph_) {
    DSLAB_CUDA(cudaGraphExecDestroy(graph_));
    graph_ = nullptr;
  }
  captures_ = 0;
  // Free the previous point's buffers before making this one's.
  attn_.clear();
  moe_.clear();
  dense_.clear();
  arena_.reserve(0);
  streamer_.reset();
  caches_.clear();
  weights_.clear();
  active_experts_.clear();
  prepared_label_.clear();
  plan_ = std::make_unique<Plan>(model, point);
  const Plan& P = *plan_;
  if (!P.why_not.empty()) throw std::runtime_error(P.why_not);
  m_ = P.m;
  seed_ = seed;
  if (!blas_) blas_ = std::make_unique<BlasHandle>();
  if (!side_blas_) side_blas_ = std::make_unique<BlasHandle>();
  blas_->set_projections(gpu::parse_projections(point.text("proj")));
  side_blas_->set_projections(gpu::parse_projections(point.text("proj")));
  const int64_t B = P.bucket, S = P.q_len, T = P.tokens(), H = m_.hidden_size, L = P.layers;

  // Lengths: the requests' kv_len; a bucket's padding requests start empty (they attend to their own new tokens).
  lengths0_.assign(size_t(B), 0);
  for (int64_t b = 0; b < P.batch; ++b) lengths0_[size_t(b)] = P.kv_len;

  // Metadata layout (4-byte values, each part 16-byte aligned): lengths, page table, RoPE cos, sin, schedule,
  // token ids, step.
  const auto probe = mla::cuda::make_mla_op(P.attn);
  const int64_t half = m_.qk_rope_head_dim / 2;
  const int64_t ppr = (P.max_keys() + P.page_size - 1) / P.page_size;
  const int64_t off_len = 0, off_pt = align4(B), off_cos = off_pt + align4(B * ppr),
                off_sin = off_cos + align4(T * half);
  const int64_t off_sched = off_sin + align4(T * half);
  const int64_t sched_ints = int64_t(probe->schedule_ints_for(m_, P.attn_shape()));
  const int64_t off_ids = off_sched + align4(sched_ints), off_step = off_ids + align4(T), meta_ints = off_step + 4;
  meta_.resize(size_t(meta_ints));
  meta_.zero();
  meta_ints_ = meta_ints;
  off_ids_ = off_ids;
  off_step_ = off_step;

  // Weights: a checkpoint's (every MoE layer its own experts: the plan refuses a point that would reuse them), or
  // generated on the device with the reference's values, MoE sets reused cyclically if they must be.
  checkpoint_.reset();
  if (!model.weights.empty()) checkpoint_ = std::make_unique<Checkpoint>(model.weights);
  const auto load_began = std::chrono::steady_clock::now();
  weights_.resize(size_t(L));
  std::vector<std::shared_ptr<const moe::cuda::MoeWeights>> sets;
  int64_t moe_ordinal = 0;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t layer = P.first + i;
    LayerWeights& w = weights_[size_t(i)];
    if (checkpoint_) {
      // (a host op's layers beyond the resident ones leave their experts to the op, which reads them into host memory)
      const int64_t q = P.dense(layer) ? 0 : moe_ordinal++;
      load_layer_weights(*checkpoint_, layer, &w, !P.experts_on_host || q < P.resident_moe_layers);
      w.seed = layer_seed(seed, layer);  // (the cache's streams)
      std::fprintf(stderr, "\rweights: layer %lld of %lld read", static_cast<long long>(i + 1),
                   static_cast<long long>(L));
      continue;
    }
    w.seed = layer_seed(seed, layer);
    w.input_layernorm.resize(size_t(H));
    w.post_attention_layernorm.resize(size_t(H));
    fill_random_bf16(w.input_layernorm.get(), size_t(H), w.seed, "input_layernorm", 0.1f, 1.0f);
    fill_random_bf16(w.post_attention_layernorm.get(), size_t(H), w.seed, "post_attention_layernorm", 0.1f, 1.0f);
    mla::cuda::generate_mla_weights(m_, m_.num_attention_heads, w.seed, &w.attn);
    if (P.dense(layer)) {
      moe::cuda::generate_mlp_weights(m_, m_.intermediate_size, w.seed, "mlp", &w.dense);
    } else {
      const int64_t q = moe_ordinal++, set = P.moe_set(q);
      w.moe_seed = moe_set_seed(seed, set);
      if (size_t(set) == sets.size()) {
        auto mw = std::make_shared<moe::cuda::MoeWeights>();
        const bool on_device = (!P.experts_on_host && !P.streamed) || q < P.resident_moe_layers;
        moe::cuda::generate_moe_weights(m_, m_.n_routed_experts, w.moe_seed, mw.get(), /*routed_on_device=*/on_device);
        if (P.streamed) {  // the experts made in their staging buffer, kept in host memory, read from the staging
                           // buffer
          const int64_t E = m_.n_routed_experts, I = m_.moe_intermediate_size, n = E * I * H;
          if (!streamer_) streamer_ = std::make_unique<ExpertStreamer>(P.moe_layers, size_t(3 * n));
          __nv_bfloat16* at = streamer_->slot(q);
          for (int64_t e = 0; e < E; ++e)
            moe::cuda::generate_expert_weights(m_, w.moe_seed, e, at + e * I * H, at + n + e * I * H,
                                               at + 2 * n + e * H * I);
          DSLAB_CUDA(cudaMemcpy(streamer_->host_set(q), at, size_t(3 * n) * 2, cudaMemcpyDeviceToHost));
          mw->staged_gate = at, mw->staged_up = at + n, mw->staged_down = at + 2 * n;
        }
        sets.push_back(mw);
      }
      w.moe = sets[size_t(set)];
    }
  }
  if (P.whole) {
    if (checkpoint_)
      load_model_ends(*checkpoint_, &embed_, &final_norm_, &lm_head_);
    else
      make_model_ends(m_, seed, &embed_, &final_norm_, &lm_head_);
    logits_.resize(size_t(T * m_.vocab_size));
  } else {
    inputs_.resize(size_t(P.steps * T * H));
    for (int64_t s = 0; s < P.steps; ++s)
      fill_random_bf16(inputs_.get() + s * T * H, size_t(T * H), seed, "layer_inputs.s" + std::to_string(s),
                       kUnitScale);
  }
  if (checkpoint_) {
    std::fprintf(stderr, "\n");
    checkpoint_->report_load(P.whole ? "the whole model" : std::to_string(L) + " layers",
                             std::chrono::steady_clock::now() - load_began);
    load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_began).count();
  }
  resid_.resize(size_t(T * H));
  attn_out_.resize(size_t(T * H));
  ffn_out_.resize(size_t(T * H));
  xb_.resize(size_t(T * H));

  // Caches: each layer its own pool, all with the same page layout, read through the one page table in the
  // metadata; filled with each layer's counter-based latent.
  caches_.resize(size_t(L));
  DeviceArray<int32_t> len_dev;
  len_dev.upload(std::vector<int32_t>(lengths0_.begin(), lengths0_.end()));
  for (int64_t i = 0; i < L; ++i) {
    auto& c = caches_[size_t(i)];
    mla::cuda::allocate_paged_cache(m_, P.kv_dtype, P.page_size, lengths0_, P.steps * S, seed, &c);
    std::vector<uint64_t> streams(size_t(2 * B));
    for (int64_t b = 0; b < B; ++b) {
      streams[size_t(2 * b)] = mla::cuda::ckv_stream(weights_[size_t(i)].seed, b);
      streams[size_t(2 * b + 1)] = mla::cuda::kpe_stream(weights_[size_t(i)].seed, b);
    }
    mla::cuda::fill_paged_cache(c, len_dev.get(), B, P.kv_len, streams, m_.kv_lora_rank);
    c.shared_page_table = meta_.get() + off_pt;
  }
  const std::vector<int32_t> page_table =
      caches_[0].host_page_table;  // the same in every layer (same lengths, room, seed)

  // Each step's metadata, built now (as a scheduler would before each step) into pinned memory.
  if (meta_host_) DSLAB_CUDA(cudaFreeHost(meta_host_));
  meta_host_ = nullptr;
  DSLAB_CUDA(cudaMallocHost(&meta_host_, size_t(P.steps * meta_ints) * 4));
  meta_ints_ = meta_ints;
  for (int64_t s = 0; s < P.steps; ++s) {
    int32_t* h = meta_host_ + s * meta_ints;
    std::fill(h, h + meta_ints, 0);
    std::vector<int64_t> lengths(lengths0_);
    for (auto& l : lengths) l += s * S;
    for (int64_t b = 0; b < B; ++b) h[off_len + b] = int32_t(lengths[size_t(b)]);
    std::copy(page_table.begin(), page_table.end(), h + off_pt);
    std::vector<float> cs, sn;
    mla::cuda::rope_tables(m_, lengths, S, &cs, &sn);
    std::memcpy(h + off_cos, cs.data(), cs.size() * 4);
    std::memcpy(h + off_sin, sn.data(), sn.size() * 4);
    if (P.whole)
      for (int64_t t = 0; t < T; ++t) h[off_ids + t] = token_id(seed, s, t, m_.vocab_size);
    h[off_step] = int32_t(s);
  }
  // Step 0's metadata in place before the ops are prepared: a form that builds state from the cache in prepare
  // (cd decompresses it into its K/V pages) reads the lengths and page table there.
  DSLAB_CUDA(cudaMemcpy(meta_.get(), meta_host_, size_t(meta_ints) * 4, cudaMemcpyHostToDevice));

  // The ops, each on its layer's weights and cache and the shared buffers, and all taking their forward scratch
  // from one arena: they run one after another on one stream. DSLAB_SCRATCH_ARENA=off gives each op buffers of its
  // own instead, for compute-sanitizer's memcheck (it sees an overrun only at an allocation's end, not between
  // buffers of one arena: scripts/sanitize.sh runs the layer both ways).
  const char* arena_setting = std::getenv("DSLAB_SCRATCH_ARENA");
  ScratchArena* arena = arena_setting && std::string(arena_setting) == "off" ? nullptr : &arena_;
  if (arena) arena_.reserve(size_t(P.arena_bytes));
  for (int64_t i = 0; i < L; ++i) {
    MlaBuffers b;
    b.x = xb_.get();
    b.out = attn_out_.get();
    b.cache = &caches_[size_t(i)];
    b.lengths = meta_.get() + off_len;
    b.rope_cos = reinterpret_cast<const float*>(meta_.get() + off_cos);
    b.rope_sin = reinterpret_cast<const float*>(meta_.get() + off_sin);
    b.schedule = sched_ints ? meta_.get() + off_sched : nullptr;
    attn_.push_back(mla::cuda::make_mla_op(P.attn));
    // The fused decode's key block and split count as the tuning cache has them (measured by mla/fused/cuda for
    // that shape), else the per-GPU default table (mla/cuda/fused/host.cu).
    attn_.back()->use_tuned_launches(true);
    if (arena) arena->rewind();
    attn_.back()->prepare(m_, P.attn_shape(), P.max_keys(), weights_[size_t(i)].attn, b, *blas_,
                          /*lengths_vary=*/P.steps > 1, arena);
    if (weights_[size_t(i)].moe) {
      MoeBuffers mb;
      mb.x = xb_.get();
      mb.out = ffn_out_.get();
      if (P.fused_norms) {  // the residual add and the next layer's input norm (or the final norm) in the combine
        mb.resid = resid_.get();
        mb.norm_weight = next_norm_weight(i);
        mb.norm_eps = float(m_.rms_norm_eps);
        mb.norm_out = xb_.get();
      }
      // (the first resident_moe_layers MoE layers' experts are on the GPU: the grouped op runs them)
      moe_.push_back(
          moe::cuda::make_moe_op(moe_.size() < size_t(P.resident_moe_layers) ? "moe/grouped_wgmma/cuda" : P.moe));
      moe_.back()->set_cpu_threads(P.cpu_threads);
      moe_.back()->set_tile(P.moe_tile.first, P.moe_tile.second);
      if (moe_.size() > size_t(P.resident_moe_layers)) moe_.back()->set_hot_experts(P.hot_experts);
      if (arena) arena->rewind();
      moe_.back()->prepare(m_, T, *weights_[size_t(i)].moe, mb, *blas_, side_blas_.get(), arena);
    } else {
      dense_.emplace_back();
      if (arena) arena->rewind();
      dense_.back().prepare(m_, weights_[size_t(i)].dense, T, arena);
    }
  }

  if (sched_ints)  // the split-KV schedule of each step, from a prepared op
    for (int64_t s = 0; s < P.steps; ++s) {
      std::vector<int64_t> lengths(lengths0_);
      for (auto& l : lengths) l += s * S;
      const auto sched = attn_[0]->schedule(lengths);
      std::copy(sched.blob.begin(), sched.blob.end(), meta_host_ + s * meta_ints + off_sched);
    }
  DSLAB_CUDA(cudaDeviceSynchronize());

  // One step, eagerly: first-call initialisation outside any capture, and the routing each MoE layer makes
  // (for cost()).
  enqueue_step(0, 0);
  DSLAB_CUDA(cudaDeviceSynchronize());
  for (const auto& op : moe_) {
    std::vector<int32_t> ids;
    std::vector<float> w;
    op->routing(&ids, &w);
    std::vector<char> hit(size_t(m_.n_routed_experts), 0);
    for (int32_t e : ids) hit[size_t(e)] = 1;
    active_experts_.push_back(double(std::count(hit.begin(), hit.end(), 1)));
  }
  prepared_label_ = point.label() + "@" + m_.source;
  if (P.graph) capture();
  history_.resize(0);
}

void DeepseekLayerCuda::capture() {
  cudaStream_t stream{};
  DSLAB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph{};
  DSLAB_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    forward(stream, nullptr);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    throw;
  }
  DSLAB_CUDA(cudaStreamEndCapture(stream, &graph));
  DSLAB_CUDA(cudaGraphInstantiate(&graph_, graph, 0));
  DSLAB_CUDA(cudaGraphDestroy(graph));
  DSLAB_CUDA(cudaStreamDestroy(stream));
  ++captures_;
}

const __nv_bfloat16* DeepseekLayerCuda::next_norm_weight(size_t i) const {
  return i + 1 < weights_.size() ? weights_[i + 1].input_layernorm.get() : plan_->whole ? final_norm_.get() : nullptr;
}

void DeepseekLayerCuda::forward(cudaStream_t stream, gpu::OpMarks* marks) {
  const Plan& P = *plan_;
  const int64_t T = P.tokens();
  const int H = int(m_.hidden_size);
  const float eps = float(m_.rms_norm_eps);
  auto mark = [&](const char* op) {
    if (marks) marks->mark(op, stream);
  };
  gpu::NvtxRange range("layer.step");
  const ProgrammaticLaunchScope pdl(P.pdl);  // (the pdl axis: for the kernels of every op this step launches)
  const int32_t* ids = P.whole ? meta_.get() + off_ids_ : nullptr;
  input_norm(P.whole ? embed_.get() : inputs_.get(), ids, meta_.get() + off_step_, T, H,
             weights_[0].input_layernorm.get(), eps, resid_.get(), xb_.get(), stream);
  mark(P.whole ? "embed_norm" : "norm");
  size_t moe_i = 0, dense_i = 0;
  if (streamer_) streamer_->begin(stream);
  for (size_t i = 0; i < weights_.size(); ++i) {
    gpu::NvtxRange layer_range("layer");
    attn_[i]->forward(stream, marks);
    add_norm(T, resid_.get(), attn_out_.get(), H, weights_[i].post_attention_layernorm.get(), eps, xb_.get(), stream);
    mark("norm");
    if (weights_[i].moe) {
      if (streamer_) {
        streamer_->before(int64_t(moe_i), stream);
        mark("wait_streamed_experts");  // (the copy's stall, if it did not finish under the layers before)
      }
      moe_[moe_i]->forward(stream, marks);
      if (streamer_) streamer_->after(int64_t(moe_i), stream);
      ++moe_i;
    } else {
      blas_->set_stream(stream);
      dense_[dense_i++].forward(*blas_, xb_.get(), ffn_out_.get(), 0.0f, stream);
      mark("dense_mlp");
    }
    if (weights_[i].moe && P.fused_norms) continue;  // (done in the MoE's combine)
    add_norm(T, resid_.get(), ffn_out_.get(), H, next_norm_weight(i), eps, xb_.get(), stream);
    mark("norm");
  }
  if (P.whole) {
    blas_->set_stream(stream);
    gpu::linear(*blas_, xb_.get(), T, H, lm_head_.get(), m_.vocab_size, logits_.get(), CUDA_R_32F);
    mark("lm_head");
  }
}

void DeepseekLayerCuda::enqueue_step(int64_t step, cudaStream_t stream) {
  DSLAB_CUDA(cudaMemcpyAsync(meta_.get(), meta_host_ + step * meta_ints_, size_t(meta_ints_) * 4,
                             cudaMemcpyHostToDevice, stream));
  if (graph_)
    DSLAB_CUDA(cudaGraphLaunch(graph_, stream));
  else
    forward(stream, nullptr);
  if (record_) {
    const int64_t rows = std::min<int64_t>(plan_->tokens(), kRecordedRows), width = output_width();
    if (history_.size() < size_t(plan_->steps * rows * width)) history_.resize(size_t(plan_->steps * rows * width));
    DSLAB_CUDA(cudaMemcpyAsync(history_.get() + step * rows * width, plan_->whole ? logits_.get() : resid_.get(),
                               size_t(rows * width) * 4, cudaMemcpyDeviceToDevice, stream));
  }
}

void DeepseekLayerCuda::run() {
  for (int64_t s = 0; s < plan_->steps; ++s) enqueue_step(s, 0);
}

std::vector<std::vector<float>> DeepseekLayerCuda::recorded_steps() const {
  DSLAB_CUDA(cudaDeviceSynchronize());
  const int64_t rows = std::min<int64_t>(plan_->tokens(), kRecordedRows), width = output_width();
  std::vector<std::vector<float>> out;
  if (history_.size() == 0) return out;
  for (int64_t s = 0; s < plan_->steps; ++s) {
    out.emplace_back(size_t(rows * width));
    DSLAB_CUDA(cudaMemcpy(out.back().data(), history_.get() + s * rows * width, size_t(rows * width) * 4,
                          cudaMemcpyDeviceToHost));
  }
  return out;
}

// The last one-step reference verify() computed (one at a time: at batch 128 of the whole model it is 100 MB).
DeepseekLayerCuda::ReferenceCache& DeepseekLayerCuda::last_reference() {
  static ReferenceCache kept;
  return kept;
}

std::string DeepseekLayerCuda::reference_key(const std::vector<std::vector<int32_t>>& routing,
                                             const std::vector<int64_t>& rows) const {
  const Plan& P = *plan_;
  std::string key = m_.source + "|" + (checkpoint_ ? checkpoint_->dir() : std::string("random")) + "|" +
                    std::to_string(seed_) + "|" + std::to_string(P.batch) + "|" + std::to_string(P.q_len) + "|" +
                    std::to_string(P.kv_len) + "|" + std::to_string(P.first) + "|" + std::to_string(P.layers) + "|" +
                    (P.whole ? "whole" : "layers") + "|rows";
  for (int64_t r : rows) key += " " + std::to_string(r);
  key += "|seeds";
  for (const LayerWeights& w : weights_) key += " " + std::to_string(w.seed) + ":" + std::to_string(w.moe_seed);
  // The requests' tokens' chosen experts (a graph's bucket pads the batch with requests the reference leaves out, as
  // append_reference does), each token's as a set: neither the fp64 reference nor its check of differing choices
  // depends on the order a routing kernel lists them in.
  key += "|routing";
  const size_t K = size_t(std::max<int64_t>(1, m_.num_experts_per_tok)), real = size_t(P.batch * P.q_len) * K;
  for (const auto& layer : routing) {
    std::vector<int32_t> chosen(layer.begin(), layer.begin() + int64_t(std::min(real, layer.size())));
    for (size_t t = 0; t + K <= chosen.size(); t += K)
      std::sort(chosen.begin() + int64_t(t), chosen.begin() + int64_t(t + K));
    key += " " + std::to_string(chosen.size()) + ":";
    key.append(reinterpret_cast<const char*>(chosen.data()), chosen.size() * sizeof(int32_t));
  }
  return key;
}

void DeepseekLayerCuda::append_reference(int64_t step, const std::vector<std::vector<int32_t>>& routing,
                                         const std::vector<int64_t>& rows, const std::vector<int64_t>& sample,
                                         ModelEndsHost* ends, NewKeys* new_keys, ref::MoeParams::RoutingCheck* check,
                                         std::vector<double>* out) const {
  const Plan& P = *plan_;
  const int64_t S = P.q_len, H = m_.hidden_size, width = output_width(), B = P.batch, V = m_.vocab_size;
  const int64_t r = m_.kv_lora_rank, rope = m_.qk_rope_head_dim, K = m_.num_experts_per_tok;
  const int64_t n = int64_t(rows.size());
  if (P.whole && ends->norm.empty()) {
    ends->norm = checkpoint_ ? checkpoint_->bf16_tensor("model.norm.weight", {H})
                             : ref::random_bf16(seed_, "norm", size_t(H), 0.1f, 1.0f);
    ends->head = checkpoint_ ? checkpoint_->bf16_tensor("lm_head.weight", {V, H})
                             : ref::random_bf16(seed_, "lm_head", size_t(V * H), fan_in_scale(H));
    if (checkpoint_) ends->embed = checkpoint_->bf16_tensor("model.embed_tokens.weight", {V, H});
  }
  const std::vector<bf16>&embed = ends->embed, &norm = ends->norm, &head = ends->head;
  std::vector<double>& want = *out;
  std::vector<double> x(size_t(B * S * H));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < B * S; ++t) {
    const int64_t id = token_id(seed_, step, t, V);
    const std::string inputs = "layer_inputs.s" + std::to_string(step);
    const auto row = !P.whole      ? host_random_rows(seed_, inputs, t * H, H, kUnitScale)
                     : checkpoint_ ? std::vector<double>()
                                   : host_random_rows(seed_, "embed_tokens", id * H, H, kUnitScale);
    for (int64_t j = 0; j < H; ++j)
      x[size_t(t * H + j)] = row.empty() ? double(to_float(embed[size_t(id * H + j)])) : row[size_t(j)];
  }
  size_t moe_index = 0;
  for (int64_t i = 0; i < P.layers; ++i) {
    const int64_t layer = P.first + i;
    const LayerWeights& w = weights_[size_t(i)];
    ref::LayerParams params;
    if (checkpoint_) {
      params = ref::load_layer_params(*checkpoint_, layer, /*lazy_experts=*/true);
    } else {
      params.input_layernorm = ref::random_bf16(w.seed, "input_layernorm", size_t(H), 0.1f, 1.0f);
      params.post_attention_layernorm = ref::random_bf16(w.seed, "post_attention_layernorm", size_t(H), 0.1f, 1.0f);
      params.attn = ref::make_mla_params(m_, m_.num_attention_heads, w.seed);
      if (P.dense(layer))
        params.dense = ref::make_mlp_params(m_, m_.intermediate_size, w.seed, "mlp");
      else
        params.moe = ref::make_moe_params_lazy(m_, w.moe_seed);
    }
    if (!P.dense(layer)) {
      const auto& chosen = routing[moe_index++];
      params.moe.forced_experts.assign(chosen.begin(), chosen.begin() + B * S * K);
      params.moe.check = check;
    }
    ref::MlaInputs in;
    in.batch = B;
    in.q_len = S;
    in.kv_len = P.kv_len + step * S;
    in.ckv_cache.resize(size_t(B * in.kv_len * r));
    in.kpe_cache.resize(size_t(B * in.kv_len * rope));
#pragma omp parallel for schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
      const auto latent =
          mla::cuda::host_latent(m_, mla::cuda::ckv_stream(w.seed, b), mla::cuda::kpe_stream(w.seed, b), P.kv_len);
      const auto& added = (*new_keys)[size_t(i)][size_t(b)];
      for (int64_t j = 0; j < in.kv_len; ++j) {
        bf16* ckv = &in.ckv_cache[size_t((b * in.kv_len + j) * r)];
        bf16* kpe = &in.kpe_cache[size_t((b * in.kv_len + j) * rope)];
        if (j < P.kv_len) {
          std::copy_n(&latent[size_t(j * (r + rope))], r, ckv);
          std::copy_n(&latent[size_t(j * (r + rope) + r)], rope, kpe);
        } else {
          const double* key = &added[size_t((j - P.kv_len) * (r + rope))];
          for (int64_t c = 0; c < r; ++c) ckv[c] = to_bf16(float(key[c]));
          for (int64_t c = 0; c < rope; ++c) kpe[c] = to_bf16(float(key[r + c]));
        }
      }
    }
    if (step + 1 < verified_steps_)  // this step's keys, for the next step: as the attention makes them
#pragma omp parallel for schedule(dynamic)
      for (int64_t b = 0; b < B; ++b) {
        std::vector<double> normed(static_cast<size_t>(H)), kv(static_cast<size_t>(r + rope)),
            c(static_cast<size_t>(r));
        for (int64_t s = 0; s < S; ++s) {
          ref::rms_norm(&x[size_t((b * S + s) * H)], params.input_layernorm.data(), H, m_.rms_norm_eps, normed.data());
          for (auto& v : normed) v = double(round_to_bf16(float(v)));
          ref::matvec(params.attn.kv_a_proj_with_mqa.data(), r + rope, H, normed.data(), kv.data());
          ref::rms_norm(kv.data(), params.attn.kv_a_layernorm.data(), r, m_.rms_norm_eps, c.data());
          ref::apply_rope(m_, in.kv_len + s, kv.data() + r);
          auto& added = (*new_keys)[size_t(i)][size_t(b)];
          added.insert(added.end(), c.begin(), c.end());
          added.insert(added.end(), kv.begin() + r, kv.end());
        }
      }
    if (i + 1 == P.layers) in.rows = sample;
    x = ref::decoder_layer(m_, layer, params, x, in, ref::MlaForm::absorbed_split);
  }
  const size_t first = want.size();
  want.resize(first + size_t(B * n * width));
#pragma omp parallel for schedule(dynamic)
  for (int64_t k = 0; k < B * n; ++k) {
    const int64_t t = (k / n) * S + rows[size_t(k % n)];
    double* out = &want[first + size_t(k * width)];
    if (P.whole) {  // final norm (rounded to bf16, as the LM head's input is) and the LM head
      std::vector<double> normed(static_cast<size_t>(H));
      ref::rms_norm(&x[size_t(t * H)], norm.data(), H, m_.rms_norm_eps, normed.data());
      for (auto& v : normed) v = double(round_to_bf16(float(v)));
      for (int64_t o = 0; o < V; ++o) {
        double sum = 0;
        for (int64_t j = 0; j < H; ++j) sum += double(to_float(head[size_t(o * H + j)])) * normed[size_t(j)];
        out[o] = sum;
      }
    } else {
      std::copy_n(&x[size_t(t * H)], H, out);
    }
  }
}

Verification DeepseekLayerCuda::verify() {
  const Plan& P = *plan_;
  const int64_t S = P.q_len, width = output_width(), B = P.batch;
  // Verified: every request of the batch (the bucket's padding aside) at the run's first two steps, the second
  // attending the keys the first wrote. The steps are run again (each step's output depends only on the cache before
  // it and the step's fixed inputs; later steps are checked graph replay against eager in the tests). The fp64
  // reference runs the whole batch through each layer at once, its weights made or read once a layer.
  verified_steps_ = std::min<int64_t>(P.steps, 2);
  verified_requests_ = B;
  // A long chunk is checked on kVerifiedRows of its new tokens, evenly spread (the first and last among them): the
  // reference makes every token's key in every layer but the last layer's queries, attention and MLP / MoE only for
  // those (fp64 over all 8192 tokens of a prefill chunk took ~50 s a point on the device's CPU).
  std::vector<int64_t> sample;
  if (S > kVerifiedRows)
    for (int64_t i = 0; i < kVerifiedRows; ++i) sample.push_back(i * (S - 1) / (kVerifiedRows - 1));
  std::vector<int64_t> rows;  // the rows verified of each request: all, or the sample
  if (sample.empty())
    for (int64_t s = 0; s < S; ++s) rows.push_back(s);
  else
    rows = sample;
  ModelEndsHost ends;  // (read or made once the reference first runs)
  ref::MoeParams::RoutingCheck check;
  reference_reused_ = false;
  std::vector<float> got;
  std::vector<double> want;
  NewKeys new_keys(static_cast<size_t>(P.layers), std::vector<std::vector<double>>(static_cast<size_t>(B)));
  const bool recording = record_;
  record_ = false;
  for (int64_t step = 0; step < verified_steps_; ++step) {
    enqueue_step(step, 0);
    host_out_.resize(size_t(P.tokens() * width));
    DSLAB_CUDA(cudaDeviceSynchronize());
    DSLAB_CUDA(cudaMemcpy(host_out_.data(), P.whole ? logits_.get() : resid_.get(), host_out_.size() * 4,
                          cudaMemcpyDeviceToHost));
    // Each MoE layer's routing in this step: the reference follows it (near-ties between experts flip with the last
    // bit of an input, and a flip in one layer changes everything after it), and checks each place it differs is a
    // near-tie.
    std::vector<std::vector<int32_t>> routing(moe_.size());
    for (size_t j = 0; j < moe_.size(); ++j) {
      std::vector<float> unused;
      moe_[j]->routing(&routing[j], &unused);
    }
    // A one-step check's reference depends only on the model, its weights' seeds, the step's shape and inputs and
    // the GPU's routing - not on how the GPU ran the step (executor, pdl, splits, ops): the last one computed is kept
    // and reused by a point that matches it in all of those (a sweep's eager and graph points; at batch 128 the fp64
    // reference of the whole model takes minutes of the host). A key that missed an input would show as a failed
    // verification, never as a passed one: the GPU's output would not match a reference of other inputs.
    const int64_t n = int64_t(rows.size());
    std::string key;
    if (verified_steps_ == 1) {
      key = reference_key(routing, rows);
      if (const ReferenceCache& kept = last_reference(); kept.key == key) {
        want = kept.want;
        check = kept.check;
        reference_reused_ = true;
      }
    }
    if (!reference_reused_) {
      append_reference(step, routing, rows, sample, &ends, &new_keys, &check, &want);
      if (!key.empty()) last_reference() = ReferenceCache{key, want, check};
    }
    for (int64_t k = 0; k < B * n; ++k) {
      const int64_t t = (k / n) * S + rows[size_t(k % n)];
      got.insert(got.end(), host_out_.begin() + t * width, host_out_.begin() + (t + 1) * width);
    }
  }
  record_ = recording;
  // The bars grow with the stack's depth: each layer adds its own bf16 roundings, independent of the others', so the
  // error grows as the square root of the layers (a checkpoint's 27-layer V2-Lite step lands 2.7e-2 from the reference
  // at batch 1, where transformers' own bf16 run of it lands 3.9e-2 (median) from its float32 run).
  const double depth = std::sqrt(std::max(1.0, double(P.layers) / 4.0));
  // A differing choice must be a near-tie: its selection scores within 5% of each other (a wrong expert is not),
  // deeper stacks carrying a larger error into the router.
  const double tie_gap = 0.05 * depth;
  double rel_err = ref::relative_l2_error(got.data(), want.data(), want.size());
  routing_flips_ = check.tokens_differing;
  if (check.tokens_differing > 0) {
    std::fprintf(stderr,
                 "  (layer verify: the GPU's routing differs from the fp64 router's at %d token-layer(s), selection "
                 "score gap up to %.2g; "
                 "the reference follows the GPU's choice)\n",
                 check.tokens_differing, check.max_gap);
  }
  if (check.max_gap > tie_gap) rel_err = std::max(rel_err, 1.0);  // not a tie: a routing bug
  // bf16 weights and activations through a stack of up to 4 layers: 2e-2; quantised caches add theirs.
  const double threshold = depth * (P.kv_dtype == mla::KvDtype::bf16   ? 2e-2
                                    : P.kv_dtype == mla::KvDtype::int8 ? 4e-2
                                                                       : 8e-2);
  return {rel_err, threshold};
}

std::map<std::string, double> DeepseekLayerCuda::counters() {
  const Plan& P = *plan_;
  std::map<std::string, double> c;
  // What the ops measured of themselves in the timed runs (before the runs below add theirs): the CPU experts' own
  // time per step, summed over the layers that run them.
  int64_t hot_layers = 0;
  for (const auto& op : moe_)
    for (const auto& [name, value] : op->own_counters()) {
      if (name == "cpu_experts_engine_s")
        c[name] += value;
      else if (name == "cpu_experts_threads" || name == "gpu_hot_experts")
        c[name] = value;
      else if (name == "hot_share" || name == "hot_share_profiled")
        c[name] += value;  // (mean over the layers, below)
      if (name == "gpu_hot_experts") ++hot_layers;
    }
  for (const char* name : {"hot_share", "hot_share_profiled"})
    if (hot_layers > 0) c[name] /= double(hot_layers);
  // Per-op GPU time of one step, eager, queued behind a blocking kernel long enough to hide its launches.
  const double occupy = 2e-3 + 1e-3 * double(P.layers);  // (a layer queues ~50 launches and marks)
  {  // The step's GPU work from CUPTI's records: its busy time is what a launch-free step could take.
    gpu::flush_l2();
    const gpu::KernelTimes kt = gpu::kernel_times([&] { enqueue_step(0, 0); });
    if (kt.records > 0) {
      c["kernel_time_s"] = kt.busy_s;  // union of the step's kernel and copy intervals
      c["kernel_sum_s"] = kt.sum_s;    // their summed durations (above busy: work overlapped)
      c["gpu_activities"] = double(kt.records);
      for (const auto& [name, s] : kt.by_kernel_s) c["kernel_us." + name] = s * 1e6;  // the step's time by kernel
    }
  }
  if (P.moe != "moe/loop/cuda") {  // (the loop synchronises inside a step: its ops cannot be queued ahead)
    const auto ops = gpu::time_ops(
        [&](gpu::OpMarks& marks) {
          DSLAB_CUDA(cudaMemcpyAsync(meta_.get(), meta_host_, size_t(meta_ints_) * 4, cudaMemcpyHostToDevice, 0));
          marks.mark("metadata", 0);
          forward(0, &marks);
        },
        5, occupy);
    c.insert(ops.begin(), ops.end());         // op_us.*: event-bracketed, so each includes a mark's ~1-2 us
    if (!P.experts_on_host && !P.streamed) {  // each op against its own floor (GPU placements: HBM is their ceiling)
      const mla::cuda::MlaOp& attn = *attn_.front();  // (every layer's op is of the attn axis)
      layer::StepShape shape;
      shape.batch = P.batch, shape.q_len = P.q_len, shape.kv_len = P.kv_len;
      shape.attn = attn.algo(), shape.kv_dtype = P.kv_dtype, shape.fused_decode = attn.fused();
      shape.norms_in_moe_combine = P.fused_norms;
      shape.absorbs_fused = P.fused_absorbs;
      const auto rows = layer::op_floor_counters(P.m, shape, P.first, P.layers, P.whole, active_experts_, ops);
      c.insert(rows.begin(), rows.end());
    }
  }
  c["steps"] = double(P.steps);
  c["layers"] = double(P.layers);
  c["first_layer"] = double(P.first);
  c["moe_layers"] = double(P.moe_layers);
  c["distinct_moe_weight_sets"] = double(P.resident_moe_layers + P.moe_sets);
  c["weights_reused"] = P.resident_moe_layers + P.moe_sets < P.moe_layers ? 1.0 : 0.0;
  c["gpu_moe_layers"] =
      double(P.experts_on_host ? P.resident_moe_layers : P.moe_layers);  // MoE layers whose experts the GPU runs
  if (P.streamed)
    c["streamed_expert_bytes"] = double(P.moe_layers) * P.routed_set_bytes;  // copied to the GPU each step
  c["device_bytes"] = P.device_bytes();
  // The ops' forward scratch: the arena the formula sized, and the most any op took of it.
  c["scratch_arena_bytes"] = double(arena_.capacity());
  c["scratch_arena_used_bytes"] = double(arena_.high_water());
  c["bucket"] = double(P.bucket);
  c["padded_tokens"] = double((P.bucket - P.batch) * P.q_len);
  c["cuda_graph"] = graph_ ? 1.0 : 0.0;
  c["graph_captures"] = double(captures_);
  c["tokens_per_run"] = double(P.batch * P.q_len * P.steps);
  double active = 0;
  for (double a : active_experts_) active += a;
  if (!active_experts_.empty()) c["mean_active_experts"] = active / double(active_experts_.size());
  return c;
}

std::vector<DumpTensor> DeepseekLayerCuda::tensors() const {
  std::vector<DumpTensor> t;
  if (!host_out_.empty())
    t.push_back({plan_->whole ? "logits" : "hidden_states_out",
                 "F32",
                 {plan_->bucket, plan_->q_len, output_width()},
                 host_out_.data(),
                 host_out_.size() * 4});
  return t;
}

std::vector<std::pair<std::string, std::string>> DeepseekLayerHybrid::axes() const {
  auto a = DeepseekLayerCuda::axes();
  for (auto& [name, value] : a)
    if (name == "moe") value = "moe/host/cuda";
  return a;
}

Support DeepseekLayerHybrid::supports(const ModelFile& model, const Point& point) const {
  const std::string& moe = point.text("moe");
  const auto op = moe::cuda::make_moe_op(moe);
  if (op && !op->experts_on_host())
    return Support::no("moe: " + moe +
                       " runs the routed experts on the GPU; layer/deepseek/hybrid runs them on the CPU "
                       "(moe/host/cuda): use layer/deepseek/cuda");
  return DeepseekLayerCuda::supports(model, point);
}

DSLAB_REGISTER_VARIANT(DeepseekLayerHybrid, "layer/deepseek/hybrid", dslab::Device::cuda,
                       "layer/deepseek/cuda with KTransformers' placement: attention, router and shared experts on the "
                       "GPU, routed experts on "
                       "the CPU (moe/host/cuda; gpu_experts keeps the first N layers' or each layer's N hottest on the "
                       "GPU; gpu_budget, cpu_threads)");

DSLAB_REGISTER_VARIANT(
    DeepseekLayerCuda, "layer/deepseek/cuda", dslab::Device::cuda,
    "DeepSeek decoder layers end to end (norms, attn=any mla/*/cuda, moe=any moe/*/cuda or the dense MLP, residuals; "
    "layers=N or all with embedding and LM head), eager or one CUDA graph per batch bucket");

}  // namespace dslab::layer::cuda
