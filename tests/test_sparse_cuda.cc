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
#include "variants/sparse/cuda/indexer.h"
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
    const cudaError_t copied = cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    EXPECT_EQ(copied, cudaSuccess) << cudaGetErrorString(copied);
    (void)cudaGetLastError();  // a failed copy leaves its error for the next test's launch checks to find otherwise
    return out;
  }
};

float bf16_round(float x) { return to_float(to_bf16(x)); }

// CPU problems (one request each) as the GPU holds them: every request's keys in a paged bf16 cache whose pages are
// scattered over one shuffled pool (table [batch][ppr]), the queries [batch][heads][latent ‖ rope] bf16, and each
// request's cached keys before its decode step (its last key is the step's new one).
struct PagedProblems {
  int64_t batch = 0, heads = 0, width = 0, ppr = 0, slots = 0;
  std::vector<int32_t> table, lengths_before;
  std::vector<bf16> cache, q;
};
PagedProblems lay_out(const std::vector<sparse::Problem>& problems, int64_t P, uint64_t seed) {
  PagedProblems l;
  l.batch = int64_t(problems.size()), l.heads = problems[0].heads;
  const int64_t latent = problems[0].latent, rope = problems[0].rope;
  l.width = latent + rope;
  int64_t most = 0;
  for (const auto& p : problems) most = std::max(most, p.keys);
  l.ppr = (most + P - 1) / P, l.slots = l.batch * l.ppr * P;
  l.table.resize(size_t(l.batch * l.ppr));
  std::iota(l.table.begin(), l.table.end(), 0);
  std::shuffle(l.table.begin(), l.table.end(), std::mt19937_64(seed));
  l.cache.assign(size_t(l.slots * l.width), to_bf16(0.0f));
  l.q.resize(size_t(l.batch * l.heads * l.width));
  for (int64_t r = 0; r < l.batch; ++r) {
    const sparse::Problem& p = problems[size_t(r)];
    for (int64_t k = 0; k < p.keys; ++k) {
      bf16* row = &l.cache[size_t((l.table[size_t(r * l.ppr + k / P)] * P + k % P) * l.width)];
      for (int64_t d = 0; d < latent; ++d) row[d] = to_bf16(p.c_kv[size_t(k * latent + d)]);
      for (int64_t d = 0; d < rope; ++d) row[latent + d] = to_bf16(p.k_pe[size_t(k * rope + d)]);
    }
    for (int64_t h = 0; h < l.heads; ++h) {
      for (int64_t d = 0; d < latent; ++d)
        l.q[size_t((r * l.heads + h) * l.width + d)] = to_bf16(p.q_lat[size_t(h * latent + d)]);
      for (int64_t d = 0; d < rope; ++d)
        l.q[size_t((r * l.heads + h) * l.width + latent + d)] = to_bf16(p.q_pe[size_t(h * rope + d)]);
    }
    l.lengths_before.push_back(int32_t(p.keys - 1));
  }
  return l;
}

// One decode step's selection by the GPU's pieces (summaries of the cached keys, the step's page remade, page
// scores, compact pages) for a batch of CPU problems laid out in a shuffled page pool.
struct GpuPageSelection {
  std::vector<bf16> q, summaries;
  std::vector<float> scores;
  std::vector<int32_t> table, physical, logical, length, before, keys_after;
  int64_t ppr = 0, max_pages = 0;
};
GpuPageSelection select_on_gpu(sparse::cuda::Summary kind, const std::vector<sparse::Problem>& problems, int64_t P,
                               const sparse::Budget& budget, uint64_t seed) {
  const PagedProblems l = lay_out(problems, P, seed);
  const int64_t batch = l.batch, heads = l.heads, width = l.width, ppr = l.ppr,
                sw = sparse::cuda::summary_width(kind, width);
  GpuPageSelection g;
  g.ppr = g.max_pages = ppr;
  g.table = l.table;
  g.q = l.q;
  // prepare's summaries of the keys before a decode step (the last key's page listed with one key fewer, or not at
  // all), then the step's own page remade by step_page_summaries.
  std::vector<int32_t> counts, listed, rows;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t cached = l.lengths_before[size_t(r)], pages = (cached + P - 1) / P;
    for (int64_t pg = 0; pg < pages; ++pg) {
      listed.push_back(g.table[size_t(r * ppr + pg)]);
      rows.push_back(int32_t(r * ppr + pg));
      counts.push_back(int32_t(std::min(P, cached - pg * P)));
    }
  }
  const Device<bf16> d_cache(l.cache), d_q(g.q);
  const Device<int32_t> d_table(g.table), d_listed(listed), d_rows(rows), d_counts(counts), d_lengths(l.lengths_before);
  const Device<int32_t> d_keys{size_t(batch)}, d_before{size_t(batch)};
  const Device<bf16> d_summaries{size_t(batch * ppr * sw)}, d_split{size_t(batch * heads * 2 * width)};
  const Device<float> d_products{size_t(batch * ppr * heads)}, d_scores{size_t(batch * ppr)};
  const Device<int32_t> d_physical{size_t(batch * ppr)}, d_logical{size_t(batch * ppr)}, d_length{size_t(batch)};
  auto* cache_ptr = reinterpret_cast<const __nv_bfloat16*>(d_cache.p);
  auto* summaries = reinterpret_cast<__nv_bfloat16*>(d_summaries.p);
  sparse::cuda::page_summaries(kind, cache_ptr, P, width, d_listed.p, d_rows.p, d_counts.p, int(listed.size()),
                               summaries, 0);
  sparse::cuda::step_page_summaries(kind, cache_ptr, P, width, d_lengths.p, 1, d_table.p, ppr, batch, d_keys.p,
                                    summaries, 0);
  gpu::BlasHandle blas;
  blas.set_stream(0);
  sparse::cuda::page_scores(kind, blas.get(), reinterpret_cast<const __nv_bfloat16*>(d_q.p), batch, 1, heads, width,
                            summaries, ppr, d_keys.p, P, reinterpret_cast<__nv_bfloat16*>(d_split.p), d_products.p,
                            d_scores.p, 0);
  sparse::cuda::compact_pages(d_scores.p, d_table.p, ppr, d_keys.p, P, budget, batch, ppr, 1, d_physical.p, d_logical.p,
                              d_length.p, d_before.p, 0);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  g.summaries = d_summaries.host(size_t(batch * ppr * sw));
  g.scores = d_scores.host(size_t(batch * ppr));
  g.physical = d_physical.host(size_t(batch * ppr)), g.logical = d_logical.host(size_t(batch * ppr));
  g.length = d_length.host(size_t(batch)), g.before = d_before.host(size_t(batch)),
  g.keys_after = d_keys.host(size_t(batch));
  return g;
}

