#include "planner/offload.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "harness/command.h"
#include "harness/errors.h"
#include "harness/results.h"
#include "harness/sweep.h"
#include "harness/variant.h"
#include "variants/common/model_config.h"

namespace dslab::reports {
namespace {

double ceiling(const nlohmann::json& machine, const char* section, const char* key) {
  if (!machine.contains(section) || !machine[section].is_object()) return 0;
  const auto& s = machine[section];
  return s.contains(key) && s[key].is_number() ? s[key].get<double>() : 0;
}

// An op's axes without the ones that only name how a variant computes it: an axis not every variant of the
// family declares, at that variant's default (page_size=64, len_dist=uniform, kv_dtype=bf16 on the GPU MLA
// forms), and heads equal to the model's own. So mla/a_cc_me/cpu at (batch, kv_len) and mla/fused/cuda at
// the same point with its defaults are two ways of one op.
nlohmann::json op_axes(const std::string& variant, const std::string& model, const nlohmann::json& axes) {
  static std::map<std::string, std::vector<std::pair<std::string, std::string>>> declared;  // variant -> its axes
  static std::map<std::string, std::vector<std::string>> common;                            // family -> shared axes
  static std::map<std::string, int64_t> model_heads;
  const std::string family = variant.substr(0, variant.find('/'));
  if (common.find(family) == common.end()) {
    std::vector<std::string> names;
    bool first = true;
    for (const VariantEntry& v : registered_variants()) {
      if (v.name.substr(0, v.name.find('/')) != family) continue;
      std::vector<std::string> mine;
      for (const auto& [name, def] : v.make()->axes()) mine.push_back(name);
      if (first)
        names = mine;
      else
        names.erase(
            std::remove_if(names.begin(), names.end(),
                           [&](const std::string& n) { return std::find(mine.begin(), mine.end(), n) == mine.end(); }),
            names.end());
      first = false;
    }
    common[family] = names;
  }
  if (declared.find(variant) == declared.end()) {
    const VariantEntry* v = find_variant(variant);
    declared[variant] = v ? v->make()->axes() : std::vector<std::pair<std::string, std::string>>{};
  }
  if (axes.contains("heads") && model_heads.find(model) == model_heads.end()) {
    try {
      const ModelFile f = load_model_file(model);
      model_heads[model] = parse_model_config(f.config, f.name, f.path).num_attention_heads;
    } catch (const std::exception&) {
      model_heads[model] = 0;  // not a model of this checkout: keep heads in the key
    }
  }
  nlohmann::json out = nlohmann::json::object();
  const auto& shared = common[family];
  for (const auto& [k, v] : axes.items()) {
    const std::string text = v.is_string() ? v.get<std::string>() : v.dump();
    bool drop = k == "heads" && v.is_number_integer() && v.get<int64_t>() == model_heads[model];
    if (std::find(shared.begin(), shared.end(), k) == shared.end())
      for (const auto& [name, def] : declared[variant])
        if (name == k && !def.empty() && def == text) drop = true;
    if (!drop) out[k] = v;
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

OffloadPlan plan_offload(const std::vector<ResultsFile>& files, const OffloadOptions& o) {
  nlohmann::json machine;
  for (const auto& f : files)
    if (f.context.contains("machine") && f.context["machine"].is_object() && f.context["machine"].contains("gpu") &&
        f.context["machine"]["gpu"].is_object()) {
      machine = f.context["machine"];
      break;
    }
  if (machine.is_null())
    throw BadInput(files.front().path +
                   ": context.machine: no machine file with CPU and GPU ceilings (expected results of a "
                   "`dslab run --machine FILE` whose FILE `dslab calibrate` wrote on a GPU machine)");
  const double cpu_flops =
      std::max(ceiling(machine, "cpu", "amx_bf16_flops"), ceiling(machine, "cpu", "avx512_bf16_flops"));
  const double cpu_bw = ceiling(machine, "cpu", "dram_read_bytes_per_s");
  const double gpu_flops = ceiling(machine, "gpu", "tensor_bf16_flops"),
               gpu_bw = ceiling(machine, "gpu", "hbm_bytes_per_s");
  OffloadPlan plan;
  plan.cpu_ridge = cpu_bw > 0 ? cpu_flops / cpu_bw : 0;
  plan.gpu_ridge = gpu_bw > 0 ? gpu_flops / gpu_bw : 0;
  plan.cpu_name = machine.value("cpu_model", "CPU");
  plan.gpu_name = machine["gpu"].value("name", "GPU");

  // Group every measured entry into its op: family + model + axes. Each variant is a way to compute the
  // op with its own (FLOPs, bytes); a device gets its best measured way, or the way its roofline favours.
  struct Way {
    double flops, bytes;
    std::string variant;
  };
  std::map<std::string, Placement> ops;
  std::map<std::string, std::vector<Way>> ways;
  std::map<std::string, std::pair<double, double>> cpu_cost, gpu_cost;  // (flops, bytes) behind each time
  std::vector<std::string> order;
  for (const auto& f : files)
    for (const auto& e : f.entries) {
      const std::string family = e.variant.substr(0, e.variant.find('/'));
      const nlohmann::json axes = op_axes(e.variant, e.model, e.axes);
      const std::string key = family + "|" + e.model + "|" + axes.dump();
      auto [it, fresh] = ops.try_emplace(key);
      Placement& p = it->second;
      if (fresh) {
        order.push_back(key);
        p.family = family;
        p.model = e.model;
        p.axes = axes;
        p.op = family + " " + e.model;
        for (const auto& [k, v] : axes.items())
          p.op += " " + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
      }
      const Way way{e.raw.value("flops", 0.0), e.raw.value("bytes", 0.0), e.variant};
      ways[key].push_back(way);
      const double t = e.median_us * 1e-6;
      const bool gpu = e.device == "cuda";
      double& best = gpu ? p.gpu_s : p.cpu_s;
      if (best == 0 || t < best) {
        best = t;
        (gpu ? p.gpu_source : p.cpu_source) = "measured: " + e.variant;
        (gpu ? gpu_cost : cpu_cost)[key] = {way.flops, way.bytes};
      }
    }
  for (const auto& key : order) {
    Placement p = ops[key];
    const bool host_resident =
        std::find(o.host_resident.begin(), o.host_resident.end(), p.family) != o.host_resident.end();
    // Roofline estimate on a device that measured nothing: the best of the op's ways there.
    auto estimate = [&](double flops_rate, double bandwidth, double extra_per_byte, std::pair<double, double>& cost) {
      double best = 0;
      for (const Way& w : ways[key]) {
        if (w.flops <= 0 || w.bytes <= 0) continue;
        const double t = std::max(w.flops / flops_rate, w.bytes / bandwidth) + w.bytes * extra_per_byte;
        if (best == 0 || t < best) {
          best = t;
          cost = {w.flops, w.bytes};
        }
      }
      return best;
    };
    if (p.cpu_s == 0 && cpu_flops > 0 && cpu_bw > 0 && (p.cpu_s = estimate(cpu_flops, cpu_bw, 0, cpu_cost[key])) > 0)
      p.cpu_source = "roofline estimate";
    if (p.gpu_s == 0 && gpu_flops > 0 && gpu_bw > 0 &&
        (p.gpu_s = estimate(gpu_flops, gpu_bw, host_resident ? 1.0 / o.pcie_bytes_per_s : 0.0, gpu_cost[key])) > 0)
      p.gpu_source = host_resident ? "roofline estimate + PCIe" : "roofline estimate";  // its weights cross PCIe first
    p.device = p.gpu_s > 0 && (p.cpu_s == 0 || p.gpu_s < p.cpu_s) ? "gpu" : "cpu";
    const auto& cost = (p.device == "gpu" ? gpu_cost : cpu_cost)[key];
    p.flops = cost.first;
    p.bytes = cost.second;
    p.intensity = p.bytes > 0 ? p.flops / p.bytes : 0;
    const std::string bound_cpu = p.intensity < plan.cpu_ridge ? "memory-bound on the CPU" : "compute-bound on the CPU";
    const std::string bound_gpu = p.intensity < plan.gpu_ridge ? "memory-bound on the GPU" : "compute-bound on the GPU";
    p.reason =
        fmt("%.3g FLOP/byte: ", p.intensity) + bound_cpu + " (ridge " + fmt("%.3g", plan.cpu_ridge) + "), " +
        bound_gpu + " (ridge " + fmt("%.3g", plan.gpu_ridge) + ")" +
        (host_resident ? "; weights in host memory cross PCIe at " + fmt("%.3g GB/s", o.pcie_bytes_per_s * 1e-9) : "");
    plan.ops.push_back(p);
  }
  return plan;
}

nlohmann::json OffloadPlan::to_json() const {
  nlohmann::json j;
  j["cpu"] = {{"name", cpu_name}, {"ridge_flop_per_byte", cpu_ridge}};
  j["gpu"] = {{"name", gpu_name}, {"ridge_flop_per_byte", gpu_ridge}};
  j["ops"] = nlohmann::json::array();
  for (const auto& p : ops)
    j["ops"].push_back({{"op", p.op},
                        {"family", p.family},
                        {"model", p.model},
                        {"axes", p.axes},
                        {"flops", p.flops},
                        {"bytes", p.bytes},
                        {"arithmetic_intensity", p.intensity},
                        {"cpu_time_s", p.cpu_s},
                        {"cpu_source", p.cpu_source},
                        {"gpu_time_s", p.gpu_s},
                        {"gpu_source", p.gpu_source},
                        {"placement", p.device},
                        {"reason", p.reason}});
  return j;
}

namespace {

const char* kOffloadHelp = R"(usage: dslab offload RESULTS.json [RESULTS.json ...] --out DIR [options]

Places each measured op (a family at one model and point: e.g. moe at deepseek-v3, tokens=2048) on the
CPU or the GPU by arithmetic intensity and time. A device's time is its best measured variant, else a
roofline estimate from the calibrated ceilings in the results' machine file; an op of a host-resident
family first moves its bytes over PCIe to reach the GPU. Writes DIR/offload.json (read by
scripts/plot.py --offload) and DIR/offload.md.

options:
  --host-resident FAMILY   a family whose weights live in host memory (repeatable; default: moe,
                           the routed experts, as KTransformers keeps them)
  --pcie GBPS              host-to-device bandwidth in GB/s (default 25: PCIe 4.0 x16 as measured in practice)
)";

int cmd_offload(int argc, char** argv) {
  const Args a = parse_args(argc, argv, 2, {}, {"--out", "--host-resident", "--pcie"});
  if (a.positional.empty())
    throw BadInput("command line: expected at least one RESULTS.json (see dslab offload --help)");
  const std::string out = a.one("--out");
  if (out.empty()) throw BadInput("command line: --out: missing (expected the folder for offload.json)");
  OffloadOptions o;
  if (a.has("--host-resident")) o.host_resident = a.all("--host-resident");
  o.pcie_bytes_per_s = a.number("--pcie", 25, 1e-3) * 1e9;
  std::vector<ResultsFile> files;
  for (const auto& p : a.positional) files.push_back(load_results(p));
  const OffloadPlan plan = plan_offload(files, o);
  std::ostringstream md;
  md << "# Offload plan\n\nCPU: " << plan.cpu_name << " (ridge " << fmt("%.3g", plan.cpu_ridge)
     << " FLOP/byte); GPU: " << plan.gpu_name << " (ridge " << fmt("%.3g", plan.gpu_ridge)
     << " FLOP/byte). Host-resident families:";
  for (const auto& h : o.host_resident) md << " " << h;
  md << "; PCIe " << fmt("%.3g", o.pcie_bytes_per_s * 1e-9) << " GB/s.\n\n";
  md << "| op | FLOP/byte | CPU time | source | GPU time | source | placement | why "
        "|\n|---|---:|---:|---|---:|---|---|---|\n";
  for (const auto& p : plan.ops)
    md << "| " << p.op << " | " << fmt("%.3g", p.intensity) << " | " << fmt("%.3g ms", p.cpu_s * 1e3) << " | "
       << p.cpu_source << " | " << fmt("%.3g ms", p.gpu_s * 1e3) << " | " << p.gpu_source << " | **" << p.device
       << "** | " << p.reason << " |\n";
  write_json_atomically(out + "/offload.json", plan.to_json());
  {
    std::ofstream f(out + "/offload.md.tmp");
    f << md.str();
  }
  std::filesystem::rename(out + "/offload.md.tmp", out + "/offload.md");
  std::printf("offload plan: %s/offload.json, %s/offload.md (%zu ops)\n", out.c_str(), out.c_str(), plan.ops.size());
  return 0;
}

}  // namespace

DSLAB_REGISTER_COMMAND(offload, "offload", "place each measured op on CPU or GPU by arithmetic intensity and time",
                       kOffloadHelp, cmd_offload);

}  // namespace dslab::reports
