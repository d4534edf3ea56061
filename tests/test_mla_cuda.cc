// GPU MLA variants against the fp64 reference on fresh random inputs, over page sizes, length distributions
// and cache types (ctest label `gpu`). Without a GPU, or in a build without CUDA, they skip and say why.
// Also here (no GPU needed): the len_dist generator.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/variant.h"
#include "tests/test_util.h"
#include "variants/mla/mla.h"

namespace dslab {
namespace {

struct GpuCase {
  const char* model;
  int64_t heads, batch, q_len, kv_len, page_size;
  const char* len_dist;
  const char* kv_dtype;
  const char* executor = "eager";
  const char* kv_splits = "auto";
  const char* block_keys = "auto";
  const char* l2_evict = "auto";
  const char* split_plan = "auto";
  const char* fused_absorbs = "on";
};

std::string describe(const GpuCase& c) {
  return std::string(c.model) + " heads " + std::to_string(c.heads) + " batch " + std::to_string(c.batch) + " q_len " +
         std::to_string(c.q_len) + " kv_len " + std::to_string(c.kv_len) + " page_size " + std::to_string(c.page_size) +
         " " + c.len_dist + " " + c.kv_dtype + " " + c.executor + " kv_splits " + c.kv_splits + " block_keys " +
         c.block_keys + " l2_evict " + c.l2_evict + " split_plan " + c.split_plan + " fused_absorbs " + c.fused_absorbs;
}

Point point_of(const GpuCase& c) {
  Point p;
  p.set("batch", {std::to_string(c.batch), c.batch, true});
  p.set("q_len", {std::to_string(c.q_len), c.q_len, true});
  p.set("kv_len", {std::to_string(c.kv_len), c.kv_len, true});
  p.set("heads", {std::to_string(c.heads), c.heads, true});
  p.set("page_size", {std::to_string(c.page_size), c.page_size, true});
  p.set("len_dist", {c.len_dist, 0, false});
  p.set("kv_dtype", {c.kv_dtype, 0, false});
  p.set("executor", {c.executor, 0, false});
  p.set("kv_splits", {c.kv_splits, 0, false});
  p.set("block_keys", {c.block_keys, 0, false});
  p.set("l2_evict", {c.l2_evict, 0, false});
  p.set("split_plan", {c.split_plan, 0, false});
  if (c.fused_absorbs != std::string("on")) p.set("fused_absorbs", {c.fused_absorbs, 0, false});
  p.set("proj", {"own", 0, false});  // (the variants' default: the GEMV at 1-2 rows, tuned cuBLASLt from 3)
  return p;
}

// Skips the calling test unless the variant was built and a GPU is present.
#define REQUIRE_GPU_VARIANT(name)                                                          \
  const VariantEntry* entry = find_variant(name);                                          \
  if (!entry) GTEST_SKIP() << name << " is not built (no CUDA toolkit at configure time)"; \
  if (Support a = entry->make()->available(); !a.ok) GTEST_SKIP() << a.reason;             \
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent

// Runs two decode steps (the second rewrites the same cache slots) and returns the verification.
Verification run_case(const VariantEntry& e, const GpuCase& c, uint64_t seed) {
  const ModelFile model = load_model_file(c.model);
  const Point p = point_of(c);
  auto v = e.make();
  const Support s = v->supports(model, p);
  EXPECT_TRUE(s.ok) << s.reason;
  if (!s.ok) return {1, 0};
  v->prepare(model, p, seed);
  v->run();
  v->run();
  return v->verify();
}

class GpuMla : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuMla, MatchesReferenceOverPagesLengthsAndCacheTypes) {
  REQUIRE_GPU_VARIANT(GetParam());
  // (mla/flashinfer/cuda: a decode kernel too, FlashInfer's; bf16 caches only)
  const bool fused = GetParam() == "mla/fused/cuda" || GetParam() == "mla/flashinfer/cuda";
  const bool quantised_ok = GetParam() == "mla/fused/cuda" || GetParam() == "mla/a_cc_me/cuda";
  const uint64_t seed = test::fresh_seed();
  std::vector<GpuCase> cases;
  for (int64_t page : {1, 16, 64, 256})
    for (const char* dist : {"uniform", "mixed"})
      for (const char* kv : {"bf16", "int8", "fp8_e4m3"}) {
        if (std::string(kv) != "bf16" && !quantised_ok) continue;
        cases.push_back({"deepseek-v2-lite", 16, 3, 1, 150, page, dist, kv});
      }
  cases.push_back(
      {"deepseek-v2-lite", 16, 2, 2, 130, 16, "mixed", "bf16"});            // MTP: two new tokens, causal between them
  cases.push_back({"deepseek-v3", 128, 2, 1, 200, 64, "uniform", "bf16"});  // all heads of one GPU: 64-row tiles
  // (128 heads from tensor copies: the two-warpgroup kernel's pairs of blocks, segments of one block (its lone
  // block, no second), five (a whole pair, then three left: a pair and a lone block) and mixed)
  cases.push_back({"deepseek-v3", 128, 3, 1, 40, 64, "uniform", "bf16"});
  cases.push_back({"deepseek-v3", 128, 2, 1, 300, 64, "uniform", "bf16"});
  cases.push_back({"deepseek-v3", 128, 2, 2, 170, 1, "mixed", "bf16"});  // 64-row tiles, MTP: four tiles per request
  cases.push_back(
      {"deepseek-v3", 128, 2, 2, 170, 64, "mixed", "bf16"});  // the same with tensor-memory-accelerator copies
  cases.push_back({"deepseek-v3", 64, 3, 1, 90, 256, "uniform", "bf16"});  // one 64-row tile per request
  if (quantised_ok) {
    cases.push_back({"deepseek-v3", 128, 2, 1, 300, 16, "mixed", "int8"});      // two 64-row tiles, expanded (cp.async)
    cases.push_back({"deepseek-v3", 128, 2, 1, 300, 64, "mixed", "fp8_e4m3"});  // the same from tensor copies
    cases.push_back({"deepseek-v3", 16, 3, 2, 333, 64, "mixed", "fp8_e4m3"});   // 32 rows (MTP), narrow kernel
  }
  cases.push_back({"deepseek-v3", 16, 3, 2, 333, 64, "mixed", "bf16"});  // 32 rows (MTP) padded to one 64-row tile
  cases.push_back(
      {"deepseek-v3", 96, 3, 1, 333, 64, "mixed", "bf16"});  // 96 rows: the two-warpgroup kernel's part-filled tile
  cases.push_back({"deepseek-v2-lite", 16, 1, 1, 0, 16, "uniform", "bf16"});  // empty cache: the new token only
  if (GetParam() == "mla/fused/cuda") {
    // 16 heads in 64-key blocks (block_keys 64): the two-warpgroup kernel with 16 real rows of its 64-row tile, one
    // request (its Q box reaching past the last row) and several, with MTP, and from cp.async copies (small pages)
    for (GpuCase c : {GpuCase{"deepseek-v3", 16, 1, 1, 300, 64, "uniform", "bf16"},
                      GpuCase{"deepseek-v3", 16, 5, 1, 333, 64, "mixed", "bf16"},
                      GpuCase{"deepseek-v3", 16, 3, 2, 333, 64, "mixed", "bf16"},
                      GpuCase{"deepseek-v2-lite", 16, 3, 1, 150, 16, "mixed", "bf16"}}) {
      c.block_keys = "64";
      cases.push_back(c);
    }
    // Every block copy evict_first in L2 (l2_evict first): the fixed-roles kernel's tensor copies (32-key blocks) and
    // the two-warpgroup kernel's (64), and no hint at all (normal)
    for (const char* keys : {"32", "64"}) {
      GpuCase c{"deepseek-v3", 16, 5, 1, 333, 64, "mixed", "bf16"};
      c.block_keys = keys;
      c.l2_evict = "first";
      cases.push_back(c);
    }
    GpuCase plain{"deepseek-v3", 128, 2, 1, 300, 64, "mixed", "bf16"};
    plain.l2_evict = "normal";
    cases.push_back(plain);
  }
  if (!fused) {
    cases.push_back({"deepseek-v2-lite", 16, 2, 5, 70, 16, "uniform", "bf16"});  // extend: causal among 5 new tokens
    cases.push_back({"tiny", 4, 3, 3, 37, 16, "mixed", "bf16"});                 // narrow latent, odd sizes
  }
  // Each case under the variant's default executor, and one under the other (eager launches vs the replayed graph).
  const char* default_executor = fused ? "graph" : "eager";
  for (GpuCase& c : cases) c.executor = default_executor;
  GpuCase other = cases.back();
  other.executor = fused ? "eager" : "graph";
  cases.push_back(other);
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Verification v = run_case(*entry, c, seed);
    EXPECT_LE(v.rel_err, v.threshold);
    EXPECT_GT(v.rel_err, 0.0) << "bf16 arithmetic cannot match fp64 exactly: is the output really computed?";
    if (std::string(c.kv_dtype) == "bf16") EXPECT_LE(v.rel_err, 1e-2);
    std::printf("%-18s %-70s rel_err %.3e\n", GetParam().c_str(), describe(c).c_str(), v.rel_err);
  }
}

