// DeepseekLayerCuda's plan of one point (what supports(), cost() and prepare() need, from the model and the point)
// and its expert streamer; included by the variant (deepseek.cu) only.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "harness/errors.h"
#include "variants/common/cuda/nvtx.h"
#include "harness/host.h"
#include "variants/common/cuda/device_random.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/rng.h"
#include "variants/layer/ops.h"

namespace dslab::layer::cuda {

using gpu::ScratchArena;
using mla::cuda::MlaBuffers;
using mla::cuda::MlaOp;
using moe::cuda::MoeBuffers;
using moe::cuda::MoeOp;

// ---- the plan: what supports(), cost() and prepare() need, from the model and the point ------------------------

struct DeepseekLayerCuda::Plan {
  ModelConfig m;
  int64_t batch = 0, bucket = 0, q_len = 0, kv_len = 0, steps = 0, page_size = 0, kv_splits = 0, block_keys = 0;
  mla::SplitPlan split_plan = mla::SplitPlan::automatic;
  mla::KvDtype kv_dtype = mla::KvDtype::bf16;
  std::string attn, moe, len_dist;
  bool graph = false, whole = false, pdl = true;
  bool fused_absorbs = true;  // the fused decode's absorbs in the norm's and the merge's launches (mla::Shape)
  std::pair<int, int> moe_tile = {0, 64};  // the grouped MoE ops' tile (moe_tile axis; rows 0: measured)
  bool fused_norms = false;       // the residual add and next norm after a MoE layer in its combine (MoeBuffers::resid)
  int64_t first = 0, layers = 0;  // decoder layers [first, first + layers)
  int64_t moe_layers = 0, moe_sets = 0;
  double fixed_bytes = 0, moe_set_bytes = 0, full_set_bytes = 0, host_expert_bytes = 0;
  double arena_bytes = 0;        // the ops' forward scratch, one arena for all (part of fixed_bytes)
  bool experts_on_host = false;  // the moe op runs the routed experts from host memory (moe/host/cuda)
  // gpu_experts=streamed: a GPU op's routed experts live in pinned host memory (routed_set_bytes per MoE layer) and
  // are copied into one of two staging buffers (staging_bytes) before each layer's use.
  bool streamed = false;
  double routed_set_bytes = 0, staging_bytes = 0;
  int cpu_threads = 0;  // of that op (0: its default)
  // MoE layers (the first ones) whose experts stay on the GPU, run by moe/grouped/cuda beside a host op's layers
  // (gpu_experts axis); their weight sets are never reused.
  int64_t resident_moe_layers = 0;
  // gpu_experts=hot:N: each of the other MoE layers keeps its N most routed experts on the GPU (hot_set_bytes).
  int64_t hot_experts = 0;
  double hot_set_bytes = 0;
  std::string why_not;
  bool dense(int64_t layer) const { return !m.is_moe_layer(layer); }
  int64_t tokens() const { return bucket * q_len; }
  int64_t max_keys() const { return kv_len + steps * q_len; }
  mla::Shape attn_shape() const {
    mla::Shape s;
    s.heads = m.num_attention_heads;
    s.batch = bucket;
    s.q_len = q_len;
    s.kv_len = kv_len;
    s.kv_dtype = kv_dtype;
    s.kv_splits = kv_splits;
    s.split_plan = split_plan;
    s.block_keys = block_keys;
    s.fused_absorbs = fused_absorbs;
    return s;
  }

