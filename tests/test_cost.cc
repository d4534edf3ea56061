// The analytic cost model against the per-token counts the MADSys benchmark publishes (DeepSeek-V2).
#include <gtest/gtest.h>

#include "tests/test_util.h"
#include "variants/mla/mla.h"

namespace dslab {
namespace {

TEST(MlaCost, PerCachedTokenAtDeepSeekV2Dims) {
  const ModelConfig m = test::model("deepseek-v2");
  const auto cd = mla::cost_per_cached_token(m, mla::Algo::cd, 128);
  EXPECT_EQ(cd.flops, 81920);
  EXPECT_EQ(cd.bytes, 81920);
  const auto cc = mla::cost_per_cached_token(m, mla::Algo::cc, 128);
  EXPECT_EQ(cc.flops, 33636352);
  EXPECT_EQ(cc.bytes, 1152);
  for (auto algo : {mla::Algo::a_cc, mla::Algo::a_cc_me}) {
    const auto a = mla::cost_per_cached_token(m, algo, 128);
    EXPECT_EQ(a.flops, 278528);
    EXPECT_EQ(a.bytes, 1152);
  }
}

TEST(MlaCost, StepCostGrowsWithTheCacheAsThePerTokenFigures) {
  const ModelConfig m = test::model("deepseek-v2");
  for (auto algo : {mla::Algo::cd, mla::Algo::cc, mla::Algo::a_cc, mla::Algo::a_cc_me}) {
    const auto c1 = mla::cost(m, algo, {128, 1, 1, 4096}), c2 = mla::cost(m, algo, {128, 1, 1, 8192});
    const auto per = mla::cost_per_cached_token(m, algo, 128);
    EXPECT_DOUBLE_EQ(c2.flops - c1.flops, 4096 * per.flops);
    EXPECT_DOUBLE_EQ(c2.bytes - c1.bytes, 4096 * per.bytes);
  }
}

TEST(MlaCost, CausalExtendCountsOnlyVisiblePairs) {
  const ModelConfig m = test::model("tiny");
  const auto per = mla::cost_per_cached_token(m, mla::Algo::a_cc_me, 4);
  const auto s1 = mla::cost(m, mla::Algo::a_cc_me, {4, 1, 4, 10}), s0 = mla::cost(m, mla::Algo::a_cc_me, {4, 1, 4, 0});
  // 4 queries each see 10 more keys.
  EXPECT_DOUBLE_EQ(s1.flops - s0.flops, 40 * per.flops);
}

TEST(MlaCost, AttentionKernelByHand) {
  // The fused kernel at 16 heads over two requests of 100 and 300 cached tokens, one new token each: 402 (query, key)
  // pairs x 2 x 16 x (576 + 512) FLOPs; it reads 402 cached [512 | 64] bf16 rows and q_cat, writes the latent output.
  const ModelConfig m = test::model("deepseek-v3");
  mla::Shape s;
  s.heads = 16, s.batch = 2, s.q_len = 1, s.kv_len = 200;
  const Cost fused = mla::attention_kernel_cost(m, mla::Algo::a_cc_me, s, {100, 300}, /*fused=*/true);
  EXPECT_DOUBLE_EQ(fused.flops, 402.0 * 2 * 16 * 1088);
  EXPECT_DOUBLE_EQ(fused.bytes, 402.0 * 1152 + 2.0 * 16 * 576 * 2 + 2.0 * 16 * 512 * 2);
  // The unfused absorbed form's core adds W_UK into q and W_UV out, and reads kv_b_proj.
  const Cost unfused = mla::attention_kernel_cost(m, mla::Algo::a_cc_me, s, {100, 300}, /*fused=*/false);
  EXPECT_DOUBLE_EQ(unfused.flops - fused.flops, 2.0 * 2 * 16 * 512 * 256);
  EXPECT_GT(unfused.bytes, 2.0 * 512 * 16 * 256);
}

}  // namespace
}  // namespace dslab
