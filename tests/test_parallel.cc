// DeepSeek over several GPUs (planner/parallel.h): head and expert splits, what each GPU holds, the collectives'
// sizes, KV capacity - against counts made independently (the reference's own tensors) and by hand.
#include <gtest/gtest.h>

#include "harness/errors.h"
#include "planner/parallel.h"
#include "planner/sharded_layer.h"
#include "variants/layer/ops.h"
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
  EXPECT_TRUE(dp.per_dense_layer.empty());                // the dense MLPs replicated: each GPU runs its own tokens
  EXPECT_EQ(shard_plan(m, {8, true, false}, 64, 1, 4096).per_dense_layer[0].kind, "all_gather");
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

namespace dslab::planner {
namespace {

// The collectives' cost model by hand: NCCL's bus bandwidth, 2(n-1)/n for an all-reduce, (n-1)/n for an all-gather
// or a reduce-scatter; an all-to-all of 1 GB in all on 2 GPUs sends 0.5 GB from each, half of it to the other GPU.
TEST(ParallelEstimate, CollectivesFollowTheBusBandwidthModel) {
  const Link link{100e9, 5e-6};
  EXPECT_DOUBLE_EQ(collective_seconds({"all_reduce", "", 1e9}, 8, link), 5e-6 + 1e9 * 2 * 7 / 8 / 100e9);
  EXPECT_DOUBLE_EQ(collective_seconds({"all_gather", "", 1e9}, 4, link), 5e-6 + 1e9 * 3 / 4 / 100e9);
  EXPECT_DOUBLE_EQ(collective_seconds({"all_to_all", "", 1e9}, 2, link), 5e-6 + 1e9 / 4 / 100e9);
  EXPECT_EQ(collective_seconds({"all_reduce", "", 1e9}, 1, link), 0);
}

// A calibration's fit prices its kinds; a kind it lacks keeps the defaults; one GPU's (no fit) is the defaults; a
// fit with a bad field is bad input naming the file and the field.
TEST(ParallelEstimate, CalibratedCollectivesPriceEachKind) {
  const nlohmann::json calibration = {
      {"gpus", 8}, {"nccl", "2.27.3"}, {"fit", {{"all_reduce", {{"latency_s", 20e-6}, {"bus_bytes_per_s", 200e9}}}}}};
  const Link link = link_from_calibration(calibration, "NVIDIA H200", "machine.json");
  EXPECT_EQ(link.measured_gpus, 8);
  EXPECT_EQ(link.measured_on, "8 x NVIDIA H200, NCCL 2.27.3");
  EXPECT_DOUBLE_EQ(collective_seconds({"all_reduce", "", 1e9}, 8, link), 20e-6 + 1e9 * 2 * 7 / 8 / 200e9);
  EXPECT_DOUBLE_EQ(collective_seconds({"all_gather", "", 1e9}, 8, link), 10e-6 + 1e9 * 7 / 8 / 360e9);
  EXPECT_TRUE(link_from_calibration({{"gpus", 1}, {"points", nlohmann::json::array()}}, "", "m").measured.empty());
  EXPECT_TRUE(link_from_calibration({{"absent", "1 GPU visible"}}, "", "m").measured.empty());
  nlohmann::json bad = calibration;
  bad["fit"]["all_reduce"]["bus_bytes_per_s"] = -1;
  try {
    link_from_calibration(bad, "", "machine.json");
    ADD_FAILURE() << "a negative bus bandwidth was taken";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("machine.json: collectives.fit.all_reduce.bus_bytes_per_s: -1"),
              std::string::npos)
        << e.what();
  }
}

// One GPU: the ops' own prices, no collectives; the placements rank as SGLang reports: a large batch over long
// caches is faster with DP attention (each GPU reads only its requests' cache), one request with TP attention (DP
// cannot split it, and replicates the weights).
TEST(ParallelEstimate, OneGpuIsTheOpsAloneAndDpAttentionWinsLargeBatches) {
  const ModelConfig m = test::model("deepseek-v3");
  const GpuCeilings gpu;
  const ParallelEstimate one = estimate_parallel_step(m, {1, false, false}, 4, 4096, gpu);
  layer::StepShape s;
  s.batch = 4, s.q_len = 1, s.kv_len = 4096;
  double want = 0;
  for (const auto& op : layer::step_ops(m, s))
    want += std::max(op.flops / gpu.tensor_flops, op.bytes() / gpu.hbm_bytes_per_s) + op.gpu_kernels * gpu.kernel_s;
  EXPECT_NEAR(one.compute_s, want, 1e-12 * want);
  EXPECT_EQ(one.comm_s, 0);
  EXPECT_EQ(rank_placements(m, 1, 4, 4096).size(), 1u);

  const auto large = rank_placements(m, 8, 256, 32768);
  ASSERT_EQ(large.size(), 4u);
  EXPECT_TRUE(large.front().p.dp_attention) << large.front().label();
  const auto single = rank_placements(m, 8, 1, 4096);
  EXPECT_FALSE(single.front().p.dp_attention) << single.front().label();
  for (const auto& e : large) EXPECT_GT(e.comm_s, 0);
  // Heads that do not divide: no TP attention among the placements.
  EXPECT_EQ(rank_placements(m, 3, 8, 4096).size(), 1u);  // (V3's 256 experts and 128 heads: only DP + TP over 3)
}

// Every placement of a layer over 2 and 4 GPUs (TP or DP attention x TP or EP experts), rank by rank in fp64 with
// each rank holding only its shard: the single-GPU layer's output at every request (dense and MoE layers, a decode
// step and an MTP step of 2, a batch the DP ranks share unevenly, one rank idle), and the collectives shard_plan
// prices.
TEST(ShardedLayer, EveryPlacementComputesTheSingleGpuLayer) {
  const ModelConfig m = model("tiny");  // 4 heads, 16 experts (4 of them a token), one dense layer, then MoE
  for (const int64_t layer : {0, 1}) {
    const ref::LayerParams p = ref::make_layer_params(m, layer, 11);
    for (const auto& [batch, q_len] : std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {3, 2}}) {
      const ref::MlaInputs in = ref::make_mla_inputs(m, batch, q_len, 40, 12);
      const std::vector<double> single = ref::decoder_layer(m, layer, p, in, ref::MlaForm::absorbed_split);
      double scale = 0;
      for (double v : single) scale = std::max(scale, std::abs(v));
      for (const int64_t gpus : {2, 4})
        for (const bool dp : {false, true})
          for (const bool ep : {false, true}) {
            const Parallelism parallel{gpus, dp, ep};
            SCOPED_TRACE("layer " + std::to_string(layer) + " batch " + std::to_string(batch) + " q_len " +
                         std::to_string(q_len) + " gpus " + std::to_string(gpus) + (dp ? " DP" : " TP") +
                         " attention, " + (ep ? "EP" : "TP") + " experts");
            const ShardedLayerStep step =
                sharded_decoder_layer(m, layer, p, in, ref::MlaForm::absorbed_split, parallel);
            ASSERT_EQ(step.out.size(), single.size());
            double worst = 0;
            for (size_t i = 0; i < single.size(); ++i) worst = std::max(worst, std::abs(step.out[i] - single[i]));
            EXPECT_LT(worst, 1e-12 * scale);  // the same sums, regrouped by rank
            const ShardPlan plan = shard_plan(m, parallel, batch, q_len, 40);
            const auto& priced = m.is_moe_layer(layer) ? plan.per_moe_layer : plan.per_dense_layer;
            ASSERT_EQ(step.collectives.size(), priced.size());
            for (size_t c = 0; c < priced.size(); ++c) {
              EXPECT_EQ(step.collectives[c].kind, priced[c].kind);
              EXPECT_DOUBLE_EQ(step.collectives[c].bytes, priced[c].bytes);
            }
          }
    }
  }
}