TEST_P(GpuMla, LongSplitCacheMatchesReference) {
  // Long enough that the fused kernel splits every request across several CTAs and combines them; with 128
  // heads, mixed lengths and packed runs (or fewer CTAs than requests) a CTA's run of key blocks crosses from one
  // request into the next.
  REQUIRE_GPU_VARIANT(GetParam());
  // (128 heads both from cp.async copies (16-key pages) and tensor copies (64-key pages): two row tiles a part)
  std::vector<GpuCase> cases = {GpuCase{"deepseek-v3", 16, 2, 1, 5000, 64, "mixed", "bf16"},
                                GpuCase{"deepseek-v3", 128, 5, 1, 3000, 16, "mixed", "bf16"},
                                GpuCase{"deepseek-v3", 128, 5, 1, 3000, 64, "mixed", "bf16"}};
  if (GetParam() ==
      "mla/fused/cuda") {  // split counts other than one per SM: 1 (no merge), 3 and 8 (long runs per CTA)
    for (const char* splits : {"1", "3", "8"}) {
      cases.push_back({"deepseek-v3", 16, 2, 1, 5000, 64, "mixed", "bf16", "graph", splits});
      cases.push_back({"deepseek-v3", 128, 3, 1, 3000, 16, "mixed", "bf16", "eager", splits});
      cases.push_back({"deepseek-v3", 128, 3, 1, 3000, 64, "mixed", "bf16", "graph", splits});
      cases.push_back({"deepseek-v3", 16, 3, 1, 5000, 64, "mixed", "fp8_e4m3", "graph", splits});  // the fp8 kernel's
    }                                                                                              // segments
    // Under 8 tokens the merge absorbs the output too, a CTA's warps sharing each row's segments (1, 3 and 7 tokens
    // of V2-Lite, whose W_UK absorb at 1-2 tokens also runs in the norm's launch; 128 heads at 2 tokens: one CTA a
    // head, both tokens in turn), and each with fused_absorbs off (every absorb its own kernel)
    for (const char* fused : {"on", "off"})
      for (const GpuCase& base : {GpuCase{"deepseek-v2-lite", 16, 1, 1, 5000, 64, "uniform", "bf16", "graph"},
                                  GpuCase{"deepseek-v2-lite", 16, 2, 1, 3000, 64, "mixed", "bf16", "eager"},
                                  GpuCase{"deepseek-v2-lite", 16, 3, 1, 3000, 16, "mixed", "bf16", "graph"},
                                  GpuCase{"deepseek-v2-lite", 16, 7, 1, 2000, 64, "mixed", "bf16", "graph"},
                                  GpuCase{"deepseek-v3", 128, 2, 1, 3000, 64, "mixed", "bf16", "graph"},
                                  GpuCase{"deepseek-v2-lite", 16, 1, 2, 3000, 64, "uniform", "bf16", "eager"}}) {
        GpuCase c = base;
        c.fused_absorbs = fused;
        cases.push_back(c);
      }
    // The auto plan gives each request CTAs of its own wherever the batch fits the grid; packed runs cross requests.
    for (const GpuCase& base : {cases[0], cases[1], cases[2]}) {
      GpuCase packed = base;
      packed.split_plan = "packed";
      cases.push_back(packed);
    }
    // Two requests on one CTA a row tile, segments of ~190 blocks (over kStreamEvictFirstBlocks): the two-warpgroup
    // kernel's instance without the L2 hint (every shorter case above takes the hinted one).
    cases.push_back({"deepseek-v3", 128, 2, 1, 12000, 64, "mixed", "bf16", "graph", "1"});
    // Whole requests of an odd block count (the two-warpgroup kernel walks a padding block first) whose last block
    // holds 1 key (4096 + 1) or 16 (an MTP step of 2 at 4110 + 2), three and two a CTA: the switch lands on one.
    cases.push_back({"deepseek-v3", 128, 3, 1, 4096, 64, "uniform", "bf16", "graph", "1"});
    cases.push_back({"deepseek-v3", 128, 2, 2, 4110, 64, "uniform", "bf16", "eager", "1"});
    cases.push_back({"deepseek-v3", 16, 4, 1, 5000, 64, "mixed", "int8"});               // the narrow kernel: int8,
    cases.push_back({"deepseek-v3", 16, 2, 2, 5000, 64, "mixed", "fp8_e4m3", "eager"});  // fp8 with an MTP token
    cases.push_back({"deepseek-v3", 8, 3, 2, 3000, 64, "mixed", "fp8_e4m3", "eager"});   // 16 rows of two tokens: the
                                                                                         // fp8 kernel's causal mask
    // 8-32 tokens a CTA: the merge absorbs the output too (merge_absorb_kernel), a CTA per head and token group:
    // 8 tokens a CTA (16 heads, 2 groups), 9 of an MTP step's (rows j x heads + h, a part-filled tile), a V2-Lite
    // head, 8 and 24 tokens (two tiles) a CTA at 128 heads, short mixed lengths (requests whole and split side by
    // side), the narrow kernel's partials. (Requests all whole, no merge: RepeatedStepsGiveIdenticalOutputs' first.)
    cases.push_back({"deepseek-v3", 16, 16, 1, 3000, 64, "mixed", "bf16", "graph"});
    cases.push_back({"deepseek-v3", 16, 9, 2, 3000, 64, "mixed", "bf16", "eager"});
    cases.push_back({"deepseek-v2-lite", 16, 24, 1, 1500, 64, "mixed", "bf16", "graph"});
    cases.push_back({"deepseek-v3", 128, 8, 1, 2000, 64, "mixed", "bf16", "graph"});
    cases.push_back({"deepseek-v3", 128, 24, 1, 600, 64, "mixed", "bf16", "eager"});
    cases.push_back({"deepseek-v3", 16, 40, 1, 600, 64, "mixed", "fp8_e4m3", "graph"});
    // 16 heads in 64-key blocks (the two-warpgroup kernel): split requests merged, one CTA's run crossing requests,
    // and 16 tokens merged with the output absorbed
    cases.push_back({"deepseek-v3", 16, 2, 1, 5000, 64, "mixed", "bf16", "graph", "auto", "64"});
    cases.push_back({"deepseek-v3", 16, 5, 1, 3000, 64, "mixed", "bf16", "eager", "3", "64"});
    cases.push_back({"deepseek-v3", 16, 16, 1, 3000, 64, "mixed", "bf16", "graph", "auto", "64"});
  }
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Verification v = run_case(*entry, c, test::fresh_seed());
    EXPECT_LE(v.rel_err, std::string(c.kv_dtype) == "bf16" ? 1e-2 : v.threshold);
  }
}