  Plan(const ModelFile& model, const Point& p) {
    m = parse_model_config(model.config, model.name, model.path);
    batch = p.integer("batch");
    q_len = p.integer("q_len");
    kv_len = p.integer("kv_len");
    steps = p.integer("steps");
    page_size = p.integer("page_size");
    kv_dtype = mla::parse_kv_dtype(p.text("kv_dtype"));
    kv_splits = mla::parse_kv_splits(p.text("kv_splits"));
    split_plan = p.has("split_plan") ? mla::parse_split_plan(p.text("split_plan")) : mla::SplitPlan::automatic;
    block_keys = p.has("block_keys") ? mla::parse_block_keys(p.text("block_keys")) : 0;
    attn = p.text("attn");
    moe = p.text("moe");
    graph = p.text("executor") == "graph";
    pdl = p.text("pdl") == "on";
    fused_norms = p.has("fused_norms") && mla::parse_on_off("fused_norms", p.text("fused_norms"));
    fused_absorbs = !p.has("fused_absorbs") || mla::parse_on_off("fused_absorbs", p.text("fused_absorbs"));
    moe_tile = moe::cuda::parse_moe_tile(p.has("moe_tile") ? p.text("moe_tile") : "auto");
    bucket = graph ? batch_bucket(batch) : batch;
    const std::string& l = p.text("layers");
    whole = l == "all";
    if (!whole) {
      size_t used = 0;
      int64_t n = 0;
      try {
        n = std::stoll(l, &used);
      } catch (const std::exception&) {}
      if (used != l.size() || n < 1 || n > m.num_hidden_layers)
        throw BadInput("axis 'layers': value '" + l + "': expected all or 1.." + std::to_string(m.num_hidden_layers) +
                       " (num_hidden_layers of " + m.source + ")");
      layers = n;
      // N layers: the model's first MoE layers (the typical layer), or its last N if it has fewer.
      first = std::min(m.first_k_dense_replace, m.num_hidden_layers - n);
    } else {
      layers = m.num_hidden_layers;
      first = 0;
    }
    check_op_axis("attn", attn, mla::cuda::mla_op_names());
    check_op_axis("moe", moe, moe::cuda::moe_op_names());
    for (int64_t i = first; i < first + layers; ++i) moe_layers += dense(i) ? 0 : 1;
    const auto attn_op = mla::cuda::make_mla_op(attn);
    // (a sparse op attends the keys it selects; the layers' fp64 reference attends them all)
    why_not =
        attn_op->sparse()
            ? "attn: " + attn +
                  " attends a selection of the keys; the layers verify dense attention, so they take dense attn ops"
            : attn_op->unsupported(m, attn_shape());
    if (why_not.empty() && kv_splits > 0 && !attn_op->fused())
      why_not = "kv_splits: only the fused attention splits the keys (" + attn + " does not)";
    if (why_not.empty() && split_plan != mla::SplitPlan::automatic && !attn_op->fused())
      why_not = "split_plan: only the fused attention splits the keys (" + attn + " does not)";
    if (why_not.empty() && !fused_absorbs && !attn_op->fused())
      why_not = "fused_absorbs: only the fused attention folds its absorbs into other kernels (" + attn + " does not)";
    if (why_not.empty() && block_keys > 0 && !attn_op->fused())
      why_not = "block_keys: only the fused attention has key blocks to size (" + attn + " does not)";
    const auto moe_op = moe::cuda::make_moe_op(moe);
    experts_on_host = moe_op->experts_on_host();
    cpu_threads = p.has("cpu_threads") ? int(p.integer("cpu_threads")) : 0;
    const layer::GpuExperts gpu_experts =
        layer::parse_gpu_experts(p.has("gpu_experts") ? p.text("gpu_experts") : "none");
    const double budget_request = layer::parse_gpu_budget(  // bytes (0: the device's)
        p.has("gpu_budget") ? p.text("gpu_budget") : "all");
    if (why_not.empty() && cpu_threads > 0 && !experts_on_host)
      why_not = "cpu_threads: " + moe + " runs no experts on the CPU";
    if (why_not.empty() && moe_tile.first > 0 && !moe_op->has_tiles())
      why_not = "moe_tile: " + moe + "'s experts are not grouped GEMMs of tiles";
    streamed = gpu_experts.kind == layer::GpuExperts::Kind::streamed;
    if (why_not.empty() && streamed && experts_on_host)
      why_not = "gpu_experts: streamed copies the routed experts to a GPU op (e.g. moe/grouped/cuda); " + moe +
                " runs them on the CPU";
    if (why_not.empty() && streamed && moe_layers == 0) why_not = "gpu_experts: streamed: the step has no MoE layers";
    if (why_not.empty() && !streamed && gpu_experts.kind != layer::GpuExperts::Kind::none && !experts_on_host)
      why_not =
          "gpu_experts: " + moe +
          " keeps every layer's experts on the GPU already (the axis splits a host op's layers, e.g. moe/host/cuda's)";
    if (why_not.empty() && gpu_experts.kind == layer::GpuExperts::Kind::layers && gpu_experts.layers > moe_layers)
      why_not = "gpu_experts: layers:" + std::to_string(gpu_experts.layers) + ": the step has " +
                std::to_string(moe_layers) + " MoE layers";
    if (gpu_experts.kind == layer::GpuExperts::Kind::hot) {
      hot_experts = gpu_experts.hot;
      if (why_not.empty() && hot_experts >= m.n_routed_experts)
        why_not = "gpu_experts: hot:" + std::to_string(hot_experts) + ": " + m.source + " has " +
                  std::to_string(m.n_routed_experts) +
                  " routed experts (hot:N keeps fewer than all on the GPU; all of them is gpu_experts=layers:N or "
                  "moe/grouped/cuda)";
      if (why_not.empty() && moe_layers == 0) why_not = "gpu_experts: hot:N: the step has no MoE layers";
    }
    if (why_not.empty() && moe_layers > 0) why_not = moe_op->unavailable();
    if (why_not.empty() && graph && !moe_op->graph_safe())
      why_not = "executor graph: " + moe + " reads the routing on the host (not capturable); use executor eager";
    if (why_not.empty() && whole && m.vocab_size <= 0) why_not = "layers all needs vocab_size in " + m.source;
    if (why_not.empty() && m.hidden_size > 8192) why_not = "norm kernels: hidden_size up to 8192";
    // Device memory: every layer's attention weights, dense MLPs and cache are its own; MoE weight sets are reused
    // cyclically when not every MoE layer's fit.
    const double H = double(m.hidden_size);
    const double pages = double(bucket) * std::ceil(double(max_keys()) / double(page_size)) + double(bucket);
    const double cache = pages * double(page_size) * double(m.kv_lora_rank + m.qk_rope_head_dim) *
                         (kv_dtype == mla::KvDtype::bf16 ? 2.0 : 1.0 + 4.0 / double(mla::kQuantGroup));
    layer::StepScratch scratch;
    scratch.attn = attn_shape();
    scratch.algo = attn_op->algo();
    scratch.fused = attn_op->fused();
    scratch.max_keys = max_keys();
    scratch.layers = layers;
    scratch.moe_layers = moe_layers;
    scratch.steps = steps;
    scratch.whole = whole;
    scratch.hot_experts = hot_experts;
    fixed_bytes = double(layers) * (mla::weight_bytes(m, m.num_attention_heads) + cache + 4 * H) +
                  double(layers - moe_layers) * 3 * H * double(m.intermediate_size) * 2 +
                  (whole ? 2 * double(m.vocab_size) * H * 2 : 0) + layer::gpu_step_scratch_bytes(m, scratch);
    arena_bytes = layer::gpu_step_arena_bytes(m, scratch);
    const double host_set_bytes = moe::cuda::moe_weight_bytes(m, 0);  // router and shared experts
    full_set_bytes = moe::cuda::moe_weight_bytes(m, m.n_routed_experts);
    moe_set_bytes = experts_on_host || streamed ? host_set_bytes : full_set_bytes;
    routed_set_bytes = full_set_bytes - host_set_bytes;
    hot_set_bytes = double(hot_experts) / double(m.n_routed_experts) * routed_set_bytes;
    if (streamed) staging_bytes = double(std::min<int64_t>(2, moe_layers)) * routed_set_bytes;
    const GpuInfo& g = gpu_info();
    if (why_not.empty() && g.present && budget_request > double(g.memory_bytes))
      why_not = "gpu_budget: " + p.text("gpu_budget") + " is more than the " + g.name + "'s " +
                std::to_string(int64_t(double(g.memory_bytes) / 1e9)) + " GB";
    const double budget =
        budget_request > 0 ? std::min(budget_request, 0.85 * double(g.memory_bytes)) : 0.85 * double(g.memory_bytes);
    if (experts_on_host && gpu_experts.kind == layer::GpuExperts::Kind::layers)
      resident_moe_layers = std::min(gpu_experts.layers, moe_layers);
    if (experts_on_host && gpu_experts.kind == layer::GpuExperts::Kind::fit)
      resident_moe_layers = layer::resident_moe_layers(budget, fixed_bytes, moe_layers, host_set_bytes, full_set_bytes);
    if (experts_on_host ||
        streamed) {  // the other MoE layers' routed experts in host memory (made and packed: twice, briefly, per layer)
      host_expert_bytes = double(moe_layers - resident_moe_layers) * (routed_set_bytes - hot_set_bytes);
      const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
      if (why_not.empty() && host_expert_bytes > 0.7 * have)
        why_not = "the routed experts of " + std::to_string(moe_layers) + " layers need ~" +
                  std::to_string(int64_t(host_expert_bytes / double(1 << 30))) +
                  " GiB of host memory, this machine has " + std::to_string(int64_t(have / double(1 << 30))) +
                  " GiB (fewer layers)";
    }
    // The other MoE layers' sets: reused cyclically when they do not all fit, but only for a run with no budget and no
    // resident layers (a budget or a split states what fits).
    const int64_t others = moe_layers - resident_moe_layers;
    const double fixed_and_resident =
        fixed_bytes + double(resident_moe_layers) * full_set_bytes + staging_bytes + double(others) * hot_set_bytes;
    moe_sets = others == 0 ? 0 : std::clamp<int64_t>(int64_t((budget - fixed_and_resident) / moe_set_bytes), 0, others);
    const bool reuse = budget_request == 0 && resident_moe_layers == 0 && !streamed;
    if (why_not.empty() && g.present &&
        (fixed_and_resident > budget || (others > 0 && moe_sets < 1) || (!reuse && moe_sets < others))) {
      const double need = fixed_and_resident + double(reuse ? std::min<int64_t>(others, 1) : others) * moe_set_bytes;
      why_not = "needs ~" + std::to_string(int64_t(need / 1e9)) + " GB of GPU memory, " +
                (budget_request > 0 ? "gpu_budget is " + p.text("gpu_budget")
                                    : g.name + " has " + std::to_string(int64_t(double(g.memory_bytes) / 1e9)) + " GB");
    }
    if (!g.present) moe_sets = others;  // (cost only)
    if (why_not.empty() && !model.weights.empty() && (streamed || hot_experts > 0))
      why_not = "--weights: gpu_experts " + p.text("gpu_experts") + ": not with a checkpoint yet (streamed and hot " +
                "experts are made from the seed)";
    if (why_not.empty() && !model.weights.empty() && moe_sets < moe_layers - resident_moe_layers)
      why_not = "--weights: every MoE layer needs its own experts (" + std::to_string(moe_layers) +
                " layers' do not fit: fewer layers, or the CPU experts of moe/host/cuda)";
  }
  double device_bytes() const {
    return fixed_bytes + double(resident_moe_layers) * full_set_bytes + double(moe_sets) * moe_set_bytes +
           staging_bytes + double(moe_layers - resident_moe_layers) * hot_set_bytes;
  }
  // Which weight set MoE layer q (0-based among the step's MoE layers) uses, and whether its experts are on the GPU.
  int64_t moe_set(int64_t q) const {
    return q < resident_moe_layers ? q : resident_moe_layers + (q - resident_moe_layers) % moe_sets;
  }
};

// gpu_experts=streamed: every MoE layer's routed experts in one pinned host buffer, copied on a stream of their own
// into two staging buffers in turn (MoE layer q into q % 2). Each copy waits until the layer two before is done
// with its buffer, each layer waits for its copy: the next layer's copy overlaps this layer's work. The events
// and the copy stream are captured with the step, so a replayed graph streams the same way.
struct DeepseekLayerCuda::ExpertStreamer {
  int64_t layers = 0;
  size_t set_elements = 0;        // one layer's routed experts: gate, up, down, each stacked by expert
  __nv_bfloat16* host = nullptr;  // pinned, [layers][set_elements]
  DeviceArray<__nv_bfloat16> staging[2];
  cudaStream_t copies{};
  cudaEvent_t fork{};
  std::vector<cudaEvent_t> loaded, released;  // per MoE layer

