#include "planner/plan.h"

#include "planner/parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include "harness/collectives.h"
#include "harness/command.h"
#include "harness/errors.h"
#include "harness/machine.h"
#include "harness/sweep.h"

namespace dslab::reports {

using layer::OpCost;
using layer::OpGroup;

namespace {

double field(const nlohmann::json& machine, const std::string& source, const char* section, const char* key) {
  if (!machine.contains(section) || !machine[section].is_object())  // (calibrated where there is no such device)
    throw BadInput(source + ": " + section + ": absent (calibrated on a machine without one): plan with --machine " +
                   "of a calibration that has it, e.g. a device's committed reports/<device>/calibration/machine.json");
  if (!machine[section].contains(key) || !machine[section][key].is_number() || machine[section][key].get<double>() <= 0)
    throw BadInput(source + ": " + section + "." + key +
                   ": missing or not a positive number (run `dslab calibrate` on the machine to plan for; "
                   "this field is newer than the file)");
  return machine[section][key].get<double>();
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string gb(double bytes) { return fmt("%.1f GB", bytes / 1e9); }

}  // namespace

Ceilings Ceilings::from_machine(const nlohmann::json& machine, const std::string& source, int cpu_threads) {
  Ceilings c;
  c.source = source;
  c.gpu_name = machine.contains("gpu") && machine["gpu"].is_object() ? machine["gpu"].value("name", "GPU") : "GPU";
  c.cpu_name = machine.value("cpu_model", "CPU");
  c.gpu_flops = field(machine, source, "gpu", "tensor_bf16_flops");
  c.gpu_bytes_per_s = field(machine, source, "gpu", "hbm_bytes_per_s");
  c.gpu_kernel_s = field(machine, source, "gpu", "small_kernel_s");
  const auto& g = machine["gpu"];
  c.gpu_weight_stream_bytes_per_s =
      g.contains("gemv_bytes_per_s") && g["gemv_bytes_per_s"].is_number() && g["gemv_bytes_per_s"].get<double>() > 0
          ? g["gemv_bytes_per_s"].get<double>()
          : c.gpu_bytes_per_s;
  c.h2d_bytes_per_s = field(machine, source, "gpu", "h2d_pinned_bytes_per_s");
  c.d2h_bytes_per_s = field(machine, source, "gpu", "d2h_pinned_bytes_per_s");
  c.transfer_s = field(machine, source, "gpu", "h2d_4k_s");
  c.host_roundtrip_s = field(machine, source, "gpu", "host_roundtrip_s");
  if (machine["gpu"].contains("memory_bytes") && machine["gpu"]["memory_bytes"].is_number())
    c.gpu_memory_bytes = machine["gpu"]["memory_bytes"].get<double>();
  c.cpu_bytes_per_s = field(machine, source, "cpu", "dram_read_bytes_per_s");
  const auto& cpu = machine["cpu"];
  const bool amx =
      cpu.contains("amx_bf16_flops") && cpu["amx_bf16_flops"].is_number() && cpu["amx_bf16_flops"].get<double>() > 0;
  c.cpu_unit = amx ? "amx" : "avx512";
  c.cpu_flops = field(machine, source, "cpu", amx ? "amx_bf16_flops" : "avx512_bf16_flops");
  c.cpu_threads = cpu.value("threads", 0);
  if (cpu_threads > 0 && cpu_threads != c.cpu_threads) {
    if (!cpu.contains("by_threads") || !cpu["by_threads"].is_array())
      throw BadInput(source + ": cpu.by_threads: missing (needed for --cpu-threads; run `dslab calibrate` again)");
    const nlohmann::json* pick = nullptr;
    for (const auto& e : cpu["by_threads"])
      if (e.value("threads", 0) <= cpu_threads && (!pick || e.value("threads", 0) > pick->value("threads", 0)))
        pick = &e;
    if (!pick)
      throw BadInput(source + ": cpu.by_threads: no rate at " + std::to_string(cpu_threads) + " threads or fewer");
    const char* unit = c.cpu_unit == "amx" ? "amx_bf16_flops" : "avx512_bf16_flops";
    if (!pick->contains(unit) || !pick->contains("dram_read_bytes_per_s"))
      throw BadInput(source + ": cpu.by_threads: the entry for " + std::to_string(pick->value("threads", 0)) +
                     " threads has no " + unit);
    c.cpu_flops = (*pick)[unit].get<double>();
    c.cpu_bytes_per_s = (*pick)["dram_read_bytes_per_s"].get<double>();
    c.cpu_threads = pick->value("threads", 0);
  }
  return c;
}

double gpu_op_s(const OpCost& op, const Ceilings& c) {
  // A decode-sized cuBLAS GEMM (up to ~16 rows: as many FLOP per weight byte) streams its weights at the GEMV rate;
  // the routed experts run on grouped GEMMs of our own, measured near the copy rate (0.76-0.95 of it at decode).
  const bool cublas_gemv = op.intensity() < 16 && op.group != OpGroup::routed_experts;
  const double weight_rate = cublas_gemv ? c.gpu_weight_stream_bytes_per_s : c.gpu_bytes_per_s;
  const double bytes_s = op.weight_bytes / weight_rate + (op.kv_bytes + op.act_bytes) / c.gpu_bytes_per_s;
  return std::max((op.flops + op.extra_flops) / c.gpu_flops, bytes_s) + op.staged_bytes / c.gpu_bytes_per_s +
         double(op.gpu_kernels) * c.gpu_kernel_s;
}

double stream_crossover_tokens_per_expert(const ModelConfig& m, const Ceilings& c) {
  const double H = double(m.hidden_size), I = double(m.moe_intermediate_size), weights = 3 * H * I * 2;
  for (int64_t t = 1; t <= 65536; ++t) {
    OpCost expert;
    expert.flops = 6 * H * I * double(t);
    expert.weight_bytes = weights;
    expert.act_bytes = double(t) * H * 6;
    expert.tokens_per_expert = double(t);
    const double cpu = cpu_routed_experts_s(expert, c);
    const double gpu = std::max(expert.flops / c.gpu_flops / c.gpu_expert_efficiency_at(double(t)),
                                weights / c.h2d_bytes_per_s + expert.act_bytes / c.gpu_bytes_per_s);
    if (gpu < cpu) return double(t);
  }
  return 0;
}

double cpu_op_s(const OpCost& op, const Ceilings& c) {
  return std::max((op.flops + op.extra_flops) / c.cpu_flops, op.bytes() / c.cpu_bytes_per_s) +
         op.staged_bytes / c.cpu_bytes_per_s;
}

namespace {

double efficiency_at(const std::vector<std::pair<double, double>>& e, double tokens_per_expert) {
  if (e.empty()) return 1.0;
  if (tokens_per_expert <= e.front().first) return e.front().second;
  if (tokens_per_expert >= e.back().first) return e.back().second;
  size_t i = 1;
  while (e[i].first < tokens_per_expert) ++i;
  const double t = std::log(tokens_per_expert / e[i - 1].first) / std::log(e[i].first / e[i - 1].first);
  return e[i - 1].second + t * (e[i].second - e[i - 1].second);
}

// Each run's roofline time on these ceilings over its measured time, averaged by the run's tokens per expert.
std::vector<std::pair<double, double>> efficiencies(const std::vector<ResultsFile>& files, const std::string& variant,
                                                    const std::string& model, const char* tpe_counter,
                                                    const std::function<double(const OpCost&)>& roofline_s) {
  std::map<double, std::vector<double>> by_tpe;
  for (const ResultsFile& f : files)
    for (const Entry& e : f.entries) {
      if (e.variant != variant || e.model != model || e.median_us <= 0) continue;
      const auto& raw = e.raw;
      if (!raw.contains("flops") || !raw.contains("bytes") || !raw.contains("counters") ||
          !raw["counters"].contains(tpe_counter))
        continue;
      OpCost run;  // the run's work, priced on these ceilings
      run.flops = raw["flops"].get<double>();
      run.weight_bytes = raw["bytes"].get<double>();
      run.group = OpGroup::routed_experts;
      by_tpe[raw["counters"][tpe_counter].get<double>()].push_back(roofline_s(run) / (e.median_us * 1e-6));
    }
  std::vector<std::pair<double, double>> out;
  for (const auto& [tpe, v] : by_tpe) {
    double sum = 0;
    for (double x : v) sum += x;
    out.emplace_back(tpe, sum / double(v.size()));
  }
  return out;
}

std::string file_names(const std::vector<ResultsFile>& files) {
  std::string names;
  for (const ResultsFile& f : files) names += (names.empty() ? "" : ", ") + f.path;
  return names;
}

}  // namespace

double Ceilings::cpu_expert_efficiency_at(double tokens_per_expert) const {
  return efficiency_at(cpu_expert_efficiency, tokens_per_expert);
}
double Ceilings::gpu_expert_efficiency_at(double tokens_per_expert) const {
  return efficiency_at(gpu_expert_efficiency, tokens_per_expert);
}

double cpu_routed_experts_s(const OpCost& op, const Ceilings& c) {
  return cpu_op_s(op, c) / c.cpu_expert_efficiency_at(op.tokens_per_expert);
}

double gpu_routed_experts_s(const OpCost& op, const Ceilings& c) {
  return gpu_op_s(op, c) / c.gpu_expert_efficiency_at(op.tokens_per_expert);
}

void attach_gpu_expert_runs(Ceilings& c, const std::string& model, const std::vector<ResultsFile>& files) {
  if (files.empty()) return;
  c.gpu_expert_efficiency = efficiencies(files, "moe/grouped/cuda", model, "tokens_per_active_expert",
                                         [&](const OpCost& op) { return gpu_op_s(op, c); });
  if (c.gpu_expert_efficiency.empty())
    throw BadInput(
        file_names(files) + ": no moe/grouped/cuda results for model " + model +
        " with flops, bytes and counters.tokens_per_active_expert (expected a dslab run of the GPU MoE at this model)");
  c.gpu_expert_efficiency_source = "moe/grouped/cuda in " + file_names(files);
}

void attach_cpu_expert_runs(Ceilings& c, const std::string& model, const std::vector<ResultsFile>& files) {
  if (files.empty()) return;
  const std::string names = file_names(files);
  const std::string unit_variant = c.cpu_unit == "amx" ? "moe/amx/cpu" : "moe/avx512/cpu";
  for (const std::string& variant : {std::string("moe/auto/cpu"), unit_variant}) {
    auto e =
        efficiencies(files, variant, model, "tokens_per_expert", [&](const OpCost& op) { return cpu_op_s(op, c); });
    if (e.empty()) continue;
    c.cpu_expert_efficiency = std::move(e);
    c.cpu_expert_efficiency_source = variant + " in " + names;
    return;
  }
  throw BadInput(
      names + ": no moe/auto/cpu or " + unit_variant + " results for model " + model +
      " with flops, bytes and counters.tokens_per_expert (expected a dslab run of the CPU MoE engine at this model)");
}

namespace {

// A candidate: where each group runs. Routed experts may be split: the first gpu_layers MoE layers' experts, or
// hot_experts of each layer's, resident on the GPU; or all of them streamed to the GPU each step.
struct Candidate {
  std::string name;
  bool attention_on_gpu = true, shared_on_gpu = true, dense_on_gpu = true;
  int64_t gpu_moe_layers = 0;   // MoE layers whose experts all live on the GPU (from the first)
  int64_t hot_experts = 0;      // per other MoE layer, experts resident on the GPU
  bool stream_experts = false;  // the other layers' experts, all of them, copied to the GPU each step
};

struct Model {
  const PlanRequest& r;
  const Ceilings& c;
  const std::vector<OpCost>& ops;
  int64_t moe_layers() const {
    int64_t n = 0;
    for (int64_t l = 0; l < r.model.num_hidden_layers; ++l) n += r.model.is_moe_layer(l);
    return n;
  }
  double expert_bytes() const { return 3.0 * double(r.model.hidden_size) * double(r.model.moe_intermediate_size) * 2; }
  double kv_bytes() const {  // every layer's cache for the batch, at the step's end
    const auto& s = r.shape;
    return double(r.model.num_hidden_layers) * double(s.batch) * double(s.kv_len + s.q_len) *
           mla::cache_bytes_per_token(r.model, s.attn, r.model.num_attention_heads, s.kv_dtype);
  }
  // What our layer allocates on the GPU besides weights and caches (layer::gpu_step_scratch_bytes), with the attention
  // the op costs assume (StepShape::scores_on_chip: the fused decode kernel for decode, the unfused form beyond).
  double workspace_bytes() const {
    layer::StepScratch s;
    s.attn.heads = r.model.num_attention_heads;
    s.attn.batch = r.shape.batch;
    s.attn.q_len = r.shape.q_len;
    s.attn.kv_len = r.shape.kv_len;
    s.algo = r.shape.attn;
    s.fused = r.shape.scores_on_chip();
    s.max_keys = r.shape.kv_len + r.shape.q_len;
    s.layers = r.model.num_hidden_layers;
    s.moe_layers = moe_layers();
    s.whole = true;
    return layer::gpu_step_scratch_bytes(r.model, s);
  }