TEST(GpuMlaFused, RepeatedStepsGiveIdenticalOutputs) {
  // The fused kernel's reductions run in a fixed order, so every step over the same cache must give the same
  // output bit for bit; a race between its warpgroups (a stage refilled while another warpgroup still reads it)
  // shows up as a step that differs. Many blocks per CTA, both the tensor-copy (page_size 64) and the cp.async
  // (page_size 1) paths. (16 heads at batch 128 on a 132-SM GPU: every request whole in one CTA, written straight
  // to the output, its 48 padding rows not at all, then through merge_absorb_kernel's copy and absorb. 128 heads:
  // two row tiles a part, from either copy path. fp8 and int8 at 16 heads: the fp8 and narrow kernels, whose roles
  // hand blocks and P^T over on mbarriers and named barriers, split requests merged.)
  REQUIRE_GPU_VARIANT("mla/fused/cuda");
  for (const GpuCase& c : {GpuCase{"deepseek-v3", 16, 128, 1, 4096, 64, "uniform", "bf16", "graph"},
                           GpuCase{"deepseek-v3", 128, 32, 1, 2048, 1, "mixed", "bf16", "graph"},
                           GpuCase{"deepseek-v3", 128, 32, 1, 2048, 64, "mixed", "bf16", "graph"},
                           GpuCase{"deepseek-v3", 16, 64, 1, 4096, 64, "mixed", "fp8_e4m3", "graph"},
                           GpuCase{"deepseek-v3", 16, 64, 1, 4096, 64, "mixed", "int8", "graph"}}) {
    SCOPED_TRACE(describe(c));
    const ModelFile model = load_model_file(c.model);
    auto v = entry->make();
    v->prepare(model, point_of(c), test::fresh_seed());
    v->run();
    const Verification verified = v->verify();
    const double first = verified.rel_err;
    EXPECT_LE(first, std::string(c.kv_dtype) == "bf16" ? 1e-2 : verified.threshold);
    int differing = 0;
    for (int step = 0; step < 200; ++step) {
      v->run();
      if (v->verify().rel_err != first) ++differing;
    }
    EXPECT_EQ(differing, 0) << "of 200 steps over the same cache";
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuMla,
                         ::testing::Values("mla/cd/cuda", "mla/cd_paged/cuda", "mla/cc/cuda", "mla/a_cc/cuda",
                                           "mla/a_cc_me/cuda", "mla/fused/cuda", "mla/flashinfer/cuda"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '/', '_');
                           return n;
                         });

