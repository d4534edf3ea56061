// Sparse-attention retrieval over the MLA latent cache, the CPU reference: one request's decode query in
// MLA's MQA form (the absorbed query q_lat = q_nope · W_UK and q_pe, per head) against its cached latents c_kv and
// rope keys k_pe, the selectors that choose which keys to attend, and the fidelity of a selection against dense
// attention. One selection per request serves every head (the heads share the latent); how each selector combines
// the heads is said at its declaration. Every selection keeps the first n_init keys (attention sinks) and the
// last `local` keys (the recent window).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dslab::sparse {

struct Problem {
  int64_t heads = 0, latent = 0, rope = 0, keys = 0;
  std::vector<float> q_lat, q_pe;  // [heads][latent], [heads][rope]
  std::vector<float> c_kv, k_pe;   // [keys][latent], [keys][rope]
  float scale = 1;                 // softmax scale
  int64_t needle = -1;             // a planted key aligned with every head's query (needle caches), else -1
};

// random: unit-variance values (the scores spread little: random weights say nothing of trained attention);
// clustered: keys drawn around a few centres, the query close to one of them, with a recency bias (what a trained
// model's attention looks like, roughly: a few regions matter); needle: random, with one key at `needle_depth`
// (0 = oldest, 1 = newest) along the heads' mean query, needle_norm times a random key's typical norm (1: a key of the
// haystack's length whose score stands several deviations above theirs; longer needles stand out of block summaries
// too).
enum class CacheKind { random, clustered, needle };
Problem make_problem(int64_t heads, int64_t latent, int64_t rope, int64_t keys, CacheKind kind, double needle_depth,
                     uint64_t seed, double needle_norm = 1.0);
// The seed of request r of a batch: request 0 keeps the run's seed (batch 1 is the single-request problem), the
// others get streams of their own.
uint64_t request_seed(uint64_t seed, int64_t request);

// scores[h][k] = scale * (q_lat[h] · c_kv[k] + q_pe[h] · k_pe[k])
std::vector<float> scores(const Problem& p);

struct Budget {
  int64_t tokens = 2048;  // keys attended, sinks and window included
  int64_t block = 64;     // block selectors choose whole blocks of this many keys
  int64_t n_init = 4, local = 64;
};

// DeepSeek-V3.2's lightning indexer (DSA): `heads` index heads of `dim` dims, an FP8 (e4m3, one scale per token)
// index-key cache, score_k = sum_j w_j ReLU(q_j · k_k), the top tokens. Its projections are a trained model's; here
// they are one random projection of MLA's own [latent ‖ rope] query and key to `dim` dims (index head j takes MLA
// head j mod heads's query, w_j = 1 / heads): an indexer that approximates the attention it serves, which random
// trained-free weights could not (a random indexer selects at random).
struct Indexer {
  int64_t heads = 64, dim = 128;
  bool fp8 = true;  // the index keys (a scale per token) and queries (a scale per head) rounded to e4m3
  uint64_t seed = 1;
};

// What the selectors keep beside the cache, grown one key at a time as decode appends keys (append() is what a
// decode step pays for it, not a rebuild): per block of `block` keys the element-wise min and max (Quest) and sum
// (InfLLM's mean) over [latent ‖ rope], and per token the indexer's FP8 key (DSA). Built from scratch by appending
// every key, so the incremental and the full state are one code path and equal. A selector keeps only what it
// reads (`keep`): a decode step of Quest or InfLLM does not project its key for an indexer, nor DSA's summarise blocks.
class SelectorState {
 public:
  enum Keep { blocks = 1, index_keys = 2, all = blocks | index_keys };
  SelectorState(const Problem& p, int64_t block, const Indexer& ix, Keep keep = all);
  void append(const Problem& p);  // the key p.keys - 1 (p has grown by one since the last call)
  // Back to p's (shorter) cache: whole blocks and index keys dropped, the last block's summary made again from its
  // keys (what a serving engine does when it evicts a finished request's tail; here, a benchmark's rewind).
  void truncate(const Problem& p);
  int64_t keys() const { return keys_; }
  bool keeps(Keep k) const { return (keep_ & k) == k; }
  int64_t block() const { return block_; }
  int64_t width() const { return width_; }
  const float* block_min(int64_t b) const { return &min_[size_t(b * width_)]; }
  const float* block_max(int64_t b) const { return &max_[size_t(b * width_)]; }
  const float* block_sum(int64_t b) const { return &sum_[size_t(b * width_)]; }
  const float* index_key(int64_t k) const { return &index_keys_[size_t(k * ix_.dim)]; }
  const Indexer& indexer() const { return ix_; }
  // The indexer's projection of a [latent ‖ rope] vector to ix.dim dims.
  void project(const float* latent, const float* rope, float* out) const;
  bool operator==(const SelectorState& o) const;

