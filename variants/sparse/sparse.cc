#include "variants/sparse/sparse.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

#include "variants/common/bf16.h"
#include "variants/common/rng.h"

namespace dslab::sparse {

uint64_t request_seed(uint64_t seed, int64_t request) {
  return request == 0 ? seed : splitmix64(seed ^ (0x5e0000ull + uint64_t(request)));
}

Problem make_problem(int64_t heads, int64_t latent, int64_t rope, int64_t keys, CacheKind kind, double needle_depth,
                     uint64_t seed, double needle_norm) {
  if (heads < 1 || latent < 1 || rope < 0 || keys < 1)
    throw std::invalid_argument("sparse::make_problem: empty problem");
  Problem p;
  p.heads = heads, p.latent = latent, p.rope = rope, p.keys = keys;
  p.scale = 1.0f / std::sqrt(float(latent + rope));
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    for (float& x : v) x = normal(gen);
  };
  fill(p.q_lat, size_t(heads * latent));
  fill(p.q_pe, size_t(heads * rope));
  fill(p.c_kv, size_t(keys * latent));
  fill(p.k_pe, size_t(keys * rope));
  if (kind == CacheKind::clustered) {
    // A few centres; each key is its centre plus noise, older keys weaker (recency); the heads' queries lean
    // towards centre 0.
    const int64_t centres = 8;
    std::vector<float> c;
    fill(c, size_t(centres * latent));
    std::uniform_int_distribution<int64_t> pick(0, centres - 1);
    for (int64_t k = 0; k < keys; ++k) {
      const int64_t j = pick(gen);
      const float recency = 0.5f + 0.5f * float(k + 1) / float(keys);
      for (int64_t d = 0; d < latent; ++d)
        p.c_kv[size_t(k * latent + d)] =
            recency * (2.0f * c[size_t(j * latent + d)] + 0.5f * p.c_kv[size_t(k * latent + d)]);
    }
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < latent; ++d)
        p.q_lat[size_t(h * latent + d)] = 0.5f * p.q_lat[size_t(h * latent + d)] + c[size_t(d)];
  }
  if (kind == CacheKind::needle) {
    p.needle = std::clamp<int64_t>(int64_t(std::llround(needle_depth * double(keys - 1))), 0, keys - 1);
    // The needle's latent points along the heads' mean query, needle_norm times a haystack key's typical norm
    // (sqrt(latent)): every head's score of it stands out, by more the longer it is.
    std::vector<double> mean(size_t(latent), 0.0);
    double norm = 0;
    for (int64_t d = 0; d < latent; ++d) {
      for (int64_t h = 0; h < heads; ++h) mean[size_t(d)] += p.q_lat[size_t(h * latent + d)];
      norm += mean[size_t(d)] * mean[size_t(d)];
    }
    const double length = needle_norm * std::sqrt(double(latent)) / std::sqrt(norm);
    for (int64_t d = 0; d < latent; ++d) p.c_kv[size_t(p.needle * latent + d)] = float(mean[size_t(d)] * length);
  }
  return p;
}

std::vector<float> scores(const Problem& p) {
  std::vector<float> s(size_t(p.heads * p.keys));
  for (int64_t h = 0; h < p.heads; ++h)
    for (int64_t k = 0; k < p.keys; ++k) {
      double dot = 0;
      for (int64_t d = 0; d < p.latent; ++d)
        dot += double(p.q_lat[size_t(h * p.latent + d)]) * p.c_kv[size_t(k * p.latent + d)];
      for (int64_t d = 0; d < p.rope; ++d)
        dot += double(p.q_pe[size_t(h * p.rope + d)]) * p.k_pe[size_t(k * p.rope + d)];
      s[size_t(h * p.keys + k)] = float(dot) * p.scale;
    }
  return s;
}

namespace {

// softmax over each head's scores, in place.
void softmax_rows(std::vector<float>& s, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* x = &s[size_t(r * cols)];
    const float mx = *std::max_element(x, x + cols);
    double sum = 0;
    for (int64_t k = 0; k < cols; ++k) sum += (x[k] = std::exp(x[k] - mx));
    for (int64_t k = 0; k < cols; ++k) x[k] = float(x[k] / sum);
  }
}