// mla/cd_paged/cuda needs cd's K/V pages but not its gathered copy: at V3's 128 heads, batch 32, 16K keys it asks
// for about the gathered K/V (21 GB) less than mla/cd/cuda (checked without a GPU: supports() compares this with it).
TEST(MlaCudaMemory, PagedCdNeedsNoGatheredCopy) {
  const VariantEntry* cd = find_variant("mla/cd/cuda");
  const VariantEntry* paged = find_variant("mla/cd_paged/cuda");
  if (!cd || !paged) GTEST_SKIP() << "the CUDA MLA variants are not built (no CUDA toolkit at configure time)";
  const ModelFile model = load_model_file("deepseek-v3");
  const Point p = point_of({"deepseek-v3", 128, 32, 1, 16384, 64, "uniform", "bf16"});
  const double gathered = 32.0 * (16385 + 8) * 128 * (192 + 128) * 2;
  const double saved = cd->make()->device_memory_bytes(model, p) - paged->make()->device_memory_bytes(model, p);
  EXPECT_GT(saved, gathered);
  EXPECT_LT(saved, 1.1 * gathered);
}

TEST(GpuMlaVerify, UnwrittenOutputFails) {
  REQUIRE_GPU_VARIANT("mla/fused/cuda");
  const ModelFile model = load_model_file("deepseek-v2-lite");
  auto v = entry->make();
  v->prepare(model, point_of({"deepseek-v2-lite", 16, 1, 1, 64, 16, "uniform", "bf16"}), 5);
  EXPECT_FALSE(v->verify().pass());  // the output is NaN until run() writes it
}