  PlacementPlan evaluate(const Candidate& k) const {
    PlacementPlan p;
    p.placement = k.name;
    const auto& m = r.model;
    const double T = double(r.shape.tokens()), H = double(m.hidden_size), K = double(m.num_experts_per_tok),
                 E = double(m.n_routed_experts);
    // Capacity: the groups resident on the GPU, all their weights (every expert, not only the active ones).
    double gpu_bytes = workspace_bytes(), host_bytes = 0, stream_buffer = 0;
    int64_t moe_index = 0;
    for (const OpCost& op : ops) {
      switch (op.group) {
        case OpGroup::attention:
          (k.attention_on_gpu ? gpu_bytes : host_bytes) += op.weight_bytes;
          break;
        case OpGroup::shared_experts:
          (k.shared_on_gpu ? gpu_bytes : host_bytes) += op.weight_bytes;
          break;
        case OpGroup::dense_mlp:
          (k.dense_on_gpu ? gpu_bytes : host_bytes) += op.weight_bytes;
          break;
        case OpGroup::routed_experts: {
          const double all = E * expert_bytes();
          if (moe_index < k.gpu_moe_layers)
            gpu_bytes += all;
          else {
            const double hot = double(k.hot_experts) * expert_bytes();
            gpu_bytes += hot;
            host_bytes += all - hot;
            stream_buffer = std::max(stream_buffer, k.stream_experts ? 2 * all : 0.0);  // two layers' in flight
          }
          ++moe_index;
          break;
        }
        // The embedding reads only its tokens' rows, but the whole table lives where it runs.
        case OpGroup::embedding:
          (k.attention_on_gpu ? gpu_bytes : host_bytes) += double(m.vocab_size) * H * 2;
          break;
        default:
          (k.attention_on_gpu ? gpu_bytes : host_bytes) += op.weight_bytes;
          break;  // gate, norms, head
      }
    }
    gpu_bytes += stream_buffer + (k.attention_on_gpu ? kv_bytes() : 0);
    host_bytes += k.attention_on_gpu ? 0 : kv_bytes();
    p.gpu_bytes = gpu_bytes;
    p.host_bytes = host_bytes;
    const double budget = r.gpu_budget_bytes > 0 ? r.gpu_budget_bytes : c.gpu_memory_bytes;
    if (budget > 0 && gpu_bytes > budget)
      p.fits = false, p.why_not = "needs " + gb(gpu_bytes) + " on the GPU, budget " + gb(budget);
    if (p.fits && r.host_memory_bytes > 0 && host_bytes > r.host_memory_bytes)
      p.fits = false, p.why_not = "needs " + gb(host_bytes) + " of host memory, has " + gb(r.host_memory_bytes);

    // Time: ops in order; per MoE layer the routed experts overlap the shared experts where they run apart.
    double total = 0, xfer_total = 0, cpu_total = 0;
    moe_index = 0;
    // Streamed experts: the copies run on their own engine, in order, each into the staging buffer the layer two
    // before has finished with; a layer waits for its copy. (The step's GPU timeline is `total`.)
    double copy_done = 0, stalls = 0;
    std::vector<double> moe_end;
    double shared_s = 0;  // this layer's shared experts, waiting to overlap with its routed experts
    auto add = [&](const char* part, double s) {
      total += s;
      p.parts_s[part] += s;
    };
    for (const OpCost& op : ops) {
      const bool gpu_side = op.group == OpGroup::attention || op.group == OpGroup::gate || op.group == OpGroup::norms ||
                            op.group == OpGroup::embedding || op.group == OpGroup::lm_head;
      if (gpu_side) {
        add(group_name(op.group), k.attention_on_gpu ? gpu_op_s(op, c) : cpu_op_s(op, c));
        continue;
      }
      if (op.group == OpGroup::dense_mlp) {
        add("dense_mlp", k.dense_on_gpu ? gpu_op_s(op, c) : cpu_op_s(op, c));
        continue;
      }
      if (op.group == OpGroup::shared_experts) {
        shared_s = k.shared_on_gpu ? gpu_op_s(op, c) : cpu_op_s(op, c);
        continue;
      }
      // Routed experts of this layer: the GPU's share (resident layer, hot experts, or streamed) and the CPU's.
      double gpu_s = 0, cpu_s = 0, xfer_s = 0;
      if (moe_index < k.gpu_moe_layers) {
        gpu_s = gpu_routed_experts_s(op, c);
      } else if (k.stream_experts) {
        // every expert of the layer copied (the layer streams them all: which are reached is the GPU's to know)
        const size_t q = moe_end.size();
        const double allowed = q < 2 ? 0 : moe_end[q - 2];
        copy_done = std::max(copy_done, allowed) + E * expert_bytes() / c.h2d_bytes_per_s + c.transfer_s;
        const double stall = std::max(0.0, copy_done - total);
        add("moe", stall);
        stalls += stall;
        gpu_s = gpu_routed_experts_s(op, c);
      } else {
        // Uniform routing: hot experts take hot/E of the (token, expert) choices; each side reads the weights of
        // the experts it reaches.
        const double f = double(k.hot_experts) / E;
        OpCost on_gpu = op, on_cpu = op;
        on_gpu.flops *= f, on_gpu.act_bytes *= f, on_gpu.weight_bytes *= f;
        on_cpu.flops *= 1 - f, on_cpu.act_bytes *= 1 - f, on_cpu.weight_bytes *= 1 - f;
        if (f > 0) gpu_s = gpu_routed_experts_s(on_gpu, c);
        if (f < 1) {
          cpu_s = cpu_routed_experts_s(on_cpu, c);
          // hidden states (bf16), ids and weights to the host (three copies), the experts' sum (fp32) back (one), and
          // the host function's round trip (the stream waits for it; the CPU's workers wake for it).
          if (k.attention_on_gpu)
            xfer_s = c.host_roundtrip_s + 4 * c.transfer_s + T * (H * 2 + K * 8) / c.d2h_bytes_per_s +
                     T * H * 4 / c.h2d_bytes_per_s;
        }
      }
      // The GPU runs its shared and routed share while the CPU runs the rest (KTransformers' overlap).
      const double gpu_side_s = (k.shared_on_gpu ? shared_s : 0) + gpu_s;
      const double cpu_side_s = xfer_s + cpu_s + (k.shared_on_gpu ? 0 : shared_s);
      const double layer_s = k.attention_on_gpu ? std::max(gpu_side_s, cpu_side_s) : gpu_side_s + cpu_side_s;
      add("moe", layer_s);
      if (k.stream_experts) moe_end.push_back(total);
      xfer_total += xfer_s;
      cpu_total += cpu_s;
      shared_s = 0;
      ++moe_index;
    }
    p.parts_s["transfers (inside moe)"] = xfer_total;
    if (k.stream_experts) p.parts_s["waits for streamed experts (inside moe)"] = stalls;
    p.parts_s["cpu experts (inside moe)"] = cpu_total;
    p.predicted_s = total;
    return p;
  }
};

std::string why_op(const OpCost& op, const Ceilings& c, bool on_gpu) {
  const double i = op.intensity(), g = gpu_op_s(op, c), h = cpu_op_s(op, c);
  std::string bound_gpu = i < c.gpu_ridge() ? "memory-bound" : "compute-bound";
  std::string bound_cpu = i < c.cpu_ridge() ? "memory-bound" : "compute-bound";
  return fmt("%.1f FLOP/B: ", i) + bound_gpu + " on the GPU (ridge " + fmt("%.0f", c.gpu_ridge()) + "), " + bound_cpu +
         " on the CPU (ridge " + fmt("%.0f", c.cpu_ridge()) + "); GPU " + fmt("%.1f", h / g) + "x faster" +
         (on_gpu ? "" : ", but placed on the CPU by capacity");
}

}  // namespace

Plan make_plan(const PlanRequest& r, const Ceilings& c) {
  Plan plan;
  plan.request = r;
  plan.ceilings = c;
  plan.ops = layer::step_ops(r.model, r.shape);
  plan.stream_crossover = stream_crossover_tokens_per_expert(r.model, c);
  const Model model{r, c, plan.ops};
  const int64_t L = model.moe_layers(), E = r.model.n_routed_experts;
  std::vector<Candidate> candidates;
  candidates.push_back({"all_gpu", true, true, true, L, 0, false});
  candidates.push_back({"ktransformers", true, true, true, 0, 0, false});
  std::vector<int64_t> hot_counts{E / 8, E / 4, E / 2};
  for (int64_t n : r.hot_expert_counts)  // the hot splits that were run, so each gets its prediction
    if (std::find(hot_counts.begin(), hot_counts.end(), n) == hot_counts.end()) hot_counts.push_back(n);
  for (int64_t n : hot_counts)
    if (n > 0 && n < E) candidates.push_back({"hot_experts:" + std::to_string(n), true, true, true, 0, n, false});
  // The most whole MoE layers' experts the budget holds beside everything else.
  const double budget = r.gpu_budget_bytes > 0 ? r.gpu_budget_bytes : c.gpu_memory_bytes;
  if (budget > 0) {
    const PlacementPlan base = model.evaluate(candidates[1]);
    const int64_t n =
        std::clamp<int64_t>(int64_t((budget - base.gpu_bytes) / (double(E) * model.expert_bytes())), 0, L);
    if (n > 0 && n < L) candidates.push_back({"gpu_layers:" + std::to_string(n), true, true, true, n, 0, false});
  }
  for (int64_t n : r.gpu_layer_counts) {  // the splits that were run, so each gets its prediction
    const std::string name = "gpu_layers:" + std::to_string(n);
    if (n > 0 && n < L &&
        std::none_of(candidates.begin(), candidates.end(), [&](const Candidate& k) { return k.name == name; }))
      candidates.push_back({name, true, true, true, n, 0, false});
  }
  candidates.push_back({"streamed_experts", true, true, true, 0, 0, true});
  candidates.push_back({"all_cpu", false, false, false, 0, 0, false});
  for (const Candidate& k : candidates) plan.placements.push_back(model.evaluate(k));
  std::stable_sort(plan.placements.begin(), plan.placements.end(), [](const PlacementPlan& a, const PlacementPlan& b) {
    if (a.fits != b.fits) return a.fits;
    return a.predicted_s < b.predicted_s;
  });
  if (!plan.placements.empty() && plan.placements.front().fits) plan.placements.front().chosen = true;
  const double best = plan.placements.front().predicted_s;
  for (auto& p : plan.placements) {
    if (!p.fits)
      p.reason = p.why_not;
    else if (p.chosen)
      p.reason = "fastest predicted of those that fit";
    else
      p.reason = fmt("%.2fx the chosen placement's time", p.predicted_s / best);
  }
  return plan;
}

namespace {

std::string axis_text(const nlohmann::json& axes, const char* k) {
  if (!axes.contains(k)) return "";
  return axes[k].is_string() ? axes[k].get<std::string>() : axes[k].dump();
}

// The placement a whole-model layer run at the request's point measured ("" if it is not one, or not at that point).
std::string placement_of(const Entry& e, const PlanRequest& r) {
  if ((e.variant != "layer/deepseek/cuda" && e.variant != "layer/deepseek/hybrid") || e.model != r.model_name)
    return "";
  const auto& s = r.shape;
  if (axis_text(e.axes, "layers") != "all" || axis_text(e.axes, "batch") != std::to_string(s.batch) ||
      axis_text(e.axes, "q_len") != std::to_string(s.q_len) || axis_text(e.axes, "kv_len") != std::to_string(s.kv_len))
    return "";
  const std::string threads = axis_text(e.axes, "cpu_threads");
  if (threads != (r.cpu_threads > 0 ? std::to_string(r.cpu_threads) : "")) return "";
  const std::string moe = axis_text(e.axes, "moe");
  if (moe == "moe/grouped/cuda") return axis_text(e.axes, "gpu_experts") == "streamed" ? "streamed_experts" : "all_gpu";
  if (moe != "moe/host/cuda") return "";
  const std::string gpu_experts = axis_text(e.axes, "gpu_experts");
  if (gpu_experts.rfind("hot:", 0) == 0) return "hot_experts:" + gpu_experts.substr(4);
  const auto& counters = e.raw.contains("counters") ? e.raw["counters"] : nlohmann::json::object();
  const double resident = counters.contains("gpu_moe_layers") && counters["gpu_moe_layers"].is_number()
                              ? counters["gpu_moe_layers"].get<double>()
                              : 0;
  return resident > 0 ? "gpu_layers:" + std::to_string(int64_t(resident)) : "ktransformers";
}

using EfficiencyCurve = std::vector<std::pair<double, double>>;

nlohmann::json curve_json(const EfficiencyCurve& curve) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [tpe, e] : curve) out.push_back({{"tokens_per_expert", tpe}, {"efficiency", e}});
  return out;
}

// "<what> (<source>): 1 tokens/expert 0.77; ...; at this point 0.29." for a measured curve, nothing for none.
void curve_markdown(std::ostringstream& md, const char* what, const std::string& source, const EfficiencyCurve& curve,
                    const std::vector<OpCost>& ops) {
  if (curve.empty()) return;
  md << what << " (" << source << "):";
  for (const auto& [tpe, e] : curve) md << " " << fmt("%.3g", tpe) << " tokens/expert " << fmt("%.2f", e) << ";";
  double here = 1.0;
  for (const OpCost& op : ops)
    if (op.group == OpGroup::routed_experts) here = efficiency_at(curve, op.tokens_per_expert);
  md << " at this point " << fmt("%.2f", here) << ".\n\n";
}

}  // namespace