// The always-kept keys (sinks, window), then the ranked candidates until the budget is spent; sorted indices.
std::vector<int64_t> assemble(int64_t keys, const Budget& b, const std::vector<int64_t>& ranked, int64_t unit) {
  std::vector<char> in(size_t(keys), 0);
  int64_t used = 0;
  auto take = [&](int64_t k) {
    if (k >= 0 && k < keys && !in[size_t(k)]) in[size_t(k)] = 1, ++used;
  };
  for (int64_t k = 0; k < std::min(b.n_init, keys); ++k) take(k);
  for (int64_t k = std::max<int64_t>(0, keys - b.local); k < keys; ++k) take(k);
  for (int64_t r : ranked) {  // a unit (token or block) at a time, while it fits
    int64_t adds = 0;
    for (int64_t k = r * unit; k < std::min(keys, (r + 1) * unit); ++k) adds += !in[size_t(k)];
    if (used + adds > b.tokens) {
      if (unit == 1) break;
      continue;
    }
    for (int64_t k = r * unit; k < std::min(keys, (r + 1) * unit); ++k) take(k);
  }
  std::vector<int64_t> out;
  for (int64_t k = 0; k < keys; ++k)
    if (in[size_t(k)]) out.push_back(k);
  return out;
}

std::vector<int64_t> rank_descending(const std::vector<double>& score) {
  std::vector<int64_t> order(score.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return score[size_t(a)] > score[size_t(b)]; });
  return order;
}

// Each block's best head's score of a per-block summary: score_of(h, first, end).
template <class ScoreOf>
std::vector<double> block_scores(const Problem& p, const Budget& b, ScoreOf score_of) {
  if (b.block < 1) throw std::invalid_argument("sparse: block must be positive");
  const int64_t blocks = (p.keys + b.block - 1) / b.block;
  std::vector<double> best(size_t(blocks), -INFINITY);
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int64_t h = 0; h < p.heads; ++h)
      best[size_t(blk)] =
          std::max(best[size_t(blk)], score_of(h, blk * b.block, std::min(p.keys, (blk + 1) * b.block)));
  return best;
}
}  // namespace

std::vector<double> oracle_key_mass(const Problem& p) {
  std::vector<float> prob = scores(p);
  softmax_rows(prob, p.heads, p.keys);
  std::vector<double> mass(size_t(p.keys), 0.0);
  for (int64_t h = 0; h < p.heads; ++h)
    for (int64_t k = 0; k < p.keys; ++k) mass[size_t(k)] += prob[size_t(h * p.keys + k)];
  return mass;
}

std::vector<int64_t> select_oracle(const Problem& p, const Budget& b) {
  return select_tokens(p.keys, b, oracle_key_mass(p));
}

void append_key(Problem& p, const float* latent, const float* rope) {
  p.c_kv.insert(p.c_kv.end(), latent, latent + p.latent);
  p.k_pe.insert(p.k_pe.end(), rope, rope + p.rope);
  ++p.keys;
}

void truncate_keys(Problem& p, int64_t keys) {
  if (keys < 1 || keys > p.keys) throw std::invalid_argument("sparse::truncate_keys: keys out of range");
  p.c_kv.resize(size_t(keys * p.latent));
  p.k_pe.resize(size_t(keys * p.rope));
  p.keys = keys;
  if (p.needle >= keys) p.needle = -1;
}

void SelectorState::truncate(const Problem& p) {
  if (p.keys > keys_ || p.keys < 1)
    throw std::logic_error("SelectorState::truncate: the problem is not a prefix of the state's");
  const int64_t last = (p.keys - 1) / block_;  // the last block, made again from its keys
  keys_ = last * block_;
  if (keeps(blocks)) min_.resize(size_t(last * width_)), max_.resize(min_.size()), sum_.resize(min_.size());
  if (keeps(index_keys)) index_keys_.resize(size_t(keys_ * ix_.dim));
  for (int64_t k = keys_; k < p.keys; ++k) append_row(&p.c_kv[size_t(k * latent_)], &p.k_pe[size_t(k * rope_)]);
}

std::vector<float> indexer_projection(const Indexer& ix, int64_t width) {
  std::mt19937_64 gen(ix.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(ix.dim)));
  std::vector<float> proj(size_t(width * ix.dim));
  for (float& v : proj)
    v = to_float(to_bf16(normal(gen)));  // (bf16 weights, as a model's: the GPU multiplies the same numbers)
  return proj;
}

SelectorState::SelectorState(const Problem& p, int64_t block, const Indexer& ix, Keep keep)
    : block_(block), latent_(p.latent), rope_(p.rope), width_(p.latent + p.rope), ix_(ix), keep_(keep) {
  if (block < 1) throw std::invalid_argument("sparse: block must be positive");
  const int64_t keys = p.keys;
  if (keeps(blocks)) {
    min_.reserve(size_t(((keys + block - 1) / block) * width_));
    max_.reserve(min_.capacity()), sum_.reserve(min_.capacity());
  }
  if (keeps(index_keys)) {
    proj_ = indexer_projection(ix, width_);
    index_keys_.reserve(size_t(keys * ix.dim));
  }
  for (int64_t k = 0; k < keys; ++k)
    append_row(&p.c_kv[size_t(k * latent_)], &p.k_pe[size_t(k * rope_)]);  // key by key
}

