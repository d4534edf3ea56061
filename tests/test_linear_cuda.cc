// linear/{own,cublas}/cuda against the fp64 product of the same bf16 values, for every DeepSeek weight shape of
// three models and row counts on both sides of the own GEMV's limit (ctest label `gpu`; skipped without a GPU).
// Also here (no GPU needed): how many warps the GEMV gives one output feature.
#include <gtest/gtest.h>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/variant.h"
#include "tests/test_util.h"
#ifdef DSLAB_HAVE_CUDA
#include "variants/mla/cuda/mla_cuda.h"
#endif

namespace dslab {
namespace {

Point linear_point(const std::string& weight, int64_t tokens) {
  Point p;
  p.set("weight", {weight, 0, false});
  p.set("tokens", {std::to_string(tokens), tokens, true});
  return p;
}

class GpuLinear : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuLinear, MatchesFp64ProductForEveryWeightAndRowCount) {
  const VariantEntry* entry = find_variant(GetParam());
  if (!entry) GTEST_SKIP() << GetParam() << " is not built (no CUDA toolkit at configure time)";
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  const uint64_t seed = test::fresh_seed();
  const std::vector<std::string> weights = {"q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj", "shared_gate_up",
                                            "shared_down_proj", "dense_gate_up", "dense_down_proj", "gate", "lm_head"};
  int checked = 0;
  for (const char* model_name : {"tiny", "deepseek-v2-lite", "deepseek-v3"}) {
    const ModelFile model = load_model_file(model_name);
    for (const std::string& weight : weights) {
      // Every row count the GEMV has a kernel for and two past it (cuBLAS), on the smaller models; V3's weights
      // (and the LM heads) at fewer counts: the fp64 check on the host is the slow part.
      const std::string name = model_name;
      std::vector<int64_t> counts = {1, 2, 3, 33};
      if (name == "deepseek-v3") counts = {1, 2, 3};
      if (weight == "lm_head" && name != "tiny") counts = {3};
      for (int64_t tokens : counts) {
        SCOPED_TRACE(std::string(model_name) + " " + weight + " tokens " + std::to_string(tokens));
        const Point p = linear_point(weight, tokens);
        auto v = entry->make();
        const Support s = v->supports(model, p);
        if (!s.ok) continue;  // q_proj of a q_lora model and the like
        v->prepare(model, p, seed);
        v->run();
        v->run();
        const Verification r = v->verify();
        EXPECT_LE(r.rel_err, r.threshold);
        EXPECT_GT(r.rel_err, 0.0) << "fp32 sums cannot match fp64 exactly: is the output really computed?";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 70);
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuLinear, ::testing::Values("linear/own/cuda", "linear/cublas/cuda"), [](const auto& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (ch == '/') ch = '_';
  return n;
});

TEST(Linear, UnknownWeightIsBadInput) {
  const VariantEntry* entry = find_variant("linear/own/cuda");
  if (!entry) GTEST_SKIP() << "linear/own/cuda is not built (no CUDA toolkit at configure time)";
  auto v = entry->make();
  EXPECT_THROW(v->supports(load_model_file("tiny"), linear_point("wq", 1)), BadInput);
  EXPECT_FALSE(v->supports(load_model_file("deepseek-v2-lite"), linear_point("q_b_proj", 1)).ok);  // no q_lora_rank
}

#ifdef DSLAB_HAVE_CUDA
TEST(Linear, GemvSplitFillsOneWave) {
  // An H100 holding 32 GEMV warps per SM (4224): V2-Lite's kv_a (576 features, K 2048) gets 4 warps per feature,
  // o_proj (2048) two, q_proj (3072) and the LM head one; a split never leaves a lane without a 16-byte chunk
  // (K 512: at most two warps).
  // Small matrices:
  EXPECT_EQ(mla::cuda::gemv_split(576, 2048, 4224), 4);
  EXPECT_EQ(mla::cuda::gemv_split(2048, 2048, 4224), 2);
  EXPECT_EQ(mla::cuda::gemv_split(3072, 2048, 4224), 1);
  EXPECT_EQ(mla::cuda::gemv_split(102400, 2048, 4224), 1);
  EXPECT_EQ(mla::cuda::gemv_split(64, 512, 4224), 2);
  EXPECT_EQ(mla::cuda::gemv_split(64, 256, 4224), 1);
  EXPECT_EQ(mla::cuda::gemv_split(16, 16384, 4224), 8);  // never more than one CTA per feature
  // Long rows: about one batch of 8 loads per lane, many waves (V3's o_proj: 7168 x 16384; V2-Lite's dense down).
  EXPECT_EQ(mla::cuda::gemv_split(7168, 16384, 4224), 8);
  EXPECT_EQ(mla::cuda::gemv_split(2048, 10944, 4224), 4);
}
#endif

}  // namespace
}  // namespace dslab
