// layer/deepseek/cuda on the GPU (ctest label `gpu`; without a GPU they skip): every attention op x MoE op against
// the fp64 reference stack, the whole tiny model, graph replay against eager launches at every step of a 64-step
// decode with growing lengths (one capture), bucket padding, and a step captured in global mode (no allocation, no
// host synchronisation), with the host-synchronising MoE loop as the control that must fail it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/variant.h"
#include "tests/test_util.h"
#ifdef DSLAB_HAVE_CUDA
#include <cuda_runtime.h>

#include "variants/layer/cuda/deepseek.h"
#endif

namespace dslab {
namespace {

struct LayerCase {
  const char* model;
  const char* layers;
  int64_t batch, kv_len, steps;
  std::string attn, moe;
  const char* executor;
  const char* proj = "own";
  const char* kv_splits = "auto";
  const char* pdl = "on";
  const char* gpu_experts = "none";
  int64_t cpu_threads = 0;  // 0: the axis absent
  const char* gpu_budget = "all";
  int64_t q_len = 1;  // past layer/deepseek/cuda's kVerifiedRows (64): the last layer verified on a sample of the rows
  int64_t page_size = 16;
  const char* block_keys = "auto";
  const char* fused_norms = "off";
};

std::string describe(const LayerCase& c) {
  return std::string(c.model) + " layers " + c.layers + " batch " + std::to_string(c.batch) + " kv_len " +
         std::to_string(c.kv_len) + " steps " + std::to_string(c.steps) + " " + c.attn + " " + c.moe + " " +
         c.executor + " proj " + c.proj + " kv_splits " + c.kv_splits + " pdl " + c.pdl + " gpu_experts " +
         c.gpu_experts + " gpu_budget " + c.gpu_budget +
         (c.cpu_threads ? " cpu_threads " + std::to_string(c.cpu_threads) : "") +
         (c.q_len != 1 ? " q_len " + std::to_string(c.q_len) : "") + " page_size " + std::to_string(c.page_size) +
         " block_keys " + c.block_keys + " fused_norms " + c.fused_norms;
}

Point layer_point(const LayerCase& c) {
  Point p;
  auto integer = [&](const char* axis, int64_t v) { p.set(axis, {std::to_string(v), v, true}); };
  auto text = [&](const char* axis, const std::string& v) { p.set(axis, {v, 0, false}); };
  integer("batch", c.batch);
  integer("q_len", c.q_len);
  integer("kv_len", c.kv_len);
  text("layers", c.layers);
  text("attn", c.attn);
  text("moe", c.moe);
  text("executor", c.executor);
  integer("steps", c.steps);
  integer("page_size", c.page_size);
  text("kv_dtype", "bf16");
  text("proj", c.proj);
  text("kv_splits", c.kv_splits);
  text("block_keys", c.block_keys);
  text("pdl", c.pdl);
  text("fused_norms", c.fused_norms);
  text("gpu_experts", c.gpu_experts);
  text("gpu_budget", c.gpu_budget);
  if (c.cpu_threads) integer("cpu_threads", c.cpu_threads);
  return p;
}

// Prepares and runs the case once and verifies it against the fp64 stack (bf16: within 2e-2, and not exactly 0, so
// the output is really computed); the variant is returned for its counters, null if the case is not supported.
std::unique_ptr<Variant> run_verified(const VariantEntry& entry, const ModelFile& model, const LayerCase& c,
                                      uint64_t seed) {
  auto v = entry.make();
  const Support s = v->supports(model, layer_point(c));
  EXPECT_TRUE(s.ok) << s.reason;
  if (!s.ok) return nullptr;
  v->prepare(model, layer_point(c), seed);
  v->run();
  const Verification r = v->verify();
  EXPECT_LE(r.rel_err, 2e-2);
  EXPECT_GT(r.rel_err, 0.0) << "bf16 arithmetic cannot match fp64 exactly: is the output really computed?";
  std::printf("%-90s rel_err %.3e\n", describe(c).c_str(), r.rel_err);
  return v;
}

// Whether an op's peer library was built in (mla/flashinfer/cuda needs the set-up's FlashInfer headers).
bool available(const char* variant) {
  const VariantEntry* e = find_variant(variant);
  return e && e->make()->available().ok;
}

#define REQUIRE_LAYER()                                                                               \
  const VariantEntry* entry = find_variant("layer/deepseek/cuda");                                    \
  if (!entry) GTEST_SKIP() << "layer/deepseek/cuda is not built (no CUDA toolkit at configure time)"; \
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent

// layer/deepseek/hybrid is the layer with KTransformers' placement by default, and takes only CPU-expert MoE ops
// (checked without a GPU: the refusal comes before the device's).
TEST(LayerHybrid, DefaultsToTheCpuExpertsAndRefusesGpuMoeOps) {
  const VariantEntry* entry = find_variant("layer/deepseek/hybrid");
  if (!entry) GTEST_SKIP() << "layer/deepseek/hybrid is not built (no CUDA toolkit at configure time)";
  auto v = entry->make();
  const auto axes = v->axes();
  const auto moe = std::find_if(axes.begin(), axes.end(), [](const auto& a) { return a.first == "moe"; });
  ASSERT_NE(moe, axes.end());
  EXPECT_EQ(moe->second, "moe/host/cuda");
  LayerCase c{"deepseek-v2-lite", "2", 1, 150, 1, "mla/fused/cuda", "moe/grouped/cuda", "graph"};
  const Support s = v->supports(load_model_file(c.model), layer_point(c));
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("use layer/deepseek/cuda"), std::string::npos) << s.reason;
}

// A sparse attention op is refused by the layers with the reason (their reference attends every key), before any
// device is needed.
TEST(LayerCuda, RefusesSparseAttentionWithTheReason) {
  const VariantEntry* entry = find_variant("layer/deepseek/cuda");
  if (!entry) GTEST_SKIP() << "layer/deepseek/cuda is not built (no CUDA toolkit at configure time)";
  const LayerCase c{"deepseek-v2-lite", "2", 1, 150, 1, "sparse/quest/cuda", "moe/grouped/cuda", "graph"};
  const Support s = entry->make()->supports(load_model_file(c.model), layer_point(c));
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("verify dense attention"), std::string::npos) << s.reason;
}