// Each problem in bf16 values (the CPU reference reads the same numbers the GPU does).
sparse::Problem bf16_problem(int64_t heads, int64_t keys, sparse::CacheKind kind, double depth, uint64_t seed,
                             double needle_norm = 1) {
  sparse::Problem p = sparse::make_problem(heads, 512, 64, keys, kind, depth, seed, needle_norm);
  for (auto* v : {&p.q_lat, &p.q_pe, &p.c_kv, &p.k_pe})
    for (float& x : *v) x = bf16_round(x);
  return p;
}

TEST(GpuSparse, PageSelectionMatchesTheCpuReference) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  using sparse::cuda::Summary;
  const uint64_t seed = test::fresh_seed();
  const int64_t heads = 16, width = 576, P = 64;
  const std::vector<int64_t> keys = {1000, 641, 130,
                                     4096};  // partial last pages (641: the step opens one); one within the budget
  const int64_t batch = int64_t(keys.size());
  sparse::Budget budget;
  budget.tokens = 512, budget.block = P, budget.n_init = 4, budget.local = 64;
  std::vector<sparse::Problem> problems;
  for (int64_t r = 0; r < batch; ++r)
    problems.push_back(
        bf16_problem(heads, keys[size_t(r)], sparse::CacheKind::clustered, 0, sparse::request_seed(seed, r)));
  for (const Summary kind : {Summary::quest_bounds, Summary::infllm_mean}) {
    const bool quest = kind == Summary::quest_bounds;
    SCOPED_TRACE(quest ? "quest" : "infllm");
    const GpuPageSelection g = select_on_gpu(kind, problems, P, budget, seed);
    const int64_t ppr = g.ppr, sw = sparse::cuda::summary_width(kind, width);
    for (int64_t r = 0; r < batch; ++r) {
      SCOPED_TRACE("request " + std::to_string(r) + ", " + std::to_string(keys[size_t(r)]) + " keys");
      const sparse::Problem& p = problems[size_t(r)];
      const sparse::SelectorState st(p, P, sparse::Indexer{}, sparse::SelectorState::blocks);
      const int64_t pages = (p.keys + P - 1) / P;
      ASSERT_EQ(g.keys_after[size_t(r)], p.keys);
      // Summaries in the request's row: Quest's max and min of the same values exactly; InfLLM's mean to bf16.
      std::vector<std::vector<float>> mean(static_cast<size_t>(pages), std::vector<float>(static_cast<size_t>(width)));
      for (int64_t pg = 0; pg < pages; ++pg) {
        const int64_t at = (r * ppr + pg) * sw, count = std::min(P, p.keys - pg * P);
        for (int64_t d = 0; d < width; ++d) {
          if (quest) {
            ASSERT_EQ(to_float(g.summaries[size_t(at + d)]), st.block_max(pg)[d]) << "page " << pg << " column " << d;
            ASSERT_EQ(to_float(g.summaries[size_t(at + width + d)]), st.block_min(pg)[d])
                << "page " << pg << " column " << d;
          } else {
            mean[size_t(pg)][size_t(d)] = st.block_sum(pg)[d] / float(count);
            ASSERT_NEAR(to_float(g.summaries[size_t(at + d)]), mean[size_t(pg)][size_t(d)],
                        std::abs(mean[size_t(pg)][size_t(d)]) * 0x1p-8 + 1e-30)
                << "page " << pg << " column " << d;
          }
        }
      }
      const std::vector<double> want =
          quest ? sparse::quest_block_scores(p, budget, st) : sparse::infllm_block_scores(p, budget, st);
      const std::vector<double> got(g.scores.begin() + r * ppr, g.scores.begin() + r * ppr + pages);
      for (int64_t pg = 0; pg < pages; ++pg) {
        // Quest: fp32 sums of exact bf16 products, far within 1e-4 of the sum of magnitudes; InfLLM's bf16 mean adds
        // up to 2^-9 of it. A wrong bound, sign or row is off by a good part of it.
        double magnitude = 0;
        for (int64_t h = 0; h < heads; ++h) {
          double m = 0;
          for (int64_t d = 0; d < width; ++d) {
            const double summary = quest ? std::max(std::abs(st.block_min(pg)[d]), std::abs(st.block_max(pg)[d]))
                                         : std::abs(mean[size_t(pg)][size_t(d)]);
            m += std::abs(to_float(g.q[size_t((r * heads + h) * width + d)])) * summary;
          }
          magnitude = std::max(magnitude, m);
        }
        EXPECT_NEAR(got[size_t(pg)], want[size_t(pg)], (quest ? 1e-4 : 4e-3) * magnitude) << pg;
      }
      for (int64_t pg = pages; pg < ppr; ++pg) EXPECT_TRUE(std::isinf(g.scores[size_t(r * ppr + pg)])) << pg;
      // The selection from the GPU's own scores (fp32 sums: a near-tie may rank otherwise than the fp64 ones).
      const sparse::PageSelection cpu = sparse::select_pages(p.keys, P, budget, got);
      EXPECT_EQ(g.length[size_t(r)], cpu.length);
      EXPECT_EQ(g.before[size_t(r)], cpu.length - 1);
      EXPECT_EQ(g.length[size_t(r)], sparse::paged_sparse_length(p.keys, P, budget));
      ASSERT_LE(cpu.pages.size(), size_t(g.max_pages));
      for (size_t i = 0; i < cpu.pages.size(); ++i) {
        EXPECT_EQ(g.logical[size_t(r * g.max_pages) + i], cpu.pages[i]) << i;
        EXPECT_EQ(g.physical[size_t(r * g.max_pages) + i], g.table[size_t(r * ppr + cpu.pages[i])]) << i;
      }
    }
  }
}