std::string run_with(const std::string& placement) {
  const std::string layer = "layer/deepseek/cuda layers=all ", hybrid = "layer/deepseek/hybrid layers=all";
  if (placement == "all_gpu") return layer + "moe=moe/grouped/cuda";
  if (placement == "ktransformers") return hybrid;
  if (placement.rfind("gpu_layers:", 0) == 0) return hybrid + " gpu_experts=layers:" + placement.substr(11);
  if (placement == "streamed_experts") return layer + "moe=moe/grouped/cuda gpu_experts=streamed";
  if (placement.rfind("hot_experts:", 0) == 0) return hybrid + " gpu_experts=hot:" + placement.substr(12);
  return "";
}

namespace {
// The N of every `<prefix>N` placement the files ran at the request's point.
std::vector<int64_t> measured_counts(const PlanRequest& r, const std::vector<ResultsFile>& files,
                                     const std::string& prefix) {
  std::vector<int64_t> counts;
  for (const ResultsFile& f : files)
    for (const Entry& e : f.entries) {
      const std::string p = placement_of(e, r);
      if (p.rfind(prefix, 0) != 0) continue;
      int64_t n = 0;
      try {
        n = std::stoll(p.substr(prefix.size()));
      } catch (const std::exception&) {
        continue;  // (an axis value the layer itself rejects)
      }
      if (std::find(counts.begin(), counts.end(), n) == counts.end()) counts.push_back(n);
    }
  return counts;
}
}  // namespace

