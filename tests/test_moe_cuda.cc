// GPU MoE variants (router, permutation, grouped or looped experts, shared experts, combine) against the fp64
// reference on fresh random inputs, over models (each router: greedy softmax, group_limited_greedy, noaux_tc
// sigmoid), token counts (each row-tile size of the grouped GEMMs) and routings (ctest label `gpu`).
// Without a GPU they skip. Also here (no GPU needed): tile sizes and the expected-active-experts count.
#include <gtest/gtest.h>

#include "harness/errors.h"

#include <cmath>

#include "harness/host.h"
#include "harness/variant.h"
#include "tests/test_util.h"
#ifdef DSLAB_HAVE_CUDA
#include "variants/moe/cuda/moe_cuda.h"
#endif

namespace dslab {
namespace {

Point moe_point(int64_t tokens, const std::string& routing, int64_t experts = 0, const std::string& router = "auto",
                const std::string& tile = "auto") {
  Point p;
  p.set("moe_tile", {tile, 0, false});
  p.set("tokens", {std::to_string(tokens), tokens, true});
  if (experts) p.set("experts", {std::to_string(experts), experts, true});
  p.set("routing", {routing, 0, false});
  p.set("router", {router, 0, false});
  p.set("proj", {"own", 0, false});
  return p;
}

class GpuMoe : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuMoe, MatchesReferenceOverRoutersTokensAndRoutings) {
  const VariantEntry* entry = find_variant(GetParam());
  if (!entry) GTEST_SKIP() << GetParam() << " is not built (no CUDA toolkit at configure time)";
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  struct Case {
    const char* model;
    int64_t tokens;
    const char* routing;
    int64_t experts;
    const char* router = "auto";  // the router's kernels (auto: as measured on this GPU)
    const char* tile = "auto";    // the grouped GEMMs' tile (auto: as measured on this GPU)
  };
  const std::vector<Case> cases = {
      {"tiny", 1, "model", 0},
      {"tiny", 37, "model", 0},  // noaux_tc, sigmoid; odd intermediate (24)
      {"deepseek-v2-lite", 1, "model", 0},
      {"deepseek-v2-lite", 300, "model", 0},   // greedy softmax; 16- and 64-row tiles
      {"deepseek-v2-lite", 2048, "model", 0},  // 128-row tiles
      {"deepseek-v2", 7, "model", 0},          // group_limited_greedy
      {"deepseek-v2-lite", 64, "uniform", 0},
      {"deepseek-v2-lite", 200, "zipf:1.2", 32},
      {"deepseek-v3", 3, "model", 0},
      {"deepseek-v3", 600, "model", 0},  // noaux_tc over 8 groups of 32
      {"deepseek-v3", 16, "model", 0},
      {"deepseek-v2-lite", 32, "model", 0},  // the most tokens routed in one block
      {"deepseek-v3", 17, "model", 0},       // and one past it (router, then scan)
      // Each router form wherever it runs, whatever the tuner chose above.
      {"deepseek-v2-lite", 8, "model", 0, "one_kernel"},
      {"deepseek-v2-lite", 32, "model", 0, "one_kernel"},
      {"deepseek-v3", 8, "model", 0, "one_kernel"},  // noaux_tc, 8 groups
      {"deepseek-v2-lite", 1, "model", 0, "separate"},
      {"deepseek-v2", 3, "model", 0, "separate"},
  };
  std::vector<Case> all = cases;
  // Each decode tile width of the grouped GEMMs, whatever the tuner chose: V2-Lite (1408 outputs: a part-filled
  // column tile at 128 B rows) at 1 and 5 tokens, V3 at 2 (its 2048-wide experts)
  if (GetParam() == "moe/grouped/cuda" || GetParam() == "moe/grouped_wgmma/cuda")
    for (const char* tile : {"16x32", "16x64", "16x128", "gemv"}) {
      all.push_back({"deepseek-v2-lite", 1, "model", 0, "auto", tile});
      all.push_back({"deepseek-v2-lite", 5, "uniform", 0, "auto", tile});
      all.push_back({"deepseek-v3", 2, "model", 0, "auto", tile});
    }
  if (GetParam() == "moe/grouped/cuda") {  // the GEMV form with several rows a tile and a tile's rows past 16
    all.push_back({"deepseek-v2-lite", 64, "model", 0, "auto", "gemv"});
    all.push_back({"tiny", 37, "model", 0, "auto", "gemv"});
  }
  const uint64_t seed = test::fresh_seed();
  for (const Case& c : all) {
    SCOPED_TRACE(std::string(c.model) + " tokens " + std::to_string(c.tokens) + " routing " + c.routing + " router " +
                 c.router + " tile " + c.tile);
    const ModelFile model = load_model_file(c.model);
    const Point p = moe_point(c.tokens, c.routing, c.experts, c.router, c.tile);
    auto v = entry->make();
    const Support s = v->supports(model, p);
    if (!s.ok && GetParam() == "moe/host/cuda" && !cpu_info().avx512_bf16) GTEST_SKIP() << s.reason;
    ASSERT_TRUE(s.ok) << s.reason;
    v->prepare(model, p, seed);
    v->run();
    v->run();
    const Verification r = v->verify();
    EXPECT_LE(r.rel_err, 1e-2);
    EXPECT_GT(r.rel_err, 0.0) << "bf16 arithmetic cannot match fp64 exactly: is the output really computed?";
    std::printf("%-16s %-18s tokens %5lld %-9s router %-10s tile %-6s rel_err %.3e\n", GetParam().c_str(), c.model,
                static_cast<long long>(c.tokens), c.routing, c.router, c.tile, r.rel_err);
  }
  // One kernel routes at most 32 tokens (a warp each): more is bad input, not a silent fallback.
  auto v = entry->make();
  EXPECT_THROW(v->prepare(load_model_file("deepseek-v2-lite"), moe_point(64, "model", 0, "one_kernel"), seed),
               BadInput);
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuMoe,
                         ::testing::Values("moe/grouped/cuda", "moe/grouped_wgmma/cuda", "moe/loop/cuda",
                                           "moe/host/cuda"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '/') ch = '_';
                           return n;
                         });