void SelectorState::project(const float* latent, const float* rope, float* out) const {
  for (int64_t j = 0; j < ix_.dim; ++j) out[j] = 0;
  for (int64_t d = 0; d < width_; ++d) {
    const float v = d < latent_ ? latent[d] : rope[d - latent_];
    const float* row = &proj_[size_t(d * ix_.dim)];
    for (int64_t j = 0; j < ix_.dim; ++j) out[j] += v * row[j];
  }
}

void SelectorState::append(const Problem& p) {
  const int64_t k = p.keys - 1;
  if (k != keys_) throw std::logic_error("SelectorState::append: the problem must have grown by exactly one key");
  append_row(&p.c_kv[size_t(k * latent_)], &p.k_pe[size_t(k * rope_)]);
}

void SelectorState::append_row(const float* latent, const float* rope) {
  const int64_t k = keys_++;
  if (keeps(blocks)) {
    auto value = [&](int64_t d) { return d < latent_ ? latent[d] : rope[d - latent_]; };
    if (k % block_ == 0) {  // a new block starts with this key
      for (int64_t d = 0; d < width_; ++d) min_.push_back(value(d)), max_.push_back(value(d)), sum_.push_back(value(d));
    } else {
      const size_t base = size_t((k / block_) * width_);
      for (int64_t d = 0; d < width_; ++d) {
        const float v = value(d);
        min_[base + size_t(d)] = std::min(min_[base + size_t(d)], v);
        max_[base + size_t(d)] = std::max(max_[base + size_t(d)], v);
        sum_[base + size_t(d)] += v;
      }
    }
  }
  if (keeps(index_keys)) {
    const size_t at = index_keys_.size();
    index_keys_.resize(at + size_t(ix_.dim));
    float* key = &index_keys_[at];
    project(latent, rope, key);
    if (ix_.fp8) round_e4m3_scaled(key, ix_.dim);  // the cache holds e4m3 values and one fp32 scale per token
  }
}

bool SelectorState::operator==(const SelectorState& o) const {
  return block_ == o.block_ && width_ == o.width_ && keys_ == o.keys_ && keep_ == o.keep_ && min_ == o.min_ &&
         max_ == o.max_ && sum_ == o.sum_ && index_keys_ == o.index_keys_;
}

namespace {

void check_state(const Problem& p, const Budget& b, const SelectorState& st, SelectorState::Keep needs) {
  if (st.keys() != p.keys || st.block() != b.block || st.width() != p.latent + p.rope || !st.keeps(needs))
    throw std::logic_error("sparse: the selector state does not describe this cache");
}

}  // namespace

std::vector<double> quest_block_scores(const Problem& p, const Budget& b, const SelectorState& st) {
  check_state(p, b, st, SelectorState::blocks);
  return block_scores(p, b, [&](int64_t h, int64_t first, int64_t) {
    const float *lo = st.block_min(first / b.block), *hi = st.block_max(first / b.block);
    double bound = 0;
    for (int64_t d = 0; d < p.latent; ++d) {
      const double qd = p.q_lat[size_t(h * p.latent + d)];
      bound += std::max(qd * lo[d], qd * hi[d]);
    }
    for (int64_t d = 0; d < p.rope; ++d) {
      const double qd = p.q_pe[size_t(h * p.rope + d)];
      bound += std::max(qd * lo[p.latent + d], qd * hi[p.latent + d]);
    }
    return bound;
  });
}

std::vector<int64_t> select_quest(const Problem& p, const Budget& b, const SelectorState& st) {
  return assemble(p.keys, b, rank_descending(quest_block_scores(p, b, st)), b.block);
}

std::vector<int64_t> select_quest(const Problem& p, const Budget& b) {
  return select_quest(p, b, SelectorState(p, b.block, Indexer{}, SelectorState::blocks));
}

namespace {
// The pages select_pages always keeps: those holding the first n_init keys (sinks) and the last `local` (window).
std::vector<char> kept_pages(int64_t keys, int64_t page_size, const Budget& b) {
  const int64_t pages = (keys + page_size - 1) / page_size;
  std::vector<char> kept(size_t(pages), 0);
  for (int64_t k = 0; k < std::min(b.n_init, keys); k += page_size) kept[size_t(k / page_size)] = 1;
  for (int64_t pg = std::max<int64_t>(0, keys - b.local) / page_size; pg < pages; ++pg) kept[size_t(pg)] = 1;
  return kept;
}
}  // namespace