TEST(GpuLayer, EveryAttentionAndMoeOpMatchesReferenceStack) {
  REQUIRE_LAYER();
  const uint64_t seed = test::fresh_seed();
  std::vector<LayerCase> cases;
  for (const char* attn :
       {"mla/fused/cuda", "mla/a_cc_me/cuda", "mla/a_cc/cuda", "mla/cc/cuda", "mla/cd/cuda", "mla/cd_paged/cuda"})
    for (const char* moe : {"moe/grouped/cuda", "moe/loop/cuda"})
      cases.push_back({"deepseek-v2-lite", "2", 2, 150, 1, attn, moe, "eager"});
  cases.push_back({"deepseek-v2-lite", "2", 2, 150, 1, "mla/fused/cuda", "moe/grouped/cuda", "graph"});
  cases.push_back({"deepseek-v2-lite", "2", 2, 150, 1, "mla/fused/cuda", "moe/grouped/cuda", "graph",
                   "cublas"});  // cuBLAS projections
  cases.push_back(
      {"deepseek-v2-lite", "2", 2, 150, 1, "mla/fused/cuda", "moe/grouped/cuda", "graph", "cublas", "2"});  // 2 splits
  cases.push_back({"deepseek-v2-lite", "2", 2, 150, 1, "mla/fused/cuda", "moe/grouped/cuda", "graph", "cublas", "auto",
                   "off"});  // plain launches
  cases.push_back(
      {"deepseek-v2-lite", "2", 2, 150, 1, "mla/fused/cuda", "moe/grouped/cuda", "eager", "own", "auto", "off"});
  cases.push_back({"tiny", "all", 3, 40, 1, "mla/a_cc_me/cuda", "moe/grouped/cuda",
                   "graph"});  // embedding, dense + MoE layer, LM head
  LayerCase chunk{"tiny", "all", 2, 40, 1, "mla/a_cc_me/cuda", "moe/grouped/cuda",
                  "eager"};  // a 100-token chunk: its last layer
  chunk.q_len = 100;         // and LM head checked on 64 rows
  cases.push_back(chunk);
  if (available("mla/flashinfer/cuda"))
    cases.push_back({"deepseek-v2-lite", "2", 2, 150, 1, "mla/flashinfer/cuda", "moe/grouped/cuda", "graph"});
  if (cpu_info().avx512_bf16) {  // KTransformers' split: routed experts on the CPU, inside the captured step
    cases.push_back({"deepseek-v2-lite", "2", 2, 150, 1, "mla/fused/cuda", "moe/host/cuda", "graph"});
    cases.push_back({"tiny", "all", 3, 40, 1, "mla/a_cc_me/cuda", "moe/host/cuda", "eager"});
  }
  cases.push_back({"tiny", "all", 3, 40, 1, "mla/cd/cuda", "moe/loop/cuda", "eager"});
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(describe(c));
    ASSERT_NE(run_verified(*entry, load_model_file(c.model), c, seed), nullptr);
  }
}

