// The layer's op cost model (variants/layer/ops.h) against values derived by hand from the configs, and the
// whole step's weights against the models' published parameter counts.
#include <gtest/gtest.h>

#include <map>

#include "harness/errors.h"
#include "tests/test_util.h"
#include "variants/layer/ops.h"

namespace dslab {
namespace {

std::map<std::string, layer::OpCost> by_name(const std::vector<layer::OpCost>& ops) {
  std::map<std::string, layer::OpCost> out;
  for (const auto& o : ops) out[o.name] = o;
  return out;
}

// The per-op floor rows of a whole V2-Lite step: brackets summed into rows, each row's work the sum of its ops over
// the layers, the routed experts as the step's routing reached them; a row without brackets is left out.
TEST(LayerOps, OpFloorRowsGatherBracketsAndTheirOpsWork) {
  const ModelConfig m = test::model("deepseek-v2-lite");  // 27 layers: one dense, 26 MoE
  layer::StepShape s;
  s.batch = 1, s.q_len = 1, s.kv_len = 4096;
  const std::map<std::string, double> op_us = {{"op_us.qkv_a", 300},   {"op_us.decode", 400},  {"op_us.absorb_q", 200},
                                               {"op_us.gate_up", 700}, {"op_us.experts", 500}, {"op_us.metadata", 8}};
  std::vector<double> active(26, 6.0);
  active[0] = 12;  // (as if the first MoE layer's routing had reached twice the experts)
  const auto c = layer::op_floor_counters(m, s, 0, m.num_hidden_layers, true, active, op_us);
  EXPECT_DOUBLE_EQ(c.at("op_time_us.qkv_a"), 300);
  EXPECT_DOUBLE_EQ(c.at("op_time_us.attention_core"), 600);
  EXPECT_DOUBLE_EQ(c.at("op_time_us.experts"), 1200);
  EXPECT_EQ(c.count("op_time_us.o_proj"), 0u);    // no bracket of it ran
  EXPECT_EQ(c.count("op_time_us.metadata"), 0u);  // no op of the model's
  const auto one = by_name(layer::layer_ops(m, 1, s));
  EXPECT_DOUBLE_EQ(c.at("op_floor_bytes.qkv_a"), 27 * (one.at("q_proj").bytes() + one.at("kv_a_proj").bytes()));
  EXPECT_DOUBLE_EQ(c.at("op_floor_kernels.qkv_a"), 27);  // (kv_a_proj stacked under q_proj: one launch)
  const double routed = one.at("routed_experts").bytes(), set = 3.0 * 2048 * 1408 * 2 * 6;
  EXPECT_DOUBLE_EQ(c.at("op_floor_bytes.experts"), 26 * (one.at("shared_experts").bytes() + routed) + set);
  EXPECT_DOUBLE_EQ(c.at("op_floor_flops.attention_core"), 27 * one.at("attention_core").flops);
}

// With the norms after the MoE layers in their combine kernels (fused_norms): those 26 norms (25 next-layer input
// norms and the final norm) move into the experts row without kernels of their own; the rest stay.
TEST(LayerOps, NormsInTheMoeCombineCountUnderTheExperts) {
  const ModelConfig m = test::model("deepseek-v2-lite");  // layer 0 dense, 1..26 MoE
  layer::StepShape s;
  s.batch = 1, s.q_len = 1, s.kv_len = 4096;
  const std::map<std::string, double> op_us = {{"op_us.norm", 100}, {"op_us.embed_norm", 5}, {"op_us.experts", 500}};
  const std::vector<double> active(26, 6.0);
  const auto apart = layer::op_floor_counters(m, s, 0, m.num_hidden_layers, true, active, op_us);
  s.norms_in_moe_combine = true;
  const auto fused = layer::op_floor_counters(m, s, 0, m.num_hidden_layers, true, active, op_us);
  EXPECT_DOUBLE_EQ(apart.at("op_floor_kernels.norms"), 55);  // 27 x 2 + the final norm
  EXPECT_DOUBLE_EQ(fused.at("op_floor_kernels.norms"), 55 - 26);
  EXPECT_DOUBLE_EQ(fused.at("op_floor_kernels.experts"), apart.at("op_floor_kernels.experts"));
  const double moved = apart.at("op_floor_bytes.norms") - fused.at("op_floor_bytes.norms");
  EXPECT_GT(moved, 0);
  EXPECT_DOUBLE_EQ(fused.at("op_floor_bytes.experts"), apart.at("op_floor_bytes.experts") + moved);
}

// The fused decode's absorbs inside other kernels (fused_absorbs): V2-Lite (no q_lora_rank) at 1-2 tokens folds both
// (norm + W_UK, decode, merge + W_UV: 3 kernels), from 3 tokens W_UV only; V3 (q_lora_rank: its W_UK after q_b) W_UV
// only; the unfused forms (past 2 new tokens) none.
TEST(LayerOps, FusedAbsorbsTakeTheirKernelsAway) {
  const ModelConfig lite = test::model("deepseek-v2-lite"), v3 = test::model("deepseek-v3");
  const auto kernels = [](const ModelConfig& m, int64_t batch, int64_t q_len, bool fused) {
    layer::StepShape s;
    s.batch = batch, s.q_len = q_len, s.kv_len = 4096, s.absorbs_fused = fused;
    return by_name(layer::layer_ops(m, 3, s)).at("attention_core").gpu_kernels;
  };
  EXPECT_EQ(kernels(lite, 1, 1, false), 5);
  EXPECT_EQ(kernels(lite, 1, 1, true), 3);
  EXPECT_EQ(kernels(lite, 2, 1, true), 3);
  EXPECT_EQ(kernels(lite, 8, 1, true), 4);
  EXPECT_EQ(kernels(v3, 1, 1, false), 6);
  EXPECT_EQ(kernels(v3, 1, 1, true), 5);
  EXPECT_EQ(kernels(lite, 1, 5, true), 8);  // (an extend chunk: the unfused form's kernels)
}

TEST(LayerOps, V2LiteDecodeOpsByHand) {
  // hidden 2048, 16 heads x (128 nope + 64 rope), v 128, kv_lora 512, no q_lora; 64 experts x 1408, top-6, 2 shared.
  const ModelConfig m = test::model("deepseek-v2-lite");
  layer::StepShape s;
  s.batch = 1, s.q_len = 1, s.kv_len = 4096;
  const auto ops = by_name(layer::layer_ops(m, 1, s));
  EXPECT_EQ(ops.count("q_a_proj"), 0u);
  EXPECT_DOUBLE_EQ(ops.at("q_proj").flops, 2.0 * 2048 * 16 * 192);
  EXPECT_DOUBLE_EQ(ops.at("q_proj").weight_bytes, 2.0 * 2048 * 16 * 192);
  EXPECT_DOUBLE_EQ(ops.at("kv_a_proj").flops, 2.0 * 2048 * 576);
  // a_cc_me: 4097 (query, key) pairs x 2 x 16 x (512 + 512 + 64), plus W_UK into q and W_UV out (2 x 16 x 512 x 256).
  EXPECT_DOUBLE_EQ(ops.at("attention_core").flops, 4097.0 * 2 * 16 * 1088 + 2.0 * 16 * 512 * 256);
  EXPECT_DOUBLE_EQ(ops.at("attention_core").weight_bytes, 2.0 * 512 * 16 * 256);
  EXPECT_DOUBLE_EQ(ops.at("attention_core").kv_bytes, (4097.0 + 1) * 576 * 2);
  EXPECT_DOUBLE_EQ(ops.at("o_proj").flops, 2.0 * 16 * 128 * 2048);
  EXPECT_DOUBLE_EQ(ops.at("gate").weight_bytes, 2.0 * 2048 * 64);
  EXPECT_DOUBLE_EQ(ops.at("shared_experts").flops, 6.0 * 2048 * 2 * 1408);
  EXPECT_DOUBLE_EQ(ops.at("shared_experts").weight_bytes, 3.0 * 2048 * 2816 * 2);
  // One token reaches exactly its 6 experts.
  EXPECT_DOUBLE_EQ(ops.at("routed_experts").active_experts, 6);
  EXPECT_DOUBLE_EQ(ops.at("routed_experts").tokens_per_expert, 1);
  EXPECT_DOUBLE_EQ(ops.at("routed_experts").flops, 6.0 * 6 * 2048 * 1408);
  EXPECT_DOUBLE_EQ(ops.at("routed_experts").weight_bytes, 6.0 * 3 * 2048 * 1408 * 2);
  EXPECT_EQ(ops.count("dense_mlp"), 0u);
  // Layer 0 is dense (first_k_dense_replace 1): 10944 wide, no gate or experts.
  const auto first = by_name(layer::layer_ops(m, 0, s));
  EXPECT_DOUBLE_EQ(first.at("dense_mlp").weight_bytes, 3.0 * 2048 * 10944 * 2);
  EXPECT_EQ(first.count("routed_experts"), 0u);
  // Decode at batch 1 streams weights: every weight-bearing op sits near 1 FLOP per byte.
  EXPECT_LT(ops.at("routed_experts").intensity(), 1.01);
  EXPECT_GT(ops.at("attention_core").intensity(), 10.0);  // 16 heads share each cached latent
}

TEST(LayerOps, V3PrefillRoutedExpertsByHand) {
  // q_lora 1536, 128 heads; 256 experts x 2048, top-8.
  const ModelConfig m = test::model("deepseek-v3");
  layer::StepShape s;
  s.batch = 1, s.q_len = 4096, s.kv_len = 0;
  const auto ops = by_name(layer::layer_ops(m, 3, s));
  EXPECT_DOUBLE_EQ(ops.at("q_a_proj").flops, 2.0 * 4096 * 7168 * 1536);
  EXPECT_DOUBLE_EQ(ops.at("q_b_proj").weight_bytes, 2.0 * 1536 * 128 * 192);
  const auto& r = ops.at("routed_experts");
  EXPECT_NEAR(r.active_experts, 256, 1e-6);  // 32768 choices reach every expert
  EXPECT_NEAR(r.tokens_per_expert, 128, 1e-6);
  EXPECT_DOUBLE_EQ(r.flops, 6.0 * 4096 * 8 * 7168 * 2048);
  EXPECT_NEAR(r.weight_bytes, 256.0 * 3 * 7168 * 2048 * 2, 1);
  // Causal pairs among 4096 new tokens: 4096 * 4097 / 2.
  EXPECT_DOUBLE_EQ(ops.at("attention_core").flops, 4096.0 * 4097 / 2 * 2 * 128 * 1088 + 4096.0 * 2 * 128 * 512 * 256);
}

TEST(LayerOps, AnUnfusedAttentionPaysItsRectangleAndItsScoresThroughMemory) {
  const ModelConfig m = test::model("deepseek-v2-lite");  // 16 heads, latent 512 + rope 64
  layer::StepShape s;
  s.batch = 1, s.q_len = 4096, s.kv_len = 0;
  const auto ops = by_name(layer::layer_ops(m, 1, s));
  const auto& core = ops.at("attention_core");
  const double pair = 2.0 * 16 * (576 + 512);  // a_cc_me: q.[latent | rope] and p.latent per head
  EXPECT_DOUBLE_EQ(core.extra_flops, (4096.0 * 4096 - 4096.0 * 4097 / 2) * pair);
  // fp32 scores written, read and rewritten by the rope product, read by the softmax; bf16 probabilities written
  // and read; the gathered latent written and read.
  EXPECT_DOUBLE_EQ(core.staged_bytes, 4096.0 * 4096 * 16 * 20 + 4096.0 * 576 * 4);
  // A decode step runs the fused kernel: nothing staged, no rectangle; unless the step says it runs unfused.
  s.q_len = 1, s.kv_len = 4096;
  EXPECT_EQ(by_name(layer::layer_ops(m, 1, s)).at("attention_core").staged_bytes, 0.0);
  s.fused_decode = false;
  EXPECT_DOUBLE_EQ(by_name(layer::layer_ops(m, 1, s)).at("attention_core").staged_bytes,
                   4097.0 * 16 * 20 + 4097.0 * 576 * 4);
  EXPECT_DOUBLE_EQ(by_name(layer::layer_ops(m, 1, s)).at("attention_core").extra_flops, 0.0);
}

TEST(LayerOps, WholeStepWeightsAreTheModelsParameters) {
  // With every expert reached, the step reads each weight once: with the embedding table, the published totals
  // (V2-Lite 15.7 B parameters; V3 671 B, its checkpoint's 685 B less the 14 B multi-token-prediction module).
  for (const auto& [name, params] :
       std::vector<std::pair<const char*, double>>{{"deepseek-v2-lite", 15.7e9}, {"deepseek-v3", 671e9}}) {
    const ModelConfig m = test::model(name);
    layer::StepShape s;
    s.batch = 1, s.q_len = 1 << 20;
    double weights = 0;
    for (const auto& op : layer::step_ops(m, s)) weights += op.weight_bytes;
    const double total = weights / 2 + double(m.vocab_size) * double(m.hidden_size);  // + the embedding table
    EXPECT_NEAR(total / params, 1.0, 0.005) << name << ": " << total;
  }
}

TEST(LayerOps, GpuExpertsAndBudgetAxesParseOrNameTheAxis) {
  EXPECT_EQ(layer::parse_gpu_experts("none").kind, layer::GpuExperts::Kind::none);
  EXPECT_EQ(layer::parse_gpu_experts("fit").kind, layer::GpuExperts::Kind::fit);
  EXPECT_EQ(layer::parse_gpu_experts("streamed").kind, layer::GpuExperts::Kind::streamed);
  const auto g = layer::parse_gpu_experts("layers:12");
  EXPECT_EQ(g.kind, layer::GpuExperts::Kind::layers);
  EXPECT_EQ(g.layers, 12);
  const auto hot = layer::parse_gpu_experts("hot:16");
  EXPECT_EQ(hot.kind, layer::GpuExperts::Kind::hot);
  EXPECT_EQ(hot.hot, 16);
  for (const char* bad : {"layers:", "layers:0", "layers:-1", "layers:3x", "hot:", "hot:0", "hot:8.5", "some", ""})
    try {
      layer::parse_gpu_experts(bad);
      ADD_FAILURE() << "'" << bad << "' must be refused";
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("axis 'gpu_experts': value '" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  EXPECT_EQ(layer::parse_gpu_budget("all"), 0);
  EXPECT_EQ(layer::parse_gpu_budget("24GB"), 24e9);
  for (const char* bad : {"24", "GB", "0GB", "24 GB", "1.5GB", "24gb"})
    EXPECT_THROW(layer::parse_gpu_budget(bad), BadInput) << bad;
}

TEST(LayerOps, ResidentMoeLayersAreWhatTheBudgetHoldsBesideEveryLayersRouterAndSharedExperts) {
  // 10 GB fixed, 26 MoE layers each needing 0.1 GB (router + shared) and 1.1 GB with all experts: an 80 GB budget
  // holds (80 - 10 - 2.6) / 1.0 = 67.4 -> all 26; a 24 GB one (24 - 10 - 2.6) / 1.0 = 11.4 -> 11; 12 GB none.
  EXPECT_EQ(layer::resident_moe_layers(80e9, 10e9, 26, 0.1e9, 1.1e9), 26);
  EXPECT_EQ(layer::resident_moe_layers(24e9, 10e9, 26, 0.1e9, 1.1e9), 11);
  EXPECT_EQ(layer::resident_moe_layers(12e9, 10e9, 26, 0.1e9, 1.1e9), 0);
  EXPECT_EQ(layer::resident_moe_layers(5e9, 10e9, 26, 0.1e9, 1.1e9), 0);
}

}  // namespace
}  // namespace dslab