std::vector<int64_t> measured_gpu_layer_counts(const PlanRequest& r, const std::vector<ResultsFile>& files) {
  return measured_counts(r, files, "gpu_layers:");
}
std::vector<int64_t> measured_hot_expert_counts(const PlanRequest& r, const std::vector<ResultsFile>& files) {
  return measured_counts(r, files, "hot_experts:");
}

void attach_measurements(Plan& plan, const std::vector<ResultsFile>& files) {
  for (auto& p : plan.placements) {
    bool graph = false;
    for (const ResultsFile& f : files)
      for (const Entry& e : f.entries) {
        if (placement_of(e, plan.request) != p.placement) continue;
        const bool is_graph = axis_text(e.axes, "executor") == "graph";
        if (p.measured_s >= 0 && (graph || !is_graph)) continue;  // keep a graph run over an eager one
        p.measured_s = e.median_us * 1e-6;
        p.measured_by = f.path + ": " + e.name;
        p.measured_spread = -1;
        if (e.samples_us.size() >= 3 && e.median_us > 0) {
          std::vector<double> v = e.samples_us;
          std::sort(v.begin(), v.end());
          auto at = [&](double q) { return v[size_t(q * double(v.size() - 1) + 0.5)]; };
          p.measured_spread = (at(0.9) - at(0.1)) / e.median_us;
        }
        graph = is_graph;
      }
  }
}

