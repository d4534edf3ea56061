#include "planner/sharded_layer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "harness/errors.h"
#include "variants/common/bf16.h"

namespace dslab::planner {

namespace {

constexpr double kBf16 = 2;

// Rows [first, first + count) of a row-major [rows][cols] matrix.
std::vector<bf16> rows_of(const std::vector<bf16>& w, int64_t cols, int64_t first, int64_t count) {
  return {w.begin() + first * cols, w.begin() + (first + count) * cols};
}

// Columns [first, first + count) of a row-major [rows][cols] matrix.
std::vector<bf16> columns_of(const std::vector<bf16>& w, int64_t rows, int64_t cols, int64_t first, int64_t count) {
  std::vector<bf16> out(size_t(rows * count));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(w.begin() + r * cols + first, count, out.begin() + r * count);
  return out;
}

// Requests [first, first + count) of a step's inputs: their new tokens' rows and their caches.
ref::MlaInputs requests_of(const ModelConfig& m, const ref::MlaInputs& in, int64_t first, int64_t count) {
  ref::MlaInputs sub = in;
  sub.batch = count;
  const int64_t H = m.hidden_size, r = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  auto slice = [&](const auto& v, int64_t per_request) {
    using V = std::decay_t<decltype(v)>;
    return v.empty() ? V{} : V(v.begin() + first * per_request, v.begin() + (first + count) * per_request);
  };
  sub.hidden_states = slice(in.hidden_states, in.q_len * H);
  sub.hidden_exact = slice(in.hidden_exact, in.q_len * H);
  sub.ckv_cache = slice(in.ckv_cache, in.kv_len * r);
  sub.kpe_cache = slice(in.kpe_cache, in.kv_len * rope);
  sub.ckv_exact = slice(in.ckv_exact, in.kv_len * r);
  sub.kpe_exact = slice(in.kpe_exact, in.kv_len * rope);
  return sub;
}

void add(std::vector<double>& sum, const std::vector<double>& part, size_t offset = 0) {
  for (size_t i = 0; i < part.size(); ++i) sum[offset + i] += part[i];
}

void rms_norm_rows(const ModelConfig& m, const std::vector<double>& x, const std::vector<bf16>& weight,
                   std::vector<double>& out) {
  const int64_t H = m.hidden_size;
  out.resize(x.size());
  for (size_t t = 0; t < x.size() / size_t(H); ++t)
    ref::rms_norm(&x[t * size_t(H)], weight.data(), H, m.rms_norm_eps, &out[t * size_t(H)]);
}

}  // namespace

ref::MlaParams shard_heads(const ModelConfig& m, const ref::MlaParams& p, int64_t rank, int64_t ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks || p.heads % ranks)
    throw BadInput("tensor-parallel attention: " + std::to_string(p.heads) + " heads over " + std::to_string(ranks) +
                   " GPUs (expected a divisor of the heads)");
  const int64_t heads = p.heads / ranks, first = rank * heads, qhd = m.q_head_dim(), H = m.hidden_size;
  const int64_t kv_rows = m.qk_nope_head_dim + m.v_head_dim;
  ref::MlaParams s = p;  // the latent projections and their norms: every rank's whole
  s.heads = heads;
  if (!p.q_b_proj.empty()) s.q_b_proj = rows_of(p.q_b_proj, *m.q_lora_rank, first * qhd, heads * qhd);
  if (!p.q_proj.empty()) s.q_proj = rows_of(p.q_proj, H, first * qhd, heads * qhd);
  s.kv_b_proj = rows_of(p.kv_b_proj, m.kv_lora_rank, first * kv_rows, heads * kv_rows);
  s.o_proj = columns_of(p.o_proj, H, p.heads * m.v_head_dim, first * m.v_head_dim, heads * m.v_head_dim);
  return s;
}

ref::MlpParams shard_intermediate(const ref::MlpParams& p, int64_t rank, int64_t ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks || p.intermediate % ranks)
    throw BadInput("tensor-parallel FFN: intermediate size " + std::to_string(p.intermediate) + " over " +
                   std::to_string(ranks) + " GPUs (expected a multiple of the GPUs)");
  const int64_t units = p.intermediate / ranks, first = rank * units;
  const int64_t H = int64_t(p.gate_proj.size()) / std::max<int64_t>(1, p.intermediate);
  ref::MlpParams s;
  s.intermediate = units;
  s.gate_proj = rows_of(p.gate_proj, H, first, units);
  s.up_proj = rows_of(p.up_proj, H, first, units);
  s.down_proj = columns_of(p.down_proj, H, p.intermediate, first, units);
  return s;
}