// needle_recall on the GPU: a key planted at depths 0-100% of the cache along the heads' mean query, 4 typical key
// lengths long; the page holding it is among the GPU's chosen pages for Quest and InfLLM at every depth (16 pages of
// 256 chosen). (A needle of a haystack key's length stands out of a page's summary too little for either: the CPU
// sweep's cpu-needle-depth shows where.)
TEST(GpuSparse, NeedlePageIsChosenAtEveryDepth) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  using sparse::cuda::Summary;
  const uint64_t seed = test::fresh_seed();
  const int64_t P = 64, keys = 16384;
  sparse::Budget budget;
  budget.tokens = 1024, budget.block = P, budget.n_init = 4, budget.local = 128;
  std::vector<sparse::Problem> problems;
  const std::vector<double> depths = {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0};
  for (size_t i = 0; i < depths.size(); ++i)
    problems.push_back(
        bf16_problem(16, keys, sparse::CacheKind::needle, depths[i], sparse::request_seed(seed, int64_t(i)), 4));
  for (const Summary kind : {Summary::quest_bounds, Summary::infllm_mean}) {
    const GpuPageSelection g = select_on_gpu(kind, problems, P, budget, seed);
    for (size_t r = 0; r < problems.size(); ++r) {
      const int64_t needle_page = problems[r].needle / P, chosen = (g.length[r] + P - 1) / P;
      bool found = false;
      for (int64_t i = 0; i < chosen; ++i) found |= g.logical[r * size_t(g.max_pages) + size_t(i)] == needle_page;
      EXPECT_TRUE(found) << (kind == Summary::quest_bounds ? "quest" : "infllm") << " depth " << depths[r] << " (page "
                         << needle_page << ")";
    }
  }
}

// An e4m3 byte's value (sign, 4 exponent bits of bias 7, 3 mantissa bits; subnormals below 2^-6).
float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float v = e == 0 ? std::ldexp(float(m) / 8.0f, -6) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  return (b & 0x80) ? -v : v;
}