nlohmann::json Plan::to_json() const {
  nlohmann::json j;
  j["model"] = request.model_name;
  j["phase"] = request.phase;
  j["point"] = {{"batch", request.shape.batch}, {"q_len", request.shape.q_len}, {"kv_len", request.shape.kv_len}};
  j["gpu_budget_bytes"] = request.gpu_budget_bytes > 0 ? request.gpu_budget_bytes : ceilings.gpu_memory_bytes;
  j["ceilings"] = {{"source", ceilings.source},
                   {"gpu", ceilings.gpu_name},
                   {"cpu", ceilings.cpu_name},
                   {"gpu_flops", ceilings.gpu_flops},
                   {"gpu_bytes_per_s", ceilings.gpu_bytes_per_s},
                   {"gpu_kernel_s", ceilings.gpu_kernel_s},
                   {"gpu_weight_stream_bytes_per_s", ceilings.gpu_weight_stream_bytes_per_s},
                   {"h2d_bytes_per_s", ceilings.h2d_bytes_per_s},
                   {"d2h_bytes_per_s", ceilings.d2h_bytes_per_s},
                   {"transfer_s", ceilings.transfer_s},
                   {"host_roundtrip_s", ceilings.host_roundtrip_s},
                   {"cpu_flops", ceilings.cpu_flops},
                   {"cpu_unit", ceilings.cpu_unit},
                   {"cpu_bytes_per_s", ceilings.cpu_bytes_per_s},
                   {"gpu_ridge", ceilings.gpu_ridge()},
                   {"cpu_ridge", ceilings.cpu_ridge()}};
  j["ceilings"]["cpu_expert_efficiency"] = curve_json(ceilings.cpu_expert_efficiency);
  j["ceilings"]["cpu_expert_efficiency_source"] = ceilings.cpu_expert_efficiency_source;
  j["ceilings"]["gpu_expert_efficiency"] = curve_json(ceilings.gpu_expert_efficiency);
  j["ceilings"]["gpu_expert_efficiency_source"] = ceilings.gpu_expert_efficiency_source;
  // One row per op name and kind of layer (ops repeat identically across the MoE layers).
  nlohmann::json ops = nlohmann::json::array();
  std::map<std::string, size_t> row_of;
  for (const OpCost& op : this->ops) {
    const std::string key = op.name;
    auto it = row_of.find(key);
    if (it != row_of.end()) {
      ops[it->second]["count"] = ops[it->second]["count"].get<int>() + 1;
      continue;
    }
    row_of[key] = ops.size();
    nlohmann::json o = {{"op", op.name},
                        {"group", layer::group_name(op.group)},
                        {"count", 1},
                        {"flops", op.flops},
                        {"bytes", op.bytes()},
                        {"weight_bytes", op.weight_bytes},
                        {"kv_bytes", op.kv_bytes},
                        {"intensity", op.intensity()},
                        {"gpu_s", gpu_op_s(op, ceilings)},
                        {"cpu_s", cpu_op_s(op, ceilings)}};
    if (op.group == OpGroup::routed_experts)
      o["tokens_per_expert"] = op.tokens_per_expert, o["active_experts"] = op.active_experts;
    ops.push_back(o);
  }
  j["ops"] = ops;
  nlohmann::json placements = nlohmann::json::array();
  for (const auto& p : this->placements) {
    placements.push_back(
        {{"placement", p.placement},
         {"point", j["point"]},
         {"predicted_s", p.predicted_s},
         {"measured_s", p.measured_s >= 0 ? nlohmann::json(p.measured_s) : nlohmann::json(nullptr)},
         {"measured_by", p.measured_by},
         {"measured_spread", p.measured_spread >= 0 ? nlohmann::json(p.measured_spread) : nlohmann::json(nullptr)},
         {"run_with", run_with(p.placement).empty() ? nlohmann::json(nullptr) : nlohmann::json(run_with(p.placement))},
         {"chosen", p.chosen},
         {"fits", p.fits},
         {"gpu_bytes", p.gpu_bytes},
         {"host_bytes", p.host_bytes},
         {"parts_s", p.parts_s},
         {"reason", p.reason}});
  }
  j["placements"] = placements;
  j["stream_crossover_tokens_per_expert"] = stream_crossover;
  return j;
}

