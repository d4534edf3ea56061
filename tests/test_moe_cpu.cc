// Every CPU MoE variant against the fp64 reference on random inputs and routings: experts no token
// chose, one hot expert, token counts that are not multiples of any tile, odd thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/variant.h"
#include "tests/test_util.h"
#include "harness/team_thread.h"
#include "variants/moe/moe.h"

namespace dslab {
namespace {

struct MoeCase {
  const char* model;
  int64_t tokens;
  const char* routing;
  int64_t experts;  // 0: the model's
  int64_t threads;
};

Point moe_point(const MoeCase& c) {
  Point p;
  p.set("tokens", {std::to_string(c.tokens), c.tokens, true});
  if (c.experts) p.set("experts", {std::to_string(c.experts), c.experts, true});
  p.set("threads", {std::to_string(c.threads), c.threads, true});
  p.set("routing", {c.routing, 0, false});
  return p;
}

class MoeCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeCpu, MatchesReference) {
  auto v = find_variant(GetParam())->make();
  if (Support s = v->available(); !s.ok) GTEST_SKIP() << s.reason;
  const uint64_t seed = test::fresh_seed();
  for (const MoeCase& c :
       {MoeCase{"tiny", 1, "model", 0, 2},    // decode: most experts idle
        MoeCase{"tiny", 37, "model", 0, 3},   // odd tokens, odd threads
        MoeCase{"tiny", 50, "zipf:3", 0, 2},  // one hot expert, a long tail of empty ones
        MoeCase{"deepseek-v2-lite", 3, "uniform", 16, 2}, MoeCase{"deepseek-v2-lite", 70, "zipf:1.2", 12, 3},
        MoeCase{"deepseek-v3", 2, "uniform", 8, 2}}) {
    SCOPED_TRACE(std::string(c.model) + " tokens " + std::to_string(c.tokens) + " routing " + c.routing);
    const ModelFile model = load_model_file(c.model);
    const Point p = moe_point(c);
    ASSERT_TRUE(v->supports(model, p).ok);
    v->prepare(model, p, seed);
    v->run();
    v->run();  // reruns must not accumulate
    const Verification ver = v->verify();
    const bool int8 = GetParam().find("int8") != std::string::npos;
    EXPECT_EQ(ver.threshold, int8 ? 5e-2 : 1e-2);  // bf16 1e-2; int8 weights and activations 5e-2
    EXPECT_LE(ver.rel_err, ver.threshold);
    EXPECT_GT(ver.rel_err, 0.0);
  }
}

// Relative L2 error of the engine's out [tokens][hidden] against the fp64 sum over each token's choices of weight x
// expert(x) (choices with id < 0 run elsewhere and are left out).
double rel_err_vs_experts(const ModelConfig& m, const std::vector<ref::MlpParams>& experts, const std::vector<bf16>& x,
                          int64_t tokens, const std::vector<int32_t>& ids, const std::vector<float>& w, int64_t K,
                          const std::vector<float>& out) {
  const int64_t H = m.hidden_size;
  double num = 0, den = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> xt(static_cast<size_t>(H)), want(static_cast<size_t>(H), 0.0);
    for (int64_t j = 0; j < H; ++j) xt[size_t(j)] = to_float(x[size_t(t * H + j)]);
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = ids[size_t(t * K + k)];
      if (e < 0) continue;
      const auto y = ref::mlp(m, experts[size_t(e)], xt, 1);
      for (int64_t j = 0; j < H; ++j) want[size_t(j)] += double(w[size_t(t * K + k)]) * y[size_t(j)];
    }
    for (int64_t j = 0; j < H; ++j) {
      const double d = double(out[size_t(t * H + j)]) - want[size_t(j)];
      num += d * d, den += want[size_t(j)] * want[size_t(j)];
    }
  }
  return std::sqrt(num / den);
}

// The engine as the hybrid layer calls it: one set of packed experts, then calls of different sizes and routings on
// buffers it is given (growing, then shrinking its arenas), each against the fp64 experts.
TEST(HostExperts, CallsOfAnySizeOnOnePackedLayer) {
  const CpuInfo& cpu = cpu_info();
  if (!cpu.avx512_bf16) GTEST_SKIP() << "needs AVX512_BF16";
  const ModelConfig m = test::model("deepseek-v2-lite");
  const int64_t E = 12, K = m.num_experts_per_tok, H = m.hidden_size;
  const uint64_t seed = test::fresh_seed();
  std::vector<ref::MlpParams> experts;
  for (int64_t e = 0; e < E; ++e)
    experts.push_back(ref::make_mlp_params(m, m.moe_intermediate_size, seed, "experts." + std::to_string(e)));
  for (auto kernel : {moe::HostExperts::Kernel::avx512, moe::HostExperts::Kernel::choose}) {
    if (kernel != moe::HostExperts::Kernel::avx512 && !cpu.amx_bf16) continue;
    moe::HostExperts op(kernel, 2);
    op.set_weights(m, experts);
    for (int64_t tokens : {3, 40, 1, 17}) {
      SCOPED_TRACE("tokens " + std::to_string(tokens));
      const auto x = ref::random_bf16(seed, "x" + std::to_string(tokens), size_t(tokens * H), 1.0f);
      std::vector<int32_t> ids(size_t(tokens * K));
      std::vector<float> w(ids.size());
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t k = 0; k < K; ++k) {
          ids[size_t(t * K + k)] =
              int32_t((t * 5 + k * 7 + tokens) % E);  // distinct per token (7 k mod 12 differ for k < 6)
          w[size_t(t * K + k)] = 0.1f + 0.05f * float(k);
        }
      std::vector<float> out(size_t(tokens * H), std::nanf(""));
      op.forward(x.data(), tokens, ids.data(), w.data(), K, out.data());
      const double rel = rel_err_vs_experts(m, experts, x, tokens, ids, w, K, out);
      EXPECT_LE(rel, 1e-2);
      EXPECT_GT(rel, 0.0);
    }
  }
}

