#include "variants/layer/ops.h"

#include <algorithm>
#include <cmath>

#include "harness/errors.h"
#include "variants/moe/moe.h"

namespace dslab::layer {

const char* group_name(OpGroup g) {
  switch (g) {
    case OpGroup::attention:
      return "attention";
    case OpGroup::gate:
      return "gate";
    case OpGroup::shared_experts:
      return "shared_experts";
    case OpGroup::routed_experts:
      return "routed_experts";
    case OpGroup::dense_mlp:
      return "dense_mlp";
    case OpGroup::norms:
      return "norms";
    case OpGroup::embedding:
      return "embedding";
    case OpGroup::lm_head:
      return "lm_head";
  }
  return "?";
}

namespace {

// A bf16 projection of T rows, in -> out features: weights read once, bf16 rows in, out_bytes per output value.
OpCost projection(const char* name, OpGroup g, int64_t layer, double T, double in, double out, double out_bytes = 2) {
  OpCost c;
  c.name = name;
  c.group = g;
  c.layer = layer;
  c.flops = 2 * T * in * out;
  c.weight_bytes = 2 * in * out;
  c.act_bytes = T * in * 2 + T * out * out_bytes;
  return c;
}

// RMSNorm of T rows of H on the fp32 residual stream: residual (+ the op's output) read, residual written, bf16 out.
OpCost norm(const char* name, int64_t layer, double T, double H, bool adds) {
  OpCost c;
  c.name = name;
  c.group = OpGroup::norms;
  c.layer = layer;
  c.flops = 4 * T * H;
  c.weight_bytes = 2 * H;
  c.act_bytes = T * H * ((adds ? 4 + 4 : 4) + 4 + 2);
  return c;
}

// gate (SiLU) and up fused, then down: 6 H I FLOPs per token, three H x I matrices.
OpCost mlp(const char* name, OpGroup g, int64_t layer, double T, double H, double I) {
  OpCost c;
  c.name = name;
  c.group = g;
  c.layer = layer;
  c.flops = 6 * T * H * I;
  c.gpu_kernels = 3;  // gate+up GEMM, SiLU x up, down GEMM
  c.weight_bytes = 3 * H * I * 2;
  c.act_bytes = T * H * 2 + T * H * 4;  // bf16 in, fp32 out
  return c;
}

}  // namespace

std::vector<OpCost> layer_ops(const ModelConfig& m, int64_t layer, const StepShape& s) {
  const double T = double(s.tokens()), H = double(m.hidden_size), nh = double(m.num_attention_heads);
  const double r = double(m.kv_lora_rank), rope = double(m.qk_rope_head_dim), qhd = double(m.q_head_dim());
  const double nope = double(m.qk_nope_head_dim), vd = double(m.v_head_dim);
  std::vector<OpCost> ops;
  ops.push_back(norm("input_norm", layer, T, H, /*adds=*/layer > 0));
  if (m.q_lora_rank) {
    const double ql = double(*m.q_lora_rank);
    ops.push_back(projection("q_a_proj", OpGroup::attention, layer, T, H, ql, 4));
    ops.push_back(projection("q_b_proj", OpGroup::attention, layer, T, ql, nh * qhd));
  } else {
    ops.push_back(projection("q_proj", OpGroup::attention, layer, T, H, nh * qhd));
  }
  ops.push_back(projection("kv_a_proj", OpGroup::attention, layer, T, H, r + rope, 4));
  ops.back().gpu_kernels = 0;  // (its weights stacked under q_a_proj's or q_proj's: one launch for both)

  // The core: scores and the weighted sum over the cache (and this step's new keys, causal among them), with
  // kv_b_proj as the form uses it: absorbed into q and the output per new token (a_cc, a_cc_me), decompressing
  // the new tokens into the K/V cache (cd), or the whole cache every step (cc).
  OpCost core;
  core.name = "attention_core";
  core.group = OpGroup::attention;
  core.layer = layer;
  const int64_t H_heads = m.num_attention_heads;
  const double keys = double(s.kv_len + s.q_len), S = double(s.q_len), B = double(s.batch);
  const double pairs = B * (S * double(s.kv_len) + S * (S + 1) / 2);
  core.flops = pairs * mla::pair_flops(m, s.attn, H_heads);
  switch (s.attn) {
    case mla::Algo::cd:
      core.flops += T * mla::decompress_flops(m, H_heads);
      break;
    case mla::Algo::cc:
      core.flops += B * keys * mla::decompress_flops(m, H_heads);
      break;
    default:
      core.flops += T * 2 * nh * r * (nope + vd);
      break;
  }
  core.weight_bytes = 2 * r * nh * (nope + vd);  // kv_b_proj
  // norm + cache write, RoPE (inside the norm's kernel without q_lora_rank), W_UK into q, attention, split merge,
  // W_UV out (fused form). With the absorbs fused: W_UV in the merge wherever its CTAs (a head and a group of tokens,
  // as many groups as fill one wave of the H100's or H200's 132 SMs) get at most 32 tokens; W_UK in the norm's
  // launch where the q / kv_a projection is the own GEMV (1-2 tokens) and q needs no second projection.
  core.gpu_kernels = m.q_lora_rank ? 6 : 5;
  if (s.absorbs_fused && s.scores_on_chip()) {
    const double groups = std::max(1.0, std::floor(132.0 / nh));
    if (T <= 32 * groups) core.gpu_kernels -= 1;
    if (!m.q_lora_rank && T <= 2) core.gpu_kernels -= 1;
  }
  const double per_token = mla::cache_bytes_per_token(m, s.attn, H_heads, s.kv_dtype);
  core.kv_bytes = B * keys * per_token + T * per_token;  // read every cached key, write the new ones
  core.act_bytes = T * nh * qhd * 2 + T * (r + rope) * 4 + T * nh * vd * 2;  // q and the latent in, per-head output out
  if (!s.scores_on_chip()) {
    // The unfused forms (variants/mla/cuda/forms.cu): every new token against every key of its request, masked;
    // scores fp32 written by the first product (a_cc_me: a second one reads and adds to them), read by the softmax,
    // which writes bf16 probabilities the value product reads; the cache gathered into a padded copy first.
    const double rectangle = B * S * keys;
    core.extra_flops = std::max(0.0, rectangle - pairs) * mla::pair_flops(m, s.attn, H_heads);
    const double per_score = s.attn == mla::Algo::a_cc_me ? 4 + 8 + 4 + 2 + 2 : 4 + 4 + 2 + 2;
    core.staged_bytes = rectangle * double(H_heads) * per_score + B * keys * (r + rope) * 2 * 2;
    core.gpu_kernels = 8;
  }
  ops.push_back(core);

  ops.push_back(projection("o_proj", OpGroup::attention, layer, T, nh * vd, H, 4));
  ops.push_back(norm("post_attention_norm", layer, T, H, /*adds=*/true));
  if (!m.is_moe_layer(layer)) {
    ops.push_back(mlp("dense_mlp", OpGroup::dense_mlp, layer, T, H, double(m.intermediate_size)));
    return ops;
  }
  const double E = double(m.n_routed_experts), K = double(m.num_experts_per_tok), I = double(m.moe_intermediate_size);
  ops.push_back(projection("gate", OpGroup::gate, layer, T, H, E, 4));
  // decode: logits, routing and permutation in one kernel; beyond: the logits' GEMM, then routing (+ permutation)
  ops.back().gpu_kernels = T <= double(moe::kGateKernelTokens) ? 1 : 2;
  if (m.n_shared_experts > 0)
    ops.push_back(mlp("shared_experts", OpGroup::shared_experts, layer, T, H, I * double(m.n_shared_experts)));
  OpCost routed;
  routed.name = "routed_experts";
  routed.group = OpGroup::routed_experts;
  routed.layer = layer;
  routed.active_experts = moe::expected_active_experts(m.n_routed_experts, m.num_experts_per_tok, s.tokens());
  routed.tokens_per_expert = T * K / routed.active_experts;
  routed.flops = 6 * T * K * H * I;
  routed.weight_bytes = routed.active_experts * 3 * H * I * 2;
  routed.act_bytes =
      T * K * (H * 2 + H * 2);  // each (token, expert) row in and out, bf16 (moe/grouped*: MoeOp::bf16_rows)
  routed.gpu_kernels = 3;       // grouped gate+up, grouped down, weighted combine
  ops.push_back(routed);
  return ops;
}

std::vector<OpCost> step_ops(const ModelConfig& m, const StepShape& s) {
  const double T = double(s.tokens()), H = double(m.hidden_size), V = double(m.vocab_size);
  std::vector<OpCost> ops;
  OpCost embed;
  embed.name = "embedding";
  embed.group = OpGroup::embedding;
  embed.act_bytes = T * H * 2 + T * H * 4;  // the tokens' rows read, the residual stream written
  embed.gpu_kernels = 0;                    // (inside the first norm's kernel)
  ops.push_back(embed);
  for (int64_t layer = 0; layer < m.num_hidden_layers; ++layer) {
    auto l = layer_ops(m, layer, s);
    ops.insert(ops.end(), l.begin(), l.end());
  }
  ops.push_back(norm("final_norm", -1, T, H, /*adds=*/true));
  // Logits for each request's last new token (prefill needs only those; decode has one token per request).
  OpCost head = projection("lm_head", OpGroup::lm_head, -1, double(s.batch), H, V, 4);
  ops.push_back(head);
  return ops;
}

namespace {

// The digits of text from `from` on as a positive integer, or -1 (no sign, no trailing characters).
int64_t positive_integer(const std::string& text, size_t from) {
  if (from >= text.size() || text.size() - from > 12) return -1;
  int64_t n = 0;
  for (size_t i = from; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return -1;
    n = n * 10 + (text[i] - '0');
  }
  return n > 0 ? n : -1;
}

}  // namespace

double gpu_step_arena_bytes(const ModelConfig& m, const StepScratch& s) {
  const int64_t T = s.attn.tokens();
  double largest = mla::gpu_forward_scratch_bytes(m, s.algo, s.attn, s.max_keys, s.fused);
  if (s.moe_layers > 0) largest = std::max(largest, moe::gpu_moe_forward_scratch_bytes(m, T));
  if (s.layers > s.moe_layers) largest = std::max(largest, moe::gpu_mlp_scratch_bytes(T, m.intermediate_size));
  return largest + double(size_t(1) << 20);  // (each buffer starts on a 256-byte boundary: a few KB; 1 MB spare)
}

double gpu_step_scratch_bytes(const ModelConfig& m, const StepScratch& s) {
  const double T = double(s.attn.tokens()), H = double(m.hidden_size);
  return gpu_step_arena_bytes(m, s) +
         double(s.layers) * mla::gpu_owned_scratch_bytes(m, s.algo, s.attn, s.max_keys, s.fused) +
         double(s.moe_layers) * moe::gpu_moe_owned_bytes(m, s.attn.tokens(), m.n_routed_experts, s.hot_experts) +
         T * H * 16 + (s.whole ? T * double(m.vocab_size) * 4 : double(s.steps) * T * H * 2) +
         double(size_t(256) << 20);
}

GpuExperts parse_gpu_experts(const std::string& text) {
  GpuExperts g;
  if (text == "none") return g;
  if (text == "fit") {
    g.kind = GpuExperts::Kind::fit;
    return g;
  }
  if (text == "streamed") {
    g.kind = GpuExperts::Kind::streamed;
    return g;
  }
  if (text.rfind("layers:", 0) == 0) {
    g.kind = GpuExperts::Kind::layers;
    g.layers = positive_integer(text, 7);
    if (g.layers > 0) return g;
  }
  if (text.rfind("hot:", 0) == 0) {
    g.kind = GpuExperts::Kind::hot;
    g.hot = positive_integer(text, 4);
    if (g.hot > 0) return g;
  }
  throw BadInput("axis 'gpu_experts': value '" + text +
                 "': expected none, layers:N (N >= 1), fit, streamed or hot:N (N >= 1)");
}

double parse_gpu_budget(const std::string& text) {
  if (text == "all") return 0;
  if (text.size() > 2 && text.compare(text.size() - 2, 2, "GB") == 0) {
    const int64_t n = positive_integer(text.substr(0, text.size() - 2), 0);
    if (n > 0) return double(n) * 1e9;
  }
  throw BadInput("axis 'gpu_budget': value '" + text +
                 "': expected all or <N>GB with N a positive integer (e.g. 24GB)");
}

int64_t resident_moe_layers(double budget_bytes, double fixed_bytes, int64_t moe_layers, double host_set_bytes,
                            double full_set_bytes) {
  const double room = budget_bytes - fixed_bytes - double(moe_layers) * host_set_bytes;
  const double extra = full_set_bytes - host_set_bytes;
  if (room <= 0 || extra <= 0) return 0;
  return std::clamp<int64_t>(int64_t(std::floor(room / extra)), 0, moe_layers);
}

std::map<std::string, double> op_floor_counters(const ModelConfig& m, const StepShape& s, int64_t first, int64_t layers,
                                                bool whole, const std::vector<double>& active_experts,
                                                const std::map<std::string, double>& op_us) {
  // row: the cost model's ops, the step's brackets (op_us.<bracket>)
  struct Row {
    const char* name;
    std::vector<std::string> ops, brackets;
  };
  const std::vector<Row> rows = {
      {"qkv_a", {"q_proj", "q_a_proj", "kv_a_proj"}, {"qkv_a"}},
      {"q_b", {"q_b_proj"}, {"q_b"}},
      {"attention_core",
       {"attention_core"},
       {"norm_cache_write", "rope_q", "absorb_q", "decode", "combine", "absorb_o", "attend"}},
      {"o_proj", {"o_proj"}, {"o_proj"}},
      {"norms", {"input_norm", "post_attention_norm", "final_norm", "embedding"}, {"norm", "embed_norm"}},
      {"router", {"gate"}, {"route", "gate"}},
      {"experts",
       {"shared_experts", "routed_experts", "norm_in_moe_combine"},
       {"gate_up", "experts", "shared_experts", "shared_experts_join", "moe_combine"}},
      {"dense_mlp", {"dense_mlp"}, {"dense_mlp"}},
      {"lm_head", {"lm_head"}, {"lm_head"}},
  };
  std::vector<OpCost> ops;
  const std::vector<OpCost> ends = whole ? step_ops(m, s) : std::vector<OpCost>{};
  if (whole) ops.push_back(ends.front());  // the embedding
  size_t moe_ordinal = 0;
  // A norm right after a MoE layer's experts: in its combine kernel (s.norms_in_moe_combine), so timed there.
  const auto after_experts = [&](OpCost c) {
    if (s.norms_in_moe_combine && !ops.empty() && ops.back().name == "routed_experts" &&
        (c.name == "input_norm" || c.name == "final_norm"))
      c.name = "norm_in_moe_combine", c.gpu_kernels = 0;
    ops.push_back(c);
  };
  for (int64_t layer = first; layer < first + layers; ++layer)
    for (OpCost c : layer_ops(m, layer, s)) {
      if (c.name == "routed_experts" && moe_ordinal < active_experts.size() && c.active_experts > 0)
        c.weight_bytes *= active_experts[moe_ordinal] / c.active_experts;  // as this step's routing reached them
      moe_ordinal += c.name == "routed_experts";
      after_experts(c);
    }
  if (whole)
    for (auto it = ends.end() - 2; it != ends.end(); ++it) after_experts(*it);  // the final norm, the LM head
  std::map<std::string, double> c;
  for (const Row& row : rows) {
    double time_us = 0, bytes = 0, flops = 0, kernels = 0;
    bool ran = false;
    for (const auto& b : row.brackets)
      if (const auto it = op_us.find("op_us." + b); it != op_us.end()) time_us += it->second, ran = true;
    for (const OpCost& op : ops)
      if (std::find(row.ops.begin(), row.ops.end(), op.name) != row.ops.end())
        bytes += op.bytes(), flops += op.flops, kernels += op.gpu_kernels;
    if (!ran) continue;
    const std::string r = row.name;
    c["op_time_us." + r] = time_us;
    c["op_floor_bytes." + r] = bytes;
    c["op_floor_flops." + r] = flops;
    c["op_floor_kernels." + r] = kernels;
  }
  return c;
}

}  // namespace dslab::layer
