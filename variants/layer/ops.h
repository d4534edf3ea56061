// The ops of a DeepSeek decode or prefill step, each with its work and its traffic: what the offload planner
// (`dslab plan`) places on a device and prices against that device's ceilings. One list per step: the embedding,
// every decoder layer's ops in order, the final norm and the LM head. Each op counts what it must move once:
// its weights, the KV cache it reads or writes, and its activations in and out (bf16 in, fp32 residual traffic
// where the GPU layer keeps an fp32 residual stream). Unit-tested against hand-derived values (tests/test_ops.cc).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "variants/common/model_config.h"
#include "variants/mla/mla.h"

namespace dslab::layer {

// The op groups a placement moves as one (the planner's granularity).
enum class OpGroup { attention, gate, shared_experts, routed_experts, dense_mlp, norms, embedding, lm_head };
const char* group_name(OpGroup g);

struct StepShape {
  int64_t batch = 1, q_len = 1, kv_len = 0;  // requests, new tokens per request, tokens cached per request before
  mla::Algo attn = mla::Algo::a_cc_me;       // the attention form (what its core computes and caches)
  mla::KvDtype kv_dtype = mla::KvDtype::bf16;
  // Decode steps (q_len up to 2) run the fused kernel (mla/fused/cuda: the a_cc_me form, scores on chip), as the
  // layer sweeps do; longer chunks, or every step when false, the unfused form (scores through memory).
  bool fused_decode = true;
  // The residual add and norm after each MoE layer run inside its combine kernel (layer/deepseek/cuda's fused_norms):
  // op_floor_counters counts those norms in the experts row, without a kernel of their own.
  bool norms_in_moe_combine = false;
  // The fused decode's absorbs inside the kernels beside them (mla::Shape::fused_absorbs): W_UV in the split merge,
  // and without q_lora_rank at 1-2 tokens W_UK in the latent norm's launch; each a kernel less a layer.
  bool absorbs_fused = true;
  int64_t tokens() const { return batch * q_len; }
  bool scores_on_chip() const { return fused_decode && q_len <= 2; }
};

struct OpCost {
  std::string name;  // q_proj | q_a_proj | q_b_proj | kv_a_proj | attention_core | o_proj | gate | shared_experts |
                     // routed_experts | dense_mlp | input_norm | post_attention_norm | embedding | final_norm | lm_head
  OpGroup group = OpGroup::attention;
  int64_t layer = -1;  // decoder layer, -1 outside the layers
  double flops = 0;
  double weight_bytes = 0, kv_bytes = 0, act_bytes = 0;
  // Routed experts only: the experts the step reaches (expected under uniform routing) and the mean tokens each
  // receives (tokens x topk / active): the number that decides CPU (few) or GPU (many) for them.
  double active_experts = 0, tokens_per_expert = 0;
  int gpu_kernels = 1;  // kernels layer/deepseek/cuda launches for it (each pays a small kernel's fixed cost)
  // What an implementation does beyond the op's own work, which a time prediction pays and the roofline floor does
  // not: an unfused attention form multiplies the whole rectangle of new tokens x keys (masked, where causality needs
  // about half at a prefill), and stages its score matrix through memory between its kernels (GEMM, softmax, GEMM:
  // a chain of memory-bound passes that does not overlap the products).
  double extra_flops = 0, staged_bytes = 0;
  double bytes() const { return weight_bytes + kv_bytes + act_bytes; }
  double intensity() const { return bytes() > 0 ? flops / bytes() : 0; }
};

// The ops of decoder layer `layer` (dense MLP below first_k_dense_replace, else gate + shared + routed experts).
std::vector<OpCost> layer_ops(const ModelConfig& m, int64_t layer, const StepShape& s);
// The whole step: embedding, every layer, final norm, LM head (for the last token of each request in prefill).
std::vector<OpCost> step_ops(const ModelConfig& m, const StepShape& s);

// Each op of a GPU step against its own floor: the step's event-bracketed op times (op_us.<bracket>, summed over
// its layers) gathered into the cost model's ops, with those ops' work, as the counters op_time_us.<row>,
// op_floor_bytes.<row>, op_floor_flops.<row> and op_floor_kernels.<row> (the results add each row's floor at the
// machine's ceilings). Rows: qkv_a (q_proj or q_a_proj, kv_a_proj), q_b (q_b_proj), attention_core (its cache
// write, RoPE, absorbs, decode and split merge), o_proj, norms (the layers', the final one and the embedding),
// router (gate), experts (shared and routed, their combine), dense_mlp, lm_head. Layers [first, first + layers),
// plus the model's ends when `whole`; routed experts as `active_experts` (per MoE layer, in order; the uniform
// expectation where it is short). A row none of whose brackets ran is left out.
std::map<std::string, double> op_floor_counters(const ModelConfig& m, const StepShape& s, int64_t first, int64_t layers,
                                                bool whole, const std::vector<double>& active_experts,
                                                const std::map<std::string, double>& op_us);

// GPU memory layer/deepseek/cuda allocates for a step besides weights and KV caches: one scratch arena that every
// op's forward scratch comes from in turn (the largest op's: attention, MoE or dense MLP), every layer's owned
// attention and MoE buffers, the residual streams, the logits (whole model) or the layer inputs, and 256 MB of
// library workspaces. The layer sizes its memory by it and the planner counts it in a placement's capacity: one
// formula for both.
struct StepScratch {
  mla::Shape attn;  // heads, batch (the graph's bucket), q_len, kv_len
  mla::Algo algo = mla::Algo::a_cc_me;
  bool fused = true;     // the fused decode kernel (mla/fused/cuda) rather than an unfused form
  int64_t max_keys = 0;  // per request, at the run's last step
  int64_t layers = 0, moe_layers = 0, steps = 1;
  int64_t hot_experts = 0;  // moe/host/cuda's per MoE layer (gpu_experts=hot:N; their weights are not scratch)
  bool whole = false;       // embedding .. LM head: the logits are kept
};
double gpu_step_scratch_bytes(const ModelConfig& m, const StepScratch& s);
double gpu_step_arena_bytes(const ModelConfig& m, const StepScratch& s);  // the arena's part of it

// Where a step's routed experts live beside the GPU (layer/deepseek/cuda's `gpu_experts` axis): for an op that
// runs them on the CPU (moe/host/cuda), none, the first N MoE layers' kept whole on the GPU (the planner's
// gpu_layers:N), or as many leading MoE layers as the budget holds (fit); for an op that runs them on the GPU
// (moe/grouped/cuda), streamed: every layer's experts in pinned host memory, copied to the GPU before its use,
// two layers' in flight (the planner's streamed_experts); for the CPU op again, hot:N: each MoE layer's N most
// routed experts kept on the GPU and run there beside the CPU's share (the planner's hot_experts:N).
struct GpuExperts {
  enum class Kind { none, layers, fit, streamed, hot };
  Kind kind = Kind::none;
  int64_t layers = 0;  // Kind::layers
  int64_t hot = 0;     // Kind::hot
};
GpuExperts parse_gpu_experts(
    const std::string& text);  // none | layers:N | fit | streamed | hot:N; BadInput naming the axis otherwise
// The `gpu_budget` axis: all (0: the device's memory) or "<N>GB" (decimal gigabytes) as bytes; BadInput otherwise.
double parse_gpu_budget(const std::string& text);
// How many leading MoE layers can keep all their experts on the GPU: each costs full_set_bytes instead of the
// host_set_bytes (router and shared experts) every MoE layer needs; fixed_bytes is everything else on the GPU.
int64_t resident_moe_layers(double budget_bytes, double fixed_bytes, int64_t moe_layers, double host_set_bytes,
                            double full_set_bytes);

}  // namespace dslab::layer