// The hybrid layer's hot experts: the GPU runs some experts, so the engine is given only the others (the rest empty,
// not packed) and those choices come as id -1. Each token's sum must be over its CPU choices alone (zero if none).
TEST(HostExperts, LeavesOutTheChoicesTheGpuRuns) {
  const CpuInfo& cpu = cpu_info();
  if (!cpu.avx512_bf16) GTEST_SKIP() << "needs AVX512_BF16";
  const ModelConfig m = test::model("deepseek-v2-lite");
  const int64_t E = 12, K = m.num_experts_per_tok, H = m.hidden_size, tokens = 9;
  const uint64_t seed = test::fresh_seed();
  auto on_gpu = [](int64_t e) { return e % 3 == 0; };  // 0, 3, 6, 9
  std::vector<ref::MlpParams> experts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    if (!on_gpu(e))
      experts[size_t(e)] = ref::make_mlp_params(m, m.moe_intermediate_size, seed, "experts." + std::to_string(e));
  moe::HostExperts op(moe::HostExperts::Kernel::avx512, 2);
  op.set_weights(m, experts);
  const auto x = ref::random_bf16(seed, "x", size_t(tokens * H), 1.0f);
  std::vector<int32_t> ids(size_t(tokens * K));
  std::vector<float> w(ids.size());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t k = 0; k < K; ++k) {
      // token 4: every choice on the GPU; the others a mix
      const int32_t e = t == 4 ? int32_t(3 * (k % 4)) : int32_t((t * 5 + k * 7) % E);
      ids[size_t(t * K + k)] = on_gpu(e) ? -1 : e;
      w[size_t(t * K + k)] = 0.1f + 0.05f * float(k);
    }
  std::vector<float> out(size_t(tokens * H), std::nanf(""));
  op.forward(x.data(), tokens, ids.data(), w.data(), K, out.data());
  for (int64_t j = 0; j < H; ++j) ASSERT_EQ(out[size_t(4 * H + j)], 0.0f);  // token 4: every choice on the GPU
  const double rel = rel_err_vs_experts(m, experts, x, tokens, ids, w, K, out);
  EXPECT_LE(rel, 1e-2);
  EXPECT_GT(rel, 0.0);
  ids[0] = 3;  // an expert it was not given
  EXPECT_THROW(op.forward(x.data(), tokens, ids.data(), w.data(), K, out.data()), std::logic_error);
}

// What a flushed sample evicts: the packed weights of exactly the experts the routing reaches (the decode step's
// DRAM stream), for the bf16 engine and the int8 variant alike.
TEST_P(MoeCpu, ColdBuffersAreTheReachedExpertsWeights) {
  auto v = find_variant(GetParam())->make();
  if (Support s = v->available(); !s.ok) GTEST_SKIP() << s.reason;
  const MoeCase c{"deepseek-v2-lite", 2, "uniform", 16, 2};
  const ModelFile model = load_model_file(c.model);
  v->prepare(model, moe_point(c), test::fresh_seed());
  const auto buffers = v->cold_buffers();
  if (GetParam() == "moe/onednn/cpu") {  // oneDNN holds its weights inside its primitives: the LLC sweep only
    EXPECT_TRUE(buffers.empty());
    return;
  }
  const ModelConfig m = test::model(c.model);
  const double weights_per_expert = 3.0 * double(m.hidden_size) * double(m.moe_intermediate_size);  // elements
  const double bytes_per_weight = GetParam().find("int8") != std::string::npos ? 1 : 2;
  double bytes = 0;
  for (const auto& [p, n] : buffers) {
    ASSERT_NE(p, nullptr);
    bytes += double(n);
  }
  ASSERT_EQ(buffers.size() % 3, 0u);  // gate, up, down per expert
  const double experts = double(buffers.size() / 3);
  EXPECT_GE(experts, 1);
  EXPECT_LE(experts, double(c.tokens * m.num_experts_per_tok));
  EXPECT_NEAR(bytes, experts * weights_per_expert * bytes_per_weight, 0.01 * bytes);  // (packing pads at most 1%)
  v->run();  // the harness evicts them before a sample; the run still verifies
  EXPECT_LE(v->verify().rel_err, GetParam().find("int8") != std::string::npos ? 5e-2 : 1e-2);
}

