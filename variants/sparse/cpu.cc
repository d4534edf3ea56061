// sparse/{oracle,quest,infllm,dsa}/cpu: one decode step of MLA attention (its MQA form over the latent cache) on
// the keys a selector chooses, for `batch` requests (each its own cache, selector state and selection; requests in
// parallel). run() = per request, the step's new key appended to the cache and to the selector's state (block
// min/max/sum, the FP8 index key: incremental, not rebuilt), the selection, and attention over the selected keys;
// the caches grow one key per run() (rewound to kv_len every kRewind steps). verify() = that attention against fp64
// over the same keys (the worst request); counters = the selections' fidelity against dense attention (mass_recall,
// rel_err_vs_dense, needle_recall: means over the requests) and the append's, selection's and attention's own times.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "harness/errors.h"
#include "harness/variant.h"
#include "variants/common/model_config.h"
#include "variants/sparse/sparse.h"

namespace dslab::sparse {
namespace {

enum class Selector { oracle, quest, infllm, dsa };

CacheKind parse_cache_kind(const std::string& text) {
  if (text == "random") return CacheKind::random;
  if (text == "clustered") return CacheKind::clustered;
  if (text == "needle") return CacheKind::needle;
  throw BadInput("axis cache_kind: '" + text + "': expected random, clustered or needle");
}

// Decode steps between rewinds of the cache to kv_len: its length moves at most this much while it is timed.
constexpr int64_t kRewind = 1024;

int64_t batch_of(const Point& p) { return p.has("batch") ? p.integer("batch") : 1; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class SparseCpu : public Variant {
 public:
  explicit SparseCpu(Selector s) : selector_(s) {}
  std::vector<std::pair<std::string, std::string>> axes() const override {
    return {{"batch", "1"},  {"kv_len", "32768"},         {"heads", ""},          {"budget", "2048"},
            {"block", "64"}, {"cache_kind", "clustered"}, {"needle_depth", "50"}, {"needle_norm", "1"}};
  }
  Support supports(const ModelFile& model, const Point& point) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    parse_cache_kind(point.text("cache_kind"));
    if (point.integer("needle_depth") > 100) throw BadInput("axis needle_depth: expected a percentage 0..100");
    if (point.integer("needle_norm") < 1)
      throw BadInput("axis needle_norm: expected the needle's length in typical key lengths, 1 or more");
    if (point.integer("kv_len") < 1) return Support::no("an empty cache selects nothing");
    if (double(batch_of(point)) * double(point.integer("kv_len")) * double(m.kv_lora_rank + m.qk_rope_head_dim) * 4 >
        8e9)
      return Support::no("caches above 8 GB");
    return {};
  }
  Cost cost(const ModelFile& model, const Point& point) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const double H = double(point.has("heads") ? point.integer("heads") : m.num_attention_heads),
                 N = double(point.integer("kv_len"));
    const double width = double(m.kv_lora_rank + m.qk_rope_head_dim), B = std::min(N, double(point.integer("budget")));
    const double blocks = std::ceil(N / double(point.integer("block")));
    Cost c;
    // The attention over the selected keys (scores and the weighted sum), then what the selector reads and computes:
    // its state kept incrementally (one key's update per step: a block's min/max/sum, one FP8 index key), so a step
    // reads the block summaries or the index keys, not the cache.
    c.flops = 2 * H * B * (width + double(m.kv_lora_rank));
    c.bytes = B * width * 4;
    switch (selector_) {
      case Selector::oracle:
        c.flops += 2 * H * N * width, c.bytes += N * width * 4;
        break;  // every key's true score
      case Selector::quest:
        c.flops += 2 * H * blocks * width * 2, c.bytes += blocks * width * 2 * 4;
        break;
      case Selector::infllm:
        c.flops += 2 * H * blocks * width, c.bytes += blocks * width * 4;
        break;
      case Selector::dsa: {
        const Indexer ix;  // index keys: e4m3 plus a scale per token; the queries' and the new key's projections
        c.flops += 2 * double(ix.heads) * N * double(ix.dim) + 2 * (double(ix.heads) + 1) * width * double(ix.dim);
        c.bytes += N * (double(ix.dim) + 4);
        break;
      }
    }
    const double requests = double(batch_of(point));
    c.flops *= requests, c.bytes *= requests;
    return c;
  }
  std::string compute_ceiling() const override { return "cpu.avx512_bf16_flops"; }
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const int64_t heads = point.has("heads") ? point.integer("heads") : m.num_attention_heads;
    b_.tokens = point.integer("budget");
    b_.block = point.integer("block");
    requests_.clear();
    requests_.resize(size_t(batch_of(point)));
    for (size_t r = 0; r < requests_.size(); ++r) {
      Request& q = requests_[r];
      const uint64_t own = request_seed(seed, int64_t(r));
      q.p = make_problem(heads, m.kv_lora_rank, m.qk_rope_head_dim, point.integer("kv_len"),
                         parse_cache_kind(point.text("cache_kind")), double(point.integer("needle_depth")) / 100.0, own,
                         double(point.integer("needle_norm")));
      // The keys decode appends: fresh random latents and rope keys (the cache kind shapes the prefix only).
      q.new_keys = make_problem(1, m.kv_lora_rank, m.qk_rope_head_dim, kRewind, CacheKind::random, 0,
                                own ^ 0x9e3779b97f4a7c15ull);
      if (selector_ != Selector::oracle)
        q.state = std::make_unique<SelectorState>(
            q.p, b_.block, Indexer{}, selector_ == Selector::dsa ? SelectorState::index_keys : SelectorState::blocks);
      q.out.assign(size_t(q.p.heads * q.p.latent), std::nanf(""));
    }
    kv_len_ = requests_.front().p.keys;
  }
  void run() override {
    // Requests in parallel; one request keeps every core for its own selection's loops.
#pragma omp parallel for schedule(dynamic) if (requests_.size() > 1)
    for (size_t r = 0; r < requests_.size(); ++r) {
      Request& q = requests_[r];
      append(q);
      q.selected = select(q);
      attend(q, q.selected, q.out);
    }
  }
  Verification verify() override {  // against fp64 attention over the same keys; the worst request
    double worst = 0;
    for (const Request& q : requests_) {
      const std::vector<double> want = attention(q.p, q.selected);
      double err = 0, norm = 0;
      for (size_t i = 0; i < want.size(); ++i)
        err += (q.out[i] - want[i]) * (q.out[i] - want[i]), norm += want[i] * want[i];
      const double e = std::sqrt(err / norm);
      worst = std::isnan(e) || std::isnan(worst) ? std::nan("") : std::max(worst, e);
    }
    return {worst, 1e-5};
  }
  std::map<std::string, double> counters() override {
    const double n = double(requests_.size());
    double mass = 0, err = 0, found = 0, selected = 0, append_s = 0, select_s = 0, attend_s = 0;
    for (Request& q : requests_) {
      const Fidelity f = fidelity(q.p, q.selected);
      mass += f.mass_recall / n, err += f.rel_err / n, found += (f.needle_found ? 1.0 : 0.0) / n;
      selected = std::max(selected, double(q.selected.size()));
      std::vector<float> scratch(q.out.size());
      const auto t0 = std::chrono::steady_clock::now();
      append(q);  // one more decode step, its parts timed apart (request by request: the batch's sum)
      append_s += seconds_since(t0);
      const auto t1 = std::chrono::steady_clock::now();
      const auto sel = select(q);
      select_s += seconds_since(t1);
      const auto t2 = std::chrono::steady_clock::now();
      attend(q, sel, scratch);
      attend_s += seconds_since(t2);
    }
    std::map<std::string, double> c = {{"mass_recall", mass},  {"rel_err_vs_dense", err}, {"selected_tokens", selected},
                                       {"append_s", append_s}, {"select_s", select_s},    {"attend_s", attend_s}};
    if (requests_.front().p.needle >= 0) c["needle_recall"] = found;
    return c;
  }