TEST(GpuMlaOps, CountersTimeEachOpOfTheStep) {
  REQUIRE_GPU_VARIANT("mla/fused/cuda");
  const ModelFile model = load_model_file("deepseek-v3");
  auto v = entry->make();
  // (fused_absorbs off: every absorb its own kernel, so every op has a bracket; on, the merge absorbs the output)
  GpuCase apart{"deepseek-v3", 16, 4, 1, 2048, 64, "uniform", "bf16", "graph"};
  apart.fused_absorbs = "off";
  const uint64_t seed = test::fresh_seed();
  auto fused = entry->make();
  fused->prepare(model, point_of({"deepseek-v3", 16, 4, 1, 2048, 64, "uniform", "bf16", "graph"}), seed);
  fused->run();
  EXPECT_TRUE(fused->counters().count("op_us.combine"));
  EXPECT_FALSE(fused->counters().count("op_us.absorb_o"));
  v->prepare(model, point_of(apart), seed);
  v->run();
  const auto c = v->counters();
  for (const char* op :
       {"qkv_a", "norm_cache_write", "q_b", "absorb_q", "rope_q", "decode", "combine", "absorb_o", "o_proj"}) {
    const auto it = c.find(std::string("op_us.") + op);
    ASSERT_NE(it, c.end()) << op;
    EXPECT_GT(it->second, 0.0) << op;
    EXPECT_LT(it->second, 1e4) << op;  // microseconds: a step of this size takes well under 10 ms
  }
  // The attention kernel's own numbers: decode + merge as one bracket (steps of their own, no mark between the two
  // kernels), and its rates from its own FLOPs and bytes. Inside the step: below the sum of every op's time.
  ASSERT_TRUE(c.count("kernel_s") && c.count("kernel_tb_per_s"));
  double step_us = 0;
  for (const auto& [name, value] : c)
    if (name.rfind("op_us.", 0) == 0) step_us += value;
  EXPECT_GT(c.at("kernel_s"), 0.0);
  EXPECT_LT(c.at("kernel_s") * 1e6, step_us);
  EXPECT_GT(c.at("kernel_tb_per_s"), 0.0);
  EXPECT_LT(c.at("kernel_tb_per_s"), 10.0);  // no HBM moves 10 TB/s
  // Where the decode kernel's CTAs spend their time (medians over the CTAs that walked blocks): every phase there, in
  // the order a CTA reaches them, inside the step's time.
  ASSERT_TRUE(c.count("decode_phase.working_ctas") && c.count("decode_phase.blocks") &&
              c.count("decode_phase_us.span"));
  EXPECT_GE(c.at("decode_phase.working_ctas"), 1.0);
  EXPECT_GE(c.at("decode_phase.blocks"), 1.0);
  ASSERT_TRUE(c.count("decode_phase.block_keys"));
  EXPECT_TRUE(c.at("decode_phase.block_keys") == 32 || c.at("decode_phase.block_keys") == 64);
  double before = -1e4;  // (with early loads the first copies are queued before the wait: a negative time)
  for (const char* phase : {"first_block_landed", "first_block_scored", "first_block_handed_over",
                            "first_block_accumulated", "last_block_accumulated", "done"}) {
    const auto it = c.find(std::string("decode_phase_us.") + phase);
    ASSERT_NE(it, c.end()) << phase;
    EXPECT_GE(it->second, before) << phase;
    before = it->second;
  }
  EXPECT_LE(c.at("decode_phase_us.q_landed"), c.at("decode_phase_us.first_block_scored"));
  // The replayed step's kernels (CUPTI, when no other tool holds it): numbered in start order, each inside the span,
  // the first at 0, and the decode kernel among them.
  if (c.count("step_gpu.span_us")) {
    EXPECT_GT(c.at("step_gpu.busy_us"), 0.0);
    EXPECT_LE(c.at("step_gpu.busy_us"), c.at("step_gpu.span_us") + 1e-3);
    double previous_start = -1;
    int kernels = 0, decode = 0;
    for (const auto& [name, start] : c) {
      if (name.rfind("step_start_us.", 0) != 0) continue;
      const std::string key = name.substr(std::string("step_start_us.").size());
      ASSERT_TRUE(c.count("step_end_us." + key)) << key;
      EXPECT_GE(start, previous_start) << key;  // the keys' numbers sort them by start
      EXPECT_LE(c.at("step_end_us." + key), c.at("step_gpu.span_us") + 1e-3) << key;
      EXPECT_GT(c.at("step_end_us." + key), start) << key;
      if (kernels++ == 0) EXPECT_EQ(start, 0.0);
      decode += key.find("decode_kernel") != std::string::npos ? 1 : 0;
      previous_start = start;
    }
    EXPECT_GE(kernels, 8);
    EXPECT_EQ(decode, 1);
  }
  EXPECT_LE(c.at("decode_phase_us.loads_issued"), c.at("decode_phase_us.done"));
  // The spread of the CTAs' ends and block rates around their medians (the slowest CTA's end last of all).
  EXPECT_LE(c.at("decode_phase_us.done_p10"), c.at("decode_phase_us.done"));
  EXPECT_LE(c.at("decode_phase_us.done"), c.at("decode_phase_us.done_p90"));
  EXPECT_LE(c.at("decode_phase_us.done_p90"), c.at("decode_phase_us.last_done"));
  if (c.count("decode_phase_us.per_block")) {
    EXPECT_LE(c.at("decode_phase_us.per_block_min"), c.at("decode_phase_us.per_block"));
    EXPECT_LE(c.at("decode_phase_us.per_block"), c.at("decode_phase_us.per_block_max"));
  }
  EXPECT_GT(c.at("decode_phase.sm_ghz"), 0.3);  // the SM clock as the kernel ran
  EXPECT_LT(c.at("decode_phase.sm_ghz"), 3.0);
  EXPECT_GT(c.at("decode_phase_us.done"), 0.0);
  EXPECT_LT(c.at("decode_phase_us.done"), 1e4);
  EXPECT_GT(c.at("decode_phase_us.span"), 0.0);
  EXPECT_TRUE(v->verify().pass());  // timing the ops leaves the step's output intact

  // At 128 heads (the two-warpgroup kernel) a subset of the phases, in order; the fixed roles' own are absent.
  auto w = entry->make();
  w->prepare(model, point_of({"deepseek-v3", 128, 2, 1, 2048, 64, "uniform", "bf16", "graph"}), test::fresh_seed());
  w->run();
  const auto wide = w->counters();
  before = -1e4;
  for (const char* phase : {"loads_issued", "q_landed", "first_block_scored", "first_block_accumulated",
                            "last_block_accumulated", "done"}) {
    const auto it = wide.find(std::string("decode_phase_us.") + phase);
    ASSERT_NE(it, wide.end()) << phase;
    EXPECT_GE(it->second, before) << phase;
    before = it->second;
  }
  EXPECT_EQ(wide.count("decode_phase_us.first_block_maxed"), 0u);
  EXPECT_EQ(wide.at("decode_phase.block_keys"), 64.0);
  EXPECT_EQ(wide.count("decode_phase_us.first_segment_accumulated"), 0u);  // (one segment a CTA)
  EXPECT_TRUE(w->verify().pass());

  // More requests than CTAs a row tile (70 requests of 4 blocks on 66 CTAs: split, two segments a CTA): the
  // segment switch's phases, in order.
  auto many = entry->make();
  many->prepare(model, point_of({"deepseek-v3", 128, 70, 1, 192, 64, "uniform", "bf16", "graph"}), test::fresh_seed());
  many->run();
  const auto switched = many->counters();
  before = -1e4;
  for (const char* phase :
       {"first_block_accumulated", "first_segment_last_pair", "first_segment_accumulated", "first_segment_summed",
        "first_segment_stored", "first_segment_written", "second_segment_q_landed", "second_segment_scored",
        "second_segment_first_accumulated", "last_block_accumulated", "done"}) {
    const auto it = switched.find(std::string("decode_phase_us.") + phase);
    ASSERT_NE(it, switched.end()) << phase;
    EXPECT_GE(it->second, before) << phase;
    before = it->second;
  }
  EXPECT_TRUE(many->verify().pass());

  // 64 requests at 16 heads, each split across CTAs: the merge absorbs the output in the same kernel, so the step
  // has a combine op and no absorb_o op (and the timeline no absorb GEMM after the merge).
  auto merged = entry->make();
  merged->prepare(model, point_of({"deepseek-v3", 16, 64, 1, 2048, 64, "uniform", "bf16", "graph"}),
                  test::fresh_seed());
  merged->run();
  const auto fused_absorb = merged->counters();
  EXPECT_GT(fused_absorb.at("op_us.combine"), 0.0);
  EXPECT_EQ(fused_absorb.count("op_us.absorb_o"), 0u);
  if (fused_absorb.count("step_gpu.span_us")) {
    int merge_absorb = 0;
    for (const auto& [name, start] : fused_absorb)
      merge_absorb += name.find("step_start_us.") == 0 && name.find("merge_absorb_kernel") != std::string::npos;
    EXPECT_EQ(merge_absorb, 1);
  }
  EXPECT_TRUE(merged->verify().pass());
}