TEST(GpuLayer, SplitStepRunsTheFirstMoeLayersExpertsOnTheGpuAndTheRestOnTheCpu) {
  REQUIRE_LAYER();
  if (!cpu_info().avx512_bf16) GTEST_SKIP() << "moe/host/cuda needs AVX512_BF16";
  const uint64_t seed = test::fresh_seed();
  const ModelFile model = load_model_file("deepseek-v2-lite");
  LayerCase c{"deepseek-v2-lite", "3", 2, 150, 1, "mla/fused/cuda", "moe/host/cuda", "graph"};
  c.gpu_experts = "layers:1";
  c.cpu_threads = 4;
  auto v = run_verified(*entry, model, c, seed);
  ASSERT_NE(v, nullptr);
  const auto counters = v->counters();
  EXPECT_EQ(counters.at("gpu_moe_layers"), 1);
  EXPECT_EQ(counters.at("distinct_moe_weight_sets"), 3);
  EXPECT_EQ(counters.at("cpu_experts_threads"), 4);
  EXPECT_GT(counters.at("cpu_experts_engine_s"), 0);  // the CPU ran the other two layers' experts
  std::printf("%s: CPU experts %.3f ms per step\n", describe(c).c_str(), counters.at("cpu_experts_engine_s") * 1e3);

  // fit under a budget: as many leading MoE layers as it holds (3 GB: not all three 1.1 GB expert sets)
  c.gpu_experts = "fit";
  c.gpu_budget = "3GB";
  ASSERT_TRUE(v->supports(model, layer_point(c)).ok) << v->supports(model, layer_point(c)).reason;
  v->prepare(model, layer_point(c), seed);
  const double resident = v->counters().at("gpu_moe_layers");
  EXPECT_GE(resident, 1);
  EXPECT_LE(resident, 2);
  // all on the GPU does not fit 1 GB, and a device op takes no split: each refused with the reason
  c.moe = "moe/grouped/cuda";
  c.gpu_experts = "none";
  c.cpu_threads = 0;
  c.gpu_budget = "1GB";
  const Support tight = v->supports(model, layer_point(c));
  EXPECT_FALSE(tight.ok);
  EXPECT_NE(tight.reason.find("gpu_budget is 1GB"), std::string::npos) << tight.reason;
  c.gpu_budget = "all";
  c.gpu_experts = "layers:1";
  EXPECT_NE(v->supports(model, layer_point(c)).reason.find("gpu_experts"), std::string::npos);
  // streaming copies the experts to a GPU op; an op that runs them on the CPU is refused with the reason
  c.moe = "moe/host/cuda";
  c.gpu_experts = "streamed";
  EXPECT_NE(v->supports(model, layer_point(c)).reason.find("gpu_experts: streamed"), std::string::npos);
}

#ifdef DSLAB_HAVE_CUDA
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i)
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<std::vector<float>> recorded_run(const VariantEntry& entry, const LayerCase& c, uint64_t seed,
                                             int* captures) {
  const ModelFile model = load_model_file(c.model);
  auto v = entry.make();
  auto* layer = dynamic_cast<layer::cuda::DeepseekLayerCuda*>(v.get());
  EXPECT_NE(layer, nullptr);
  v->prepare(model, layer_point(c), seed);
  layer->record_steps(true);
  v->run();
  v->run();  // a second run replays the same graph again from step 0
  if (captures) *captures = layer->graph_captures();
  return layer->recorded_steps();
}

