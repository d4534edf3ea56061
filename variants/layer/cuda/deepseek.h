// layer/deepseek/cuda: DeepSeek decoder layers end to end on the GPU, composed from the ops the family variants
// time: RMSNorm -> attention (any mla/<form>/cuda, `attn` axis) -> residual -> RMSNorm -> MoE (any moe/<algo>/cuda,
// `moe` axis; the dense MLP below first_k_dense_replace) -> residual, for N consecutive layers or the whole model
// (embedding, every layer, final norm, LM head). Compiled by nvcc only.
//
// Executors (the `executor` axis): eager launches kernel by kernel; graph replays one CUDA graph of the whole step,
// captured per batch-size bucket (1, 2, 4, ...: a batch is padded up to its bucket, and the padding is counted) at
// the largest page table the run needs, as serving engines do. Each step's metadata (lengths, page table, RoPE
// tables at the new tokens' positions, the fused kernel's split-KV schedule, token ids, the step number) is built on
// the host before the run, as a scheduler does before a step, and copied into the static buffers the graph was
// captured on before each replay, so one graph serves every step as the sequences grow (`steps` axis).
#pragma once
#include <cuda_bf16.h>

#include <memory>
#include <string>
#include <vector>

#include "harness/variant.h"
#include "variants/common/checkpoint.h"
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/moe/cuda/moe_cuda.h"

namespace dslab::layer::cuda {

using gpu::BlasHandle;
using gpu::DeviceArray;

// One decoder layer's weights on the device. MoE weights may be shared by several layers (a V3 layer's
// experts are 22.5 GB: a stack longer than memory holds reuses them, and says so).
struct LayerWeights {
  DeviceArray<__nv_bfloat16> input_layernorm, post_attention_layernorm;
  mla::cuda::MlaWeights attn;
  moe::cuda::MlpWeights dense;                       // layer_index < first_k_dense_replace
  std::shared_ptr<const moe::cuda::MoeWeights> moe;  // otherwise
  uint64_t seed = 0, moe_seed = 0;                   // the reference's seeds of this layer's tensors
};

// A decoder layer's weights: the seed's (the reference's values, each MoE layer its own expert set) or a checkpoint's.
void make_layer_weights(const ModelConfig& m, int64_t layer, uint64_t seed, LayerWeights* w,
                        bool experts_on_device = true);
// experts_on_device false: a MoE layer's routed experts stay in the checkpoint for an op that reads them into host
// memory (moe/host/cuda).
void load_layer_weights(const Checkpoint& c, int64_t layer, LayerWeights* w, bool experts_on_device = true);
// The embedding, final norm and LM head: the seed's or a checkpoint's.
void make_model_ends(const ModelConfig& m, uint64_t seed, DeviceArray<__nv_bfloat16>* embed,
                     DeviceArray<__nv_bfloat16>* norm, DeviceArray<__nv_bfloat16>* lm_head);
void load_model_ends(const Checkpoint& c, DeviceArray<__nv_bfloat16>* embed, DeviceArray<__nv_bfloat16>* norm,
                     DeviceArray<__nv_bfloat16>* lm_head);

// BadInput naming the axis unless `value` is one of `names` (a registry's op names), listing them.
void check_op_axis(const std::string& axis, const std::string& value, const std::vector<std::string>& names);

// Batch-size buckets of the graph executor: the smallest power of two at least `batch`.
int64_t batch_bucket(int64_t batch);

class DeepseekLayerCuda : public Variant {
 public:
  DeepseekLayerCuda();
  ~DeepseekLayerCuda() override;
  std::vector<std::pair<std::string, std::string>> axes() const override;
  Support supports(const ModelFile& model, const Point& point) const override;
  Cost cost(const ModelFile& model, const Point& point) const override;
  double host_memory_bytes(const ModelFile& model, const Point& point) const override;
  double device_memory_bytes(const ModelFile& model, const Point& point) const override;
  std::string compute_ceiling() const override { return "gpu.tensor_bf16_flops"; }
  bool reads_weights() const override { return true; }
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override;
  void run() override;  // `steps` consecutive steps
  Verification verify() override;
  // What verify() covered (verified_requests, verified_steps) and the routing near-ties it followed.
  std::map<std::string, double> verification_counters() const override {
    return {{"verified_requests", double(verified_requests_)},
            {"verified_steps", double(verified_steps_)},
            {"routing_near_ties", double(routing_flips_)},
            {"reference_reused", reference_reused_ ? 1.0 : 0.0}};
  }
  std::vector<DumpTensor> tensors() const override;
  std::map<std::string, double> counters() override;

  // For tests. Queues step `step` on `stream` (its metadata copy, then the layers, eagerly or as the graph).
  void enqueue_step(int64_t step, cudaStream_t stream);
  // Keep each step's output (its first min(tokens, 8) rows) from the next run() on: recorded_steps()[step].
  void record_steps(bool on) { record_ = on; }
  std::vector<std::vector<float>> recorded_steps() const;
  int graph_captures() const { return captures_; }
  int64_t output_width() const;

