// DeepSeek over several GPUs (planner/parallel.h): head and expert splits, what each GPU holds, the collectives'
// sizes, KV capacity - against counts made independently (the reference's own tensors) and by hand.
#include <gtest/gtest.h>

#include "harness/errors.h"
#include "planner/parallel.h"
#include "tests/test_util.h"
#include "variants/reference/reference.h"

namespace dslab::planner {
namespace {

using test::model;

TEST(Parallel, OneGpuHoldsEveryWeightTheReferenceMakes) {
  const ModelConfig m = model("tiny");
  double elements = 2.0 * double(m.vocab_size * m.hidden_size);  // embedding, LM head
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const ref::LayerParams p = ref::make_layer_params(m, l, 7);
    const ref::MlaParams& a = p.attn;
    for (const auto* t :
         {&p.input_layernorm, &p.post_attention_layernorm, &a.q_a_proj, &a.q_a_layernorm, &a.q_b_proj, &a.q_proj,
          &a.kv_a_proj_with_mqa, &a.kv_a_layernorm, &a.kv_b_proj, &a.o_proj, &p.dense.gate_proj, &p.dense.up_proj,
          &p.dense.down_proj, &p.moe.gate, &p.moe.shared.gate_proj, &p.moe.shared.up_proj, &p.moe.shared.down_proj})
      elements += double(t->size());
    for (const auto& e : p.moe.experts) elements += double(e.gate_proj.size() + e.up_proj.size() + e.down_proj.size());
  }
  const ShardPlan s = shard_plan(m, {1, false, false}, 4, 1, 100);
  EXPECT_DOUBLE_EQ(s.weight_bytes_per_gpu, 2 * elements);
  EXPECT_TRUE(s.per_moe_layer.empty());  // one GPU: no collectives
  EXPECT_DOUBLE_EQ(s.kv_bytes_per_gpu, 4.0 * 100 * 2 * (32 + 8) * 2);
}

TEST(Parallel, DeepseekV3OnEightGpusSplitsHeadsOrRequestsAndExpertsOrSlices) {
  const ModelConfig m = model("deepseek-v3");
  const double rows = 64.0 * 7168 * 2;  // a decode step of 64 tokens' hidden states, bf16
  const ShardPlan tp = shard_plan(m, {8, false, false}, 64, 1, 4096);
  EXPECT_EQ(tp.heads_per_gpu, 16);  // dslab's 16-head case
  EXPECT_EQ(tp.requests_per_gpu, 64);
  EXPECT_EQ(tp.experts_per_gpu, 256);
  EXPECT_DOUBLE_EQ(tp.expert_fraction, 1.0 / 8);
  EXPECT_DOUBLE_EQ(tp.kv_bytes_per_token_layer, (512 + 64) * 2);
  ASSERT_EQ(tp.per_moe_layer.size(), 2u);
  EXPECT_EQ(tp.per_moe_layer[0].kind, "all_reduce");
  EXPECT_DOUBLE_EQ(tp.per_moe_layer[0].bytes, rows);
  const ShardPlan dp = shard_plan(m, {8, true, true}, 64, 1, 4096);
  EXPECT_EQ(dp.heads_per_gpu, 128);
  EXPECT_EQ(dp.requests_per_gpu, 8);
  EXPECT_EQ(dp.experts_per_gpu, 32);
  EXPECT_DOUBLE_EQ(dp.kv_bytes_per_gpu * 8, tp.kv_bytes_per_gpu);  // the latent cache no longer duplicated
  ASSERT_EQ(dp.per_moe_layer.size(), 2u);
  EXPECT_EQ(dp.per_moe_layer[0].kind, "all_to_all");
  EXPECT_DOUBLE_EQ(dp.per_moe_layer[0].bytes, rows * 8);  // each token to its 8 experts
  EXPECT_EQ(dp.per_dense_layer[0].kind, "all_gather");
  EXPECT_GT(dp.weight_bytes_per_gpu, tp.weight_bytes_per_gpu);  // DP replicates the attention weights
  const ShardPlan dp_tp = shard_plan(m, {8, true, false}, 100, 1, 4096);
  EXPECT_EQ(dp_tp.requests_per_gpu, 13);  // ceil(100 / 8)
  EXPECT_EQ(dp_tp.per_moe_layer[1].kind, "reduce_scatter");
}

TEST(Parallel, KvCapacityCountsTensorParallelCopiesOnceAndDataParallelGpusEach) {
  const ModelConfig m = model("tiny");
  const double per_request = 100.0 * 2 * (32 + 8) * 2;
  const Parallelism tp{2, false, false}, dp{2, true, false};
  const double tp_weights = shard_plan(m, tp, 1, 1, 100).weight_bytes_per_gpu;
  const double dp_weights = shard_plan(m, dp, 1, 1, 100).weight_bytes_per_gpu;
  EXPECT_LT(tp_weights, dp_weights);
  EXPECT_EQ(kv_capacity_requests(m, tp, tp_weights + 10 * per_request + 1, 100), 10);
  EXPECT_EQ(kv_capacity_requests(m, dp, dp_weights + 10 * per_request + 1, 100), 20);
  EXPECT_EQ(kv_capacity_requests(m, tp, tp_weights / 2, 100), 0);  // the weights alone do not fit
}

TEST(Parallel, SplitsThatDoNotDivideAreBadInput) {
  const ModelConfig m = model("deepseek-v3");
  EXPECT_THROW(shard_plan(m, {3, false, false}, 8, 1, 1024), BadInput);  // 128 heads over 3
  EXPECT_THROW(shard_plan(m, {3, true, true}, 8, 1, 1024), BadInput);    // 256 experts over 3
  EXPECT_NO_THROW(shard_plan(m, {3, true, false}, 8, 1, 1024));          // DP attention, TP experts
  EXPECT_THROW(shard_plan(m, {0, false, false}, 8, 1, 1024), BadInput);
}

}  // namespace
}  // namespace dslab::planner