TEST(GpuLayer, StreamedExpertsMatchTheReferenceAndTheResidentExpertsAtEveryStep) {
  REQUIRE_LAYER();
  const uint64_t seed = test::fresh_seed();
  const ModelFile model = load_model_file("deepseek-v2-lite");
  // Four MoE layers: two staging buffers, each refilled once per step (layers 2 and 3 wait for 0 and 1 to finish).
  LayerCase c{"deepseek-v2-lite", "4", 2, 150, 3, "mla/fused/cuda", "moe/grouped/cuda", "graph"};
  c.gpu_experts = "streamed";
  auto v = run_verified(*entry, model, c, seed);
  ASSERT_NE(v, nullptr);
  const auto counters = v->counters();
  EXPECT_EQ(counters.at("streamed_expert_bytes"), 4.0 * 64 * 3 * 2048 * 1408 * 2);
  EXPECT_EQ(counters.at("gpu_moe_layers"), 4);
  // Step by step, replayed from one graph, the same as the same layers with their experts resident.
  LayerCase resident = c;
  resident.gpu_experts = "none";
  resident.executor = "eager";
  const auto streamed_steps = recorded_run(*entry, c, seed, nullptr);
  const auto resident_steps = recorded_run(*entry, resident, seed, nullptr);
  ASSERT_EQ(streamed_steps.size(), resident_steps.size());
  for (size_t s = 0; s < streamed_steps.size(); ++s)
    EXPECT_LE(max_rel_diff(streamed_steps[s], resident_steps[s]), 1e-6) << "step " << s;
}

// gpu_experts=hot:N: each layer's N most routed experts on the GPU beside the CPU's share, in one captured step:
// against the fp64 stack, and step by step against the same layers with every routed expert on the CPU.
TEST(GpuLayer, HotExpertsRunOnTheGpuBesideTheCpuShare) {
  REQUIRE_LAYER();
  if (!cpu_info().avx512_bf16) GTEST_SKIP() << "moe/host/cuda needs AVX512_BF16";
  const uint64_t seed = test::fresh_seed();
  const ModelFile model = load_model_file("deepseek-v2-lite");
  LayerCase c{"deepseek-v2-lite", "3", 4, 150, 3, "mla/fused/cuda", "moe/host/cuda", "graph"};
  c.gpu_experts = "hot:16";
  c.cpu_threads = 4;
  auto v = run_verified(*entry, model, c, seed);
  ASSERT_NE(v, nullptr);
  const auto counters = v->counters();
  EXPECT_EQ(counters.at("gpu_hot_experts"), 16);
  EXPECT_GT(counters.at("hot_share"), 0.0);  // both sides had work: 4 tokens x 6 choices over 64 experts
  EXPECT_LT(counters.at("hot_share"), 1.0);
  EXPECT_GT(counters.at("hot_share_profiled"), 0.2);  // the profile's 16 busiest of 64 take at least their quarter
  EXPECT_GT(counters.at("cpu_experts_engine_s"), 0);
  LayerCase all_cpu = c;
  all_cpu.gpu_experts = "none";
  auto plain = entry->make();
  plain->prepare(model, layer_point(all_cpu), seed);
  // The hot experts' weights on the GPU: 3 layers x 16 experts x 3 matrices, beside what the CPU split holds.
  EXPECT_NEAR(counters.at("device_bytes") - plain->counters().at("device_bytes"), 3.0 * 16 * 3 * 2048 * 1408 * 2, 1e6);
  const auto hot_steps = recorded_run(*entry, c, seed, nullptr);
  const auto cpu_steps = recorded_run(*entry, all_cpu, seed, nullptr);
  ASSERT_EQ(hot_steps.size(), cpu_steps.size());
  // The same experts in bf16 on either side: only accumulation order and the SwiGLU's rounding differ, but layer 2's
  // router already sees layer 1's outputs with those differences, so a near-tie choice may go the other way in one
  // run from the first step on (device runs saw 7.6e-3 at step 1, and 1.1e-2 at step 0 where the layer's verify
  // reported a selection-score gap of 0.0048, seed 8826768128240392585): the layer's bf16 bound.
  for (size_t s = 0; s < hot_steps.size(); ++s)
    EXPECT_LE(max_rel_diff(hot_steps[s], cpu_steps[s]), 2e-2) << "step " << s;
  // all of the experts is not a hot set; a GPU op takes none
  c.gpu_experts = "hot:64";
  EXPECT_NE(v->supports(model, layer_point(c)).reason.find("gpu_experts: hot:64"), std::string::npos);
  c.gpu_experts = "hot:8";
  c.moe = "moe/grouped/cuda";
  c.cpu_threads = 0;
  EXPECT_NE(v->supports(model, layer_point(c)).reason.find("gpu_experts"), std::string::npos);
}

