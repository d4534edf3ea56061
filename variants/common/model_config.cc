#include "variants/common/model_config.h"

#include <cmath>
#include <set>

#include "harness/errors.h"

namespace dslab {
namespace {

// Hugging Face bookkeeping that no DeepSeek layer computation depends on.
const std::set<std::string> kIgnoredFields = {"_name_or_path",
                                              "architectures",
                                              "attention_bias",
                                              "attention_dropout",
                                              "auto_map",
                                              "aux_loss_alpha",
                                              "bos_token_id",
                                              "eos_token_id",
                                              "ep_size",
                                              "hidden_act",
                                              "initializer_range",
                                              "model_type",
                                              "num_key_value_heads",
                                              "num_nextn_predict_layers",
                                              "pretraining_tp",
                                              "quantization_config",
                                              "seq_aux",
                                              "tie_word_embeddings",
                                              "torch_dtype",
                                              "transformers_version",
                                              "use_cache"};

class Reader {
 public:
  Reader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}

  int64_t positive_int(const char* field) const {
    const auto& v = require(field);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) throw bad_field(where_, field, v.dump(), "a positive integer");
    return v.get<int64_t>();
  }
  int64_t nonneg_int(const char* field, int64_t fallback) const {
    if (!j_.contains(field)) return fallback;
    const auto& v = j_.at(field);
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw bad_field(where_, field, v.dump(), "a non-negative integer");
    return v.get<int64_t>();
  }
  double positive_number(const char* field, double fallback) const {
    if (!j_.contains(field)) return fallback;
    const auto& v = j_.at(field);
    if (!v.is_number() || !(v.get<double>() > 0)) throw bad_field(where_, field, v.dump(), "a positive number");
    return v.get<double>();
  }
  std::string one_of(const char* field, const std::string& fallback, const std::set<std::string>& allowed) const {
    if (!j_.contains(field)) return fallback;
    const auto& v = j_.at(field);
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : " | ") + a;
    if (!v.is_string() || !allowed.count(v.get<std::string>()))
      throw bad_field(where_, field, v.dump(), "one of " + list);
    return v.get<std::string>();
  }
  bool boolean(const char* field, bool fallback) const {
    if (!j_.contains(field)) return fallback;
    const auto& v = j_.at(field);
    if (!v.is_boolean()) throw bad_field(where_, field, v.dump(), "true or false");
    return v.get<bool>();
  }
  const nlohmann::json& require(const char* field) const {
    if (!j_.contains(field)) throw bad_field(where_, field, "(missing)", "present");
    return j_.at(field);
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

}  // namespace

