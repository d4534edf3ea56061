#include "variants/reference/model.h"

#include <string>

#include "harness/errors.h"

namespace dslab::ref {

MlpParams load_mlp(const Checkpoint& c, const std::string& prefix, int64_t hidden, int64_t intermediate) {
  MlpParams p;
  p.intermediate = intermediate;
  p.gate_proj = c.bf16_tensor(prefix + "gate_proj.weight", {intermediate, hidden});
  p.up_proj = c.bf16_tensor(prefix + "up_proj.weight", {intermediate, hidden});
  p.down_proj = c.bf16_tensor(prefix + "down_proj.weight", {hidden, intermediate});
  return p;
}

MlaParams load_mla_params(const Checkpoint& c, int64_t layer) {
  const ModelConfig& m = c.config();
  const int64_t H = m.hidden_size, r = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  const int64_t heads = m.num_attention_heads, qhd = m.q_head_dim();
  const std::string A = "model.layers." + std::to_string(layer) + ".self_attn.";
  MlaParams a;
  a.heads = heads;
  if (m.q_lora_rank) {
    a.q_a_proj = c.bf16_tensor(A + "q_a_proj.weight", {*m.q_lora_rank, H});
    a.q_a_layernorm = c.bf16_tensor(A + "q_a_layernorm.weight", {*m.q_lora_rank});
    a.q_b_proj = c.bf16_tensor(A + "q_b_proj.weight", {heads * qhd, *m.q_lora_rank});
  } else {
    a.q_proj = c.bf16_tensor(A + "q_proj.weight", {heads * qhd, H});
  }
  a.kv_a_proj_with_mqa = c.bf16_tensor(A + "kv_a_proj_with_mqa.weight", {r + rope, H});
  a.kv_a_layernorm = c.bf16_tensor(A + "kv_a_layernorm.weight", {r});
  a.kv_b_proj = c.bf16_tensor(A + "kv_b_proj.weight", {heads * (m.qk_nope_head_dim + m.v_head_dim), r});
  a.o_proj = c.bf16_tensor(A + "o_proj.weight", {H, heads * m.v_head_dim});
  return a;
}

int64_t first_moe_layer(const ModelConfig& m) {
  for (int64_t l = 0; l < m.num_hidden_layers; ++l)
    if (m.is_moe_layer(l)) return l;
  return -1;
}

std::vector<bf16> load_router(const Checkpoint& c, int64_t layer) {
  const ModelConfig& m = c.config();
  return c.bf16_tensor("model.layers." + std::to_string(layer) + ".mlp.gate.weight",
                       {m.n_routed_experts, m.hidden_size});
}

std::vector<float> load_router_bias(const Checkpoint& c, int64_t layer) {
  const ModelConfig& m = c.config();
  if (m.topk_method != "noaux_tc") return {};
  return c.f32_tensor("model.layers." + std::to_string(layer) + ".mlp.gate.e_score_correction_bias",
                      {m.n_routed_experts});
}

MlpParams load_expert(const Checkpoint& c, int64_t layer, int64_t expert) {
  const ModelConfig& m = c.config();
  return load_mlp(c, "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + ".",
                  m.hidden_size, m.moe_intermediate_size);
}

LayerParams load_layer_params(const Checkpoint& c, int64_t l, bool lazy_experts) {
  const ModelConfig& m = c.config();
  const int64_t H = m.hidden_size;
  const std::string L = "model.layers." + std::to_string(l) + ".";
  LayerParams lp;
  lp.input_layernorm = c.bf16_tensor(L + "input_layernorm.weight", {H});
  lp.post_attention_layernorm = c.bf16_tensor(L + "post_attention_layernorm.weight", {H});
  lp.attn = load_mla_params(c, l);
  const std::string M = L + "mlp.";
  if (!m.is_moe_layer(l)) {
    lp.dense = load_mlp(c, M, H, m.intermediate_size);
    return lp;
  }
  lp.moe.gate = load_router(c, l);
  lp.moe.e_score_correction_bias = load_router_bias(c, l);
  if (lazy_experts)
    lp.moe.make_expert = [&c, l](int e) { return load_expert(c, l, e); };
  else
    for (int64_t e = 0; e < m.n_routed_experts; ++e) lp.moe.experts.push_back(load_expert(c, l, e));
  if (m.n_shared_experts > 0)
    lp.moe.shared = load_mlp(c, M + "shared_experts.", H, m.moe_intermediate_size * m.n_shared_experts);
  return lp;
}

ModelParams load_model_params(const Checkpoint& c) {
  const ModelConfig& m = c.config();
  const int64_t H = m.hidden_size, V = m.vocab_size;
  if (V <= 0) throw BadInput(c.dir() + "/config.json: field 'vocab_size': missing: expected the vocabulary's size");
  ModelParams p;
  p.embed_tokens = c.bf16_tensor("model.embed_tokens.weight", {V, H});
  p.norm = c.bf16_tensor("model.norm.weight", {H});
  p.lm_head = c.bf16_tensor("lm_head.weight", {V, H});
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) p.layers.push_back(load_layer_params(c, l));
  return p;
}