PageSelection select_pages(int64_t keys, int64_t page_size, const Budget& b, const std::vector<double>& page_score) {
  if (keys < 1 || page_size < 1)
    throw std::invalid_argument("sparse::select_pages: keys and page_size must be positive");
  const int64_t pages = (keys + page_size - 1) / page_size;
  if (int64_t(page_score.size()) != pages)
    throw std::invalid_argument("sparse::select_pages: one score per page expected");
  std::vector<char> in = kept_pages(keys, page_size, b);
  int64_t used = std::count(in.begin(), in.end(), 1);
  auto take = [&](int64_t pg) {
    if (!in[size_t(pg)]) in[size_t(pg)] = 1, ++used;
  };
  const int64_t budget = std::max<int64_t>(1, b.tokens / page_size);
  for (int64_t pg : rank_descending(page_score)) {
    if (used >= budget) break;
    take(pg);
  }
  PageSelection s;
  for (int64_t pg = 0; pg < pages; ++pg)
    if (in[size_t(pg)]) s.pages.push_back(pg);
  s.length =
      (int64_t(s.pages.size()) - 1) * page_size + (keys - (pages - 1) * page_size);  // (the last page is always kept)
  return s;
}

int64_t paged_sparse_length(int64_t keys, int64_t page_size, const Budget& b) {
  // (select_pages keeps max(budget, sinks' and window's pages) pages, at most all; the last one is the cache's last)
  const int64_t pages = (keys + page_size - 1) / page_size;
  const std::vector<char> kept = kept_pages(keys, page_size, b);
  const int64_t fixed = std::count(kept.begin(), kept.end(), 1);
  const int64_t count = std::min(pages, std::max(fixed, std::max<int64_t>(1, b.tokens / page_size)));
  return (count - 1) * page_size + (keys - (pages - 1) * page_size);
}

std::vector<int64_t> keys_of(const PageSelection& s, int64_t keys, int64_t page_size) {
  std::vector<int64_t> out;
  for (int64_t pg : s.pages)
    for (int64_t k = pg * page_size; k < std::min(keys, (pg + 1) * page_size); ++k) out.push_back(k);
  return out;
}

std::vector<double> infllm_block_scores(const Problem& p, const Budget& b, const SelectorState& st) {
  check_state(p, b, st, SelectorState::blocks);
  return block_scores(p, b, [&](int64_t h, int64_t first, int64_t end) {
    const float* sum = st.block_sum(first / b.block);
    double dot = 0;
    for (int64_t d = 0; d < p.latent; ++d) dot += double(p.q_lat[size_t(h * p.latent + d)]) * sum[d];
    for (int64_t d = 0; d < p.rope; ++d) dot += double(p.q_pe[size_t(h * p.rope + d)]) * sum[p.latent + d];
    return dot / double(end - first);  // the mean key's score
  });
}

std::vector<int64_t> select_infllm(const Problem& p, const Budget& b, const SelectorState& st) {
  return assemble(p.keys, b, rank_descending(infllm_block_scores(p, b, st)), b.block);
}

std::vector<int64_t> select_infllm(const Problem& p, const Budget& b) {
  return select_infllm(p, b, SelectorState(p, b.block, Indexer{}, SelectorState::blocks));
}

float round_e4m3(float x) {
  const float a = std::fabs(x);
  if (a == 0 || std::isnan(x)) return x;
  if (a >= 448.0f) return std::copysign(448.0f, x);
  int e = 0;
  std::frexp(a, &e);                                         // a = m 2^e, m in [0.5, 1)
  const float step = std::ldexp(1.0f, std::max(e, -5) - 4);  // 3 mantissa bits; subnormal spacing 2^-9 below 2^-6
  return std::copysign(std::min(448.0f, std::nearbyint(a / step) * step), x);
}

float round_e4m3_scaled(float* v, int64_t n) {
  float amax = 0;
  for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(v[j]));
  const float scale = amax > 0 ? amax / 448.0f : 1.0f;
  for (int64_t j = 0; j < n; ++j) v[j] = round_e4m3(v[j] / scale) * scale;
  return scale;
}

