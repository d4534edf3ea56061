#include "planner/parallel.h"

#include <algorithm>
#include <cmath>

#include "harness/collectives.h"
#include "harness/errors.h"
#include "variants/layer/ops.h"

namespace dslab::planner {

namespace {

constexpr double kBf16 = 2;

void check(const ModelConfig& m, const Parallelism& p) {
  if (p.gpus < 1) throw BadInput("gpus " + std::to_string(p.gpus) + ": expected at least 1");
  if (!p.dp_attention && m.num_attention_heads % p.gpus)
    throw BadInput("tensor-parallel attention over " + std::to_string(p.gpus) + " GPUs: num_attention_heads " +
                   std::to_string(m.num_attention_heads) + " is not a multiple (use dp_attention)");
  if (p.ep && m.n_routed_experts % p.gpus)
    throw BadInput("expert parallel over " + std::to_string(p.gpus) + " GPUs: n_routed_experts " +
                   std::to_string(m.n_routed_experts) + " is not a multiple");
}

// Shared experts (and dense MLPs) stay whole on each GPU under DP attention with EP (each GPU runs its own tokens');
// otherwise they are split as tensor-parallel FFNs.
bool ffn_replicated(const Parallelism& p) { return p.dp_attention && p.ep; }

double weight_bytes_per_gpu(const ModelConfig& m, const Parallelism& p) {
  const double H = double(m.hidden_size), heads = double(m.num_attention_heads), g = double(p.gpus);
  const double qhd = double(m.q_head_dim()), r = double(m.kv_lora_rank), rope = double(m.qk_rope_head_dim);
  const double head_split = p.dp_attention ? 1 : g;  // the per-head matrices' share a GPU holds
  // Attention: the latent projections are shared by all heads (replicated); the per-head ones split under TP.
  double attn = (r + rope) * H + r + 2 * H;  // kv_a_proj_with_mqa, kv_a_layernorm, the layer's two norms
  if (m.q_lora_rank) {
    const double ql = double(*m.q_lora_rank);
    attn += ql * H + ql + heads * qhd * ql / head_split;
  } else {
    attn += heads * qhd * H / head_split;
  }
  attn += heads * (double(m.qk_nope_head_dim) + double(m.v_head_dim)) * r / head_split;  // kv_b_proj
  attn += H * heads * double(m.v_head_dim) / head_split;                                 // o_proj
  const double ffn_split = ffn_replicated(p) ? 1 : g;
  const double expert = 3 * H * double(m.moe_intermediate_size);
  const double routed = p.ep ? double(m.n_routed_experts) / g * expert : double(m.n_routed_experts) * expert / g;
  const double moe = routed + double(m.n_routed_experts) * H + double(m.n_shared_experts) * expert / ffn_split;
  const double dense = 3 * H * double(m.intermediate_size) / ffn_split;
  double total = 2 * double(m.vocab_size) * H / g;  // embedding and LM head, split by vocabulary
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) total += attn + (m.is_moe_layer(l) ? moe : dense);
  return total * kBf16;
}

}  // namespace

ShardPlan shard_plan(const ModelConfig& m, const Parallelism& p, int64_t batch, int64_t q_len, int64_t kv_len) {
  check(m, p);
  ShardPlan s;
  const int64_t g = p.gpus;
  s.heads_per_gpu = p.dp_attention ? m.num_attention_heads : m.num_attention_heads / g;
  s.requests_per_gpu = p.dp_attention ? (batch + g - 1) / g : batch;
  s.experts_per_gpu = p.ep ? m.n_routed_experts / g : m.n_routed_experts;
  s.expert_fraction = p.ep ? 1.0 : 1.0 / double(g);
  s.weight_bytes_per_gpu = weight_bytes_per_gpu(m, p);
  s.kv_bytes_per_token_layer = double(m.kv_lora_rank + m.qk_rope_head_dim) * kBf16;
  s.kv_bytes_per_gpu =
      double(s.requests_per_gpu) * double(kv_len) * double(m.num_hidden_layers) * s.kv_bytes_per_token_layer;
  if (g == 1) return s;
  const double tokens = double(batch * q_len), rows = tokens * double(m.hidden_size) * kBf16;
  const double routed_rows = rows * double(m.num_experts_per_tok);
  for (int moe = 0; moe < 2; ++moe) {
    std::vector<Collective>& c = moe ? s.per_moe_layer : s.per_dense_layer;
    if (!p.dp_attention) {
      c.push_back({"all_reduce", "attention output (o_proj's partial sums)", rows});
      c.push_back({"all_reduce", moe ? "MoE output (down_proj's partial sums)" : "MLP output", rows});
    } else if (p.ep) {  // (a dense layer's MLP replicated: each GPU runs its own tokens, nothing moves)
      if (moe) {
        c.push_back({"all_to_all", "dispatch: each token to its top-k experts' GPUs", routed_rows});
        c.push_back({"all_to_all", "combine: the experts' outputs back", routed_rows});
      }
    } else {
      c.push_back({"all_gather", "every GPU's tokens before the FFN", rows});
      c.push_back({"reduce_scatter", "the FFN's partial sums back to each token's GPU", rows});
    }
  }
  return s;
}

int64_t kv_capacity_requests(const ModelConfig& m, const Parallelism& p, double gpu_bytes, int64_t kv_len) {
  check(m, p);
  const double free = gpu_bytes - weight_bytes_per_gpu(m, p);
  const double per_request =
      double(kv_len) * double(m.num_hidden_layers) * double(m.kv_lora_rank + m.qk_rope_head_dim) * kBf16;
  if (free <= 0 || per_request <= 0) return 0;
  const int64_t per_gpu = int64_t(std::floor(free / per_request));
  return p.dp_attention ? per_gpu * p.gpus : per_gpu;
}

