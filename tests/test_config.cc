// Config parsing: the four shipped configs, and each kind of bad config.
#include <gtest/gtest.h>

#include "harness/errors.h"
#include "tests/test_util.h"

namespace dslab {
namespace {

TEST(ModelConfig, DeepSeekV2) {
  const ModelConfig m = test::model("deepseek-v2");
  EXPECT_EQ(m.hidden_size, 5120);
  EXPECT_EQ(m.num_attention_heads, 128);
  EXPECT_EQ(*m.q_lora_rank, 1536);
  EXPECT_EQ(m.kv_lora_rank, 512);
  EXPECT_EQ(m.q_head_dim(), 192);
  EXPECT_EQ(m.n_routed_experts, 160);
  EXPECT_EQ(m.topk_method, "group_limited_greedy");
  EXPECT_EQ(m.n_group, 8);
  EXPECT_EQ(m.topk_group, 3);
  EXPECT_EQ(m.scoring_func, "softmax");
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 16.0);
  EXPECT_TRUE(m.rope_scaling.yarn);
  EXPECT_DOUBLE_EQ(m.rope_scaling.factor, 40);
  EXPECT_DOUBLE_EQ(m.rope_scaling.mscale_all_dim, 0.707);
}

TEST(ModelConfig, DeepSeekV2LiteHasNoQLora) {
  const ModelConfig m = test::model("deepseek-v2-lite");
  EXPECT_FALSE(m.q_lora_rank.has_value());
  EXPECT_EQ(m.num_attention_heads, 16);
  EXPECT_EQ(m.n_routed_experts, 64);
  EXPECT_EQ(m.topk_method, "greedy");
}

TEST(ModelConfig, DeepSeekV3) {
  const ModelConfig m = test::model("deepseek-v3");
  EXPECT_EQ(m.hidden_size, 7168);
  EXPECT_EQ(m.n_routed_experts, 256);
  EXPECT_EQ(m.num_experts_per_tok, 8);
  EXPECT_EQ(m.topk_method, "noaux_tc");
  EXPECT_EQ(m.scoring_func, "sigmoid");
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 2.5);
  EXPECT_EQ(m.first_k_dense_replace, 3);
  // 1/sqrt(192) * (0.1*1*ln(40) + 1)^2
  EXPECT_NEAR(m.softmax_scale(), 0.0721687836 * 1.3688879454 * 1.3688879454, 1e-9);
}

TEST(ModelConfig, Tiny) {
  const ModelConfig m = test::model("tiny");
  EXPECT_EQ(m.hidden_size, 64);
  EXPECT_EQ(m.n_group, 4);
}

TEST(ModelConfig, ModelByPath) {
  const ModelFile f = load_model_file("workloads/models/tiny.json");  // tests run from the project root
  EXPECT_EQ(f.name, "tiny");
}

void expect_bad(const std::string& field, const nlohmann::json& value, const std::string& expect_in_message) {
  ModelFile f = load_model_file("tiny");
  if (value.is_discarded())
    f.config.erase(field);
  else
    f.config[field] = value;
  try {
    parse_model_config(f.config, f.name, f.path);
    FAIL() << "accepted " << field << " = " << value.dump();
  } catch (const BadInput& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
    EXPECT_NE(msg.find(expect_in_message), std::string::npos) << msg;
    EXPECT_NE(msg.find("tiny.json"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(ModelConfig, BadConfigsNameFileFieldAndExpectation) {
  expect_bad("hidden_size", -4, "positive integer");
  expect_bad("hidden_size", 0, "positive integer");
  expect_bad("kv_lora_rank", "512", "positive integer");
  expect_bad("hidden_size", nlohmann::json(nlohmann::json::value_t::discarded), "missing");
  expect_bad("kv_lora_rnak", 512, "unknown model field");
  expect_bad("topk_method", "best", "one of");
  expect_bad("qk_rope_head_dim", 7, "even");
  expect_bad("num_experts_per_tok", 99, "at most n_routed_experts");
  expect_bad("n_group", 3, "divisor");
}

TEST(ModelConfig, UnknownModelNameListsKnownOnes) {
  try {
    load_model_file("deepseek-v9");
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek-v2-lite"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dslab

namespace dslab {
namespace {

TEST(Config, MoeLayersFollowFirstKDenseReplaceAndMoeLayerFreq) {
  // As Hugging Face's DeepSeek modelling: routed experts from first_k_dense_replace on, every moe_layer_freq-th layer.
  ModelConfig m;
  m.num_hidden_layers = 8, m.n_routed_experts = 16, m.first_k_dense_replace = 1, m.moe_layer_freq = 1;
  std::vector<int> moe;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) moe.push_back(m.is_moe_layer(l));
  EXPECT_EQ(moe, (std::vector<int>{0, 1, 1, 1, 1, 1, 1, 1}));
  m.first_k_dense_replace = 3, m.moe_layer_freq = 2;
  moe.clear();
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) moe.push_back(m.is_moe_layer(l));
  EXPECT_EQ(moe, (std::vector<int>{0, 0, 0, 0, 1, 0, 1, 0}));
  m.n_routed_experts = 0;  // a dense model
  EXPECT_FALSE(m.is_moe_layer(5));
}

}  // namespace
}  // namespace dslab