TEST(GpuMlaSupport, FusedKernelNeedsRowsInSixteens) {
  REQUIRE_GPU_VARIANT("mla/fused/cuda");
  const ModelFile model = load_model_file("deepseek-v2-lite");
  EXPECT_FALSE(entry->make()->supports(model, point_of({"deepseek-v2-lite", 8, 1, 1, 64, 16, "uniform", "bf16"})).ok);
  EXPECT_FALSE(entry->make()->supports(model, point_of({"deepseek-v2-lite", 16, 1, 4, 64, 16, "uniform", "bf16"})).ok);
}

// ---- no GPU needed -------------------------------------------------------------------------------------------

TEST(RequestLengths, MixedIsSkewedWithTheUniformTotal) {
  const auto len = mla::request_lengths("mixed", 64, 4096, 7);
  ASSERT_EQ(len.size(), 64u);
  EXPECT_EQ(std::accumulate(len.begin(), len.end(), int64_t(0)), 64 * 4096);
  EXPECT_GT(*std::max_element(len.begin(), len.end()), 3 * 4096);
  EXPECT_LT(*std::min_element(len.begin(), len.end()), 4096 / 2);
  EXPECT_EQ(mla::request_lengths("uniform", 3, 10, 7), (std::vector<int64_t>{10, 10, 10}));
  EXPECT_EQ(mla::request_lengths("mixed", 1, 100, 7), std::vector<int64_t>{100});
  EXPECT_THROW(mla::request_lengths("zipf", 3, 10, 7), BadInput);
}

// A plan's segments of each request are adjacent, in key order, and cover its keys once.
void expect_every_key_once(const mla::SplitKv& s, const std::vector<int64_t>& lengths, int64_t q_len) {
  ASSERT_EQ(s.requests.size(), lengths.size());
  for (size_t b = 0; b < lengths.size(); ++b) {
    const auto& r = s.requests[b];
    ASSERT_GE(r.count, 1);
    int32_t key = 0;
    for (int32_t i = r.first; i < r.first + r.count; ++i) {
      EXPECT_EQ(s.segments[size_t(i)].request, int32_t(b));
      EXPECT_EQ(s.segments[size_t(i)].first_key, key);
      key = s.segments[size_t(i)].end_key;
    }
    EXPECT_EQ(key, lengths[b] + q_len);
  }
}