// A shard is the weights' rows and columns it should be: heads' rows of kv_b and columns of o_proj, an MLP's
// intermediate units; the shards together hold each weight once. Splits that do not divide are bad input.
TEST(ShardedLayer, ShardsTileTheWeights) {
  const ModelConfig m = model("tiny");
  const ref::LayerParams p = ref::make_layer_params(m, 1, 3);
  size_t kv_b = 0, o = 0, q_b = 0;
  for (int64_t rank = 0; rank < 4; ++rank) {
    const ref::MlaParams s = shard_heads(m, p.attn, rank, 4);
    EXPECT_EQ(s.heads, 1);
    ASSERT_EQ(s.kv_a_proj_with_mqa.size(), p.attn.kv_a_proj_with_mqa.size());  // the latent projection whole
    EXPECT_EQ(to_float(s.kv_a_proj_with_mqa.back()), to_float(p.attn.kv_a_proj_with_mqa.back()));
    kv_b += s.kv_b_proj.size(), o += s.o_proj.size(), q_b += s.q_b_proj.size();
    // head `rank`'s first kv_b row, and o_proj's row 0 at that head's first column
    const int64_t kv_rows = m.qk_nope_head_dim + m.v_head_dim;
    EXPECT_EQ(to_float(s.kv_b_proj[0]), to_float(p.attn.kv_b_proj[size_t(rank * kv_rows * m.kv_lora_rank)]));
    EXPECT_EQ(to_float(s.o_proj[1]), to_float(p.attn.o_proj[size_t(rank * m.v_head_dim + 1)]));
  }
  EXPECT_EQ(kv_b, p.attn.kv_b_proj.size());
  EXPECT_EQ(o, p.attn.o_proj.size());
  EXPECT_EQ(q_b, p.attn.q_b_proj.size());
  const ref::MlpParams half = shard_intermediate(p.moe.shared, 1, 2);
  EXPECT_EQ(half.intermediate, p.moe.shared.intermediate / 2);
  EXPECT_EQ(to_float(half.down_proj[0]), to_float(p.moe.shared.down_proj[size_t(half.intermediate)]));
  EXPECT_EQ(to_float(half.gate_proj[0]), to_float(p.moe.shared.gate_proj[size_t(half.intermediate * m.hidden_size)]));
  EXPECT_THROW(shard_heads(m, p.attn, 0, 3), BadInput);
  EXPECT_THROW(shard_intermediate(p.moe.shared, 0, 5), BadInput);
}

}  // namespace
}  // namespace dslab::planner
