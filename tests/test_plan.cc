// `dslab plan`: ceilings read from a machine file (each missing one named), per-op device times from the
// rooflines, capacity checks, and the choice of the fastest placement that fits.
#include <gtest/gtest.h>

#include "harness/errors.h"
#include "harness/sweep.h"
#include "harness/variant.h"
#include "planner/plan.h"
#include "tests/test_util.h"
#include "variants/mla/mla.h"
#include "variants/moe/moe.h"

namespace dslab {
namespace {

// An H100-like GPU and a 16-core AMX host (round numbers, so the expected times below are easy to derive).
nlohmann::json machine() {
  return {{"cpu_model", "test CPU"},
          {"cpu",
           {{"amx_bf16_flops", 10e12}, {"avx512_bf16_flops", 1e12}, {"dram_read_bytes_per_s", 100e9}, {"threads", 16}}},
          {"gpu",
           {{"name", "test GPU"},
            {"tensor_bf16_flops", 800e12},
            {"hbm_bytes_per_s", 3e12},
            {"small_kernel_s", 3e-6},
            {"h2d_pinned_bytes_per_s", 50e9},
            {"d2h_pinned_bytes_per_s", 50e9},
            {"h2d_4k_s", 5e-6},
            {"host_roundtrip_s", 20e-6},
            {"memory_bytes", 80e9}}}};
}

reports::PlanRequest request(const char* model, int64_t batch, int64_t q_len, int64_t kv_len, double budget_gb) {
  reports::PlanRequest r;
  r.model_name = model;
  r.model = test::model(model);
  r.phase = q_len > 1 ? "prefill" : "decode";
  r.shape.batch = batch, r.shape.q_len = q_len, r.shape.kv_len = kv_len;
  r.gpu_budget_bytes = budget_gb * 1e9;
  return r;
}

TEST(Plan, CeilingsComeFromTheMachineFileAndAMissingOneIsNamed) {
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  EXPECT_EQ(c.cpu_unit, "amx");
  EXPECT_DOUBLE_EQ(c.cpu_flops, 10e12);
  EXPECT_DOUBLE_EQ(c.gpu_ridge(), 800e12 / 3e12);
  auto old = machine();
  old["gpu"].erase("small_kernel_s");
  try {
    reports::Ceilings::from_machine(old, "m.json");
    FAIL() << "a machine file without small_kernel_s must be refused";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("m.json: gpu.small_kernel_s"), std::string::npos) << e.what();
  }
  auto no_amx = machine();
  no_amx["cpu"]["amx_bf16_flops"] = nullptr;
  EXPECT_EQ(reports::Ceilings::from_machine(no_amx, "m.json").cpu_unit, "avx512");
}

TEST(Plan, FewerCpuThreadsTakeTheirCalibratedRates) {
  auto m = machine();
  m["cpu"]["by_threads"] = {{{"threads", 1}, {"amx_bf16_flops", 1e12}, {"dram_read_bytes_per_s", 20e9}},
                            {{"threads", 8}, {"amx_bf16_flops", 6e12}, {"dram_read_bytes_per_s", 80e9}},
                            {{"threads", 16}, {"amx_bf16_flops", 10e12}, {"dram_read_bytes_per_s", 100e9}}};
  const auto c = reports::Ceilings::from_machine(m, "m.json", 12);  // the most calibrated threads not above 12: 8
  EXPECT_EQ(c.cpu_threads, 8);
  EXPECT_DOUBLE_EQ(c.cpu_flops, 6e12);
  EXPECT_DOUBLE_EQ(c.cpu_bytes_per_s, 80e9);
  EXPECT_DOUBLE_EQ(reports::Ceilings::from_machine(m, "m.json").cpu_bytes_per_s, 100e9);  // default: all threads
  EXPECT_THROW(reports::Ceilings::from_machine(machine(), "m.json", 4), BadInput);        // no by_threads in the file
}

TEST(Plan, OpTimesAreRooflinesPlusTheKernelsFixedCost) {
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  layer::OpCost op;
  op.flops = 1e9, op.weight_bytes = 1e9, op.gpu_kernels = 3;
  EXPECT_DOUBLE_EQ(reports::gpu_op_s(op, c), 1e9 / 3e12 + 3 * 3e-6);  // memory-bound on the GPU
  EXPECT_DOUBLE_EQ(reports::cpu_op_s(op, c), 1e9 / 100e9);
  op.flops = 1e14;  // compute-bound on both
  EXPECT_DOUBLE_EQ(reports::gpu_op_s(op, c), 1e14 / 800e12 + 9e-6);
  EXPECT_DOUBLE_EQ(reports::cpu_op_s(op, c), 1e14 / 10e12);
}

TEST(Plan, DecodeSizedGemmsStreamWeightsAtTheGemvRate) {
  auto m = machine();
  m["gpu"]["gemv_bytes_per_s"] = 1.5e12;
  const auto c = reports::Ceilings::from_machine(m, "m.json");
  layer::OpCost gemv;  // one row: 1 FLOP per byte
  gemv.flops = 1e9, gemv.weight_bytes = 1e9, gemv.act_bytes = 3e6, gemv.gpu_kernels = 1;
  EXPECT_DOUBLE_EQ(reports::gpu_op_s(gemv, c), 1e9 / 1.5e12 + 3e6 / 3e12 + 3e-6);
  layer::OpCost gemm = gemv;  // 256 rows: compute-bound, the GEMV rate does not apply
  gemm.flops = 256e9;
  EXPECT_DOUBLE_EQ(reports::gpu_op_s(gemm, c), std::max(256e9 / 800e12, (1e9 + 3e6) / 3e12) + 3e-6);
  // A machine file from before the GEMV probe: the copy rate, as before.
  EXPECT_DOUBLE_EQ(reports::Ceilings::from_machine(machine(), "m.json").gpu_weight_stream_bytes_per_s, 3e12);
}

TEST(Plan, ChoosesTheFastestPlacementThatFits) {
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  // V2-Lite (31 GB of bf16 weights) fits an 80 GB GPU whole: all on the GPU, far ahead of streaming its experts
  // over a 50 GB/s link or computing them at the host's 100 GB/s.
  const auto big = reports::make_plan(request("deepseek-v2-lite", 1, 1, 4096, 80), c);
  ASSERT_TRUE(big.placements.front().chosen);
  EXPECT_EQ(big.placements.front().placement, "all_gpu");
  // With 12 GB it does not: every choice that fits keeps some experts on the host, all_gpu is refused with why.
  const auto small = reports::make_plan(request("deepseek-v2-lite", 1, 1, 4096, 12), c);
  ASSERT_TRUE(small.placements.front().chosen);
  EXPECT_NE(small.placements.front().placement, "all_gpu");
  EXPECT_LE(small.placements.front().gpu_bytes, 12e9);
  bool refused = false;
  for (const auto& p : small.placements) {
    if (p.placement == "all_gpu") refused = !p.fits && p.why_not.find("budget 12.0 GB") != std::string::npos;
    if (p.fits) EXPECT_GE(p.predicted_s, small.placements.front().predicted_s) << p.placement;
  }
  EXPECT_TRUE(refused);
  int chosen = 0;
  for (const auto& p : small.placements) chosen += p.chosen;
  EXPECT_EQ(chosen, 1);
}

TEST(Plan, AllGpuDecodeIsTheWeightsOverBandwidthPlusEachKernel) {
  // Batch 1: nothing is compute-bound, so all_gpu predicts sum(bytes) / HBM + kernels x small-kernel cost.
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  const auto plan = reports::make_plan(request("deepseek-v2-lite", 1, 1, 4096, 80), c);
  double bytes = 0;
  int kernels = 0;
  for (const auto& op : plan.ops) bytes += op.bytes(), kernels += op.gpu_kernels;
  const auto& all_gpu = plan.placements.front();
  EXPECT_NEAR(all_gpu.predicted_s, bytes / 3e12 + kernels * 3e-6, 1e-9);
  const auto j = plan.to_json();
  for (const char* key : {"placement", "point", "predicted_s", "measured_s", "chosen"})
    EXPECT_TRUE(j["placements"][0].contains(key)) << key;
  EXPECT_TRUE(j["placements"][0]["measured_s"].is_null());  // a prediction until a run fills it
}

TEST(Plan, KTransformersSplitOverlapsTheCpuExpertsWithTheGpu) {
  // Routed experts on the CPU: per MoE layer the GPU's shared experts and the CPU's routed ones run side by side,
  // so the step is shorter than their sum, and never shorter than the CPU's share alone.
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  const auto plan = reports::make_plan(request("deepseek-v2-lite", 1, 1, 4096, 80), c);
  const reports::PlacementPlan* kt = nullptr;
  for (const auto& p : plan.placements)
    if (p.placement == "ktransformers") kt = &p;
  ASSERT_NE(kt, nullptr);
  EXPECT_GT(kt->parts_s.at("cpu experts (inside moe)"), 0);
  EXPECT_GE(kt->parts_s.at("moe"),
            kt->parts_s.at("cpu experts (inside moe)") + kt->parts_s.at("transfers (inside moe)") - 1e-12);
}

TEST(Plan, StreamingExpertsPaysWhereTheCpuTurnsComputeBound) {
  // An expert's weights (6 H I bytes) cross a 50 GB/s link in the time a 10 TFLOP/s CPU does 6 H I t FLOPs when
  // t = 10e12 / 50e9 = 200 tokens; below that the CPU (reading the same bytes at 100 GB/s) is faster.
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  EXPECT_NEAR(reports::stream_crossover_tokens_per_expert(test::model("deepseek-v3"), c), 200, 2);
  auto slow = machine();
  slow["gpu"]["h2d_pinned_bytes_per_s"] = 1e9;  // a link 50x slower moves the crossover 50x
  EXPECT_NEAR(reports::stream_crossover_tokens_per_expert(test::model("deepseek-v3"),
                                                          reports::Ceilings::from_machine(slow, "m.json")),
              10000, 100);
}

TEST(Plan, MeasuredStepsFillTheirPlacementsGraphFirst) {
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  auto plan = reports::make_plan(request("deepseek-v2-lite", 4, 1, 4096, 80), c);
  reports::ResultsFile f;
  f.path = "r.json";
  auto entry = [](const char* moe, const char* executor, int64_t batch, double us) {
    reports::Entry e;
    e.variant = "layer/deepseek/cuda";
    e.model = "deepseek-v2-lite";
    e.name = std::string(moe) + " " + executor;
    e.axes = {{"batch", batch},  {"q_len", 1}, {"kv_len", 4096},
              {"layers", "all"}, {"moe", moe}, {"executor", executor}};
    e.median_us = us;
    return e;
  };
  f.entries = {entry("moe/grouped/cuda", "eager", 4, 7000), entry("moe/grouped/cuda", "graph", 4, 6000),
               entry("moe/host/cuda", "graph", 4, 110000), entry("moe/host/cuda", "graph", 1, 40000),
               entry("moe/loop/cuda", "eager", 4, 9000)};
  reports::attach_measurements(plan, {f});
  int measured = 0;
  for (const auto& p : plan.placements) {
    if (p.placement == "all_gpu")
      EXPECT_DOUBLE_EQ(p.measured_s, 6000e-6);  // the graph run, not the eager one
    else if (p.placement == "ktransformers")
      EXPECT_DOUBLE_EQ(p.measured_s, 110000e-6);  // batch 4's, not batch 1's
    else
      EXPECT_LT(p.measured_s, 0) << p.placement;
    measured += p.measured_s >= 0;
  }
  EXPECT_EQ(measured, 2);
  EXPECT_TRUE(plan.to_json()["placements"][0]["measured_s"].is_number());
}

TEST(Plan, AllGpuCapacityIsTheWeightsTheCacheAndTheLayersScratch) {
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  for (int64_t q_len : {1, 1024}) {
    SCOPED_TRACE(q_len);
    const auto r = request("deepseek-v2-lite", 1, q_len, q_len == 1 ? 4096 : 0, 80);
    const auto plan = reports::make_plan(r, c);
    const ModelConfig& m = r.model;
    const double H = double(m.hidden_size), E = double(m.n_routed_experts), I = double(m.moe_intermediate_size);
    double weights = 0;
    for (const auto& op : plan.ops) {
      if (op.group == layer::OpGroup::routed_experts)
        weights += E * 3 * H * I * 2;  // every expert, not the reached ones
      else if (op.group == layer::OpGroup::embedding)
        weights += double(m.vocab_size) * H * 2;  // the whole table
      else
        weights += op.weight_bytes;
    }
    const double kv = double(m.num_hidden_layers) * double(r.shape.kv_len + q_len) * 576 * 2;
    layer::StepScratch s;
    s.attn.heads = m.num_attention_heads, s.attn.batch = 1, s.attn.q_len = q_len, s.attn.kv_len = r.shape.kv_len;
    s.fused = q_len == 1;  // the sweeps' attention: the fused kernel for decode, a_cc_me for the prefill chunk
    s.max_keys = r.shape.kv_len + q_len;
    s.layers = m.num_hidden_layers, s.moe_layers = m.num_hidden_layers - m.first_k_dense_replace, s.whole = true;
    const double scratch = layer::gpu_step_scratch_bytes(m, s);
    // One arena for every op's forward scratch: at a 1K prefill it holds the largest op's (a_cc_me's scores and
    // probabilities alone are heads x 1K x 1K x 6 bytes), once, not once per layer.
    const double arena = layer::gpu_step_arena_bytes(m, s);
    if (q_len == 1024) EXPECT_GT(arena, 16.0 * 1024 * 1024 * 6);
    EXPECT_LT(arena, 0.05 * double(s.layers) *
                         (mla::gpu_forward_scratch_bytes(m, s.algo, s.attn, s.max_keys, s.fused) +
                          moe::gpu_moe_forward_scratch_bytes(m, q_len)));
    EXPECT_GT(scratch, arena);
    for (const auto& p : plan.placements)
      if (p.placement == "all_gpu") EXPECT_NEAR(p.gpu_bytes, weights + kv + scratch, 1e6);
  }
}

// The planner's capacity of each runnable placement is what layer/deepseek/cuda sizes its memory by for the same
// step (one memory model for both), here the ones a 24 GB budget and a 4K prefill bring in: a layer split and
// the experts streamed through two staging sets.
TEST(Plan, RunnablePlacementsNeedWhatTheLayerAllocates) {
  const VariantEntry* entry = find_variant("layer/deepseek/cuda");
  if (!entry) GTEST_SKIP() << "layer/deepseek/cuda is not built";
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  const auto r = request("deepseek-v2-lite", 1, 4096, 0, 24);
  const auto plan = reports::make_plan(r, c);
  const ModelFile model = load_model_file("deepseek-v2-lite");
  auto layer = entry->make();
  int checked = 0;
  for (const auto& p : plan.placements) {
    std::string moe = "moe/host/cuda", gpu_experts;
    if (p.placement == "streamed_experts")
      moe = "moe/grouped/cuda", gpu_experts = "streamed";
    else if (p.placement == "ktransformers")
      gpu_experts = "none";
    else if (p.placement.rfind("gpu_layers:", 0) == 0)
      gpu_experts = "layers:" + p.placement.substr(11);
    else if (p.placement.rfind("hot_experts:", 0) == 0)
      gpu_experts = "hot:" + p.placement.substr(12);
    else
      continue;
    SCOPED_TRACE(p.placement);
    Point pt;
    for (const auto& [axis, v] : std::vector<std::pair<const char*, int64_t>>{
             {"batch", 1}, {"q_len", 4096}, {"kv_len", 0}, {"steps", 1}, {"page_size", 64}})
      pt.set(axis, {std::to_string(v), v, true});
    for (const auto& [axis, v] : std::vector<std::pair<const char*, std::string>>{{"layers", "all"},
                                                                                  {"attn", "mla/a_cc_me/cuda"},
                                                                                  {"moe", moe},
                                                                                  {"executor", "graph"},
                                                                                  {"kv_dtype", "bf16"},
                                                                                  {"proj", "own"},
                                                                                  {"kv_splits", "auto"},
                                                                                  {"pdl", "on"},
                                                                                  {"gpu_experts", gpu_experts},
                                                                                  {"gpu_budget", "all"}})
      pt.set(axis, {v, 0, false});
    EXPECT_NEAR(layer->device_memory_bytes(model, pt), p.gpu_bytes, 0.1e9);
    ++checked;
  }
  EXPECT_GE(checked, 6);  // ktransformers, streamed, a layer split, three hot sets
}

TEST(Plan, SplitRunsAreMeasuredAsTheirGpuLayersPlacement) {
  const auto c = reports::Ceilings::from_machine(machine(), "m.json");
  auto r = request("deepseek-v2-lite", 1, 1, 4096, 80);
  reports::ResultsFile f;
  f.path = "r.json";
  auto entry = [](double resident, const char* threads, double us) {
    reports::Entry e;
    e.variant = "layer/deepseek/cuda";
    e.model = "deepseek-v2-lite";
    e.name = "host " + std::to_string(resident) + " " + threads;
    e.axes = {{"batch", 1},         {"q_len", 1}, {"kv_len", 4096}, {"layers", "all"}, {"moe", "moe/host/cuda"},
              {"executor", "graph"}};
    if (*threads) e.axes["cpu_threads"] = std::stoi(threads);
    e.raw = {{"counters", {{"gpu_moe_layers", resident}}}};
    e.median_us = us;
    return e;
  };
  // V2-Lite has 26 MoE layers: 7 resident is a split the planner's budget rule would not propose at 80 GB.
  f.entries = {entry(0, "", 40000), entry(7, "", 30000), entry(7, "12", 35000), entry(0, "12", 45000)};
  r.gpu_layer_counts = reports::measured_gpu_layer_counts(r, {f});
  ASSERT_EQ(r.gpu_layer_counts, std::vector<int64_t>{7});  // (the cpu_threads 12 runs belong to another plan)
  auto plan = reports::make_plan(r, c);
  reports::attach_measurements(plan, {f});
  std::map<std::string, double> measured;
  for (const auto& p : plan.placements)
    if (p.measured_s >= 0) measured[p.placement] = p.measured_s;
  EXPECT_EQ(measured, (std::map<std::string, double>{{"gpu_layers:7", 30000 * 1e-6}, {"ktransformers", 40000 * 1e-6}}));

  r.cpu_threads = 12;  // a plan for 12 CPU threads takes only the runs that had 12
  plan = reports::make_plan(r, c);
  reports::attach_measurements(plan, {f});
  measured.clear();
  for (const auto& p : plan.placements)
    if (p.measured_s >= 0) measured[p.placement] = p.measured_s;
  EXPECT_EQ(measured, (std::map<std::string, double>{{"gpu_layers:7", 35000 * 1e-6}, {"ktransformers", 45000 * 1e-6}}));
  // Each placement says how to run it, so a plan's choice can be measured (the axes parse back to the same placement).
  EXPECT_EQ(reports::run_with("gpu_layers:7"), "layer/deepseek/hybrid layers=all gpu_experts=layers:7");
  EXPECT_EQ(reports::run_with("all_gpu"), "layer/deepseek/cuda layers=all moe=moe/grouped/cuda");
  EXPECT_EQ(reports::run_with("hot_experts:8"), "layer/deepseek/hybrid layers=all gpu_experts=hot:8");
  EXPECT_EQ(reports::run_with("all_cpu"), "");
  EXPECT_NE(plan.to_markdown().find("`layer/deepseek/hybrid layers=all gpu_experts=layers:7`"), std::string::npos);

  // A hot-experts run (gpu_experts=hot:12, not one of the planner's own N) is measured as hot_experts:12 and predicted.
  auto hot = entry(0, "", 33000);
  hot.variant = "layer/deepseek/hybrid";  // (the hybrid layer's name for the same runs)
  hot.axes["gpu_experts"] = "hot:12";
  f.entries.push_back(hot);
  r.cpu_threads = 0;
  r.hot_expert_counts = reports::measured_hot_expert_counts(r, {f});
  ASSERT_EQ(r.hot_expert_counts, std::vector<int64_t>{12});
  plan = reports::make_plan(r, c);
  reports::attach_measurements(plan, {f});
  const auto it = std::find_if(plan.placements.begin(), plan.placements.end(),
                               [](const auto& p) { return p.placement == "hot_experts:12"; });
  ASSERT_NE(it, plan.placements.end());
  EXPECT_EQ(it->measured_s, 33000 * 1e-6);
  EXPECT_GT(it->predicted_s, 0);
  EXPECT_EQ(it->measured_spread, -1);  // (one sample: no spread)
  // A disturbed run (p10-p90 over 25% of the median) is measured, and the plan says it is noisy.
  f.entries.back().samples_us = {28000, 28500, 29000, 29500, 30000, 45000, 50000, 60000, 66000, 33000, 31000};
  reports::attach_measurements(plan, {f});
  const auto noisy = std::find_if(plan.placements.begin(), plan.placements.end(),
                                  [](const auto& p) { return p.placement == "hot_experts:12"; });
  EXPECT_GT(noisy->measured_spread, reports::kNoisySpread);
  EXPECT_NE(plan.to_markdown().find("(noisy: p10-p90 spans"), std::string::npos);
}

// A run of the CPU MoE engine: floor (on machine()'s 100 GB/s, 10 TFLOP/s) over time is its efficiency.
reports::Entry engine_entry(const char* variant, const char* model, double tokens_per_expert, double bytes, double us) {
  reports::Entry e;
  e.variant = variant;
  e.model = model;
  e.name = std::string(variant) + "/" + std::to_string(tokens_per_expert);
  e.median_us = us;
  e.raw = {{"flops", bytes}, {"bytes", bytes}, {"counters", {{"tokens_per_expert", tokens_per_expert}}}};
  return e;
}

// Where a placement's predicted time goes: one of its parts (-1 if the plan has no such placement).
double part_s(const reports::Plan& p, const std::string& placement, const char* part) {
  for (const auto& x : p.placements)
    if (x.placement == placement) return x.parts_s.at(part);
  return -1.0;
}

TEST(Plan, CpuExpertsRunAtTheEnginesMeasuredEfficiency) {
  auto c = reports::Ceilings::from_machine(machine(), "m.json");
  EXPECT_DOUBLE_EQ(c.cpu_expert_efficiency_at(3), 1.0);  // nothing measured: the roofline
  reports::ResultsFile f;
  f.path = "engine.json";
  // 100 MB at 100 GB/s is 1 ms: 2 ms measured is 0.5 of the roofline, 1.25 ms is 0.8.
  f.entries = {engine_entry("moe/auto/cpu", "deepseek-v2-lite", 1, 100e6, 2000),
               engine_entry("moe/auto/cpu", "deepseek-v2-lite", 4, 100e6, 1250),
               engine_entry("moe/amx/cpu", "deepseek-v2-lite", 1, 100e6, 10000),  // auto preferred over the unit's own
               engine_entry("moe/auto/cpu", "deepseek-v3", 1, 100e6, 10000)};     // another model's
  reports::attach_cpu_expert_runs(c, "deepseek-v2-lite", {f});
  ASSERT_EQ(c.cpu_expert_efficiency.size(), 2u);
  EXPECT_NEAR(c.cpu_expert_efficiency_at(1), 0.5, 1e-12);
  EXPECT_NEAR(c.cpu_expert_efficiency_at(2), 0.65, 1e-12);   // halfway in log(tokens per expert)
  EXPECT_NEAR(c.cpu_expert_efficiency_at(0.5), 0.5, 1e-12);  // held at the ends
  EXPECT_NEAR(c.cpu_expert_efficiency_at(100), 0.8, 1e-12);
  // The routed experts on the CPU take 1/efficiency of their roofline time; the rest of the plan is unchanged.
  const auto plain = reports::make_plan(request("deepseek-v2-lite", 1, 1, 4096, 80),
                                        reports::Ceilings::from_machine(machine(), "m.json"));
  const auto measured = reports::make_plan(request("deepseek-v2-lite", 1, 1, 4096, 80), c);
  auto cpu_experts = [](const reports::Plan& p) { return part_s(p, "ktransformers", "cpu experts (inside moe)"); };
  double tpe = 0;
  for (const auto& op : measured.ops)
    if (op.group == layer::OpGroup::routed_experts) tpe = op.tokens_per_expert;
  EXPECT_NEAR(cpu_experts(measured), cpu_experts(plain) / c.cpu_expert_efficiency_at(tpe), 1e-12);
  EXPECT_NE(measured.to_markdown().find("engine's measured fraction"), std::string::npos);
}

TEST(Plan, GpuExpertsRunAtTheGroupedGemmsMeasuredEfficiency) {
  auto c = reports::Ceilings::from_machine(machine(), "m.json");
  reports::ResultsFile f;
  f.path = "gpu-moe.json";
  // 8 TFLOP at 800 TFLOP/s is 10 ms (compute-bound on machine()'s GPU): 40 ms measured is 0.25 of the roofline.
  auto gpu_entry = [](const char* variant, double tpe, double us) {
    reports::Entry e;
    e.variant = variant;
    e.model = "deepseek-v2-lite";
    e.name = std::string(variant) + "/" + std::to_string(tpe);
    e.median_us = us;
    e.raw = {{"flops", 8e12}, {"bytes", 1e9}, {"counters", {{"tokens_per_active_expert", tpe}}}};
    return e;
  };
  f.entries = {gpu_entry("moe/grouped/cuda", 96, 40000),
               gpu_entry("moe/loop/cuda", 96, 20000)};  // only the grouped op counts
  reports::attach_gpu_expert_runs(c, "deepseek-v2-lite", {f});
  ASSERT_EQ(c.gpu_expert_efficiency.size(), 1u);
  EXPECT_NEAR(c.gpu_expert_efficiency_at(96), (10e-3 + 3e-6) / 40e-3, 1e-9);  // (+ one small kernel's fixed cost)
  // A prefill chunk all on the GPU: its routed experts take 1/efficiency of their roofline, nothing else changes.
  const auto plain = reports::make_plan(request("deepseek-v2-lite", 1, 1024, 0, 80),
                                        reports::Ceilings::from_machine(machine(), "m.json"));
  const auto measured = reports::make_plan(request("deepseek-v2-lite", 1, 1024, 0, 80), c);
  auto moe_s = [](const reports::Plan& p) { return part_s(p, "all_gpu", "moe"); };
  EXPECT_GT(moe_s(measured), 3 * moe_s(plain));
  EXPECT_NE(measured.to_markdown().find("grouped GEMMs' measured fraction"), std::string::npos);
  reports::ResultsFile none;
  none.path = "cpu-only.json";
  none.entries = {gpu_entry("moe/loop/cuda", 96, 20000)};
  EXPECT_THROW(reports::attach_gpu_expert_runs(c, "deepseek-v2-lite", {none}), BadInput);
}

TEST(Plan, EngineRunsWithoutTheModelAreBadInput) {
  auto c = reports::Ceilings::from_machine(machine(), "m.json");
  reports::ResultsFile f;
  f.path = "engine.json";
  f.entries = {engine_entry("moe/auto/cpu", "deepseek-v3", 1, 100e6, 2000)};
  try {
    reports::attach_cpu_expert_runs(c, "deepseek-v2-lite", {f});
    FAIL() << "runs of another model must be refused";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("engine.json: no moe/auto/cpu"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dslab