// The lightning indexer's GPU pieces against the CPU state and scores: the index keys of every cached key (prepare's
// GEMM) and of the step's new key (a block per key), the index queries and every key's score, and the top-k from the
// GPU's own scores as select_tokens makes it; the keys scattered over a shuffled page pool.
void check_indexer(int64_t P, uint64_t seed) {
  SCOPED_TRACE("page_size " + std::to_string(P));
  const int64_t heads = 16, latent = 512, rope = 64, width = latent + rope, D = sparse::cuda::kIndexDim;
  const std::vector<int64_t> keys = {1000, 641, 130, 4096};
  const int64_t batch = int64_t(keys.size());
  sparse::Budget budget;
  budget.tokens = 512, budget.block = 1, budget.n_init = 4, budget.local = 64;
  std::vector<sparse::Problem> problems;
  for (int64_t r = 0; r < batch; ++r)
    problems.push_back(
        bf16_problem(heads, keys[size_t(r)], sparse::CacheKind::clustered, 0, sparse::request_seed(seed, r)));
  const PagedProblems l = lay_out(problems, P, seed);
  const int64_t ppr = l.ppr, slots = l.slots;
  const std::vector<int32_t>& table = l.table;
  const std::vector<float> projection = sparse::indexer_projection(sparse::Indexer{}, width);
  std::vector<bf16> projection_bf16(projection.size());
  for (size_t i = 0; i < projection.size(); ++i) projection_bf16[i] = to_bf16(projection[i]);
  const Device<bf16> d_cache(l.cache), d_q(l.q), d_projection(projection_bf16);
  const Device<int32_t> d_table(table), d_lengths(l.lengths_before), d_keys{size_t(batch)};
  const Device<uint8_t> d_index{size_t(slots * D)};
  const Device<float> d_scales{size_t(slots)}, d_scratch{size_t(1000 * D)}, d_scores{size_t(batch * ppr * P)};
  const Device<uint8_t> d_queries{size_t(batch * sparse::cuda::kIndexHeads * D)};
  const Device<float> d_query_scales{size_t(batch * sparse::cuda::kIndexHeads)};
  const Device<int32_t> d_slots{size_t(batch * (budget.tokens + 1))}, d_logical{size_t(batch * (budget.tokens + 1))},
      d_length{size_t(batch)}, d_before{size_t(batch)};
  auto* cache_ptr = reinterpret_cast<const __nv_bfloat16*>(d_cache.p);
  auto* projection_ptr = reinterpret_cast<const __nv_bfloat16*>(d_projection.p);
  gpu::BlasHandle blas;
  blas.set_stream(0);
  // Every slot by prepare's GEMM (1000-row chunks: a partial last chunk), then the step's new keys remade; each
  // request's last key's slot zeroed first, so the step must write it.
  sparse::cuda::index_all_keys(blas.get(), cache_ptr, slots, width, projection_ptr, d_scratch.p, 1000, d_index.p,
                               d_scales.p, 0);
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t k = keys[size_t(r)] - 1, slot = table[size_t(r * ppr + k / P)] * P + k % P;
    ASSERT_EQ(cudaMemset(d_index.p + slot * D, 0, size_t(D)), cudaSuccess);
  }
  sparse::cuda::index_step_keys(cache_ptr, width, d_lengths.p, 1, d_table.p, ppr, P, batch, projection_ptr, d_index.p,
                                d_scales.p, d_keys.p, 0);
  const Device<float> d_projected{size_t(batch * heads * D)};
  sparse::cuda::index_queries(blas.get(), reinterpret_cast<const __nv_bfloat16*>(d_q.p), batch, heads, width,
                              projection_ptr, d_projected.p, d_queries.p, d_query_scales.p, 0);
  const CUtensorMap index_map = sparse::cuda::index_key_map(d_index.p, slots);
  sparse::cuda::indexer_scores(d_queries.p, d_query_scales.p, d_index.p, &index_map, d_scales.p, d_table.p, ppr, P,
                               d_keys.p, batch, ppr * P, d_scores.p, 0);
  sparse::cuda::compact_tokens(d_scores.p, ppr * P, d_table.p, ppr, d_keys.p, P, budget, batch, budget.tokens + 1, 1,
                               d_slots.p, d_logical.p, d_length.p, d_before.p, 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto index = d_index.host(size_t(slots * D));
  const auto scales = d_scales.host(size_t(slots)), scores = d_scores.host(size_t(batch * ppr * P));
  const auto queries = d_queries.host(size_t(batch * sparse::cuda::kIndexHeads * D));
  const auto query_scales = d_query_scales.host(size_t(batch * sparse::cuda::kIndexHeads));
  const auto out_slots = d_slots.host(size_t(batch * (budget.tokens + 1))),
             logical = d_logical.host(size_t(batch * (budget.tokens + 1)));
  const auto length = d_length.host(size_t(batch)), before = d_before.host(size_t(batch)),
             keys_after = d_keys.host(size_t(batch));
  const int64_t max_tokens = budget.tokens + 1;
  for (int64_t r = 0; r < batch; ++r) {
    SCOPED_TRACE("request " + std::to_string(r) + ", " + std::to_string(keys[size_t(r)]) + " keys");
    const sparse::Problem& p = problems[size_t(r)];
    const sparse::SelectorState st(p, 1, sparse::Indexer{}, sparse::SelectorState::index_keys);
    ASSERT_EQ(keys_after[size_t(r)], p.keys);
    // Index keys: the same fp32 sums in another order, so an element may round to the neighbouring e4m3 value, and
    // the token's scale (amax / 448) may differ in its last bit: the same e4m3 code is a match within 1e-4 (the
    // neighbouring codes are 1/16 apart).
    int64_t exact = 0;
    for (int64_t k = 0; k < p.keys; ++k) {
      const int64_t slot = table[size_t(r * ppr + k / P)] * P + k % P;
      const float* want = st.index_key(k);
      float amax = 0;
      for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::abs(want[d]));
      ASSERT_NEAR(scales[size_t(slot)], amax / 448.0f, 1e-3 * amax / 448.0f) << "key " << k;
      for (int64_t d = 0; d < D; ++d) {
        const float got = e4m3_value(index[size_t(slot * D + d)]) * scales[size_t(slot)];
        exact += std::abs(got - want[d]) <= 1e-4f * std::abs(want[d]);
        ASSERT_NEAR(got, want[d], std::abs(want[d]) / 8 + std::ldexp(scales[size_t(slot)], -9) * 1.01f)
            << "key " << k << " dim " << d;
      }
    }
    EXPECT_GE(double(exact), 0.99 * double(p.keys * D));
    // Index queries: e4m3 with a scale per head, index head j from MLA head j mod heads; the same codes as the CPU's
    // but for neighbouring-value roundings of fp32 sums taken in another order.
    std::vector<float> iq(size_t(sparse::cuda::kIndexHeads * D));
    int64_t same_query = 0;
    for (int64_t j = 0; j < sparse::cuda::kIndexHeads; ++j) {
      float* row = &iq[size_t(j * D)];
      st.project(&p.q_lat[size_t((j % heads) * latent)], &p.q_pe[size_t((j % heads) * rope)], row);
      std::vector<float> rounded(row, row + D);
      const float scale = sparse::round_e4m3_scaled(rounded.data(), D);
      const size_t at = size_t((r * sparse::cuda::kIndexHeads + j) * D);
      ASSERT_NEAR(query_scales[size_t(r * sparse::cuda::kIndexHeads + j)], scale, 1e-3 * scale) << "index head " << j;
      for (int64_t d = 0; d < D; ++d) {
        const float got = e4m3_value(queries[at + size_t(d)]) * query_scales[size_t(r * sparse::cuda::kIndexHeads + j)];
        same_query += std::abs(got - rounded[size_t(d)]) <= 1e-4f * std::abs(rounded[size_t(d)]);
        ASSERT_NEAR(got, rounded[size_t(d)], std::abs(rounded[size_t(d)]) / 8 + std::ldexp(scale, -9) * 1.01f)
            << "index head " << j << " dim " << d;
      }
    }
    EXPECT_GE(double(same_query), 0.99 * double(sparse::cuda::kIndexHeads * D));
    // Scores: against the fp64 scores of the GPU's own e4m3 queries and keys (checked against the CPU's above) within
    // 1e-3 of the score's sum of magnitudes - Hopper's e4m3 MMA accumulates with about 14 mantissa bits (DeepSeek-V3's
    // report; measured here up to 1.1e-4, seed 9806297671492805580); and against the CPU's scores within 2e-2 of it:
    // a neighbouring e4m3 rounding (one code, 1/8 of an element at most) moves a score by more than that (seed
    // 13004474275044208441: 0.25% at one key of 1000, over the 2e-3 this check had).
    const std::vector<double> want = sparse::dsa_token_scores(p, st);
    const std::vector<double> got(scores.begin() + r * ppr * P, scores.begin() + r * ppr * P + p.keys);
    std::vector<double> gpu_query(size_t(sparse::cuda::kIndexHeads * D));
    for (int64_t j = 0; j < sparse::cuda::kIndexHeads; ++j)
      for (int64_t d = 0; d < D; ++d)
        gpu_query[size_t(j * D + d)] =
            double(e4m3_value(queries[size_t((r * sparse::cuda::kIndexHeads + j) * D + d)])) *
            double(query_scales[size_t(r * sparse::cuda::kIndexHeads + j)]);
    for (int64_t k = 0; k < p.keys; ++k) {
      const int64_t slot = table[size_t(r * ppr + k / P)] * P + k % P;
      double magnitude = 0, cpu_magnitude = 0, from_gpu_values = 0;
      for (int64_t j = 0; j < sparse::cuda::kIndexHeads; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) {
          const double key = double(e4m3_value(index[size_t(slot * D + d)])) * double(scales[size_t(slot)]);
          dot += gpu_query[size_t(j * D + d)] * key;
          magnitude += std::abs(gpu_query[size_t(j * D + d)] * key) / double(sparse::cuda::kIndexHeads);
          cpu_magnitude +=
              std::abs(double(iq[size_t(j * D + d)]) * st.index_key(k)[d]) / double(sparse::cuda::kIndexHeads);
        }
        from_gpu_values += std::max(0.0, dot) / double(sparse::cuda::kIndexHeads);
      }
      ASSERT_NEAR(got[size_t(k)], from_gpu_values, 1e-3 * magnitude + 1e-6) << "key " << k;
      ASSERT_NEAR(got[size_t(k)], want[size_t(k)], 2e-2 * cpu_magnitude + 1e-6) << "key " << k;
    }
    // The selection from the GPU's own scores.
    const std::vector<int64_t> cpu = sparse::select_tokens(p.keys, budget, got);
    ASSERT_EQ(length[size_t(r)], int32_t(cpu.size()));
    EXPECT_EQ(before[size_t(r)], int32_t(cpu.size()) - 1);
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_EQ(logical[size_t(r * max_tokens) + i], cpu[i]) << i;
      EXPECT_EQ(out_slots[size_t(r * max_tokens) + i], table[size_t(r * ppr + cpu[i] / P)] * P + cpu[i] % P) << i;
    }
  }
}

