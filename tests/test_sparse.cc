// The sparse-attention selectors on the MLA latent cache (CPU reference): budgets, sinks and window,
// whole blocks, the oracle's optimality for its budget, the needle, and the fidelity metrics at the extremes.
#include <gtest/gtest.h>

#include <algorithm>

#include "harness/errors.h"
#include "harness/sweep.h"
#include "harness/variant.h"
#include "tests/test_util.h"
#include "variants/sparse/cuda/paged_select.h"
#include "variants/sparse/sparse.h"

namespace dslab {
namespace {

using sparse::Budget;
using sparse::CacheKind;

TEST(SparseFidelity, TheWholeCacheIsDenseAttention) {
  const auto p = sparse::make_problem(4, 64, 16, 300, CacheKind::random, 0, test::fresh_seed());
  std::vector<int64_t> all(300);
  for (int64_t k = 0; k < 300; ++k) all[size_t(k)] = k;
  const auto f = sparse::fidelity(p, all);
  EXPECT_NEAR(f.mass_recall, 1.0, 1e-12);
  EXPECT_LT(f.rel_err, 1e-9);
  Budget b;
  b.tokens = 300, b.block = 32;
  for (const auto& sel : {sparse::select_oracle(p, b), sparse::select_quest(p, b), sparse::select_infllm(p, b)})
    EXPECT_EQ(sel, all);
  // Only the sinks: little mass, a large error.
  const auto few = sparse::fidelity(p, {0, 1, 2, 3});
  EXPECT_LT(few.mass_recall, 0.2);
  EXPECT_GT(few.rel_err, 0.1);
}

TEST(SparseSelect, BudgetSinksWindowAndWholeBlocks) {
  const auto p = sparse::make_problem(4, 64, 16, 1000, CacheKind::clustered, 0, test::fresh_seed());
  Budget b;
  b.tokens = 256, b.block = 32, b.n_init = 4, b.local = 40;
  for (const auto& [name, sel] :
       {std::pair{"oracle", sparse::select_oracle(p, b)}, std::pair{"quest", sparse::select_quest(p, b)},
        std::pair{"infllm", sparse::select_infllm(p, b)}}) {
    SCOPED_TRACE(name);
    EXPECT_LE(int64_t(sel.size()), b.tokens);
    EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
    for (int64_t k : {0, 1, 2, 3, 960, 999}) EXPECT_TRUE(std::binary_search(sel.begin(), sel.end(), k)) << k;
    if (std::string(name) != "oracle")  // outside the sinks and window, whole blocks
      for (int64_t k : sel)
        if (k >= b.n_init && k < 1000 - b.local)
          for (int64_t j = k / b.block * b.block; j < std::min<int64_t>(1000 - b.local, (k / b.block + 1) * b.block);
               ++j)
            if (j >= b.n_init) EXPECT_TRUE(std::binary_search(sel.begin(), sel.end(), j)) << k << " without " << j;
  }
}

// Page-level selection for the GPU's block-sparse decode: whole pages (sinks' and window's always), the best-scored
// others while the budget lasts, ascending so the partial last page is last; its length is the one the host's
// schedule is made from before the scores exist, and with page-aligned sinks and window it is Quest's own selection.
// Token-level selection (the GPU's DSA and oracle attend exactly these): the sinks and window, then the best-scored
// others while the budget lasts, ties to the lower key; a length the budget fixes beforehand; select_dsa is it over
// the indexer's scores.
TEST(SparseTokens, SinksWindowAndTheBestScoredWithALengthKnownBeforehand) {
  Budget b;
  b.n_init = 4, b.local = 100;
  const int64_t keys = 1000;
  std::vector<double> score(static_cast<size_t>(keys));
  for (int64_t k = 0; k < keys; ++k) score[size_t(k)] = double((k * 37) % 101);  // (ties: every value ~10 times)
  for (int64_t tokens : {50, 104, 300, 2000}) {
    b.tokens = tokens;
    const auto sel = sparse::select_tokens(keys, b, score);
    EXPECT_EQ(int64_t(sel.size()), sparse::token_sparse_length(keys, b)) << tokens;
    EXPECT_EQ(int64_t(sel.size()), std::min(keys, std::max<int64_t>(104, tokens))) << tokens;
    ASSERT_TRUE(std::is_sorted(sel.begin(), sel.end()));
    std::vector<char> in(size_t(keys), 0);
    for (int64_t k : sel) in[size_t(k)] = 1;
    for (int64_t k = 0; k < 4; ++k) EXPECT_TRUE(in[size_t(k)]) << k;
    for (int64_t k = keys - 100; k < keys; ++k) EXPECT_TRUE(in[size_t(k)]) << k;
    // Every chosen other scores at least every left-out one; among equals the lower keys go first.
    double lowest_in = INFINITY, highest_out = -INFINITY;
    int64_t last_in_at_lowest = -1, first_out_at_lowest = keys;
    for (int64_t k = 4; k < keys - 100; ++k) {
      if (in[size_t(k)])
        lowest_in = std::min(lowest_in, score[size_t(k)]);
      else
        highest_out = std::max(highest_out, score[size_t(k)]);
    }
    if (tokens > 104 && tokens < keys) {
      EXPECT_GE(lowest_in, highest_out) << tokens;
      for (int64_t k = 4; k < keys - 100; ++k)
        if (score[size_t(k)] == lowest_in)
          (in[size_t(k)] ? last_in_at_lowest = k : first_out_at_lowest = std::min(first_out_at_lowest, k));
      EXPECT_LT(last_in_at_lowest, first_out_at_lowest) << tokens;
    }
  }
  const auto p = sparse::make_problem(4, 64, 16, 700, CacheKind::clustered, 0, test::fresh_seed());
  b.tokens = 128, b.local = 32;
  const sparse::SelectorState st(p, 1, sparse::Indexer{}, sparse::SelectorState::index_keys);
  EXPECT_EQ(sparse::select_dsa(p, b, st), sparse::select_tokens(p.keys, b, sparse::dsa_token_scores(p, st)));
}

TEST(SparsePages, WholePagesTheBestScoredAndALengthKnownBeforehand) {
  Budget b;
  b.tokens = 256, b.n_init = 4, b.local = 64;
  const int64_t keys = 1000, P = 64, pages = 16;  // the last page holds keys 960..999
  std::vector<double> score(static_cast<size_t>(pages));
  for (int64_t pg = 0; pg < pages; ++pg) score[size_t(pg)] = double((pg * 7) % 16);  // (distinct, below 16)
  score[5] = 100;                                                                    // the best other page
  const auto s = sparse::select_pages(keys, P, b, score);
  EXPECT_EQ(s.pages, (std::vector<int64_t>{0, 5, 14, 15}));  // sinks' page, the best page, the window's two pages
  EXPECT_EQ(s.length, 3 * P + (keys - 15 * P));
  EXPECT_EQ(s.length, sparse::paged_sparse_length(keys, P, b));
  const auto k = sparse::keys_of(s, keys, P);
  EXPECT_EQ(int64_t(k.size()), s.length);
  EXPECT_EQ(k.back(), keys - 1);
  for (int64_t tokens : {64, 128, 512, 4096}) {  // budgets below, at and above what must be kept, and above the cache
    b.tokens = tokens;
    const auto t = sparse::select_pages(keys, P, b, score);
    EXPECT_EQ(t.length, sparse::paged_sparse_length(keys, P, b)) << tokens;
    EXPECT_TRUE(std::is_sorted(t.pages.begin(), t.pages.end()));
    EXPECT_EQ(t.pages.back(), pages - 1);
    EXPECT_EQ(int64_t(t.pages.size()), std::min(pages, std::max<int64_t>(3, tokens / P)));
  }
  // Page-aligned sinks and window: the same keys as Quest's token-budget selection over the same block scores.
  const auto p = sparse::make_problem(4, 64, 16, 640, CacheKind::clustered, 0, test::fresh_seed());
  Budget q;
  q.tokens = 256, q.block = 64, q.n_init = 64, q.local = 64;
  const sparse::SelectorState st(p, q.block, sparse::Indexer{}, sparse::SelectorState::blocks);
  const auto paged = sparse::select_pages(p.keys, 64, q, sparse::quest_block_scores(p, q, st));
  EXPECT_EQ(sparse::keys_of(paged, p.keys, 64), sparse::select_quest(p, q, st));
}

TEST(SparseSelect, TheOracleKeepsTheMostMassForItsBudget) {
  // The oracle takes the keys of largest summed probability: no selection of the same size (sinks and window
  // included) keeps more mean softmax mass.
  for (auto kind : {CacheKind::random, CacheKind::clustered}) {
    const auto p = sparse::make_problem(8, 128, 32, 2048, kind, 0, test::fresh_seed());
    Budget b;
    b.tokens = 512, b.block = 64;
    const double oracle = sparse::fidelity(p, sparse::select_oracle(p, b)).mass_recall;
    EXPECT_GE(oracle + 1e-12, sparse::fidelity(p, sparse::select_quest(p, b)).mass_recall);
    EXPECT_GE(oracle + 1e-12, sparse::fidelity(p, sparse::select_infllm(p, b)).mass_recall);
    EXPECT_GT(oracle, 512.0 / 2048);  // better than a random quarter of the keys
  }
}

TEST(SparseSelect, TheOracleFindsTheNeedleAtAnyDepth) {
  for (double depth : {0.0, 0.3, 0.5, 0.9, 1.0}) {
    const auto p = sparse::make_problem(8, 128, 32, 4096, CacheKind::needle, depth, test::fresh_seed());
    Budget b;
    b.tokens = 256, b.block = 64;
    EXPECT_TRUE(sparse::fidelity(p, sparse::select_oracle(p, b)).needle_found) << depth;
    if (p.needle >= 3) EXPECT_FALSE(sparse::fidelity(p, {0, 1, 2}).needle_found) << depth;  // (a selection without it)
  }
}

TEST(SparseDsa, E4m3RoundingAsTheFormatHoldsIt) {
  EXPECT_EQ(sparse::round_e4m3(1.0f), 1.0f);
  EXPECT_EQ(sparse::round_e4m3(1.0625f), 1.0f);          // halfway to 1.125 rounds to even
  EXPECT_EQ(sparse::round_e4m3(1.1f), 1.125f);           // 3 mantissa bits: steps of 1/8 in [1, 2)
  EXPECT_EQ(sparse::round_e4m3(300.0f), 288.0f);         // steps of 32 in [256, 448]
  EXPECT_EQ(sparse::round_e4m3(1000.0f), 448.0f);        // saturates
  EXPECT_EQ(sparse::round_e4m3(-0.01f), -0.009765625f);  // subnormal: a multiple of 2^-9
}

TEST(SparseDsa, AnIndexerThatApproximatesTheAttentionKeepsMostOfItsMass) {
  // Index keys and queries a 128-dim projection of MLA's own: the selection keeps much of the oracle's mass (far above
  // a random selection of the same size) and finds the needle; FP8 keys change little.
  const auto p = sparse::make_problem(8, 128, 32, 2048, CacheKind::clustered, 0, test::fresh_seed());
  Budget b;
  b.tokens = 512;
  const double oracle = sparse::fidelity(p, sparse::select_oracle(p, b)).mass_recall;
  sparse::Indexer ix;
  const double dsa = sparse::fidelity(p, sparse::select_dsa(p, b, ix)).mass_recall;
  EXPECT_LE(dsa, oracle + 1e-12);
  EXPECT_GT(dsa, 0.5 * oracle);
  EXPECT_GT(dsa, 512.0 / 2048 * 1.5);
  ix.fp8 = false;
  EXPECT_NEAR(sparse::fidelity(p, sparse::select_dsa(p, b, ix)).mass_recall, dsa, 0.1);
  const auto needle = sparse::make_problem(8, 128, 32, 4096, CacheKind::needle, 0.4, test::fresh_seed());
  EXPECT_TRUE(sparse::fidelity(needle, sparse::select_dsa(needle, b, sparse::Indexer{})).needle_found);
}

TEST(SparseVariants, EachAttendsItsSelectionExactlyAndReportsItsFidelity) {
  const ModelFile model = load_model_file("deepseek-v2-lite");
  for (const char* name : {"sparse/oracle/cpu", "sparse/quest/cpu", "sparse/infllm/cpu", "sparse/dsa/cpu"}) {
    SCOPED_TRACE(name);
    const VariantEntry* e = find_variant(name);
    ASSERT_NE(e, nullptr);
    Point p;
    auto integer = [&](const char* axis, int64_t v) { p.set(axis, {std::to_string(v), v, true}); };
    integer("kv_len", 2048);
    integer("budget", 256);
    integer("block", 64);
    integer("needle_depth", 30), integer("needle_norm", 1);
    p.set("cache_kind", {"needle", 0, false});
    auto v = e->make();
    ASSERT_TRUE(v->supports(model, p).ok);
    v->prepare(model, p, test::fresh_seed());
    EXPECT_FALSE(v->verify().pass());  // nothing attended yet: the output is NaN
    v->run();
    const Verification ver = v->verify();
    EXPECT_LE(ver.rel_err, ver.threshold);  // fp32 attention over the selection against fp64 over the same keys
    const auto c = v->counters();
    EXPECT_LE(c.at("selected_tokens"), 256);
    EXPECT_GT(c.at("mass_recall"), 0.0);
    EXPECT_LE(c.at("mass_recall"), 1.0 + 1e-9);
    EXPECT_TRUE(c.count("needle_recall") && c.count("append_s") && c.count("select_s") && c.count("attend_s"));
    if (std::string(name) == "sparse/oracle/cpu") EXPECT_EQ(c.at("needle_recall"), 1.0);
    p.set("cache_kind", {"noise", 0, false});
    EXPECT_THROW(v->supports(model, p), BadInput);
  }
}

// The selectors' state grows a key at a time as decode appends: after any number of appends (across block
// boundaries) and a rewind it equals the state built from scratch over the same cache, and so do the selections.
TEST(SparseState, IncrementalEqualsFromScratchAcrossAppendsAndRewinds) {
  const uint64_t seed = test::fresh_seed();
  auto p = sparse::make_problem(4, 64, 16, 1000, CacheKind::clustered, 0, seed);
  const auto more = sparse::make_problem(1, 64, 16, 150, CacheKind::random, 0, seed + 1);
  Budget b;
  b.tokens = 256, b.block = 64;
  sparse::Indexer ix;
  ix.heads = 8, ix.dim = 32;
  sparse::SelectorState st(p, b.block, ix);
  for (int64_t k = 0; k < more.keys; ++k) {  // 1000 -> 1150 keys: blocks 15 (partial) to 17 (partial)
    sparse::append_key(p, &more.c_kv[size_t(k * 64)], &more.k_pe[size_t(k * 16)]);
    st.append(p);
    if (k % 37 == 0 || k == more.keys - 1) {
      SCOPED_TRACE("keys " + std::to_string(p.keys));
      const sparse::SelectorState scratch(p, b.block, ix);
      ASSERT_TRUE(st == scratch);
      EXPECT_EQ(sparse::select_quest(p, b, st), sparse::select_quest(p, b));
      EXPECT_EQ(sparse::select_infllm(p, b, st), sparse::select_infllm(p, b));
      EXPECT_EQ(sparse::select_dsa(p, b, st), sparse::select_dsa(p, b, ix));
    }
  }
  sparse::truncate_keys(p, 1030);  // a rewind into the middle of a block
  st.truncate(p);
  EXPECT_TRUE(st == sparse::SelectorState(p, b.block, ix));
  EXPECT_THROW(st.append(p), std::logic_error);  // the cache has not grown since
  sparse::Problem shorter = p;
  sparse::truncate_keys(shorter, 900);
  EXPECT_THROW(sparse::select_quest(shorter, b, st), std::logic_error);  // a state of another cache
}

// A decode step grows the cache by one key per run() and rewinds it after kRewind steps; the verified output and the
// fidelity are of the grown cache.
TEST(SparseVariants, EachRunAppendsTheStepsKey) {
  const ModelFile model = load_model_file("deepseek-v2-lite");
  Point p;
  auto integer = [&](const char* axis, int64_t v) { p.set(axis, {std::to_string(v), v, true}); };
  integer("kv_len", 600), integer("budget", 128), integer("block", 64), integer("needle_depth", 50),
      integer("needle_norm", 1), integer("heads", 4);
  p.set("cache_kind", {"random", 0, false});
  for (const auto& [name, steps] : {std::pair<const char*, int>{"sparse/quest/cpu", 1030}, {"sparse/dsa/cpu", 5}}) {
    SCOPED_TRACE(name);
    auto v = find_variant(name)->make();
    v->prepare(model, p, test::fresh_seed());
    for (int i = 0; i < steps; ++i) v->run();  // Quest past one rewind (1024 steps)
    const Verification ver = v->verify();
    EXPECT_LE(ver.rel_err, ver.threshold);
    const auto c = v->counters();
    EXPECT_GE(c.at("append_s"), 0.0);
    EXPECT_LE(c.at("selected_tokens"), 128);
  }
}

// A batch is its requests side by side: each with its own cache (request_seed), selector state and selection, so a
// batch's fidelity is the mean of the single-request runs' at those seeds, and each request is verified.
TEST(SparseVariants, ABatchIsItsRequestsEachWithItsOwnCacheAndSelection) {
  const ModelFile model = load_model_file("deepseek-v2-lite");
  const uint64_t seed = test::fresh_seed();
  auto point = [](int64_t batch) {
    Point p;
    auto integer = [&](const char* axis, int64_t v) { p.set(axis, {std::to_string(v), v, true}); };
    integer("batch", batch), integer("kv_len", 1500), integer("budget", 256), integer("block", 64),
        integer("needle_depth", 50), integer("needle_norm", 1), integer("heads", 4);
    p.set("cache_kind", {"clustered", 0, false});
    return p;
  };
  for (const char* name : {"sparse/quest/cpu", "sparse/dsa/cpu"}) {
    SCOPED_TRACE(name);
    double mass = 0, err = 0;
    std::vector<std::pair<double, double>> each;  // (mass_recall, rel_err_vs_dense) of each single-request run
    for (int64_t r = 0; r < 3; ++r) {
      auto v = find_variant(name)->make();
      v->prepare(model, point(1), sparse::request_seed(seed, r));
      v->run();
      const auto c = v->counters();
      mass += c.at("mass_recall") / 3, err += c.at("rel_err_vs_dense") / 3;
      each.emplace_back(c.at("mass_recall"), c.at("rel_err_vs_dense"));
    }
    EXPECT_NE(each[0], each[1]);  // the requests' caches differ (a selection may keep all the mass of both)
    auto batch = find_variant(name)->make();
    ASSERT_TRUE(batch->supports(model, point(3)).ok);
    batch->prepare(model, point(3), seed);
    EXPECT_FALSE(batch->verify().pass());  // nothing attended yet
    batch->run();
    const Verification ver = batch->verify();
    EXPECT_LE(ver.rel_err, ver.threshold);
    const auto c = batch->counters();
    EXPECT_NEAR(c.at("mass_recall"), mass, 1e-9);
    EXPECT_NEAR(c.at("rel_err_vs_dense"), err, 1e-9);
    EXPECT_NEAR(batch->cost(model, point(3)).flops, 3 * batch->cost(model, point(1)).flops,
                1e-6 * batch->cost(model, point(1)).flops);
  }
}

}  // namespace
}  // namespace dslab

