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

}  // namespace
}  // namespace dslab