// Pages of whole 64-key tiles, one or two a page (a tile by a tensor copy and a warpgroup MMA), and of 48 keys
// (cp.async and mma.sync, a page-table lookup per key).
TEST(GpuSparse, IndexerMatchesTheCpuReference) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  const uint64_t seed = test::fresh_seed();
  for (const int64_t page_size : {64, 128, 48}) check_indexer(page_size, seed);
}

// The oracle's attention mass on the GPU against the CPU's (each key's softmax probability summed over the heads, at
// the CPU problem's scale), and its top-k from the GPU's own mass as select_tokens makes it.
TEST(GpuSparse, OracleMassMatchesTheCpuReference) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  const uint64_t seed = test::fresh_seed();
  const int64_t heads = 16, P = 64;
  const std::vector<int64_t> keys = {1000, 641, 3000};
  sparse::Budget budget;
  budget.tokens = 256, budget.block = 1, budget.n_init = 4, budget.local = 64;
  std::vector<sparse::Problem> problems;
  for (size_t r = 0; r < keys.size(); ++r)
    problems.push_back(
        bf16_problem(heads, keys[r], sparse::CacheKind::clustered, 0, sparse::request_seed(seed, int64_t(r))));
  const PagedProblems l = lay_out(problems, P, seed);
  const int64_t batch = l.batch, max_keys = l.ppr * P, max_tokens = budget.tokens + 1;
  const Device<bf16> d_cache(l.cache), d_q(l.q), d_gathered{size_t(batch * max_keys * l.width)};
  const Device<int32_t> d_table(l.table), d_lengths(l.lengths_before), d_keys{size_t(batch)};
  const Device<float> d_head_scores{size_t(batch * heads * max_keys)}, d_max{size_t(batch * heads)},
      d_sum{size_t(batch * heads)}, d_mass{size_t(batch * max_keys)};
  const Device<int32_t> d_slots{size_t(batch * max_tokens)}, d_logical{size_t(batch * max_tokens)},
      d_length{size_t(batch)};
  gpu::BlasHandle blas;
  blas.set_stream(0);
  sparse::cuda::attention_mass(blas.get(), reinterpret_cast<const __nv_bfloat16*>(d_cache.p), l.width, d_lengths.p, 1,
                               d_table.p, l.ppr, P, batch, reinterpret_cast<const __nv_bfloat16*>(d_q.p), heads,
                               problems[0].scale, max_keys, reinterpret_cast<__nv_bfloat16*>(d_gathered.p),
                               d_head_scores.p, d_max.p, d_sum.p, d_keys.p, d_mass.p, 0);
  sparse::cuda::compact_tokens(d_mass.p, max_keys, d_table.p, l.ppr, d_keys.p, P, budget, batch, max_tokens, 1,
                               d_slots.p, d_logical.p, d_length.p, nullptr, 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto mass = d_mass.host(size_t(batch * max_keys));
  const auto keys_after = d_keys.host(size_t(batch));
  const auto logical = d_logical.host(size_t(batch * max_tokens)), length = d_length.host(size_t(batch));
  for (int64_t r = 0; r < batch; ++r) {
    SCOPED_TRACE("request " + std::to_string(r));
    const sparse::Problem& p = problems[size_t(r)];
    ASSERT_EQ(keys_after[size_t(r)], p.keys);
    const std::vector<double> want = sparse::oracle_key_mass(p);
    const std::vector<double> got(mass.begin() + r * max_keys, mass.begin() + r * max_keys + p.keys);
    double total = 0;
    for (int64_t k = 0; k < p.keys; ++k) {
      ASSERT_NEAR(got[size_t(k)], want[size_t(k)], 2e-3 * want[size_t(k)] + 1e-7) << "key " << k;
      total += got[size_t(k)];
    }
    EXPECT_NEAR(total, double(heads), 1e-3 * double(heads));  // (each head's probabilities sum to one)
    const std::vector<int64_t> cpu = sparse::select_tokens(p.keys, budget, got);
    ASSERT_EQ(length[size_t(r)], int32_t(cpu.size()));
    for (size_t i = 0; i < cpu.size(); ++i) ASSERT_EQ(logical[size_t(r * max_tokens) + i], cpu[i]) << i;
  }
}

