// The reference layer: RoPE/YaRN against hand-computed values, routing on hand-checked cases, and the
// absorption identity (all MLA forms give the same layer output) in fp64.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"
#include "variants/reference/reference.h"

namespace dslab {
namespace {

ModelConfig rope_config(double mscale, double mscale_all_dim) {
  ModelConfig m = test::model("tiny");  // qk_nope 16, qk_rope 8
  m.rope_theta = 10000;
  m.rope_scaling = {true, 4, 16, 32, 1, mscale, mscale_all_dim};
  return m;
}

TEST(Rope, YarnInverseFrequenciesByHand) {
  // dim 8, base 1e4, factor 4, original context 16: the correction range is [0, 1]
  // (8 ln(16/(32·2π)) / (2 ln 1e4) = -1.099 -> 0;  8 ln(16/(1·2π)) / (2 ln 1e4) = 0.406 -> 1),
  // so only frequency 0 keeps its original value and 1..3 are divided by the factor.
  const auto inv = ref::rope_inv_freq(rope_config(0.707, 0.707));
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_NEAR(inv[0], 1.0, 1e-15);
  EXPECT_NEAR(inv[1], 0.1 / 4, 1e-15);
  EXPECT_NEAR(inv[2], 0.01 / 4, 1e-15);
  EXPECT_NEAR(inv[3], 0.001 / 4, 1e-15);
}

TEST(Rope, RotatesInterleavedPairsIntoHalves) {
  const ModelConfig m = rope_config(0.707, 0.707);
  double x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ref::apply_rope(m, 2, x);
  // pair (1,2) at angle 2·1: (1 cos2 - 2 sin2, 2 cos2 + 1 sin2) lands at indices 0 and 4.
  EXPECT_NEAR(x[0], -2.2347416, 1e-6);
  EXPECT_NEAR(x[4], 0.0770029, 1e-6);
  // pair (3,4) at angle 2·0.025 = 0.05 lands at indices 1 and 5.
  EXPECT_NEAR(x[1], 2.7963341, 1e-6);
  EXPECT_NEAR(x[5], 4.1449385, 1e-6);
}

TEST(Rope, MscaleCorrections) {
  // Equal mscale and mscale_all_dim: cos/sin unscaled; the softmax scale carries mscale(all_dim)^2.
  EXPECT_DOUBLE_EQ(ref::rope_mscale(rope_config(0.707, 0.707)), 1.0);
  const double m = 0.1 * 0.707 * std::log(4.0) + 1;  // 1.0980
  EXPECT_NEAR(rope_config(0.707, 0.707).softmax_scale(), m * m / std::sqrt(24.0), 1e-12);
  // mscale 1 vs all_dim 0.707: (0.1 ln4 + 1) / (0.0707 ln4 + 1)
  EXPECT_NEAR(ref::rope_mscale(rope_config(1.0, 0.707)), 1.1386294 / 1.0980112, 1e-6);
}

ModelConfig routing_config(const std::string& method, const std::string& scoring, int64_t groups, int64_t topk_group) {
  ModelConfig m;
  m.n_routed_experts = 8;
  m.num_experts_per_tok = 2;
  m.topk_method = method;
  m.scoring_func = scoring;
  m.n_group = groups;
  m.topk_group = topk_group;
  return m;
}

TEST(Routing, GreedySoftmax) {
  ModelConfig m = routing_config("greedy", "softmax", 1, 1);
  m.routed_scaling_factor = 16;  // V2: no normalisation, scaled
  const auto r = ref::route(m, {0, 1, 2, 3, 0, 0, 0, 0}, {}, 1);
  ASSERT_EQ(r.expert, (std::vector<int>{3, 2}));
  const double sum = 5 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);  // five experts at logit 0: 35.1929
  EXPECT_NEAR(r.weight[0], 16 * std::exp(3.0) / sum, 1e-12);
  EXPECT_NEAR(r.weight[1], 16 * std::exp(2.0) / sum, 1e-12);
}

TEST(Routing, GroupLimitedGreedyKeepsToTheBestGroup) {
  // Groups of two: g0 = {5, 0}, g1 = {4.8, 4.8}. Greedy would take experts 0 and 2; with one group
  // allowed only g0 (max 5) remains, so the second choice is expert 1 despite its low score.
  const ModelConfig m = routing_config("group_limited_greedy", "softmax", 4, 1);
  const auto r = ref::route(m, {5, 0, 4.8, 4.8, 0, 0, 4.5, 0}, {}, 1);
  EXPECT_EQ(r.expert, (std::vector<int>{0, 1}));
  const auto g = ref::route(routing_config("greedy", "softmax", 1, 1), {5, 0, 4.8, 4.8, 0, 0, 4.5, 0}, {}, 1);
  EXPECT_EQ(g.expert, (std::vector<int>{0, 2}));
}

TEST(Routing, NoauxTcChoosesByBiasWeighsWithout) {
  ModelConfig m = routing_config("noaux_tc", "sigmoid", 4, 2);
  m.norm_topk_prob = true;
  m.routed_scaling_factor = 2.5;
  // sigmoid: 0.5 everywhere but expert 7 (logit ln 3 -> 0.75). Biased group scores (sum of best two):
  // g0 1.0, g1 0.8+0.6 = 1.4, g2 1.0, g3 0.95+0.5 = 1.45 -> groups 3 and 1; best biased there: 7 (0.95), 2 (0.8).
  const std::vector<float> bias = {0, 0, 0.3f, 0.1f, 0, 0, 0, 0.2f};
  const auto r = ref::route(m, {0, 0, 0, 0, 0, 0, 0, std::log(3.0)}, bias, 1);
  ASSERT_EQ(r.expert, (std::vector<int>{7, 2}));
  // Weights from unbiased scores 0.75 and 0.5, normalised (0.6, 0.4), times 2.5.
  EXPECT_NEAR(r.weight[0], 1.5, 1e-6);
  EXPECT_NEAR(r.weight[1], 1.0, 1e-6);
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

void expect_forms_agree(const ModelConfig& m, int64_t layer) {
  const uint64_t seed = test::fresh_seed();
  const auto p = ref::make_layer_params(m, layer, seed);
  const auto in = ref::make_mla_inputs(m, 2, 3, 11, seed);
  const auto base = ref::decoder_layer(m, layer, p, in, ref::MlaForm::decompressed);
  for (double v : base) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LE(rel_diff(ref::decoder_layer(m, layer, p, in, ref::MlaForm::absorbed_concat), base), 1e-10);
  EXPECT_LE(rel_diff(ref::decoder_layer(m, layer, p, in, ref::MlaForm::absorbed_split), base), 1e-10);
  // Sanity: the attention output is not negligible next to the residual, so the identity says something.
  const auto attn = ref::mla_attention(m, p.attn, in, ref::MlaForm::decompressed);
  double norm = 0;
  for (double v : attn) norm += v * v;
  EXPECT_GT(norm / double(attn.size()), 1e-3);
}

// A layer computed for a sample of its new tokens (MlaInputs::rows) gives exactly those rows of the whole
// computation, and zeros elsewhere: dense and MoE layers, two requests, the sample's first and last tokens included.
TEST(DecoderLayer, SampledRowsEqualTheWholeComputation) {
  const ModelConfig m = test::model("tiny");
  const uint64_t seed = test::fresh_seed();
  for (int64_t layer : {0, 1}) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    const auto p = ref::make_layer_params(m, layer, seed);
    auto in = ref::make_mla_inputs(m, 2, 9, 13, seed);
    const auto whole = ref::decoder_layer(m, layer, p, in, ref::MlaForm::absorbed_split);
    in.rows = {0, 4, 8};
    const auto sampled = ref::decoder_layer(m, layer, p, in, ref::MlaForm::absorbed_split);
    ASSERT_EQ(sampled.size(), whole.size());
    const int64_t H = m.hidden_size;
    int64_t compared = 0;
    for (int64_t t = 0; t < 2 * 9; ++t) {
      const bool kept = t % 9 == 0 || t % 9 == 4 || t % 9 == 8;
      for (int64_t j = 0; j < H; ++j) {
        const size_t i = size_t(t * H + j);
        if (kept)
          EXPECT_EQ(sampled[i], whole[i]) << "token " << t;
        else
          EXPECT_EQ(sampled[i], 0.0) << "token " << t;
      }
      compared += kept;
    }
    EXPECT_EQ(compared, 6);
    in.rows = {9};
    EXPECT_THROW(ref::decoder_layer(m, layer, p, in, ref::MlaForm::absorbed_split), std::invalid_argument);
  }
}

TEST(AbsorptionIdentity, AllFormsGiveTheSameLayerOutputDenseLayer) { expect_forms_agree(test::model("tiny"), 0); }
TEST(AbsorptionIdentity, AllFormsGiveTheSameLayerOutputMoeLayer) { expect_forms_agree(test::model("tiny"), 1); }
TEST(AbsorptionIdentity, PlainQProjection) {
  ModelConfig m = test::model("tiny");
  m.q_lora_rank.reset();  // V2-Lite style
  expect_forms_agree(m, 1);
}

// Sparse attention's reference: attention over a selection of keys per request. Selecting every key is dense
// attention exactly; with a subset, a key left out has no influence (perturbing its latent changes nothing) and a
// key kept has (perturbing it changes the output); the three forms agree on the subset too; the dense mass inside
// a selection adds up over complementary ones.
TEST(Reference, MlaAttentionOverAKeySelection) {
  const ModelConfig m = test::model("tiny");
  const uint64_t seed = test::fresh_seed();
  const auto p = ref::make_mla_params(m, m.num_attention_heads, seed);
  auto in = ref::make_mla_inputs(m, 2, 2, 20, seed);
  const int64_t N = in.kv_len + in.q_len, r = m.kv_lora_rank;
  std::vector<std::vector<int64_t>> all(2);
  for (auto& keys : all)
    for (int64_t j = 0; j < N; ++j) keys.push_back(j);
  const auto dense = ref::mla_attention(m, p, in, ref::MlaForm::absorbed_split);
  EXPECT_EQ(ref::mla_attention(m, p, in, ref::MlaForm::absorbed_split, &all), dense);
  // request 0: two sinks, a middle run and the new tokens; request 1: every third key and the new tokens
  std::vector<std::vector<int64_t>> some = {{0, 1, 7, 8, 9, 10, 20, 21}, {0, 3, 6, 9, 12, 15, 18, 20, 21}};
  const auto sparse = ref::mla_attention(m, p, in, ref::MlaForm::absorbed_split, &some);
  EXPECT_GT(rel_diff(sparse, dense), 1e-6);
  EXPECT_LE(rel_diff(ref::mla_attention(m, p, in, ref::MlaForm::decompressed, &some), sparse), 1e-10);
  EXPECT_LE(rel_diff(ref::mla_attention(m, p, in, ref::MlaForm::absorbed_concat, &some), sparse), 1e-10);
  auto perturbed = [&](int64_t request, int64_t key) {
    ref::MlaInputs x = in;
    for (int64_t i = 0; i < r; ++i) x.ckv_cache[size_t((request * in.kv_len + key) * r + i)] = to_bf16(0.5f);
    return ref::mla_attention(m, p, x, ref::MlaForm::absorbed_split, &some);
  };
  EXPECT_EQ(perturbed(0, 5), sparse);  // key 5 of request 0: not selected
  EXPECT_EQ(perturbed(1, 4), sparse);  // key 4 of request 1: not selected
  EXPECT_NE(perturbed(0, 8), sparse);  // selected
  std::vector<std::vector<int64_t>> bad = {{0, N}, {0}};
  EXPECT_THROW(ref::mla_attention(m, p, in, ref::MlaForm::absorbed_split, &bad), std::invalid_argument);
  // mass_recall: dense attention's mass inside the selection; every key keeps it all, a split into two halves shares
  // it.
  double mass_all = 0, mass_even = 0, mass_odd = 0;
  ref::mla_attention(m, p, in, ref::MlaForm::absorbed_split, &all, &mass_all);
  std::vector<std::vector<int64_t>> even(2), odd(2);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < N; ++j) (j % 2 ? odd : even)[size_t(b)].push_back(j);
  ref::mla_attention(m, p, in, ref::MlaForm::absorbed_split, &even, &mass_even);
  ref::mla_attention(m, p, in, ref::MlaForm::absorbed_split, &odd, &mass_odd);
  EXPECT_NEAR(mass_all, 1.0, 1e-12);
  EXPECT_NEAR(mass_even + mass_odd, 1.0, 1e-12);
  EXPECT_GT(mass_even, 0.05);
  EXPECT_GT(mass_odd, 0.05);
}