namespace dslab {
namespace {

// The token top-k's cluster size (sparse::cuda::topk_launch), given the clusters of each size a GPU holds at once -
// here the H100's measured answers (15 clusters of 8, 17 of 6, 22 of 5): the fewest rounds x keys a CTA,
// a streaming pass (keys past 22 a thread) counted 1.5 register passes; one block below 16K keys.
TEST(TopkLaunch, ChoosesTheClusterThatFinishesFirstOnThisGpu) {
  const auto h100 = [](int ctas, bool) {
    return ctas == 8 ? 15 : ctas == 7 ? 15 : ctas == 6 ? 17 : ctas == 5 ? 22 : 30;
  };
  const auto small = sparse::cuda::topk_launch_given(3000, 16, h100);
  EXPECT_EQ(small.ctas_per_request, 1);
  EXPECT_EQ(small.max_active_clusters, 0);
  // 128K keys: one request takes 8 CTAs; 16 take 6 (17 fit: one round, 21.3K keys a CTA in registers) where 8 would
  // take two rounds; 64 go back to 8 (5 rounds of 16K keys beat 4 of 21.8K).
  const auto one = sparse::cuda::topk_launch_given(131072, 1, h100);
  EXPECT_EQ(one.ctas_per_request, 8);
  EXPECT_EQ(one.rounds, 1);
  EXPECT_FALSE(one.streaming);
  const auto sixteen = sparse::cuda::topk_launch_given(131072, 16, h100);
  EXPECT_EQ(sixteen.ctas_per_request, 6);
  EXPECT_EQ(sixteen.rounds, 1);
  EXPECT_FALSE(sixteen.streaming);
  EXPECT_EQ(sixteen.max_active_clusters, 17);
  const auto many = sparse::cuda::topk_launch_given(131072, 64, h100);
  EXPECT_EQ(many.ctas_per_request, 8);
  EXPECT_EQ(many.rounds, 5);
  // 1M keys stream at every size; 16 requests fit one round of 6.
  const auto long_16 = sparse::cuda::topk_launch_given(1048576, 16, h100);
  EXPECT_EQ(long_16.ctas_per_request, 6);
  EXPECT_TRUE(long_16.streaming);
  // A GPU whose GPCs lose no SM to cluster packing (132 / ctas clusters: 16 of 8) keeps 8 at batch 16.
  const auto roomy = sparse::cuda::topk_launch_given(131072, 16, [](int ctas, bool) { return 132 / ctas; });
  EXPECT_EQ(roomy.ctas_per_request, 8);
  EXPECT_EQ(roomy.rounds, 1);
  EXPECT_THROW(sparse::cuda::topk_cluster_launch_given(131072, 16, 9, h100), std::invalid_argument);
  EXPECT_THROW(sparse::cuda::topk_launch_given(131072, 16, [](int, bool) { return 0; }), std::invalid_argument);
}

}  // namespace
}  // namespace dslab