// How the top-k launches: one block a request below 16K keys, a cluster of 4 to 8 CTAs from there, streaming its
// scores where its registers do not hold them; how many clusters of that size this GPU holds at once (at least one, at
// most one per `ctas` SMs) and so in how many rounds the batch runs; and the size chosen does no more work on its
// slowest SM (rounds x keys a CTA) than the 8-CTA cluster would.
TEST(GpuSparse, TopkLaunchSaysHowManyClustersFit) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  const sparse::cuda::TopkLaunch small = sparse::cuda::topk_launch(3000, 16);
  EXPECT_EQ(small.ctas_per_request, 1);
  EXPECT_EQ(small.max_active_clusters, 0);
  for (const int64_t keys : {int64_t(40000), int64_t(131072), int64_t(1048576)})
    for (const int64_t batch : {int64_t(1), int64_t(16), int64_t(64)}) {
      SCOPED_TRACE(std::to_string(keys) + " keys, batch " + std::to_string(batch));
      const sparse::cuda::TopkLaunch t = sparse::cuda::topk_launch(keys, batch);
      EXPECT_GE(t.ctas_per_request, 4);
      EXPECT_LE(t.ctas_per_request, 8);
      EXPECT_EQ(t.streaming, keys > int64_t(t.ctas_per_request) * 1024 *
                                        22);  // (22 keys a thread in registers: 128K keys fit 6 CTAs)
      EXPECT_GE(t.max_active_clusters, 1);
      EXPECT_LE(t.max_active_clusters, gpu_info().sms / t.ctas_per_request);
      EXPECT_EQ(t.rounds, (batch + t.max_active_clusters - 1) / t.max_active_clusters);
      const sparse::cuda::TopkLaunch eight = sparse::cuda::topk_cluster_launch(keys, batch, 8);
      EXPECT_LE(double(t.rounds) * double((keys + t.ctas_per_request - 1) / t.ctas_per_request),
                double(eight.rounds) * double((keys + 7) / 8) * (eight.streaming ? 1.5 : 1.0));
      std::printf("top-k over %lld keys, batch %lld: clusters of %d%s, %d at once on this GPU (8: %d), %d round(s)\n",
                  static_cast<long long>(keys), static_cast<long long>(batch), t.ctas_per_request,
                  t.streaming ? " (streaming)" : "", t.max_active_clusters, eight.max_active_clusters, t.rounds);
    }
}