double collective_seconds(const Collective& c, int64_t gpus, const Link& link) {
  if (gpus <= 1) return 0;
  const auto m = link.measured.find(c.kind);
  const double latency = m != link.measured.end() ? m->second.latency_s : link.latency_s,
               bus = m != link.measured.end() ? m->second.bus_bytes_per_s : link.bus_bytes_per_s;
  return latency + c.bytes * collectives::bus_factor(c.kind, gpus) / bus;
}

Link link_from_calibration(const nlohmann::json& collectives, const std::string& gpu_name, const std::string& source) {
  Link link;
  if (!collectives.is_object() || !collectives.contains("fit")) return link;
  const nlohmann::json& fit = collectives["fit"];
  for (const std::string& kind : collectives::kinds()) {
    if (!fit.contains(kind)) continue;
    const nlohmann::json& f = fit[kind];
    for (const char* field : {"latency_s", "bus_bytes_per_s"})
      if (!f.contains(field) || !f[field].is_number() || (std::string(field) == "bus_bytes_per_s" && f[field] <= 0))
        throw BadInput(source + ": collectives.fit." + kind + "." + field + ": " +
                       (f.contains(field) ? f[field].dump() : "missing") + " (expected a positive number)");
    link.measured[kind] = {f["bus_bytes_per_s"].get<double>(), f["latency_s"].get<double>()};
  }
  link.measured_gpus = collectives.value("gpus", int64_t(0));
  link.measured_on = std::to_string(link.measured_gpus) + " x " + (gpu_name.empty() ? "GPU" : gpu_name) + ", NCCL " +
                     collectives.value("nccl", std::string("?"));
  return link;
}

std::string ParallelEstimate::label() const {
  return std::string(p.dp_attention ? "DP" : "TP") + " attention + " + (p.ep ? "EP" : "TP") + " experts on " +
         std::to_string(p.gpus) + " GPU" + (p.gpus > 1 ? "s" : "");
}

ParallelEstimate estimate_parallel_step(const ModelConfig& m, const Parallelism& p, int64_t batch, int64_t kv_len,
                                        const GpuCeilings& gpu, const Link& link) {
  const ShardPlan plan = shard_plan(m, p, batch, 1, kv_len);
  layer::StepShape shape;
  shape.batch = batch;
  shape.q_len = 1;
  shape.kv_len = kv_len;
  const double g = double(p.gpus);
  // A GPU's share of the requests under DP attention (the busiest GPU's: ceil(batch / gpus)).
  const double dp_share = double(plan.requests_per_gpu) / double(batch);
  ParallelEstimate e;
  e.p = p;
  for (layer::OpCost op : layer::step_ops(m, shape)) {
    switch (op.group) {
      case layer::OpGroup::attention:
        if (p.dp_attention) {  // this GPU's requests, every head, the weights whole
          op.flops *= dp_share, op.kv_bytes *= dp_share, op.act_bytes *= dp_share;
        } else if (op.name != "kv_a_proj") {  // the heads split; the latent projection and the cache are every GPU's
          op.flops /= g, op.weight_bytes /= g;
        }
        break;
      case layer::OpGroup::routed_experts:
        // TP: every token, a slice of each reached expert; EP: this GPU's experts and the tokens routed to them.
        op.flops /= g, op.weight_bytes /= g;
        if (p.ep) op.act_bytes /= g;
        break;
      case layer::OpGroup::shared_experts:
      case layer::OpGroup::dense_mlp:
        if (ffn_replicated(p))  // each GPU its own tokens through the whole FFN
          op.flops *= dp_share, op.act_bytes *= dp_share;
        else  // split as a tensor-parallel FFN over every token
          op.flops /= g, op.weight_bytes /= g;
        break;
      case layer::OpGroup::lm_head:  // vocabulary-parallel
        op.flops /= g, op.weight_bytes /= g;
        break;
      default:  // norms, router, embedding: this GPU's tokens
        if (p.dp_attention) op.flops *= dp_share, op.act_bytes *= dp_share;
        break;
    }
    e.compute_s +=
        std::max(op.flops / gpu.tensor_flops, op.bytes() / gpu.hbm_bytes_per_s) + double(op.gpu_kernels) * gpu.kernel_s;
  }
  for (int64_t layer = 0; layer < m.num_hidden_layers; ++layer)
    for (const Collective& c : m.is_moe_layer(layer) ? plan.per_moe_layer : plan.per_dense_layer)
      e.comm_s += collective_seconds(c, p.gpus, link);
  e.step_s = e.compute_s + e.comm_s;
  e.tokens_per_s = e.step_s > 0 ? double(batch) / e.step_s : 0;
  e.weight_bytes_per_gpu = plan.weight_bytes_per_gpu;
  e.kv_bytes_per_gpu = plan.kv_bytes_per_gpu;
  return e;
}

std::vector<ParallelEstimate> rank_placements(const ModelConfig& m, int64_t gpus, int64_t batch, int64_t kv_len,
                                              const GpuCeilings& gpu, const Link& link) {
  std::vector<ParallelEstimate> out;
  for (bool dp : {false, true})
    for (bool ep : {false, true}) {
      const Parallelism p{gpus, dp, ep};
      if ((!dp && m.num_attention_heads % gpus) || (ep && m.n_routed_experts % gpus)) continue;
      if (gpus == 1 && (dp || ep)) continue;  // (one GPU: one placement)
      out.push_back(estimate_parallel_step(m, p, batch, kv_len, gpu, link));
    }
  std::stable_sort(out.begin(), out.end(),
                   [](const ParallelEstimate& a, const ParallelEstimate& b) { return a.step_s < b.step_s; });
  return out;
}

}  // namespace dslab::planner