TEST(GpuLayer, GraphReplayMatchesEagerAtEveryStepWithoutRecapture) {
  REQUIRE_LAYER();
  const uint64_t seed = test::fresh_seed();
  std::vector<LayerCase> bases{
      LayerCase{"deepseek-v2-lite", "2", 4, 200, 64, "mla/fused/cuda", "moe/grouped/cuda", "eager"},
      LayerCase{"tiny", "all", 2, 30, 16, "mla/a_cc_me/cuda", "moe/grouped/cuda", "eager"}};
  // FlashInfer's plan made again for each step's lengths and copied in before the replay, as the fused kernel's
  if (available("mla/flashinfer/cuda"))
    bases.push_back({"deepseek-v2-lite", "2", 4, 200, 16, "mla/flashinfer/cuda", "moe/grouped/cuda", "eager"});
  for (const LayerCase& base : bases) {
    SCOPED_TRACE(describe(base));
    LayerCase graph = base;
    graph.executor = "graph";
    int captures = 0;
    const auto eager_steps = recorded_run(*entry, base, seed, nullptr);
    const auto graph_steps = recorded_run(*entry, graph, seed, &captures);
    ASSERT_EQ(eager_steps.size(), size_t(base.steps));
    ASSERT_EQ(graph_steps.size(), size_t(base.steps));
    EXPECT_EQ(captures, 1)
        << "one graph for every step: lengths, page table, positions and schedule are updated in place";
    for (int64_t s = 0; s < base.steps; ++s)
      EXPECT_LE(max_rel_diff(graph_steps[size_t(s)], eager_steps[size_t(s)]), 1e-6) << "step " << s;
    // The steps really differ (each sees one more cached token at a new position), so equality above means something.
    EXPECT_GT(max_rel_diff(eager_steps.back(), eager_steps.front()), 1e-3);
  }
}

TEST(GpuLayer, BucketPaddingLeavesTheRealRequestsUnchanged) {
  REQUIRE_LAYER();
  const uint64_t seed = test::fresh_seed();
  LayerCase eager{"deepseek-v2-lite", "1", 3, 120, 4, "mla/fused/cuda", "moe/grouped/cuda", "eager"};
  LayerCase graph = eager;
  graph.executor = "graph";  // batch 3 runs in the bucket of 4
  const auto e = recorded_run(*entry, eager, seed, nullptr);
  const auto g = recorded_run(*entry, graph, seed, nullptr);
  ASSERT_EQ(e.size(), g.size());
  const size_t width = e[0].size() / 3;  // recorded rows: the 3 requests' (eager) and the bucket's first 4 (graph)
  for (size_t s = 0; s < e.size(); ++s) {
    const std::vector<float> g3(g[s].begin(), g[s].begin() + long(3 * width));
    EXPECT_LE(max_rel_diff(g3, e[s]), 5e-3) << "step " << s;  // (cuBLAS may pick other kernels for 4 rows than for 3)
  }
}

// 16 heads in 64-key blocks (block_keys 64, pages of 64: the two-warpgroup kernel of 128 heads) inside the whole step,
// which the MLA op's own tests do not reach: a padded bucket (5 requests in the graph of 8), lengths growing between
// replays of one graph, requests split across CTAs and whole; each against the fp64 stack, and the replays equal to
// eager launches step by step.
TEST(GpuLayer, SixteenHeadsIn64KeyBlocksMatchTheStack) {
  REQUIRE_LAYER();
  const uint64_t seed = test::fresh_seed();
  const ModelFile model = load_model_file("deepseek-v2-lite");
  for (int64_t kv_len : {200, 3000}) {
    LayerCase eager{"deepseek-v2-lite", "2", 5, kv_len, 3, "mla/fused/cuda", "moe/grouped/cuda", "eager"};
    eager.page_size = 64;
    eager.block_keys = "64";
    LayerCase graph = eager;
    graph.executor = "graph";
    SCOPED_TRACE(describe(graph));
    run_verified(*entry, model, eager, seed);
    run_verified(*entry, model, graph, seed);
    const auto e = recorded_run(*entry, eager, seed, nullptr);
    const auto g = recorded_run(*entry, graph, seed, nullptr);
    ASSERT_EQ(e.size(), g.size());
    const size_t width = e[0].size() / 5;  // (the graph's rows: the bucket's first 5 of 8)
    for (size_t s = 0; s < e.size(); ++s) {
      const std::vector<float> g5(g[s].begin(), g[s].begin() + long(5 * width));
      EXPECT_LE(max_rel_diff(g5, e[s]), 5e-3) << "step " << s;  // (cuBLAS may pick other kernels for 8 rows)
    }
  }
}