 private:
  void append_row(const float* latent, const float* rope);
  int64_t block_, latent_, rope_, width_, keys_ = 0;
  Indexer ix_;
  Keep keep_;
  std::vector<float> proj_;             // [width][dim]
  std::vector<float> min_, max_, sum_;  // [blocks][width]
  std::vector<float> index_keys_;       // [keys][dim], e4m3 values times the token's scale
};

// Appends one key (a latent row and a rope row) to the problem's cache; truncate_keys drops keys from its end.
void append_key(Problem& p, const float* latent, const float* rope);
void truncate_keys(Problem& p, int64_t keys);

// The exact top keys by the true scores: each key's softmax probability summed over the heads (the fidelity bound
// for a token budget).
std::vector<int64_t> select_oracle(const Problem& p, const Budget& b);
// Each key's softmax probability summed over the heads: what select_oracle ranks.
std::vector<double> oracle_key_mass(const Problem& p);
// Quest: per block the element-wise min and max of its keys; a block's score for a head is the upper bound
// sum_j max(q_j min_j, q_j max_j) of any of its keys' scores; blocks ranked by their best head.
std::vector<int64_t> select_quest(const Problem& p, const Budget& b);
std::vector<int64_t> select_quest(const Problem& p, const Budget& b, const SelectorState& st);
// Quest's score of every block (its best head's upper bound): what select_quest ranks, and what a GPU selection
// kernel must reproduce.
std::vector<double> quest_block_scores(const Problem& p, const Budget& b, const SelectorState& st);

// Block-level sparse decode on a paged cache (the GPU's: a block is a page). Whole pages: always the pages holding the
// first n_init keys and the last `local` keys, then the best-scored others while the budget lasts (tokens /
// page_size pages, at least the kept ones). The layout the decode kernel walks: the pages ascending, so the cache's
// last page (the only partial one) is last, and its length is (pages - 1) * page_size + the last page's keys.
struct PageSelection {
  std::vector<int64_t> pages;  // the request's logical pages, ascending
  int64_t length = 0;          // keys the decode kernel attends through them
};
PageSelection select_pages(int64_t keys, int64_t page_size, const Budget& b, const std::vector<double>& page_score);
// The length select_pages gives for any scores (the budget fixes it): what the host's split-KV schedule is made from
// before the GPU has chosen the pages.
int64_t paged_sparse_length(int64_t keys, int64_t page_size, const Budget& b);
// The key indices of a page selection (for the reference: ref::mla_attention's key selection).
std::vector<int64_t> keys_of(const PageSelection& s, int64_t keys, int64_t page_size);

// InfLLM: per block one representative key, the plain mean of its keys; blocks ranked by the best head's score of it.
std::vector<int64_t> select_infllm(const Problem& p, const Budget& b);
std::vector<int64_t> select_infllm(const Problem& p, const Budget& b, const SelectorState& st);
// InfLLM's score of every block (its best head's score of the mean key), as quest_block_scores.
std::vector<double> infllm_block_scores(const Problem& p, const Budget& b, const SelectorState& st);

// DSA: the top tokens by the lightning indexer's score (Indexer above).
std::vector<int64_t> select_dsa(const Problem& p, const Budget& b, const Indexer& ix);
std::vector<int64_t> select_dsa(const Problem& p, const Budget& b, const SelectorState& st);
// The indexer's score of every key (what select_dsa ranks, and what a GPU indexer must reproduce).
std::vector<double> dsa_token_scores(const Problem& p, const SelectorState& st);
// A token-level selection from any scores: the sinks and the window, then the best-scored others (ties to the lower
// index) while the budget lasts; ascending.
std::vector<int64_t> select_tokens(int64_t keys, const Budget& b, const std::vector<double>& score);
// The keys select_tokens keeps for any scores (the budget fixes it): max(the sinks and window, min(budget, keys)).
int64_t token_sparse_length(int64_t keys, const Budget& b);
// The indexer's projection [width][dim] (bf16 values): the same numbers for the CPU state and the GPU's indexer.
std::vector<float> indexer_projection(const Indexer& ix, int64_t width);
// e4m3 rounding (to nearest, saturating at 448; subnormals below 2^-6): the value an FP8 cache holds.
float round_e4m3(float x);
// A vector as FP8 with one scale (amax / 448; 1 for all zeros): each value becomes its e4m3 value times the scale,
// which is returned.
float round_e4m3_scaled(float* v, int64_t n);

// fp64 attention over the keys `selected` (all keys: dense attention): out[h] = softmax(scores of h over them) ·
// their latents, [heads][latent].
std::vector<double> attention(const Problem& p, const std::vector<int64_t>& selected);

struct Fidelity {
  double mass_recall = 0;     // softmax mass inside the selection, mean over heads
  double rel_err = 0;         // relative L2 error of the attention output (all heads) against dense
  bool needle_found = false;  // the planted key is in the selection (needle caches)
};
Fidelity fidelity(const Problem& p, const std::vector<int64_t>& selected);

}  // namespace dslab::sparse