  ExpertStreamer(int64_t moe_layers, size_t elements) : layers(moe_layers), set_elements(elements) {
    DSLAB_CUDA(cudaMallocHost(&host, size_t(layers) * set_elements * 2));
    for (int64_t k = 0; k < std::min<int64_t>(2, layers); ++k) staging[k].resize(set_elements);
    DSLAB_CUDA(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking));
    DSLAB_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    loaded.resize(size_t(layers));
    released.resize(size_t(layers));
    for (int64_t q = 0; q < layers; ++q) {
      DSLAB_CUDA(cudaEventCreateWithFlags(&loaded[size_t(q)], cudaEventDisableTiming));
      DSLAB_CUDA(cudaEventCreateWithFlags(&released[size_t(q)], cudaEventDisableTiming));
    }
  }
  ~ExpertStreamer() {
    for (auto e : loaded) cudaEventDestroy(e);
    for (auto e : released) cudaEventDestroy(e);
    cudaEventDestroy(fork);
    cudaStreamDestroy(copies);
    cudaFreeHost(host);
  }
  ExpertStreamer(const ExpertStreamer&) = delete;
  ExpertStreamer& operator=(const ExpertStreamer&) = delete;
  __nv_bfloat16* slot(int64_t q) const { return staging[q % 2].get(); }
  __nv_bfloat16* host_set(int64_t q) const { return host + size_t(q) * set_elements; }
  void copy(int64_t q) {
    DSLAB_CUDA(cudaMemcpyAsync(slot(q), host_set(q), set_elements * 2, cudaMemcpyHostToDevice, copies));
    DSLAB_CUDA(cudaEventRecord(loaded[size_t(q)], copies));
  }
  // At the step's start: the copy stream joins `stream` there and fetches the first two layers' experts.
  void begin(cudaStream_t stream) {
    DSLAB_CUDA(cudaEventRecord(fork, stream));
    DSLAB_CUDA(cudaStreamWaitEvent(copies, fork));
    for (int64_t q = 0; q < std::min<int64_t>(2, layers); ++q) copy(q);
  }
  void before(int64_t q, cudaStream_t stream) { DSLAB_CUDA(cudaStreamWaitEvent(stream, loaded[size_t(q)])); }
  // After MoE layer q: its buffer takes layer q + 2's experts.
  void after(int64_t q, cudaStream_t stream) {
    if (q + 2 >= layers) return;
    DSLAB_CUDA(cudaEventRecord(released[size_t(q)], stream));
    DSLAB_CUDA(cudaStreamWaitEvent(copies, released[size_t(q)]));
    copy(q + 2);
  }
};

}  // namespace dslab::layer::cuda
