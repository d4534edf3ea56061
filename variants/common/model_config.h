// A DeepSeek model's shape and routing, read from a Hugging Face config.json (field names kept as HF spells them).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace dslab {

struct RopeScaling {
  bool yarn = false;  // false: plain RoPE, the remaining fields unused
  double factor = 1, original_max_position_embeddings = 4096, beta_fast = 32, beta_slow = 1;
  double mscale = 1, mscale_all_dim = 0;
};

struct ModelConfig {
  std::string name;    // file stem, e.g. "deepseek-v2"
  std::string source;  // path it was read from, for error messages
  int64_t hidden_size = 0, intermediate_size = 0, moe_intermediate_size = 0;
  int64_t num_attention_heads = 0, num_hidden_layers = 0;
  std::optional<int64_t> q_lora_rank;  // null in V2-Lite: q comes from a plain q_proj
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t n_routed_experts = 0, n_shared_experts = 0, num_experts_per_tok = 0;
  int64_t n_group = 1, topk_group = 1, first_k_dense_replace = 0, moe_layer_freq = 1;
  std::string topk_method = "greedy", scoring_func = "softmax";
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0, rms_norm_eps = 1e-6, rope_theta = 10000;
  int64_t max_position_embeddings = 0;
  int64_t vocab_size = 0;  // 0: absent (a whole-model step needs it for the embedding and LM head)
  RopeScaling rope_scaling;

  int64_t q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Whether layer `layer` has routed experts, as Hugging Face's DeepSeek modelling decides: from first_k_dense_replace
  // on, every moe_layer_freq-th layer; the others a dense MLP.
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace &&
           layer % (moe_layer_freq > 0 ? moe_layer_freq : 1) == 0;
  }
  // 1/sqrt(q_head_dim), times YaRN's mscale(mscale_all_dim)^2 as DeepSeek applies it.
  double softmax_scale() const;
};

// Validates every field DeepSeek layers use; HF bookkeeping fields are accepted and ignored, anything else
// (a misspelt field) is BadInput naming `source`.
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& name, const std::string& source);

// YaRN's attention-temperature correction, as in DeepSeek's modeling code.
double yarn_get_mscale(double scale, double mscale);

}  // namespace dslab