 private:
  // The decode step's new key into the cache and the selector's state; every kRewind steps the cache is rewound to
  // kv_len first (a truncation and one block's summary made again: no allocation once the vectors have grown).
  struct Request {
    Problem p, new_keys;
    int64_t next = 0;  // the next of new_keys to append
    std::unique_ptr<SelectorState> state;
    std::vector<int64_t> selected;
    std::vector<float> out;
  };
  void append(Request& q) const {
    if (q.next == kRewind) {
      truncate_keys(q.p, kv_len_);
      if (q.state) q.state->truncate(q.p);
      q.next = 0;
    }
    append_key(q.p, &q.new_keys.c_kv[size_t(q.next * q.p.latent)], &q.new_keys.k_pe[size_t(q.next * q.p.rope)]);
    ++q.next;
    if (q.state) q.state->append(q.p);
  }
  std::vector<int64_t> select(const Request& q) const {
    switch (selector_) {
      case Selector::oracle:
        return select_oracle(q.p, b_);
      case Selector::quest:
        return select_quest(q.p, b_, *q.state);
      case Selector::infllm:
        return select_infllm(q.p, b_, *q.state);
      case Selector::dsa:
        return select_dsa(q.p, b_, *q.state);
    }
    return {};
  }
  // out[h] = softmax(scores over the selected keys) · their latents, fp32.
  void attend(const Request& q, const std::vector<int64_t>& sel, std::vector<float>& out) const {
    const Problem& p = q.p;
    std::vector<float> s(sel.size());
    for (int64_t h = 0; h < p.heads; ++h) {
      float mx = -INFINITY;
      for (size_t i = 0; i < sel.size(); ++i) {
        float dot = 0;
        for (int64_t d = 0; d < p.latent; ++d)
          dot += p.q_lat[size_t(h * p.latent + d)] * p.c_kv[size_t(sel[i] * p.latent + d)];
        for (int64_t d = 0; d < p.rope; ++d)
          dot += p.q_pe[size_t(h * p.rope + d)] * p.k_pe[size_t(sel[i] * p.rope + d)];
        mx = std::max(mx, s[i] = dot * p.scale);
      }
      float sum = 0;
      for (float& v : s) sum += (v = std::exp(v - mx));
      float* o = &out[size_t(h * p.latent)];
      std::fill(o, o + p.latent, 0.0f);
      for (size_t i = 0; i < sel.size(); ++i) {
        const float w = s[i] / sum;
        const float* c = &p.c_kv[size_t(sel[i] * p.latent)];
        for (int64_t d = 0; d < p.latent; ++d) o[d] += w * c[d];
      }
    }
  }