 private:
  struct Plan;            // layers, buckets, memory: what supports(), cost() and prepare() all need
  struct ExpertStreamer;  // gpu_experts=streamed: the routed experts' host copies, staging buffers, copy stream
  void forward(cudaStream_t stream, gpu::OpMarks* marks);
  // The norm after layer i's FFN: the next layer's input norm, the final norm (whole model), or none.
  const __nv_bfloat16* next_norm_weight(size_t i) const;
  void capture();
  std::unique_ptr<Plan> plan_;
  ModelConfig m_;
  uint64_t seed_ = 0;
  std::unique_ptr<BlasHandle> blas_, side_blas_;  // side: the MoE layers' shared experts, beside their routed ones
  std::vector<LayerWeights> weights_;             // one per layer (MoE weights shared where reused)
  std::vector<mla::cuda::PagedLatentCache> caches_;
  gpu::ScratchArena arena_;  // every op's forward scratch (they run one after another)
  std::unique_ptr<ExpertStreamer> streamer_;
  std::vector<std::unique_ptr<mla::cuda::MlaOp>> attn_;
  std::vector<std::unique_ptr<moe::cuda::MoeOp>> moe_;                // per MoE layer
  std::vector<moe::cuda::MlpRunner> dense_;                           // per dense layer
  DeviceArray<__nv_bfloat16> embed_, final_norm_, lm_head_, inputs_;  // inputs_: [steps][tokens][hidden] (N-layer runs)
  DeviceArray<float> resid_, attn_out_, ffn_out_, logits_;
  DeviceArray<__nv_bfloat16> xb_;  // the normalised stream, each op's input
  DeviceArray<int32_t> meta_;      // the static metadata buffer (see Plan for its layout)
  int32_t* meta_host_ = nullptr;   // pinned, [steps][meta ints]
  int64_t meta_ints_ = 0, off_ids_ = 0, off_step_ = 0;
  std::vector<double> active_experts_;  // per MoE layer: experts its routing reached in prepare()'s step
  std::string prepared_label_;          // the point (label@model) they belong to
  std::vector<int64_t> lengths0_;       // cached tokens per (bucket) request before step 0
  cudaGraphExec_t graph_ = nullptr;
  int captures_ = 0;
  bool record_ = false;
  int routing_flips_ = 0;  // near-ties the last verify() found (reference followed the GPU)
  // The last one-step reference verify() computed, and what identifies its inputs (see verify()).
  struct ReferenceCache {
    std::string key;
    std::vector<double> want;
    ref::MoeParams::RoutingCheck check;
  };
  static ReferenceCache& last_reference();
  // The reference's host copies of the model's ends (whole model), and the latent rows [r + rope] the verified steps
  // so far wrote, per layer and request.
  struct ModelEndsHost {
    std::vector<bf16> embed, norm, head;
  };
  using NewKeys = std::vector<std::vector<std::vector<double>>>;
  // The fp64 reference of verified step `step`, following the GPU's routing: the `rows` of every request appended to
  // *out (logits, or the residual stream after the last layer), the step's keys to *new_keys where a step follows.
  void append_reference(int64_t step, const std::vector<std::vector<int32_t>>& routing,
                        const std::vector<int64_t>& rows, const std::vector<int64_t>& sample, ModelEndsHost* ends,
                        NewKeys* new_keys, ref::MoeParams::RoutingCheck* check, std::vector<double>* out) const;
  std::string reference_key(const std::vector<std::vector<int32_t>>& routing, const std::vector<int64_t>& rows) const;
  bool reference_reused_ = false;  // whether the last verify() took last_reference()'s
  int64_t verified_steps_ = 0, verified_requests_ = 0;
  DeviceArray<float> history_;  // [steps][rows][width] when recording
  std::vector<float> host_out_;
  std::unique_ptr<Checkpoint> checkpoint_;  // --weights: the weights' source (the reference reads it too)
  double load_s_ = 0;
};

// layer/deepseek/hybrid: the same layer with KTransformers' placement as its default (attention, router and shared
// experts on the GPU, routed experts on the CPU: moe=moe/host/cuda, hidden states over pinned memory, the CPU's experts
// overlapped with the GPU's shared experts) and the placement axes (gpu_experts, gpu_budget, cpu_threads). It takes
// only MoE ops that run the routed experts on the CPU; the rest are layer/deepseek/cuda's.
class DeepseekLayerHybrid final : public DeepseekLayerCuda {
 public:
  std::vector<std::pair<std::string, std::string>> axes() const override;
  Support supports(const ModelFile& model, const Point& point) const override;
};

}  // namespace dslab::layer::cuda