TEST(SplitKv, EveryKeyOnceInEqualRunsPerCta) {
  for (const auto& [lengths, parts] :
       std::vector<std::pair<std::vector<int64_t>, int>>{{mla::request_lengths("mixed", 64, 4096, 3), 132},
                                                         {{0, 1, 63, 64, 65, 5000}, 7},
                                                         {{100}, 132},
                                                         {{70000}, 66}}) {
    const int64_t q_len = 2, block = 64;
    const mla::SplitKv s = mla::split_kv(lengths, q_len, block, parts, /*whole_requests=*/false);
    ASSERT_EQ(s.parts.size(), size_t(parts));
    ASSERT_EQ(s.requests.size(), lengths.size());
    int64_t total_blocks = 0;
    for (int64_t L : lengths) total_blocks += (L + q_len + block - 1) / block;
    const int64_t per_part = (total_blocks + parts - 1) / parts;
    int32_t next = 0;
    for (const auto& part : s.parts) {  // parts tile the segment list in order, each with <= per_part blocks
      EXPECT_EQ(part.first, next);
      int64_t blocks = 0;
      for (int32_t i = part.first; i < part.first + part.count; ++i) {
        const auto& g = s.segments[size_t(i)];
        EXPECT_LT(g.first_key, g.end_key);
        EXPECT_EQ(g.first_key % block, 0);
        blocks += (g.end_key - g.first_key + block - 1) / block;
      }
      EXPECT_LE(blocks, per_part);
      next = part.first + part.count;
    }
    EXPECT_EQ(size_t(next), s.segments.size());
    expect_every_key_once(s, lengths, q_len);
  }
}

TEST(SplitKv, PerRequestGivesEachRequestCtasOfItsOwn) {
  const int64_t q_len = 1, block = 64;
  for (const auto& [lengths, parts] :
       std::vector<std::pair<std::vector<int64_t>, int>>{{std::vector<int64_t>(4, 4096), 65},
                                                         {mla::request_lengths("mixed", 16, 4096, 5), 132},
                                                         {{0, 1, 63, 64, 65, 5000}, 7},
                                                         {{70000}, 132},
                                                         {std::vector<int64_t>(132, 100), 132}}) {
    const auto plan = mla::split_kv_per_request(lengths, q_len, block, parts);
    ASSERT_TRUE(plan.has_value());
    const mla::SplitKv& s = *plan;
    ASSERT_EQ(s.parts.size(), size_t(parts));
    std::vector<int64_t> blocks;
    int64_t longest_part = 0;
    int32_t next = 0;
    for (const auto& part : s.parts) {  // parts tile the segments in order, one segment each (or none: idle, last)
      EXPECT_EQ(part.first, next);
      EXPECT_LE(part.count, 1);
      if (part.count == 1) {
        const auto& g = s.segments[size_t(part.first)];
        EXPECT_LT(g.first_key, g.end_key);
        EXPECT_EQ(g.first_key % block, 0);
        longest_part = std::max<int64_t>(longest_part, (g.end_key - g.first_key + block - 1) / block);
      }
      next = part.first + part.count;
    }
    EXPECT_EQ(size_t(next), s.segments.size());
    expect_every_key_once(s, lengths, q_len);
    int64_t used = 0;
    for (size_t b = 0; b < lengths.size(); ++b) {
      used += s.requests[b].count;
      blocks.push_back((lengths[b] + q_len + block - 1) / block);
    }
    EXPECT_LE(used, parts);
    // The longest part is the smallest any per-request cut within `parts` reaches: one block fewer needs too many.
    if (longest_part > 1) {
      int64_t needed = 0;
      for (int64_t b : blocks) needed += (b + longest_part - 2) / (longest_part - 1);
      EXPECT_GT(needed, parts);
    }
  }
  // 4 requests of 65 blocks on 65 CTAs: 13 each of 5 blocks (no CTA walks two requests), 13 CTAs idle.
  const auto four = mla::split_kv_per_request(std::vector<int64_t>(4, 4096), q_len, block, 65);
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->segments.size(), 52u);
  EXPECT_EQ(four->requests[3].count, 13);
  // More requests than CTAs: no per-request plan.
  EXPECT_FALSE(mla::split_kv_per_request(std::vector<int64_t>(8, 100), q_len, block, 7).has_value());
  EXPECT_EQ(mla::parse_split_plan("per_request"), mla::SplitPlan::per_request);
  EXPECT_THROW(mla::parse_split_plan("balanced"), BadInput);
}

TEST(SplitKv, AutoSplitsGiveEachCtaAFewBlocks) {
  // 64-key blocks on a 132-part grid: batch 1 at 4K (65 blocks) takes the floor of 32 parts, batch 4 at 4K (260
  // blocks) 65 parts of 4 blocks, anything with 4+ blocks per SM the whole grid; a grid under the floor is all used.
  EXPECT_EQ(mla::auto_kv_splits({4096}, 1, 64, 132), 32);
  EXPECT_EQ(mla::auto_kv_splits(std::vector<int64_t>(4, 4096), 1, 64, 132), 65);
  EXPECT_EQ(mla::auto_kv_splits(std::vector<int64_t>(16, 4096), 1, 64, 132), 132);
  EXPECT_EQ(mla::auto_kv_splits({10}, 1, 64, 20), 20);
}