std::vector<double> dsa_token_scores(const Problem& p, const SelectorState& st) {
  if (st.keys() != p.keys || st.width() != p.latent + p.rope || !st.keeps(SelectorState::index_keys))
    throw std::logic_error("sparse: the selector state does not describe this cache");
  const Indexer& ix = st.indexer();
  std::vector<float> q(size_t(ix.heads * ix.dim));
  for (int64_t j = 0; j < ix.heads; ++j) {
    const int64_t h = j % p.heads;
    st.project(&p.q_lat[size_t(h * p.latent)], &p.q_pe[size_t(h * p.rope)], &q[size_t(j * ix.dim)]);
    if (ix.fp8) round_e4m3_scaled(&q[size_t(j * ix.dim)], ix.dim);  // e4m3 queries, one scale per head, as the keys
  }
  std::vector<double> score(size_t(p.keys), 0.0);
  for (int64_t k = 0; k < p.keys; ++k) {
    const float* key = st.index_key(k);
    for (int64_t j = 0; j < ix.heads; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < ix.dim; ++d) dot += double(q[size_t(j * ix.dim + d)]) * key[d];
      score[size_t(k)] += std::max(0.0, dot) / double(ix.heads);
    }
  }
  return score;
}

std::vector<int64_t> select_tokens(int64_t keys, const Budget& b, const std::vector<double>& score) {
  if (int64_t(score.size()) != keys) throw std::invalid_argument("sparse::select_tokens: one score per key expected");
  return assemble(keys, b, rank_descending(score), 1);
}

int64_t token_sparse_length(int64_t keys, const Budget& b) {
  const int64_t sinks = std::min(b.n_init, keys), window_first = std::max<int64_t>(0, keys - b.local);
  return std::max(std::min(sinks, window_first) + (keys - window_first), std::min(b.tokens, keys));
}

std::vector<int64_t> select_dsa(const Problem& p, const Budget& b, const SelectorState& st) {
  return select_tokens(p.keys, b, dsa_token_scores(p, st));
}

std::vector<int64_t> select_dsa(const Problem& p, const Budget& b, const Indexer& ix) {
  return select_dsa(p, b, SelectorState(p, b.block, ix, SelectorState::index_keys));
}

std::vector<double> attention(const Problem& p, const std::vector<int64_t>& selected) {
  std::vector<double> out(size_t(p.heads * p.latent), 0.0), s(selected.size());
  for (int64_t h = 0; h < p.heads; ++h) {
    double mx = -INFINITY, sum = 0;
    for (size_t i = 0; i < selected.size(); ++i) {
      const int64_t k = selected[i];
      if (k < 0 || k >= p.keys) throw std::invalid_argument("sparse: key index out of range");
      double dot = 0;
      for (int64_t d = 0; d < p.latent; ++d)
        dot += double(p.q_lat[size_t(h * p.latent + d)]) * p.c_kv[size_t(k * p.latent + d)];
      for (int64_t d = 0; d < p.rope; ++d)
        dot += double(p.q_pe[size_t(h * p.rope + d)]) * p.k_pe[size_t(k * p.rope + d)];
      mx = std::max(mx, s[i] = dot * p.scale);
    }
    for (double& v : s) sum += (v = std::exp(v - mx));
    double* o = &out[size_t(h * p.latent)];
    for (size_t i = 0; i < selected.size(); ++i)
      for (int64_t d = 0; d < p.latent; ++d) o[d] += s[i] / sum * p.c_kv[size_t(selected[i] * p.latent + d)];
  }
  return out;
}

Fidelity fidelity(const Problem& p, const std::vector<int64_t>& selected) {
  std::vector<int64_t> all(static_cast<size_t>(p.keys));
  std::iota(all.begin(), all.end(), int64_t(0));
  const std::vector<double> dense = attention(p, all), sparse = attention(p, selected);
  std::vector<char> in(size_t(p.keys), 0);
  for (int64_t k : selected) in[size_t(k)] = 1;
  Fidelity f;
  const std::vector<float> s = scores(p);
  for (int64_t h = 0; h < p.heads; ++h) {  // the softmax mass inside, in double
    const float* x = &s[size_t(h * p.keys)];
    const float mx = *std::max_element(x, x + p.keys);
    double total = 0, inside = 0;
    for (int64_t k = 0; k < p.keys; ++k) {
      const double e = std::exp(double(x[k] - mx));
      total += e;
      inside += in[size_t(k)] ? e : 0.0;
    }
    f.mass_recall += inside / total / double(p.heads);
  }
  double err = 0, norm = 0;
  for (size_t i = 0; i < dense.size(); ++i)
    err += (dense[i] - sparse[i]) * (dense[i] - sparse[i]), norm += dense[i] * dense[i];
  f.rel_err = std::sqrt(err / norm);
  f.needle_found = p.needle >= 0 && in[size_t(p.needle)];
  return f;
}

}  // namespace dslab::sparse