ShardedLayerStep sharded_decoder_layer(const ModelConfig& m, int64_t layer_index, const ref::LayerParams& p,
                                       const ref::MlaInputs& in, ref::MlaForm form, const Parallelism& parallel) {
  if (!in.rows.empty()) throw std::invalid_argument("sharded_decoder_layer: computes every new token (rows empty)");
  const ShardPlan plan = shard_plan(m, parallel, in.batch, in.q_len, in.kv_len);
  const int64_t n = parallel.gpus, H = m.hidden_size, T = in.batch * in.q_len, Q = in.q_len;
  const size_t stream_values = size_t(T * H);                 // [tokens][hidden]
  const double tensor_bytes = double(stream_values) * kBf16;  // that tensor in bf16, as a collective moves it
  ShardedLayerStep step;
  auto log = [&](const char* kind, const char* where, double bytes) {
    if (n > 1) step.collectives.push_back({kind, where, bytes});
  };
  // Every rank's requests: all of them (TP attention), or its own run of plan.requests_per_gpu (DP attention; the
  // last ranks may have fewer, or none).
  auto requests = [&](int64_t rank) {
    if (!parallel.dp_attention) return std::pair<int64_t, int64_t>{0, in.batch};
    const int64_t first = std::min(in.batch, rank * plan.requests_per_gpu);
    return std::pair<int64_t, int64_t>{first, std::min(in.batch, first + plan.requests_per_gpu) - first};
  };

  // Attention, on the normalised stream as decoder_layer rounds it.
  std::vector<double> x(in.hidden_states.size());  // (the residual stream, as decoder_layer reads it)
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(to_float(in.hidden_states[i]));
  std::vector<double> normed;
  rms_norm_rows(m, x, p.input_layernorm, normed);
  ref::MlaInputs attn_in = in;
  if (in.bf16_stream) {
    attn_in.hidden_states.resize(normed.size());
    for (size_t i = 0; i < normed.size(); ++i) attn_in.hidden_states[i] = to_bf16(float(normed[i]));
  } else {
    attn_in.hidden_exact = normed;
  }
  std::vector<double> attention(stream_values, 0.0);
  for (int64_t rank = 0; rank < n; ++rank) {
    if (!parallel.dp_attention) {  // its heads, every request: o_proj's partial sums, all-reduced
      add(attention, ref::mla_attention(m, shard_heads(m, p.attn, rank, n), attn_in, form));
    } else if (const auto [first, count] = requests(rank); count > 0) {  // every head, its requests
      add(attention, ref::mla_attention(m, p.attn, requests_of(m, attn_in, first, count), form), size_t(first * Q * H));
    }
  }
  if (!parallel.dp_attention) log("all_reduce", "attention output (o_proj's partial sums)", tensor_bytes);
  std::vector<double> h(stream_values);
  for (size_t i = 0; i < h.size(); ++i) h[i] = x[i] + attention[i];
  rms_norm_rows(m, h, p.post_attention_layernorm, normed);
  if (in.bf16_stream)
    for (auto& v : normed) v = double(round_to_bf16(float(v)));

  // The FFN. Replicated (DP attention with EP: the shared experts and dense MLPs whole on every GPU, each running its
  // own tokens) or split by intermediate units over every token (TP attention: each GPU has them all; DP attention:
  // all-gathered first, the partial sums reduce-scattered back).
  const bool dense = !m.is_moe_layer(layer_index), replicated = parallel.dp_attention && parallel.ep;
  if (!replicated && parallel.dp_attention) log("all_gather", "every GPU's tokens before the FFN", tensor_bytes);
  std::vector<double> ffn(stream_values, 0.0);
  auto own_tokens = [&](int64_t rank, const ref::MlpParams& mlp) {  // a replicated FFN on the rank's own tokens
    if (const auto [first, count] = requests(rank); count > 0) {
      const std::vector<double> rows(normed.begin() + first * Q * H, normed.begin() + (first + count) * Q * H);
      add(ffn, ref::mlp(m, mlp, rows, count * Q), size_t(first * Q * H));
    }
  };
  if (dense) {
    for (int64_t rank = 0; rank < n; ++rank)
      if (replicated)
        own_tokens(rank, p.dense);
      else
        add(ffn, ref::mlp(m, shard_intermediate(p.dense, rank, n), normed, T));
  } else {
    // Each rank: the router (replicated, so every token's choice is the same everywhere), its experts' share (a slice
    // of each under TP, the whole of its own under EP: the others none, as if the dispatch never sent it those rows)
    // and the shared experts' slice unless they are replicated.
    const ref::MoeParams& moe = p.moe;
    auto expert = [&](int e) { return moe.experts.empty() ? moe.make_expert(e) : moe.experts[size_t(e)]; };
    const int64_t experts_per_rank = m.n_routed_experts / n;
    for (int64_t rank = 0; rank < n; ++rank) {
      ref::MoeParams share;
      share.gate = moe.gate;
      share.e_score_correction_bias = moe.e_score_correction_bias;
      share.forced_experts = moe.forced_experts;
      share.check = rank == 0 ? moe.check : nullptr;
      if (m.n_shared_experts > 0 && !replicated)  // (replicated: none here, each rank's own tokens' below)
        share.shared = shard_intermediate(moe.shared, rank, n);
      share.make_expert = [&, rank](int e) {
        if (!parallel.ep) return shard_intermediate(expert(e), rank, n);
        return e / experts_per_rank == rank ? expert(e) : ref::MlpParams{};
      };
      add(ffn, ref::moe(m, share, normed, T));
    }
    if (replicated && m.n_shared_experts > 0)
      for (int64_t rank = 0; rank < n; ++rank) own_tokens(rank, moe.shared);
  }
  if (!dense && parallel.dp_attention && parallel.ep) {
    const double routed = tensor_bytes * double(m.num_experts_per_tok);
    log("all_to_all", "dispatch: each token to its top-k experts' GPUs", routed);
    log("all_to_all", "combine: the experts' outputs back", routed);
  } else if (!replicated) {
    if (parallel.dp_attention)
      log("reduce_scatter", "the FFN's partial sums back to each token's GPU", tensor_bytes);
    else
      log("all_reduce", dense ? "MLP output" : "MoE output (down_proj's partial sums)", tensor_bytes);
  }
  step.out.resize(stream_values);
  for (size_t i = 0; i < h.size(); ++i) step.out[i] = h[i] + ffn[i];
  return step;
}

}  // namespace dslab::planner