TEST(SplitKv, KeepsRequestsWholeWhereThatCostsLittleBalance) {
  const int64_t q_len = 1, block = 64;
  // 128 requests of 4097 keys (65 blocks) over 66 CTAs: two whole requests per CTA (130 blocks) against 127 in
  // equal runs, within the slack: no request is split.
  const std::vector<int64_t> uniform(128, 4096);
  const mla::SplitKv whole = mla::split_kv(uniform, q_len, block, 66, /*whole_requests=*/true);
  ASSERT_EQ(whole.segments.size(), uniform.size());
  int32_t next = 0;
  for (const auto& part : whole.parts) {
    EXPECT_EQ(part.first, next);
    EXPECT_LE(part.count, 2);
    next = part.first + part.count;
  }
  for (size_t b = 0; b < uniform.size(); ++b) {
    EXPECT_EQ(whole.requests[b].count, 1);
    const auto& g = whole.segments[size_t(whole.requests[b].first)];
    EXPECT_EQ(g.request, int32_t(b));
    EXPECT_EQ(g.first_key, 0);
    EXPECT_EQ(g.end_key, 4097);
  }
  // Fewer requests than CTAs (each would leave most CTAs idle), or one long request among short ones: equal runs.
  for (const auto& lengths : {std::vector<int64_t>(64, 4096), std::vector<int64_t>{70000, 10, 10}}) {
    const mla::SplitKv s = mla::split_kv(lengths, q_len, block, 132, /*whole_requests=*/true);
    EXPECT_GT(s.segments.size(), lengths.size());
  }
}

TEST(SplitKv, MeanSegmentBlocksCountsPartFilledBlocksWhole) {
  // Two whole requests of 4097 keys a CTA (65 blocks each, the last holding one key), and one of 8193 cut in two
  // equal runs of 65 blocks (129 blocks: the second run ends one block short, at 64).
  const mla::SplitKv whole = mla::split_kv(std::vector<int64_t>(128, 4096), 1, 64, 66, /*whole_requests=*/true);
  EXPECT_DOUBLE_EQ(mla::mean_segment_blocks(whole, 64), 65.0);
  const mla::SplitKv halves = mla::split_kv({8192}, 1, 64, 2, /*whole_requests=*/false);
  ASSERT_EQ(halves.segments.size(), 2u);
  EXPECT_DOUBLE_EQ(mla::mean_segment_blocks(halves, 64), 64.5);
  EXPECT_DOUBLE_EQ(mla::mean_segment_blocks(mla::SplitKv{}, 64), 0.0);
}

TEST(SplitKv, FinerBlocksLeaveNoCtaIdle) {
  // The 16-head fused kernel walks 32-key blocks and is cut in them (fused/host.cu, schedule): 64 requests of 4097 keys
  // on 132 CTAs. In 64-key units (65 a request, 32 a CTA) two CTAs get nothing; in 32-key blocks (129 a request) every
  // CTA gets some and the busiest 63 blocks - 2016 keys against 2048.
  const std::vector<int64_t> lengths(64, 4096);
  auto busiest_keys_and_idle = [&](int64_t block) {
    const mla::SplitKv s = mla::split_kv(lengths, 1, block, 132, /*whole_requests=*/true);
    int64_t busiest = 0, idle = 0;
    for (const auto& part : s.parts) {
      int64_t keys = 0;
      for (int32_t i = part.first; i < part.first + part.count; ++i)
        keys += s.segments[size_t(i)].end_key - s.segments[size_t(i)].first_key;
      busiest = std::max(busiest, keys);
      idle += part.count == 0;
    }
    return std::pair{busiest, idle};
  };
  EXPECT_EQ(busiest_keys_and_idle(64), (std::pair<int64_t, int64_t>{2048, 2}));
  EXPECT_EQ(busiest_keys_and_idle(32), (std::pair<int64_t, int64_t>{2016, 0}));
}

TEST(KvSplits, AutoOrAPositiveCount) {
  EXPECT_EQ(mla::parse_kv_splits("auto"), 0);
  EXPECT_EQ(mla::parse_kv_splits("16"), 16);
  for (const char* bad : {"0", "-3", "8x", "", "many", "5000"})
    EXPECT_THROW(mla::parse_kv_splits(bad), BadInput) << bad;
}

TEST(L2Evict, AutoFirstOrNormal) {
  EXPECT_EQ(mla::parse_l2_evict("auto"), mla::L2Evict::automatic);
  EXPECT_EQ(mla::parse_l2_evict("first"), mla::L2Evict::first);
  EXPECT_EQ(mla::parse_l2_evict("normal"), mla::L2Evict::normal);
  for (const char* bad : {"", "last", "First"}) EXPECT_THROW(mla::parse_l2_evict(bad), BadInput) << bad;
}

TEST(KvDtype, ParsesTheThreeCacheTypes) {
  EXPECT_EQ(mla::parse_kv_dtype("fp8_e4m3"), mla::KvDtype::fp8_e4m3);
  EXPECT_EQ(mla::parse_kv_dtype("int8"), mla::KvDtype::int8);
  EXPECT_THROW(mla::parse_kv_dtype("fp16"), BadInput);
}

}  // namespace
}  // namespace dslab