// The token top-k at every size it meets (one CTA up to 16K keys, a cluster past it: the keys in registers or read
// again each pass), with the cluster size chosen and every other one, on scores with many ties and mixed lengths: the
// keys, their slots and their count as select_tokens makes them.
TEST(GpuSparse, TokenSelectionMatchesTheCpuAtEverySize) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 gen(seed);
  const int64_t P = 64;
  sparse::Budget budget;
  budget.tokens = 2048 + 260, budget.block = 1, budget.n_init = 4, budget.local = 256;
  for (const int64_t most : {3000, 40000, 131072 + 64, 200000, 1048576}) {
    SCOPED_TRACE(std::to_string(most) + " keys at most");
    const std::vector<int64_t> keys = {most, most / 2 + 7, 1000};
    const int64_t batch = int64_t(keys.size()), ppr = (most + P - 1) / P, per_request = ppr * P,
                  max_tokens = budget.tokens + 1;
    std::vector<int32_t> table(size_t(batch * ppr));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), gen);
    std::vector<float> scores(size_t(batch * per_request), 0.0f);
    std::uniform_int_distribution<int> level(0, 4000);  // (about 50 keys per value at 200K: ties at the threshold)
    for (float& x : scores) x = float(level(gen) - 1000) * 0.25f;
    std::vector<int32_t> key_counts(keys.begin(), keys.end());
    const Device<float> d_scores(scores);
    const Device<int32_t> d_table(table), d_keys(key_counts);
    const Device<int32_t> d_slots{size_t(batch * max_tokens)}, d_logical{size_t(batch * max_tokens)},
        d_length{size_t(batch)}, d_before{size_t(batch)};
    // The launch compact_tokens chooses, then (past 16K keys) every cluster size on the same requests.
    std::vector<sparse::cuda::TopkLaunch> launches = {sparse::cuda::topk_launch(per_request, batch)};
    if (launches[0].ctas_per_request > 1)
      for (int ctas = 4; ctas <= 8; ++ctas)
        launches.push_back(sparse::cuda::topk_cluster_launch(per_request, batch, ctas));
    for (const sparse::cuda::TopkLaunch& launch : launches) {
      SCOPED_TRACE("clusters of " + std::to_string(launch.ctas_per_request) + (launch.streaming ? " (streaming)" : ""));
      ASSERT_EQ(cudaMemset(d_slots.p, 0xff, size_t(batch * max_tokens) * sizeof(int32_t)),
                cudaSuccess);  // (no answer left from the last launch)
      ASSERT_EQ(cudaMemset(d_logical.p, 0xff, size_t(batch * max_tokens) * sizeof(int32_t)), cudaSuccess);
      sparse::cuda::compact_tokens_as(launch, d_scores.p, per_request, d_table.p, ppr, d_keys.p, P, budget, batch,
                                      max_tokens, 1, d_slots.p, d_logical.p, d_length.p, d_before.p, 0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto slots = d_slots.host(size_t(batch * max_tokens)), logical = d_logical.host(size_t(batch * max_tokens));
      const auto length = d_length.host(size_t(batch)), before = d_before.host(size_t(batch));
      for (int64_t r = 0; r < batch; ++r) {
        SCOPED_TRACE("request " + std::to_string(r));
        const int64_t n = keys[size_t(r)];
        const std::vector<double> mine(scores.begin() + r * per_request, scores.begin() + r * per_request + n);
        const std::vector<int64_t> cpu = sparse::select_tokens(n, budget, mine);
        ASSERT_EQ(length[size_t(r)], int32_t(cpu.size()));
        EXPECT_EQ(before[size_t(r)], int32_t(cpu.size()) - 1);
        for (size_t i = 0; i < cpu.size(); ++i) {
          ASSERT_EQ(logical[size_t(r * max_tokens) + i], cpu[i]) << i;
          ASSERT_EQ(slots[size_t(r * max_tokens) + i], table[size_t(r * ppr + cpu[i] / P)] * P + cpu[i] % P) << i;
        }
      }
    }
  }
}