Request::Request(const ModelConfig& m, const ModelParams& p, Arithmetic arithmetic)
    : m_(m), p_(p), arithmetic_(arithmetic), ckv_(size_t(m.num_hidden_layers)), kpe_(size_t(m.num_hidden_layers)) {}

std::vector<double> Request::forward(const std::vector<int32_t>& tokens) {
  const int64_t H = m_.hidden_size, T = int64_t(tokens.size()), r = m_.kv_lora_rank, rope = m_.qk_rope_head_dim;
  std::vector<double> x(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[size_t(t)] < 0 || tokens[size_t(t)] >= m_.vocab_size)
      throw BadInput("token id " + std::to_string(tokens[size_t(t)]) + ": expected 0 .. " +
                     std::to_string(m_.vocab_size - 1));
    for (int64_t j = 0; j < H; ++j) x[size_t(t * H + j)] = to_float(p_.embed_tokens[size_t(tokens[size_t(t)] * H + j)]);
  }
  for (int64_t l = 0; l < m_.num_hidden_layers; ++l) {
    const LayerParams& lp = p_.layers[size_t(l)];
    MlaInputs in;
    in.batch = 1, in.q_len = T, in.kv_len = length_;
    const bool exact = arithmetic_ == Arithmetic::exact;
    in.bf16_stream = !exact;
    // The cache so far (the values a bf16 engine holds, or exact ones) and, after the layer, the new tokens' entries
    // as the attention makes them, from the normalised stream (rounded to bf16 but where exact).
    auto rounded = [&](const std::vector<double>& v) {
      std::vector<bf16> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(float(v[i]));
      return out;
    };
    if (exact) {
      in.ckv_exact = ckv_[size_t(l)], in.kpe_exact = kpe_[size_t(l)];
    } else {
      in.ckv_cache = rounded(ckv_[size_t(l)]), in.kpe_cache = rounded(kpe_[size_t(l)]);
    }
    std::vector<double> normed(static_cast<size_t>(H)), kv(static_cast<size_t>(r + rope)), c(static_cast<size_t>(r));
    for (int64_t t = 0; t < T; ++t) {
      rms_norm(&x[size_t(t * H)], lp.input_layernorm.data(), H, m_.rms_norm_eps, normed.data());
      if (!exact)
        for (auto& v : normed) v = double(round_to_bf16(float(v)));
      matvec(lp.attn.kv_a_proj_with_mqa.data(), r + rope, H, normed.data(), kv.data());
      rms_norm(kv.data(), lp.attn.kv_a_layernorm.data(), r, m_.rms_norm_eps, c.data());
      apply_rope(m_, length_ + t, kv.data() + r);
      ckv_[size_t(l)].insert(ckv_[size_t(l)].end(), c.begin(), c.end());
      kpe_[size_t(l)].insert(kpe_[size_t(l)].end(), kv.begin() + r, kv.end());
    }
    x = decoder_layer(m_, l, lp, x, in, MlaForm::absorbed_split);
  }
  length_ += T;
  std::vector<double> last(static_cast<size_t>(H)), logits(static_cast<size_t>(m_.vocab_size));
  rms_norm(&x[size_t((T - 1) * H)], p_.norm.data(), H, m_.rms_norm_eps, last.data());
  matvec(p_.lm_head.data(), m_.vocab_size, H, last.data(), logits.data());
  return logits;
}

}  // namespace dslab::ref
