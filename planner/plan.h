// `dslab plan`: where each op group of a DeepSeek step should run, CPU or GPU, predicted from the layer's op cost
// model (variants/layer/ops.h) and a machine's calibrated ceilings (`dslab calibrate`), KTransformers' question:
// attention and shared experts on the GPU and routed experts on the CPU, or more of the experts on the GPU, or
// their weights streamed to it. Each candidate placement gets a capacity check (weights + KV cache against the
// GPU budget) and a predicted step time; the plan names the fastest that fits, ranks the others, and says why,
// op by op (intensity against each device's ridge point).
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/results_file.h"
#include "variants/common/model_config.h"
#include "variants/layer/ops.h"

namespace dslab::reports {

// A machine's ceilings as `dslab calibrate` measured them; BadInput (naming the file and field) if one is missing.
struct Ceilings {
  std::string gpu_name, cpu_name, source;
  double gpu_flops = 0, gpu_bytes_per_s = 0, gpu_kernel_s = 0, gpu_memory_bytes = 0;
  // Weights streamed by decode-sized GEMMs (gpu.gemv_bytes_per_s); the copy rate where the file predates it.
  double gpu_weight_stream_bytes_per_s = 0;
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0, transfer_s = 0;  // pinned copies; one small copy's fixed cost
  double host_roundtrip_s = 0;  // a host function in the stream waking the CPU's workers (one per CPU-side MoE layer)
  double cpu_flops = 0, cpu_bytes_per_s = 0;
  int cpu_threads = 0;
  std::string cpu_unit;  // amx | avx512: the matrix unit the CPU experts use
  // The CPU MoE engine's measured efficiency (its roofline floor on these ceilings / its measured time) by tokens per
  // expert, ascending, from runs of the engine at the plan's model (attach_cpu_expert_runs): at a few tokens per
  // expert the engine streams weights below the DRAM probe (its compute is not fully overlapped with the loads).
  // Empty: the roofline alone.
  std::vector<std::pair<double, double>> cpu_expert_efficiency;
  std::string cpu_expert_efficiency_source;
  // The same for the GPU's grouped expert GEMMs (moe/grouped/cuda alone at the plan's model, attach_gpu_expert_runs):
  // at prefill sizes they reach a fraction of the GEMM rate. Empty: the roofline alone.
  std::vector<std::pair<double, double>> gpu_expert_efficiency;
  std::string gpu_expert_efficiency_source;
  // Interpolated in log(tokens per expert), held at the ends; 1 when nothing was measured.
  double cpu_expert_efficiency_at(double tokens_per_expert) const;
  double gpu_expert_efficiency_at(double tokens_per_expert) const;
  double gpu_ridge() const { return gpu_flops / gpu_bytes_per_s; }
  double cpu_ridge() const { return cpu_flops / cpu_bytes_per_s; }
  // cpu_threads > 0: the CPU's rates at the most calibrated threads not above it (cpu.by_threads); 0: all threads.
  static Ceilings from_machine(const nlohmann::json& machine, const std::string& source, int cpu_threads = 0);
};

struct PlanRequest {
  std::string model_name;
  ModelConfig model;
  std::string phase = "decode";  // decode | prefill
  layer::StepShape shape;
  double gpu_budget_bytes = 0;   // 0: the GPU's memory
  double host_memory_bytes = 0;  // 0: no host check
  int cpu_threads = 0;           // --cpu-threads (0: the calibration's); runs with a cpu_threads axis match only it
  // Splits measured (layer/deepseek/cuda gpu_experts runs: the first N MoE layers' experts on the GPU) to evaluate as
  // gpu_layers:N beside the planner's own candidates (measured_gpu_layer_counts).
  std::vector<int64_t> gpu_layer_counts;
  std::vector<int64_t>
      hot_expert_counts;  // likewise gpu_experts=hot:N runs, as hot_experts:N (measured_hot_expert_counts)
};

struct PlacementPlan {
  std::string placement;    // all_gpu | ktransformers | hot_experts:N | gpu_layers:N | streamed_experts | all_cpu
  double predicted_s = 0;   // the step
  double measured_s = -1;   // a run of that placement at that point (layer/deepseek/cuda), -1: none
  std::string measured_by;  // which results entry
  // (p90 - p10) / median of that run's samples: above kNoisySpread the run's own samples disagree by more than the
  // 25% a prediction is judged by (a disturbed host), and the plan says so.
  double measured_spread = -1;
  double gpu_bytes = 0, host_bytes = 0;
  bool fits = true;
  std::string why_not, reason;
  std::map<std::string, double> parts_s;  // where the time goes: attention, moe, transfers, ...
  bool chosen = false;
};

constexpr double kNoisySpread = 0.25;

struct Plan {
  PlanRequest request;
  Ceilings ceilings;
  std::vector<layer::OpCost> ops;         // the whole step's
  std::vector<PlacementPlan> placements;  // ranked: fitting ones by predicted time, then the rest
  double stream_crossover = 0;            // stream_crossover_tokens_per_expert for this model and machine
  nlohmann::json to_json() const;
  std::string to_markdown() const;
};

Plan make_plan(const PlanRequest& r, const Ceilings& c);

// How to measure a placement: the layer/deepseek/cuda axes that run it ("" for one dslab predicts but cannot run:
// all_cpu).
std::string run_with(const std::string& placement);

// Fills measured_s from runs of the whole model at the plan's point: layer/deepseek/cuda (or /hybrid), layers all, the
// same batch, q_len and kv_len (and cpu_threads, when the run set it); moe/grouped/cuda is all_gpu, moe/host/cuda is
// ktransformers, gpu_layers:N where the run kept N MoE layers' experts on the GPU (counters.gpu_moe_layers), or
// hot_experts:N where it kept each layer's N hottest (gpu_experts=hot:N); moe/grouped/cuda with gpu_experts=streamed
// is streamed_experts. A graph run is preferred to an eager one.
void attach_measurements(Plan& plan, const std::vector<ResultsFile>& files);
// The N of every gpu_layers:N split those files ran at the request's point (for PlanRequest::gpu_layer_counts).
std::vector<int64_t> measured_gpu_layer_counts(const PlanRequest& r, const std::vector<ResultsFile>& files);
// The N of every hot_experts:N split they ran there (for PlanRequest::hot_expert_counts).
std::vector<int64_t> measured_hot_expert_counts(const PlanRequest& r, const std::vector<ResultsFile>& files);

// Fills c.cpu_expert_efficiency from runs of the CPU MoE engine (moe/auto/cpu; else moe/amx/cpu or moe/avx512/cpu,
// the unit the ceilings name) at `model` in these files. BadInput (naming the files) if they hold none.
void attach_cpu_expert_runs(Ceilings& c, const std::string& model, const std::vector<ResultsFile>& files);

// Fills c.gpu_expert_efficiency from runs of moe/grouped/cuda at `model` (the whole MoE layer's roofline on these
// ceilings over its measured time, by counters.tokens_per_active_expert). BadInput (naming the files) if none.
void attach_gpu_expert_runs(Ceilings& c, const std::string& model, const std::vector<ResultsFile>& files);

// The routed experts of one layer on the CPU (GPU): the roofline time over the engine's measured efficiency there.
double cpu_routed_experts_s(const layer::OpCost& op, const Ceilings& c);
double gpu_routed_experts_s(const layer::OpCost& op, const Ceilings& c);

// The tokens per expert above which running a routed expert on the GPU with its weights copied over the link beats
// running it on the CPU from host memory (each at its roofline; the copy at the pinned link rate): the
// KTransformers question "move the experts for this batch?" answered from the ceilings. 0 if never up to 65536.
double stream_crossover_tokens_per_expert(const ModelConfig& m, const Ceilings& c);

// One op's predicted time on each device: the larger of its FLOPs and bytes over that device's ceiling, plus on the
// GPU the per-kernel cost of the kernels our layer launches for it.
double gpu_op_s(const layer::OpCost& op, const Ceilings& c);
double cpu_op_s(const layer::OpCost& op, const Ceilings& c);

}  // namespace dslab::reports