  Selector selector_;
  std::vector<Request> requests_;
  int64_t kv_len_ = 0;
  Budget b_;
};

struct SparseOracleCpu : SparseCpu {
  SparseOracleCpu() : SparseCpu(Selector::oracle) {}
};
struct SparseQuestCpu : SparseCpu {
  SparseQuestCpu() : SparseCpu(Selector::quest) {}
};
struct SparseInfllmCpu : SparseCpu {
  SparseInfllmCpu() : SparseCpu(Selector::infllm) {}
};
struct SparseDsaCpu : SparseCpu {
  SparseDsaCpu() : SparseCpu(Selector::dsa) {}
};

}  // namespace
}  // namespace dslab::sparse

using dslab::sparse::SparseDsaCpu;
using dslab::sparse::SparseInfllmCpu;
using dslab::sparse::SparseOracleCpu;
using dslab::sparse::SparseQuestCpu;
DSLAB_REGISTER_VARIANT(
    SparseOracleCpu, "sparse/oracle/cpu", dslab::Device::cpu,
    "sparse MLA decode on the exact top keys by true attention mass (the fidelity bound for a budget)");
DSLAB_REGISTER_VARIANT(SparseQuestCpu, "sparse/quest/cpu", dslab::Device::cpu,
                       "sparse MLA decode on Quest's blocks (per-block min/max upper bound of q.k, best head)");
DSLAB_REGISTER_VARIANT(SparseInfllmCpu, "sparse/infllm/cpu", dslab::Device::cpu,
                       "sparse MLA decode on InfLLM's blocks (a mean representative key per block, best head)");
DSLAB_REGISTER_VARIANT(
    SparseDsaCpu, "sparse/dsa/cpu", dslab::Device::cpu,
    "sparse MLA decode on DeepSeek-V3.2's lightning-indexer top tokens (64 index heads x 128, FP8 index keys)");