std::string Plan::to_markdown() const {
  std::ostringstream md;
  const auto& s = request.shape;
  md << "# Offload plan: " << request.model_name << ", " << request.phase << ", batch " << s.batch << ", q_len "
     << s.q_len << ", kv_len " << s.kv_len << "\n\n";
  md << "Ceilings (" << ceilings.source << "): " << ceilings.gpu_name << " " << fmt("%.0f", ceilings.gpu_flops / 1e12)
     << " TFLOP/s, " << fmt("%.2f", ceilings.gpu_bytes_per_s / 1e12) << " TB/s (ridge "
     << fmt("%.0f", ceilings.gpu_ridge()) << " FLOP/B), " << fmt("%.1f", ceilings.gpu_kernel_s * 1e6)
     << " us per small kernel, decode-sized GEMMs stream weights at "
     << fmt("%.2f", ceilings.gpu_weight_stream_bytes_per_s / 1e12) << " TB/s; " << ceilings.cpu_name << " ("
     << ceilings.cpu_unit << ") " << fmt("%.1f", ceilings.cpu_flops / 1e12) << " TFLOP/s on " << ceilings.cpu_threads
     << " threads, " << fmt("%.0f", ceilings.cpu_bytes_per_s / 1e9) << " GB/s (ridge "
     << fmt("%.0f", ceilings.cpu_ridge()) << "); link " << fmt("%.0f", ceilings.h2d_bytes_per_s / 1e9) << " GB/s, "
     << fmt("%.1f", ceilings.transfer_s * 1e6) << " us per small copy, " << fmt("%.1f", ceilings.host_roundtrip_s * 1e6)
     << " us per host round trip.\n\n";
  curve_markdown(md, "CPU routed experts at the engine's measured fraction of that roofline",
                 ceilings.cpu_expert_efficiency_source, ceilings.cpu_expert_efficiency, ops);
  curve_markdown(md, "GPU routed experts at the grouped GEMMs' measured fraction of the GPU's roofline",
                 ceilings.gpu_expert_efficiency_source, ceilings.gpu_expert_efficiency, ops);
  md << "## Placements\n\n| placement | predicted ms | measured ms | predicted / measured | GPU memory | host memory | "
        "chosen | why | run it with |\n"
        "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& p : placements) {
    const bool measured = p.measured_s >= 0;
    const std::string noisy = p.measured_spread > kNoisySpread
                                  ? fmt(" (noisy: p10-p90 spans %.0f%% of the median)", 100 * p.measured_spread)
                                  : "";
    md << "| " << p.placement << " | " << fmt("%.3f", p.predicted_s * 1e3) << " | "
       << (measured ? fmt("%.3f", p.measured_s * 1e3) + noisy : "-") << " | "
       << (measured ? fmt("%.2f", p.predicted_s / p.measured_s) : "-") << " | " << gb(p.gpu_bytes) << " | "
       << gb(p.host_bytes) << " | " << (p.chosen ? "**yes**" : "") << " | " << p.reason << " | "
       << (run_with(p.placement).empty() ? "(predicted only: dslab runs no all-CPU step)"
                                         : "`" + run_with(p.placement) + "`")
       << " |\n";
  }
  md << "\nRouted experts: running one on the GPU with its weights copied over the link beats running it on the CPU "
        "from ";
  if (stream_crossover > 0)
    md << fmt("%.0f", stream_crossover) << " tokens per expert (this step: "
       << fmt("%.1f",
              [&] {
                for (const auto& op : ops)
                  if (op.group == OpGroup::routed_experts) return op.tokens_per_expert;
                return 0.0;
              }())
       << ").\n";
  else
    md << "no batch up to 65536 tokens per expert.\n";
  md << "\n## Ops (per instance; count = instances in the step)\n\n| op | count | GFLOP | MB | FLOP/B | GPU us | CPU "
        "us | why |\n"
        "|---|---|---|---|---|---|---|---|\n";
  std::map<std::string, int> count;
  for (const OpCost& op : ops) ++count[op.name];
  std::map<std::string, bool> shown;
  for (const OpCost& op : ops) {
    if (shown[op.name]) continue;
    shown[op.name] = true;
    md << "| " << op.name << " | " << count[op.name] << " | " << fmt("%.3g", op.flops / 1e9) << " | "
       << fmt("%.3g", op.bytes() / 1e6) << " | " << fmt("%.1f", op.intensity()) << " | "
       << fmt("%.1f", gpu_op_s(op, ceilings) * 1e6) << " | " << fmt("%.1f", cpu_op_s(op, ceilings) * 1e6) << " | "
       << (op.bytes() > 0 ? why_op(op, ceilings, true) : "") << " |\n";
  }
  return md.str();
}