double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(double(q_head_dim()));
  if (rope_scaling.yarn && rope_scaling.mscale_all_dim != 0) {
    double m = yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

ModelConfig parse_model_config(const nlohmann::json& j, const std::string& name, const std::string& source) {
  if (!j.is_object()) throw BadInput(source + ": expected a JSON object (a Hugging Face config.json)");
  const std::set<std::string> used = {"hidden_size",
                                      "intermediate_size",
                                      "moe_intermediate_size",
                                      "num_attention_heads",
                                      "num_hidden_layers",
                                      "q_lora_rank",
                                      "kv_lora_rank",
                                      "qk_nope_head_dim",
                                      "qk_rope_head_dim",
                                      "v_head_dim",
                                      "n_routed_experts",
                                      "n_shared_experts",
                                      "num_experts_per_tok",
                                      "n_group",
                                      "topk_group",
                                      "first_k_dense_replace",
                                      "moe_layer_freq",
                                      "topk_method",
                                      "scoring_func",
                                      "norm_topk_prob",
                                      "routed_scaling_factor",
                                      "rms_norm_eps",
                                      "rope_theta",
                                      "max_position_embeddings",
                                      "rope_scaling",
                                      "vocab_size"};
  for (const auto& item : j.items()) {
    if (!used.count(item.key()) && !kIgnoredFields.count(item.key()))
      throw BadInput(source + ": field '" + item.key() +
                     "': unknown model field (expected DeepSeek config.json fields)");
  }
  Reader r(j, source);
  ModelConfig m;
  m.name = name;
  m.source = source;
  m.hidden_size = r.positive_int("hidden_size");
  m.intermediate_size = r.positive_int("intermediate_size");
  m.moe_intermediate_size = r.positive_int("moe_intermediate_size");
  m.num_attention_heads = r.positive_int("num_attention_heads");
  m.num_hidden_layers = r.positive_int("num_hidden_layers");
  const auto& q_lora = r.require("q_lora_rank");
  if (!q_lora.is_null()) m.q_lora_rank = r.positive_int("q_lora_rank");
  m.kv_lora_rank = r.positive_int("kv_lora_rank");
  m.qk_nope_head_dim = r.positive_int("qk_nope_head_dim");
  m.qk_rope_head_dim = r.positive_int("qk_rope_head_dim");
  if (m.qk_rope_head_dim % 2)
    throw bad_field(source, "qk_rope_head_dim", std::to_string(m.qk_rope_head_dim),
                    "an even number (RoPE rotates pairs)");
  m.v_head_dim = r.positive_int("v_head_dim");
  m.n_routed_experts = r.positive_int("n_routed_experts");
  m.n_shared_experts = r.nonneg_int("n_shared_experts", 0);
  m.num_experts_per_tok = r.positive_int("num_experts_per_tok");
  if (m.num_experts_per_tok > m.n_routed_experts)
    throw bad_field(source, "num_experts_per_tok", std::to_string(m.num_experts_per_tok),
                    "at most n_routed_experts (" + std::to_string(m.n_routed_experts) + ")");
  m.n_group = r.nonneg_int("n_group", 1);
  m.topk_group = r.nonneg_int("topk_group", 1);
  m.first_k_dense_replace = r.nonneg_int("first_k_dense_replace", 0);
  m.moe_layer_freq = r.nonneg_int("moe_layer_freq", 1);
  m.topk_method = r.one_of("topk_method", "greedy", {"greedy", "group_limited_greedy", "noaux_tc"});
  m.scoring_func = r.one_of("scoring_func", "softmax", {"softmax", "sigmoid"});
  m.norm_topk_prob = r.boolean("norm_topk_prob", false);
  m.routed_scaling_factor = r.positive_number("routed_scaling_factor", 1.0);
  m.rms_norm_eps = r.positive_number("rms_norm_eps", 1e-6);
  m.rope_theta = r.positive_number("rope_theta", 10000);
  m.max_position_embeddings = r.nonneg_int("max_position_embeddings", 0);
  m.vocab_size = r.nonneg_int("vocab_size", 0);
  if (m.topk_method != "greedy") {
    if (m.n_group < 1 || m.n_routed_experts % m.n_group)
      throw bad_field(source, "n_group", std::to_string(m.n_group),
                      "a positive divisor of n_routed_experts (" + std::to_string(m.n_routed_experts) + ")");
    if (m.topk_group < 1 || m.topk_group > m.n_group)
      throw bad_field(source, "topk_group", std::to_string(m.topk_group),
                      "between 1 and n_group (" + std::to_string(m.n_group) + ")");
    if (m.topk_group * (m.n_routed_experts / m.n_group) < m.num_experts_per_tok)
      throw bad_field(source, "topk_group", std::to_string(m.topk_group),
                      "enough groups to hold num_experts_per_tok experts");
  }
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
    const auto& rs = j.at("rope_scaling");
    const std::string where = source + " rope_scaling";
    if (!rs.is_object()) throw bad_field(source, "rope_scaling", rs.dump(), "an object or null");
    Reader rr(rs, where);
    std::string type = rs.contains("type") ? "type" : "rope_type";
    rr.one_of(type.c_str(), "", {"yarn"});
    for (const auto& item : rs.items()) {
      static const std::set<std::string> ok = {"type",      "rope_type", "factor", "original_max_position_embeddings",
                                               "beta_fast", "beta_slow", "mscale", "mscale_all_dim"};
      if (!ok.count(item.key()))
        throw BadInput(where + ": field '" + item.key() + "': unknown rope_scaling field (expected YaRN fields)");
    }
    m.rope_scaling.yarn = true;
    m.rope_scaling.factor = rr.positive_number("factor", 1);
    m.rope_scaling.original_max_position_embeddings = rr.positive_number("original_max_position_embeddings", 4096);
    m.rope_scaling.beta_fast = rr.positive_number("beta_fast", 32);
    m.rope_scaling.beta_slow = rr.positive_number("beta_slow", 1);
    m.rope_scaling.mscale = rr.positive_number("mscale", 1);
    m.rope_scaling.mscale_all_dim = rs.contains("mscale_all_dim") ? rr.positive_number("mscale_all_dim", 0) : 0;
  }
  return m;
}

}  // namespace dslab