#ifdef DSLAB_HAVE_CUDA
TEST(MoeCudaPlan, TileRowsFollowRowsPerExpert) {
  EXPECT_EQ(moe::cuda::tile_rows_for(0.03), 16);  // V3 decode, one token: 8 of 256 experts
  EXPECT_EQ(moe::cuda::tile_rows_for(4), 16);
  EXPECT_EQ(moe::cuda::tile_rows_for(17.5), 64);  // V3, 512 tokens: every expert's rows in one tile
  EXPECT_EQ(moe::cuda::tile_rows_for(64), 128);
  EXPECT_EQ(moe::cuda::tile_rows_for(128), 128);  // V3 prefill, 4096 tokens
}

// The moe_tile axis: each tile the grouped ops can be forced to, anything else one clear error.
TEST(MoeCudaPlan, TileAxisParsesEveryTileAndRejectsOthers) {
  EXPECT_EQ(moe::cuda::parse_moe_tile("auto"), std::make_pair(0, 64));
  EXPECT_EQ(moe::cuda::parse_moe_tile("16x32"), std::make_pair(16, 32));
  EXPECT_EQ(moe::cuda::parse_moe_tile("16x128"), std::make_pair(16, 128));
  EXPECT_EQ(moe::cuda::parse_moe_tile("gemv"), std::make_pair(moe::cuda::kGemvTileRows, 64));
  EXPECT_EQ(moe::cuda::parse_moe_tile("128"), std::make_pair(128, 64));
  for (const char* bad : {"", "16x48", "32", "16"}) EXPECT_THROW(moe::cuda::parse_moe_tile(bad), BadInput) << bad;
}

TEST(MoeCudaPlan, ExpectedActiveExperts) {
  EXPECT_DOUBLE_EQ(moe::cuda::expected_active_experts(256, 8, 1), 8.0);
  EXPECT_NEAR(moe::cuda::expected_active_experts(256, 8, 4096), 256.0, 1e-9);
  // Two tokens: 8 + 8 * (1 - 8/256) expected distinct.
  EXPECT_NEAR(moe::cuda::expected_active_experts(256, 8, 2), 8.0 + 8.0 * (1.0 - 8.0 / 256.0), 1e-9);
}

TEST(MoeCudaPlan, LayerCostCountsRouterExpertsAndShared) {
  const ModelConfig m = test::model("deepseek-v3");
  const Cost c = moe::cuda::moe_layer_cost(m, 1, 8);
  const double H = 7168, I = 2048;
  EXPECT_DOUBLE_EQ(c.flops, 2 * 256 * H + 8 * 6 * H * I + 6 * H * I);
  EXPECT_DOUBLE_EQ(c.bytes, 2 * 256 * H + 8 * 3 * H * I * 2 + 3 * H * I * 2 + H * 2 + H * 4);
}
#endif

}  // namespace
}  // namespace dslab
