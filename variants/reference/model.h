// A whole DeepSeek model in the reference's arithmetic: the embedding, every decoder layer, the final norm and the LM
// head, with weights read from a Hugging Face checkpoint; a request at a time (a prompt chunk, then one token a step,
// its cache growing). fp64 over the bf16 weights; the normalised stream and the latent cache rounded to bf16 as a
// bf16 engine holds them, or (exact) not at all, as an fp32 model such as transformers on the CPU computes.
#pragma once
#include <cstdint>
#include <vector>

#include "variants/common/checkpoint.h"
#include "variants/reference/reference.h"

namespace dslab::ref {

struct ModelParams {
  std::vector<bf16> embed_tokens;  // [vocab][hidden]
  std::vector<LayerParams> layers;
  std::vector<bf16> norm;     // [hidden]
  std::vector<bf16> lm_head;  // [vocab][hidden]
};

// Every tensor the config's model needs, by its Hugging Face name (model.layers.L.self_attn.kv_b_proj.weight, ...,
// routed experts mlp.experts.E.*, shared mlp.shared_experts.*); fp8 weights dequantised by their block scales.
// BadInput (file and tensor named) for anything missing or mis-shaped, before any layer is used.
ModelParams load_model_params(const Checkpoint& checkpoint);
// One decoder layer's; lazy_experts: the routed experts read when the reference reaches them (MoeParams::make_expert,
// which then refers to `checkpoint`).
LayerParams load_layer_params(const Checkpoint& checkpoint, int64_t layer, bool lazy_experts = false);
// A SwiGLU MLP's three projections under `prefix` ("model.layers.1.mlp.shared_experts."), [intermediate][hidden].
MlpParams load_mlp(const Checkpoint& checkpoint, const std::string& prefix, int64_t hidden, int64_t intermediate);
// One layer's attention weights (all num_attention_heads heads).
MlaParams load_mla_params(const Checkpoint& checkpoint, int64_t layer);
// The first layer with routed experts (first_k_dense_replace, moe_layer_freq), its router and one routed expert.
int64_t first_moe_layer(const ModelConfig& m);
std::vector<bf16> load_router(const Checkpoint& checkpoint, int64_t layer);
std::vector<float> load_router_bias(const Checkpoint& checkpoint, int64_t layer);  // empty unless noaux_tc
MlpParams load_expert(const Checkpoint& checkpoint, int64_t layer, int64_t expert);

class Request {
 public:
  enum class Arithmetic { bf16_stream, exact };
  Request(const ModelConfig& m, const ModelParams& p, Arithmetic arithmetic = Arithmetic::bf16_stream);
  // Appends `tokens` (a prompt chunk or one decode token) and returns the logits of the last one [vocab].
  std::vector<double> forward(const std::vector<int32_t>& tokens);
  int64_t length() const { return length_; }

 private:
  const ModelConfig& m_;
  const ModelParams& p_;
  Arithmetic arithmetic_;
  int64_t length_ = 0;
  std::vector<std::vector<double>> ckv_, kpe_;  // per layer: [length][kv_lora_rank], [length][qk_rope_head_dim]
};

}  // namespace dslab::ref