TEST(Reference, GeneratorIsDeterministicPerSeedAndName) {
  const auto a = ref::random_bf16(7, "w", 1000, 1.0f), b = ref::random_bf16(7, "w", 1000, 1.0f);
  const auto c = ref::random_bf16(8, "w", 1000, 1.0f), d = ref::random_bf16(7, "v", 1000, 1.0f);
  int same_ab = 0, same_ac = 0, same_ad = 0, zeros = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same_ab += a[i].bits == b[i].bits;
    same_ac += a[i].bits == c[i].bits;
    same_ad += a[i].bits == d[i].bits;
    zeros += to_float(a[i]) == 0.0f;
  }
  EXPECT_EQ(same_ab, 1000);
  EXPECT_LT(same_ac, 50);
  EXPECT_LT(same_ad, 50);
  EXPECT_LT(zeros, 5);
}

}  // namespace
}  // namespace dslab

namespace dslab {
namespace {

TEST(Reference, ForcedRoutingFollowsTheGivenExpertsAndMeasuresTheGap) {
  const ModelConfig m = test::model("deepseek-v2-lite");  // greedy softmax over 64 experts, top 6
  const int64_t E = m.n_routed_experts, K = m.num_experts_per_tok;
  std::vector<double> logits(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) logits[size_t(e)] = std::sin(double(e) * 1.7);  // distinct scores
  const ref::Routing own = ref::route(m, logits, {}, 1);
  ref::MoeParams::RoutingCheck check;
  const ref::Routing same = ref::route(m, logits, {}, 1, &own.expert, &check);
  EXPECT_EQ(check.tokens_differing, 0);
  EXPECT_EQ(same.expert, own.expert);
  // Swap the weakest chosen expert for the best unchosen one: followed, and the gap is the scores' distance.
  std::vector<int> forced = own.expert;
  int best_other = -1;
  for (int64_t e = 0; e < E; ++e)
    if (std::find(own.expert.begin(), own.expert.end(), int(e)) == own.expert.end() &&
        (best_other < 0 || logits[size_t(e)] > logits[size_t(best_other)]))
      best_other = int(e);
  forced[size_t(K - 1)] = best_other;
  const ref::Routing followed = ref::route(m, logits, {}, 1, &forced, &check);
  EXPECT_EQ(followed.expert, forced);
  EXPECT_EQ(check.tokens_differing, 1);
  EXPECT_GT(check.max_gap, 0.0);
}

// Group-limited routing (tiny: noaux_tc, 16 experts in 4 groups, the best 2 groups, top 4): a choice that differs
// because two groups' rank scores nearly tie is a near-tie however far its experts' own scores lie below ours; an
// expert outside the best of its groups is not.
TEST(Reference, AGroupFlippedByANearTieIsANearTie) {
  const ModelConfig m = test::model("tiny");
  ASSERT_EQ(m.n_routed_experts, 16);
  ASSERT_EQ(m.n_group, 4);
  ASSERT_EQ(m.topk_group, 2);
  ASSERT_EQ(m.num_experts_per_tok, 4);
  // Sigmoid scores; group rank = its two best: group 0 1.75, group 1 1.5, group 2 1.4999 (0.99 + 0.5099), group 3 0.4.
  const double p[16] = {0.9, 0.85, 0.3, 0.2, 0.8, 0.7, 0.1, 0.1, 0.99, 0.5099, 0.3, 0.1, 0.2, 0.2, 0.1, 0.1};
  std::vector<double> logits(16);
  for (int e = 0; e < 16; ++e) logits[size_t(e)] = std::log(p[e] / (1 - p[e]));
  const std::vector<float> bias(16, 0.0f);
  const ref::Routing own = ref::route(m, logits, bias, 1);
  std::vector<int> ours = own.expert;
  std::sort(ours.begin(), ours.end());
  EXPECT_EQ(ours, (std::vector<int>{0, 1, 4, 5}));
  ref::MoeParams::RoutingCheck flipped;
  const std::vector<int> group_two = {8, 0, 1, 9};  // the best four of groups 0 and 2
  ref::route(m, logits, bias, 1, &group_two, &flipped);
  EXPECT_EQ(flipped.tokens_differing, 1);
  EXPECT_LT(flipped.max_gap, 1e-3);  // expert 9 lies 27% below expert 5, but the groups tie within 1e-4
  ref::MoeParams::RoutingCheck wrong;
  const std::vector<int> weak = {0, 1, 4, 7};  // expert 7 (0.1) in place of expert 5 (0.7), groups unchanged
  ref::route(m, logits, bias, 1, &weak, &wrong);
  EXPECT_EQ(wrong.tokens_differing, 1);
  EXPECT_GT(wrong.max_gap, 0.5);
  ref::MoeParams::RoutingCheck wrong_group;
  const std::vector<int> group_three = {0, 1, 12, 13};  // group 3 (rank 0.4) in place of group 1 (1.5)
  ref::route(m, logits, bias, 1, &group_three, &wrong_group);
  EXPECT_GT(wrong_group.max_gap, 0.5);
}

}  // namespace
}  // namespace dslab