// The residual add and next norm inside the MoE's combine (fused_norms on): the whole tiny model (the final norm in
// the last combine), two V2-Lite layers (the last one's combine adds the residual only), the MoE ops' combine paths
// (grouped: bf16 rows; loop: fp32 rows; host: the CPU's per-token sums); each against the fp64 stack, and step by step
// equal to the unfused step's outputs within a last-bit flip of a bf16 norm carried through the layers.
TEST(GpuLayer, NormsFusedIntoTheMoeCombineMatchTheStackAndTheUnfusedStep) {
  REQUIRE_LAYER();
  const uint64_t seed = test::fresh_seed();
  std::vector<LayerCase> cases{
      LayerCase{"tiny", "all", 3, 40, 3, "mla/a_cc_me/cuda", "moe/grouped_wgmma/cuda", "graph"},
      LayerCase{"deepseek-v2-lite", "2", 4, 300, 3, "mla/fused/cuda", "moe/grouped_wgmma/cuda", "graph"},
      LayerCase{"deepseek-v2-lite", "2", 2, 100, 2, "mla/a_cc_me/cuda", "moe/loop/cuda", "eager"}};
  if (cpu_info().avx512_bf16)  // (moe/host/cuda's CPU experts)
    cases.push_back(LayerCase{"tiny", "all", 2, 30, 2, "mla/a_cc_me/cuda", "moe/host/cuda", "eager"});
  for (const LayerCase& unfused : cases) {
    LayerCase fused = unfused;
    fused.fused_norms = "on";
    SCOPED_TRACE(describe(fused));
    const ModelFile model = load_model_file(fused.model);
    run_verified(*entry, model, fused, seed);
    const auto f = recorded_run(*entry, fused, seed, nullptr);
    const auto u = recorded_run(*entry, unfused, seed, nullptr);
    ASSERT_EQ(f.size(), u.size());
    ASSERT_FALSE(f.empty());
    for (size_t s = 0; s < f.size(); ++s) EXPECT_LE(max_rel_diff(f[s], u[s]), 5e-3) << "step " << s;
  }
}

// A one-step check's fp64 reference is computed once for points that differ only in how the GPU runs the step (eager
// then graph, PDL on then off; batch 3, which the graph pads to a bucket of 4) and reused, the check still passing;
// another seed or shape computes its own.
TEST(GpuLayer, OneStepReferenceIsReusedOnlyAcrossHowTheStepRuns) {
  REQUIRE_LAYER();
  const uint64_t seed = test::fresh_seed();
  const ModelFile model = load_model_file("deepseek-v2-lite");
  LayerCase eager{"deepseek-v2-lite", "2", 3, 150, 1, "mla/fused/cuda", "moe/grouped_wgmma/cuda", "eager"};
  LayerCase graph = eager;
  graph.executor = "graph";
  graph.pdl = "off";
  LayerCase longer = graph;
  longer.kv_len = 160;
  const auto reused = [](const std::unique_ptr<Variant>& v) {
    return v ? v->verification_counters().at("reference_reused") : -1.0;
  };
  EXPECT_EQ(reused(run_verified(*entry, model, eager, seed)), 0.0) << "the first point computes its reference";
  EXPECT_EQ(reused(run_verified(*entry, model, graph, seed)), 1.0) << "same inputs, other executor: reused";
  EXPECT_EQ(reused(run_verified(*entry, model, longer, seed)), 0.0) << "another cache length: its own reference";
  EXPECT_EQ(reused(run_verified(*entry, model, longer, seed + 1)), 0.0) << "another seed: its own reference";
}