namespace {

const char* kPlanHelp = R"(usage: dslab plan --model NAME|PATH [options]

Where each op group of a DeepSeek step should run, CPU or GPU: every op's FLOPs, bytes and intensity (the layer's
op cost model) against a machine's calibrated ceilings (`dslab calibrate` on that machine: GPU GEMM rate, HBM,
small-kernel cost, pinned link both ways; CPU matrix-unit rate and DRAM), candidate placements (all on the GPU;
KTransformers' split: attention and shared experts on the GPU, routed experts on the CPU; the N hottest experts or
the first N layers' experts on the GPU; routed experts' weights streamed to the GPU; all on the CPU), a capacity
check of weights + KV cache against the GPU budget, and the predicted step time of each. Writes plan.json and
plan.md (JSON names: placements[].placement, point, predicted_s, measured_s, chosen) and prints the Markdown.

options:
  --model M          model name (models/) or config.json path (required)
  --phase P          decode (default) | prefill
  --batch N          requests (default 1)
  --q-len N          new tokens per request (default: 1 for decode, 1024 for prefill)
  --kv-len N         tokens already cached per request (default 4096 for decode, 0 for prefill)
  --gpu-budget GB    GPU memory to plan for (default: the calibrated GPU's memory)
  --cpu-threads N    CPU threads the experts get (default: the calibration's; rates from cpu.by_threads)
  --machine FILE     ceilings (default: dslab calibrate's output on this machine)
  --measured FILE    results.json of layer/deepseek/cuda runs (layers all) at the same point: fills measured_s of
                     all_gpu (moe/grouped/cuda), streamed_experts (moe/grouped/cuda, gpu_experts streamed),
                     ktransformers (moe/host/cuda), gpu_layers:N (moe/host/cuda with gpu_experts keeping N MoE
                     layers' experts on the GPU) and hot_experts:N (moe/host/cuda, gpu_experts hot:N: each layer's N
                     hottest experts on the GPU); a split that was run is predicted too; all_cpu has no runnable
                     layer; runs with a cpu_threads axis count only for a plan with that --cpu-threads; a run
                     whose samples' p10-p90 span more than 25% of its median is flagged noisy (measured_spread);
                     repeatable
  --cpu-experts FILE results.json of the CPU MoE engine (moe/auto/cpu) at this model over tokens: the CPU routed
                     experts are predicted at the engine's measured fraction of their roofline at the step's tokens
                     per expert (default: the roofline alone); repeatable
  --gpu-experts FILE results.json of the GPU MoE (moe/grouped/cuda) at this model over tokens: the same for the
                     routed experts the GPU runs; repeatable
  --gpus N           also the placements over N GPUs (decode): attention tensor- or data-parallel, routed experts
                     tensor- or expert-parallel, each step's time predicted from the ops' work on this machine's GPU
                     ceilings plus its collectives (NCCL's bus-bandwidth model at the machine file's calibrated
                     collectives, else NVLink 4's datasheet rate), fastest first; plan.json's gpus.placements has
                     each with its collectives a MoE and a dense layer (kind, bytes, seconds) and the requests
                     of --kv-len cached tokens the GPUs hold beside their weights (kv_capacity_requests)
  --out DIR          where plan.json and plan.md go (default: print only)
)";

int cmd_plan(int argc, char** argv) {
  const Args a = parse_args(argc, argv, 2, {},
                            {"--model", "--phase", "--batch", "--q-len", "--kv-len", "--gpu-budget", "--cpu-threads",
                             "--machine", "--measured", "--cpu-experts", "--gpu-experts", "--gpus", "--out"});
  if (!a.positional.empty())
    throw BadInput("command line: plan: unexpected argument '" + a.positional.front() + "' (see dslab plan --help)");
  if (!a.has("--model"))
    throw BadInput("command line: plan: --model is required (a name under models/ or a config.json path)");
  PlanRequest r;
  const ModelFile f = load_model_file(a.one("--model"));
  r.model_name = f.name;
  r.model = parse_model_config(f.config, f.name, f.path);
  r.phase = a.one("--phase", "decode");
  if (r.phase != "decode" && r.phase != "prefill")
    throw BadInput("command line: --phase: '" + r.phase + "': expected decode or prefill");
  const bool decode = r.phase == "decode";
  r.shape.batch = int64_t(a.number("--batch", 1, 1));
  r.shape.q_len = int64_t(a.number("--q-len", decode ? 1 : 1024, 1));
  r.shape.kv_len = int64_t(a.number("--kv-len", decode ? 4096 : 0, 0));
  r.gpu_budget_bytes = a.number("--gpu-budget", 0, 0) * 1e9;
  const std::string machine_path = a.one("--machine", default_machine_path());
  std::ifstream in(machine_path);
  if (!in)
    throw BadInput(machine_path +
                   ": cannot read the machine file (run `dslab calibrate` first, or pass --machine FILE)");
  nlohmann::json machine;
  try {
    machine = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw BadInput(machine_path + ": not JSON: " + e.what());
  }
  Ceilings ceilings = Ceilings::from_machine(machine, machine_path, int(a.number("--cpu-threads", 0, 0)));
  std::vector<ResultsFile> engine_runs;
  for (const std::string& f : a.all("--cpu-experts")) engine_runs.push_back(load_results(f));
  attach_cpu_expert_runs(ceilings, r.model_name, engine_runs);
  std::vector<ResultsFile> gpu_moe_runs;
  for (const std::string& f : a.all("--gpu-experts")) gpu_moe_runs.push_back(load_results(f));
  attach_gpu_expert_runs(ceilings, r.model_name, gpu_moe_runs);
  r.cpu_threads = int(a.number("--cpu-threads", 0, 0));
  std::vector<ResultsFile> measured;
  for (const std::string& f : a.all("--measured")) measured.push_back(load_results(f));
  r.gpu_layer_counts = measured_gpu_layer_counts(r, measured);
  r.hot_expert_counts = measured_hot_expert_counts(r, measured);
  Plan plan = make_plan(r, ceilings);
  attach_measurements(plan, measured);
  std::string md = plan.to_markdown();
  nlohmann::json plan_json = plan.to_json();
  if (a.has("--gpus")) {
    const int64_t gpus = int64_t(a.number("--gpus", 1, 1));
    if (!decode) throw BadInput("command line: --gpus: the placements over several GPUs are for --phase decode");
    using planner::GpuCeilings, planner::Link, planner::ParallelEstimate, planner::rank_placements;
    GpuCeilings gpu;
    if (ceilings.gpu_flops > 0) gpu.tensor_flops = ceilings.gpu_flops;
    if (ceilings.gpu_bytes_per_s > 0) gpu.hbm_bytes_per_s = ceilings.gpu_bytes_per_s;
    if (ceilings.gpu_kernel_s > 0) gpu.kernel_s = ceilings.gpu_kernel_s;
    const Link link =
        planner::link_from_calibration(machine.value("collectives", nlohmann::json()), ceilings.gpu_name, machine_path);
    std::string links;
    if (link.measured.empty()) {
      links = std::to_string(int(link.bus_bytes_per_s / 1e9)) + " GB/s of bus bandwidth and " +
              std::to_string(int(link.latency_s * 1e6)) +
              " us each (NVLink 4's datasheet rate: the machine file has no collectives measured on several GPUs)";
    } else {
      links = "their latency and bus bandwidth as calibrated on " + link.measured_on + " (";
      for (const auto& [kind, m] : link.measured) {
        char one[96];
        std::snprintf(one, sizeof one, "%s%s %.0f GB/s + %.1f us", kind == link.measured.begin()->first ? "" : ", ",
                      kind.c_str(), m.bus_bytes_per_s / 1e9, m.latency_s * 1e6);
        links += one;
      }
      links += ")";
      if (link.measured.size() < collectives::kinds().size()) links += ", the kinds it lacks at the defaults";
      if (link.measured_gpus != gpus)
        links += "; measured over " + std::to_string(link.measured_gpus) + " GPUs, not " + std::to_string(gpus);
    }
    char line[256];
    md += "\n## Over " + std::to_string(gpus) + " GPUs\n\nEach GPU's share of the ops at " +
          (ceilings.gpu_name.empty() ? std::string("the default ceilings") : ceilings.gpu_name + "'s ceilings") +
          ", plus the collectives at " + links +
          ", fastest first.\n\n"
          "| placement | step ms | compute ms | collectives ms | tokens/s | weights GB / GPU | KV GB / GPU | fits | "
          "requests that fit |\n"
          "|---|---|---|---|---|---|---|---|---|\n";
    nlohmann::json placements = nlohmann::json::array();
    for (const ParallelEstimate& e : rank_placements(r.model, gpus, r.shape.batch, r.shape.kv_len, gpu, link)) {
      const double need = e.weight_bytes_per_gpu + e.kv_bytes_per_gpu, have = ceilings.gpu_memory_bytes;
      const planner::ShardPlan shards = planner::shard_plan(r.model, e.p, r.shape.batch, 1, r.shape.kv_len);
      auto collectives_json = [&](const std::vector<planner::Collective>& list) {
        nlohmann::json out = nlohmann::json::array();
        for (const planner::Collective& c : list)
          out.push_back({{"kind", c.kind},
                         {"where", c.where},
                         {"bytes", c.bytes},
                         {"seconds", planner::collective_seconds(c, gpus, link)}});
        return out;
      };
      // Requests of kv_len the machine's GPUs hold beside their weights (TP attention: every GPU a copy of each)
      const int64_t capacity = have <= 0 ? -1 : planner::kv_capacity_requests(r.model, e.p, have, r.shape.kv_len);
      placements.push_back({{"placement", e.label()},
                            {"dp_attention", e.p.dp_attention},
                            {"ep", e.p.ep},
                            {"step_s", e.step_s},
                            {"compute_s", e.compute_s},
                            {"collectives_s", e.comm_s},
                            {"tokens_per_s", e.tokens_per_s},
                            {"weight_bytes_per_gpu", e.weight_bytes_per_gpu},
                            {"kv_bytes_per_gpu", e.kv_bytes_per_gpu},
                            {"fits", have <= 0 ? nlohmann::json() : nlohmann::json(need <= have)},
                            {"kv_capacity_requests", capacity < 0 ? nlohmann::json() : nlohmann::json(capacity)},
                            {"collectives_per_moe_layer", collectives_json(shards.per_moe_layer)},
                            {"collectives_per_dense_layer", collectives_json(shards.per_dense_layer)}});
      const std::string fits = have <= 0      ? "?"
                               : need <= have ? "yes"
                                              : "no (" + std::to_string(int64_t((need - have) / 1e9)) + " GB over)";
      std::snprintf(line, sizeof line, "| %s | %.3f | %.3f | %.3f | %.0f | %.1f | %.1f | %s | %s |\n",
                    e.label().c_str(), e.step_s * 1e3, e.compute_s * 1e3, e.comm_s * 1e3, e.tokens_per_s,
                    e.weight_bytes_per_gpu / 1e9, e.kv_bytes_per_gpu / 1e9, fits.c_str(),
                    capacity < 0 ? "?" : std::to_string(capacity).c_str());
      md += line;
    }
    plan_json["gpus"] = {
        {"count", gpus},
        {"links", link.measured.empty() ? "NVLink 4 datasheet rate" : "calibrated on " + link.measured_on},
        {"placements", placements}};
  }
  std::fputs(md.c_str(), stdout);
  if (a.has("--out")) {
    const std::filesystem::path dir = a.one("--out");
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "plan.json") << plan_json.dump(2) << "\n";
    std::ofstream(dir / "plan.md") << md;
    std::printf("\nplan: %s\n", (dir / "plan.md").c_str());
  }
  return 0;
}

}  // namespace

DSLAB_REGISTER_COMMAND(plan, "plan",
                       "place a DeepSeek step's ops on CPU or GPU from the op cost model and calibrated ceilings",
                       kPlanHelp, cmd_plan);

}  // namespace dslab::reports