// sparse/{quest,infllm,dsa,oracle}/cuda, the whole step (selection + mla/fused/cuda's kernel over the chosen pages or
// keys, from one captured graph): against the fp64 reference over exactly the keys it chose, at V2-Lite's 16 heads and
// V3's 128, decode and two new tokens (not DSA's or the oracle's: one query per request), requests of mixed lengths; a
// budget that holds every key gives dense attention.
class GpuSparseDecode : public ::testing::TestWithParam<const char*> {};
TEST_P(GpuSparseDecode, DecodeMatchesTheReferenceOverItsPages) {
  const VariantEntry* entry = find_variant(GetParam());
  if (!entry) GTEST_SKIP() << GetParam() << " is not built (no CUDA toolkit at configure time)";
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  struct Case {
    const char* model;
    int64_t batch, q_len, kv_len, budget, local;
    const char* len_dist;
  };
  const std::vector<Case> cases = {
      {"deepseek-v2-lite", 3, 1, 5000, 1024, 256, "mixed"},   // pages beside the window chosen by score
      {"deepseek-v2-lite", 2, 2, 3001, 512, 100, "uniform"},  // two new tokens; an unaligned window
      {"deepseek-v3", 2, 1, 4100, 768, 128, "mixed"},         // 128 heads: the best head's bound
      {"deepseek-v2-lite", 2, 1, 700, 4096, 64, "uniform"},   // the budget holds every key: dense
  };
  const uint64_t seed = test::fresh_seed();
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " batch " + std::to_string(c.batch) + " q_len " + std::to_string(c.q_len) +
                 " kv_len " + std::to_string(c.kv_len) + " budget " + std::to_string(c.budget));
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
    p.set("proj", {"own", 0, false});
    p.set("budget", {std::to_string(c.budget), c.budget, true});
    p.set("local", {std::to_string(c.local), c.local, true});
    auto v = entry->make();
    const Support s = v->supports(model, p);
    const std::string name = GetParam();
    if (c.q_len > 1 && (name == "sparse/dsa/cuda" || name == "sparse/oracle/cuda")) {  // (one query per request)
      EXPECT_FALSE(s.ok);
      continue;
    }
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
    ASSERT_TRUE(extra.count("mass_recall"));
    EXPECT_GT(extra.at("mass_recall"), 0.0);
    EXPECT_LE(extra.at("mass_recall"), 1.0 + 1e-12);
    if (dense) EXPECT_NEAR(extra.at("mass_recall"), 1.0, 1e-12);
    EXPECT_LE(extra.at("attended_keys"), double(std::min(c.budget + 64, c.kv_len + c.q_len)));  // (a partial last page)
    std::printf(
        "%s %-17s batch %lld q_len %lld kv_len %5lld budget %4lld: rel_err %.3e, vs dense %.3e, mass %.3f, keys %.0f\n",
        GetParam(), c.model, static_cast<long long>(c.batch), static_cast<long long>(c.q_len),
        static_cast<long long>(c.kv_len), static_cast<long long>(c.budget), r.rel_err, extra.at("rel_err_vs_dense"),
        extra.at("mass_recall"), extra.at("attended_keys"));
  }
  // An int8 cache is refused (the summaries read bf16 pages)
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
INSTANTIATE_TEST_SUITE_P(Gpu, GpuSparseDecode,
                         ::testing::Values("sparse/quest/cuda", "sparse/infllm/cuda", "sparse/dsa/cuda",
                                           "sparse/oracle/cuda"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param).substr(7, std::string(i.param).find('/', 7) - 7);
                         });
#endif

}  // namespace
}  // namespace dslab