TEST(GpuLayer, StepQueuesWithoutAllocationOrHostSynchronisation) {
  REQUIRE_LAYER();
  const uint64_t seed = test::fresh_seed();
  // Global capture mode makes any allocation or synchronising call in the step fail the capture.
  auto captures_globally = [&](const char* moe, const char* gpu_experts = "none") {
    LayerCase c{"deepseek-v2-lite", "3", 2, 100, 2, "mla/fused/cuda", moe, "eager"};
    c.gpu_experts = gpu_experts;
    auto v = entry->make();
    auto* layer = dynamic_cast<layer::cuda::DeepseekLayerCuda*>(v.get());
    v->prepare(load_model_file(c.model), layer_point(c), seed);
    cudaStream_t stream{};
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    bool ok = true;
    try {
      layer->enqueue_step(1, stream);
    } catch (const std::exception& e) {
      ok = false;
      std::printf("%s: %s\n", moe, e.what());
    }
    cudaGraph_t graph{};
    ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ok;
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    cudaGetLastError();
    return ok;
  };
  EXPECT_TRUE(captures_globally("moe/grouped/cuda"));
  EXPECT_TRUE(captures_globally("moe/grouped/cuda", "streamed"));  // the experts' copies and their events too
  EXPECT_FALSE(captures_globally("moe/loop/cuda"))
      << "the control: the loop's host read of the routing must break the capture";
}
#endif

TEST(LayerPlan, BadAxesAreBadInput) {
  const VariantEntry* entry = find_variant("layer/deepseek/cuda");
  if (!entry) GTEST_SKIP() << "not built";
  const ModelFile model = load_model_file("deepseek-v2-lite");
  LayerCase c{"deepseek-v2-lite", "2", 1, 10, 1, "mla/fused/cuda", "moe/grouped/cuda", "eager"};
  auto v = entry->make();
  c.attn = "mla/nope/cuda";
  EXPECT_THROW(v->supports(model, layer_point(c)), BadInput);
  c.attn = "mla/fused/cuda";
  c.layers = "28";  // V2-Lite has 27
  EXPECT_THROW(v->supports(model, layer_point(c)), BadInput);
  c.layers = "x";
  EXPECT_THROW(v->supports(model, layer_point(c)), BadInput);
  c.layers = "2";
  c.kv_splits = "none";
  EXPECT_THROW(v->supports(model, layer_point(c)), BadInput);
  c.kv_splits = "8";  // only the fused attention splits its keys: anything else says so instead of ignoring it
  c.attn = "mla/cd/cuda";
  const Support s = v->supports(model, layer_point(c));
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("kv_splits"), std::string::npos) << s.reason;
  c.kv_splits = "auto";  // and how the keys are cut among the CTAs
  Point split = layer_point(c);
  split.set("split_plan", {"per_request", 0, false});
  const Support not_fused = v->supports(model, split);
  EXPECT_FALSE(not_fused.ok);
  EXPECT_NE(not_fused.reason.find("split_plan"), std::string::npos) << not_fused.reason;
  c.attn = "mla/fused/cuda";
  split = layer_point(c);
  split.set("split_plan", {"balanced", 0, false});
  EXPECT_THROW(v->supports(model, split), BadInput);
  split.set("split_plan", {"packed", 0, false});  // (the fused attention takes it; without a GPU: another reason)
  EXPECT_EQ(v->supports(model, split).reason.find("split_plan"), std::string::npos);
  // The absorbs folded into other kernels: the fused attention's only; a value other than on / off is bad input
  Point absorbs = layer_point(c);
  absorbs.set("fused_absorbs", {"maybe", 0, false});
  EXPECT_THROW(v->supports(model, absorbs), BadInput);
  absorbs.set("fused_absorbs", {"off", 0, false});
  EXPECT_EQ(v->supports(model, absorbs).reason.find("fused_absorbs"), std::string::npos);
  c.attn = "mla/a_cc/cuda";
  absorbs = layer_point(c);
  absorbs.set("fused_absorbs", {"off", 0, false});
  const Support unfused = v->supports(model, absorbs);
  EXPECT_FALSE(unfused.ok);
  EXPECT_NE(unfused.reason.find("fused_absorbs"), std::string::npos) << unfused.reason;
}

#ifdef DSLAB_HAVE_CUDA
TEST(LayerPlan, BatchBuckets) {
  EXPECT_EQ(layer::cuda::batch_bucket(1), 1);
  EXPECT_EQ(layer::cuda::batch_bucket(3), 4);
  EXPECT_EQ(layer::cuda::batch_bucket(64), 64);
  EXPECT_EQ(layer::cuda::batch_bucket(65), 128);
}
#endif

}  // namespace
}  // namespace dslab