INSTANTIATE_TEST_SUITE_P(AllKernels, MoeCpu,
                         ::testing::Values("moe/amx/cpu", "moe/avx512/cpu", "moe/auto/cpu", "moe/onednn/cpu",
                                           "moe/amx_int8/cpu"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (ch == '/') ch = '_';
                           return n;
                         });

TEST(MoeRouting, ZipfMakesOneHotExpertAndIdleOnes) {
  const ModelConfig m = test::model("deepseek-v2-lite");
  moe::Shape s{256, 64, m.num_experts_per_tok, 2, "zipf:2"};
  const auto p = moe::problem(m, s, 5);
  size_t hottest = 0, idle = 0;
  for (const auto& r : p->rows) {
    hottest = std::max(hottest, r.size());
    idle += r.empty();
  }
  EXPECT_EQ(p->rows[0].size(), hottest);
  EXPECT_GT(hottest, 200u);  // expert 0 is in most tokens' top-k
  EXPECT_GT(idle, 0u);
  for (int64_t t = 0; t < s.tokens; ++t)  // distinct experts per token
    for (int64_t a = 0; a < s.topk; ++a)
      for (int64_t b = a + 1; b < s.topk; ++b)
        EXPECT_NE(p->routing.expert[size_t(t * s.topk + a)], p->routing.expert[size_t(t * s.topk + b)]);
}

TEST(MoeRouting, ModelRoutingNeedsAllExpertsAndBadValuesAreBadInput) {
  auto v = find_variant("moe/onednn/cpu")->make();
  const ModelFile model = load_model_file("tiny");
  EXPECT_FALSE(v->supports(model, moe_point({"tiny", 4, "model", 8, 1})).ok);
  EXPECT_THROW(v->supports(model, moe_point({"tiny", 4, "zipf:x", 0, 1})), BadInput);
  EXPECT_THROW(v->supports(model, moe_point({"tiny", 4, "skewed", 0, 1})), BadInput);
  EXPECT_THROW(v->supports(model, moe_point({"tiny", 4, "uniform", 999, 1})), BadInput);
}

TEST(MoePack, TilesHoldKPairsOfSixteenColumns) {
  // w[n][k] = n * 100 + k: tile (nb, kb), row r, lane 2c+q holds w[16nb + c][32kb + 2r + q]; padding is zero.
  std::vector<bf16> w;
  for (int n = 0; n < 20; ++n)
    for (int k = 0; k < 40; ++k) w.push_back(to_bf16(float(n * 100 + k)));
  const moe::Packed p = moe::pack(w.data(), 20, 40);
  EXPECT_EQ(p.n_blocks, 2);
  EXPECT_EQ(p.k_blocks, 2);
  auto at = [&](int n, int k) { return w[size_t(n * 40 + k)].bits; };
  EXPECT_EQ(p.block(1)[1 * 512 + 3 * 32 + 2 * 2 + 1].bits, at(16 + 2, 32 + 6 + 1));
  EXPECT_EQ(p.block(0)[0 * 512 + 5 * 32 + 2 * 7 + 0].bits, at(7, 10));
  EXPECT_EQ(to_float(p.block(1)[0 * 512 + 0 * 32 + 2 * 4]), 0.0f);  // column 20 does not exist
  EXPECT_EQ(to_float(p.block(0)[1 * 512 + 4 * 32 + 0]), 0.0f);      // k = 40 does not exist
}

// The engine's parallel regions all start from one thread, whichever thread calls (alone: the main thread; in the
// hybrid step: the CUDA runtime's host-function threads), so libgomp keeps one team for them.
TEST(TeamThread, RunsEveryCallerOnOneThreadAndRethrows) {
  std::thread::id first, second, nested_outer, nested_inner;
  run_on_team_thread([&] { first = std::this_thread::get_id(); });
  std::thread other([&] { run_on_team_thread([&] { second = std::this_thread::get_id(); }); });
  other.join();
  EXPECT_NE(first, std::this_thread::get_id());
  EXPECT_EQ(first, second);
  run_on_team_thread([&] {
    nested_outer = std::this_thread::get_id();
    run_on_team_thread([&] { nested_inner = std::this_thread::get_id(); });  // runs directly: no deadlock
  });
  EXPECT_EQ(nested_outer, nested_inner);
  EXPECT_THROW(run_on_team_thread([] { throw std::runtime_error("from the team thread"); }), std::runtime_error);
  int64_t sum = 0;
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&sum] {
      for (int i = 0; i < 100; ++i) run_on_team_thread([&sum] { ++sum; });  // callers take turns: no lost update
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum, 400);
}

}  // namespace
}  // namespace dslab
