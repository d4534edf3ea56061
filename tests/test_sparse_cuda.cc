// The GPU's page selection for block-sparse decode (variants/sparse/cuda/paged_select.h) against its CPU reference
// (variants/sparse/sparse.h) on the same bf16 values: Quest's page bounds exactly, the page scores to fp32
// rounding, and the selection (pages and length) exactly, through a shuffled page table (ctest label `gpu`; skipped
// without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "harness/host.h"
#include "harness/variant.h"
#include "tests/test_util.h"
#include "variants/common/bf16.h"
#include "variants/sparse/sparse.h"
#ifdef DSLAB_HAVE_CUDA
#include <cuda_runtime.h>

#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/paged_select.h"
#endif

namespace dslab {
namespace {

#ifdef DSLAB_HAVE_CUDA
template <class T>
struct Device {
  T* p = nullptr;
  explicit Device(size_t n) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  Device(const std::vector<T>& host) : Device(host.size()) {
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Device() { cudaFree(p); }
  std::vector<T> host(size_t n) const {
    std::vector<T> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

float bf16_round(float x) { return to_float(to_bf16(x)); }

TEST(GpuSparse, PageSelectionMatchesTheCpuReference) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  const uint64_t seed = test::fresh_seed();
  const int64_t heads = 16, latent = 512, rope = 64, width = latent + rope, P = 64;
  const std::vector<int64_t> keys = {1000, 641, 130, 4096};  // partial last pages (641: the step opens one); one within the budget
  const int64_t batch = int64_t(keys.size()), ppr = (*std::max_element(keys.begin(), keys.end()) + P - 1) / P;
  sparse::Budget budget;
  budget.tokens = 512, budget.block = P, budget.n_init = 4, budget.local = 64;
  const int64_t max_pages = ppr;
  // Each request's problem in bf16 values (the CPU reference reads the same numbers the GPU does), its pages
  // scattered over one shuffled pool.
  std::vector<sparse::Problem> problems;
  std::vector<int32_t> pool(size_t(batch * ppr));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937_64(seed));
  std::vector<int32_t> table(pool), counts, listed, rows, lengths_before;
  std::vector<bf16> cache(size_t(batch * ppr * P * width)), q(size_t(batch * heads * width));
  for (int64_t r = 0; r < batch; ++r) {
    sparse::Problem p = sparse::make_problem(heads, latent, rope, keys[size_t(r)], sparse::CacheKind::clustered, 0, sparse::request_seed(seed, r));
    for (auto* v : {&p.q_lat, &p.q_pe, &p.c_kv, &p.k_pe})
      for (float& x : *v) x = bf16_round(x);
    for (int64_t k = 0; k < p.keys; ++k) {
      const int64_t physical = table[size_t(r * ppr + k / P)];
      bf16* row = &cache[size_t((physical * P + k % P) * width)];
      for (int64_t d = 0; d < latent; ++d) row[d] = to_bf16(p.c_kv[size_t(k * latent + d)]);
      for (int64_t d = 0; d < rope; ++d) row[latent + d] = to_bf16(p.k_pe[size_t(k * rope + d)]);
    }
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < latent; ++d) q[size_t((r * heads + h) * width + d)] = to_bf16(p.q_lat[size_t(h * latent + d)]);
      for (int64_t d = 0; d < rope; ++d) q[size_t((r * heads + h) * width + latent + d)] = to_bf16(p.q_pe[size_t(h * rope + d)]);
    }
    // prepare's bounds of the keys before a decode step (the last key's page listed with one key fewer, or not at
    // all), then the step's own page remade by step_page_bounds.
    const int64_t cached = p.keys - 1, pages = (cached + P - 1) / P;
    for (int64_t pg = 0; pg < pages; ++pg) {
      listed.push_back(table[size_t(r * ppr + pg)]);
      rows.push_back(int32_t(r * ppr + pg));
      counts.push_back(int32_t(std::min(P, cached - pg * P)));
    }
    lengths_before.push_back(int32_t(cached));
    problems.push_back(std::move(p));
  }
  const Device<bf16> d_cache(cache), d_q(q);
  const Device<int32_t> d_table(table), d_listed(listed), d_rows(rows), d_counts(counts), d_lengths(lengths_before);
  const Device<int32_t> d_keys{size_t(batch)}, d_before{size_t(batch)};
  const Device<bf16> d_bounds{size_t(batch * ppr * 2 * width)}, d_split{size_t(batch * heads * 2 * width)};
  const Device<float> d_products{size_t(batch * ppr * heads)}, d_scores{size_t(batch * ppr)};
  const Device<int32_t> d_physical{size_t(batch * max_pages)}, d_logical{size_t(batch * max_pages)}, d_length{size_t(batch)};
  auto* cache_ptr = reinterpret_cast<const __nv_bfloat16*>(d_cache.p);
  auto* bounds_ptr = reinterpret_cast<__nv_bfloat16*>(d_bounds.p);
  sparse::cuda::page_bounds(cache_ptr, P, width, d_listed.p, d_rows.p, d_counts.p, int(listed.size()), bounds_ptr, 0);
  sparse::cuda::step_page_bounds(cache_ptr, P, width, d_lengths.p, 1, d_table.p, ppr, batch, d_keys.p, bounds_ptr, 0);
  mla::cuda::BlasHandle blas;
  blas.set_stream(0);
  sparse::cuda::quest_scores(blas.get(), reinterpret_cast<const __nv_bfloat16*>(d_q.p), batch, 1, heads, width, bounds_ptr, ppr, d_keys.p, P,
                             reinterpret_cast<__nv_bfloat16*>(d_split.p), d_products.p, d_scores.p, 0);
  sparse::cuda::compact_pages(d_scores.p, d_table.p, ppr, d_keys.p, P, budget, batch, max_pages, 1, d_physical.p, d_logical.p, d_length.p,
                              d_before.p, 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto bounds = d_bounds.host(size_t(batch * ppr * 2 * width));
  const auto scores = d_scores.host(size_t(batch * ppr));
  const auto physical = d_physical.host(size_t(batch * max_pages)), logical = d_logical.host(size_t(batch * max_pages));
  const auto length = d_length.host(size_t(batch)), before = d_before.host(size_t(batch)), keys_after = d_keys.host(size_t(batch));
  for (int64_t r = 0; r < batch; ++r) {
    SCOPED_TRACE("request " + std::to_string(r) + ", " + std::to_string(keys[size_t(r)]) + " keys");
    const sparse::Problem& p = problems[size_t(r)];
    const sparse::SelectorState st(p, P, sparse::Indexer{}, sparse::SelectorState::blocks);
    const int64_t pages = (p.keys + P - 1) / P;
    for (int64_t pg = 0; pg < pages; ++pg) {  // bounds: the max and min of the same values, exactly, in the request's row
      const int64_t at = (r * ppr + pg) * 2 * width;
      for (int64_t d = 0; d < width; ++d) {
        ASSERT_EQ(to_float(bounds[size_t(at + d)]), st.block_max(pg)[d]) << "page " << pg << " column " << d;
        ASSERT_EQ(to_float(bounds[size_t(at + width + d)]), st.block_min(pg)[d]) << "page " << pg << " column " << d;
      }
    }
    ASSERT_EQ(keys_after[size_t(r)], p.keys);
    const std::vector<double> want = sparse::quest_block_scores(p, budget, st);
    std::vector<double> got(scores.begin() + r * ppr, scores.begin() + r * ppr + pages);
    for (int64_t pg = 0; pg < pages; ++pg) {
      // fp32 sums of exact bf16 products in the tensor cores' order: far within 1e-4 of the sum of magnitudes (a wrong bound or sign is off by a good part of it).
      double magnitude = 0;
      for (int64_t h = 0; h < heads; ++h) {
        double m = 0;
        for (int64_t d = 0; d < width; ++d)
          m += std::abs(to_float(q[size_t((r * heads + h) * width + d)])) * std::max(std::abs(st.block_min(pg)[d]), std::abs(st.block_max(pg)[d]));
        magnitude = std::max(magnitude, m);
      }
      EXPECT_NEAR(got[size_t(pg)], want[size_t(pg)], 1e-4 * magnitude) << pg;
    }
    for (int64_t pg = pages; pg < ppr; ++pg) EXPECT_TRUE(std::isinf(scores[size_t(r * ppr + pg)])) << pg;
    // The selection from the GPU's own scores (fp32 sums: a near-tie may rank otherwise than the fp64 ones).
    const sparse::PageSelection cpu = sparse::select_pages(p.keys, P, budget, got);
    EXPECT_EQ(length[size_t(r)], cpu.length);
    EXPECT_EQ(before[size_t(r)], cpu.length - 1);
    EXPECT_EQ(length[size_t(r)], sparse::paged_sparse_length(p.keys, P, budget));
    ASSERT_LE(cpu.pages.size(), size_t(max_pages));
    for (size_t i = 0; i < cpu.pages.size(); ++i) {
      EXPECT_EQ(logical[size_t(r * max_pages) + i], cpu.pages[i]) << i;
      EXPECT_EQ(physical[size_t(r * max_pages) + i], table[size_t(r * ppr + cpu.pages[i])]) << i;
    }
  }
}

// sparse/quest/cuda, the whole step (selection + mla/fused/cuda's kernel over the chosen pages, from one captured
// graph): against the fp64 reference over exactly the keys it chose, at V2-Lite's 16 heads and V3's 128, decode
// and two new tokens, requests of mixed lengths; a budget that holds every key gives dense attention.
TEST(GpuSparse, QuestDecodeMatchesTheReferenceOverItsPages) {
  const VariantEntry* entry = find_variant("sparse/quest/cuda");
  if (!entry) GTEST_SKIP() << "sparse/quest/cuda is not built (no CUDA toolkit at configure time)";
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  struct Case {
    const char* model;
    int64_t batch, q_len, kv_len, budget, local;
    const char* len_dist;
  };
  const std::vector<Case> cases = {
      {"deepseek-v2-lite", 3, 1, 5000, 1024, 256, "mixed"},  // pages beside the window chosen by score
      {"deepseek-v2-lite", 2, 2, 3001, 512, 100, "uniform"},  // two new tokens; an unaligned window
      {"deepseek-v3", 2, 1, 4100, 768, 128, "mixed"},         // 128 heads: the best head's bound
      {"deepseek-v2-lite", 2, 1, 700, 4096, 64, "uniform"},   // the budget holds every key: dense
  };
  const uint64_t seed = test::fresh_seed();
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " batch " + std::to_string(c.batch) + " q_len " + std::to_string(c.q_len) + " kv_len " +
                 std::to_string(c.kv_len) + " budget " + std::to_string(c.budget));
    const ModelFile model = load_model_file(c.model);
    Point p;
    p.set("batch", {std::to_string(c.batch), c.batch, true});
    p.set("q_len", {std::to_string(c.q_len), c.q_len, true});
    p.set("kv_len", {std::to_string(c.kv_len), c.kv_len, true});
    p.set("page_size", {"64", 64, true});
    p.set("len_dist", {c.len_dist, 0, false});
    p.set("kv_dtype", {"bf16", 0, false});
    p.set("executor", {"graph", 0, false});
    p.set("kv_splits", {"auto", 0, false});
    p.set("budget", {std::to_string(c.budget), c.budget, true});
    p.set("local", {std::to_string(c.local), c.local, true});
    auto v = entry->make();
    const Support s = v->supports(model, p);
    ASSERT_TRUE(s.ok) << s.reason;
    v->prepare(model, p, seed);
    v->run();
    v->run();  // (the step again: the same keys rewritten, the same pages' bounds remade)
    const Verification r = v->verify();
    EXPECT_LE(r.rel_err, 1e-2);
    EXPECT_GT(r.rel_err, 0.0) << "bf16 arithmetic cannot match fp64 exactly: is the output really computed?";
    const auto extra = v->verification_counters();
    ASSERT_TRUE(extra.count("rel_err_vs_dense"));
    const bool dense = c.budget >= c.kv_len + c.q_len;
    if (dense) EXPECT_LE(extra.at("rel_err_vs_dense"), 1e-2);
    EXPECT_LE(extra.at("attended_keys"), double(std::min(c.budget + 64, c.kv_len + c.q_len)));  // (a partial last page)
    std::printf("sparse/quest/cuda %-17s batch %lld q_len %lld kv_len %5lld budget %4lld: rel_err %.3e, vs dense %.3e, keys %.0f\n", c.model,
                static_cast<long long>(c.batch), static_cast<long long>(c.q_len), static_cast<long long>(c.kv_len),
                static_cast<long long>(c.budget), r.rel_err, extra.at("rel_err_vs_dense"), extra.at("attended_keys"));
  }
  // An int8 cache is refused (the bounds read bf16 pages)
  Point bad;
  bad.set("batch", {"1", 1, true});
  bad.set("q_len", {"1", 1, true});
  bad.set("kv_len", {"1000", 1000, true});
  bad.set("page_size", {"64", 64, true});
  bad.set("len_dist", {"uniform", 0, false});
  bad.set("kv_dtype", {"int8", 0, false});
  bad.set("budget", {"512", 512, true});
  bad.set("local", {"64", 64, true});
  EXPECT_FALSE(entry->make()->supports(load_model_file("deepseek-v2-lite"), bad).ok);
}
#endif

}  // namespace
}  // namespace dslab
