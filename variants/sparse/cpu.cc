// sparse/{oracle,quest,infllm,dsa}/cpu: one decode step of MLA attention (its MQA form over the latent cache) on
// the keys a selector chooses. run() = the step's new key appended to the cache and to the selector's state
// (block min/max/sum, the FP8 index key: incremental, not rebuilt), the selection, and attention over the selected
// keys; the cache grows one key per run() (rewound to kv_len every kRewind steps). verify() = that attention
// against fp64 over the same keys; counters = the selection's fidelity against dense attention (mass_recall,
// rel_err_vs_dense, needle_recall) and the append's, selection's and attention's own times.
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

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class SparseCpu : public Variant {
 public:
  explicit SparseCpu(Selector s) : selector_(s) {}
  std::vector<std::pair<std::string, std::string>> axes() const override {
    return {{"kv_len", "32768"}, {"heads", ""}, {"budget", "2048"}, {"block", "64"}, {"cache_kind", "clustered"}, {"needle_depth", "50"}};
  }
  Support supports(const ModelFile& model, const Point& point) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    parse_cache_kind(point.text("cache_kind"));
    if (point.integer("needle_depth") > 100) throw BadInput("axis needle_depth: expected a percentage 0..100");
    if (point.integer("kv_len") < 1) return Support::no("an empty cache selects nothing");
    if (double(point.integer("kv_len")) * double(m.kv_lora_rank + m.qk_rope_head_dim) * 4 > 8e9) return Support::no("cache above 8 GB");
    return {};
  }
  Cost cost(const ModelFile& model, const Point& point) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const double H = double(point.has("heads") ? point.integer("heads") : m.num_attention_heads), N = double(point.integer("kv_len"));
    const double width = double(m.kv_lora_rank + m.qk_rope_head_dim), B = std::min(N, double(point.integer("budget")));
    const double blocks = std::ceil(N / double(point.integer("block")));
    Cost c;
    // The attention over the selected keys (scores and the weighted sum), then what the selector reads and computes:
    // its state kept incrementally (one key's update per step: a block's min/max/sum, one FP8 index key), so a step
    // reads the block summaries or the index keys, not the cache.
    c.flops = 2 * H * B * (width + double(m.kv_lora_rank));
    c.bytes = B * width * 4;
    switch (selector_) {
      case Selector::oracle: c.flops += 2 * H * N * width, c.bytes += N * width * 4; break;  // every key's true score
      case Selector::quest: c.flops += 2 * H * blocks * width * 2, c.bytes += blocks * width * 2 * 4; break;
      case Selector::infllm: c.flops += 2 * H * blocks * width, c.bytes += blocks * width * 4; break;
      case Selector::dsa: {
        const Indexer ix;  // index keys: e4m3 plus a scale per token; the queries' and the new key's projections
        c.flops += 2 * double(ix.heads) * N * double(ix.dim) + 2 * (double(ix.heads) + 1) * width * double(ix.dim);
        c.bytes += N * (double(ix.dim) + 4);
        break;
      }
    }
    return c;
  }
  std::string compute_ceiling() const override { return "cpu.avx512_bf16_flops"; }
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const int64_t heads = point.has("heads") ? point.integer("heads") : m.num_attention_heads;
    p_ = make_problem(heads, m.kv_lora_rank, m.qk_rope_head_dim, point.integer("kv_len"), parse_cache_kind(point.text("cache_kind")),
                      double(point.integer("needle_depth")) / 100.0, seed);
    b_.tokens = point.integer("budget");
    b_.block = point.integer("block");
    kv_len_ = p_.keys;
    // The keys decode appends: fresh random latents and rope keys (the cache kind shapes the prefix only).
    new_keys_ = make_problem(1, m.kv_lora_rank, m.qk_rope_head_dim, kRewind, CacheKind::random, 0, seed ^ 0x9e3779b97f4a7c15ull);
    next_ = 0;
    if (selector_ != Selector::oracle)
      state_ = std::make_unique<SelectorState>(p_, b_.block, Indexer{}, selector_ == Selector::dsa ? SelectorState::index_keys : SelectorState::blocks);
    out_.assign(size_t(p_.heads * p_.latent), std::nanf(""));
  }
  void run() override {
    append();
    selected_ = select();
    attend(selected_, out_);
  }
  Verification verify() override {  // against fp64 attention over the same keys
    const std::vector<double> want = attention(p_, selected_);
    double err = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) err += (out_[i] - want[i]) * (out_[i] - want[i]), norm += want[i] * want[i];
    return {std::sqrt(err / norm), 1e-5};
  }
  std::map<std::string, double> counters() override {
    const Fidelity f = fidelity(p_, selected_);
    std::vector<float> scratch(out_.size());
    const auto t0 = std::chrono::steady_clock::now();
    append();  // one more decode step, its parts timed apart
    const double append_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    const auto sel = select();
    const double select_s = seconds_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    attend(sel, scratch);
    const double attend_s = seconds_since(t2);
    std::map<std::string, double> c = {{"mass_recall", f.mass_recall},
                                       {"rel_err_vs_dense", f.rel_err},
                                       {"selected_tokens", double(selected_.size())},
                                       {"append_s", append_s},
                                       {"select_s", select_s},
                                       {"attend_s", attend_s}};
    if (p_.needle >= 0) c["needle_recall"] = f.needle_found ? 1.0 : 0.0;
    return c;
  }

 private:
  // The decode step's new key into the cache and the selector's state; every kRewind steps the cache is rewound to
  // kv_len first (a truncation and one block's summary made again: no allocation once the vectors have grown).
  void append() {
    if (next_ == kRewind) {
      truncate_keys(p_, kv_len_);
      if (state_) state_->truncate(p_);
      next_ = 0;
    }
    append_key(p_, &new_keys_.c_kv[size_t(next_ * p_.latent)], &new_keys_.k_pe[size_t(next_ * p_.rope)]);
    ++next_;
    if (state_) state_->append(p_);
  }
  std::vector<int64_t> select() const {
    switch (selector_) {
      case Selector::oracle: return select_oracle(p_, b_);
      case Selector::quest: return select_quest(p_, b_, *state_);
      case Selector::infllm: return select_infllm(p_, b_, *state_);
      case Selector::dsa: return select_dsa(p_, b_, *state_);
    }
    return {};
  }
  // out[h] = softmax(scores over the selected keys) · their latents, fp32.
  void attend(const std::vector<int64_t>& sel, std::vector<float>& out) const {
    std::vector<float> s(sel.size());
    for (int64_t h = 0; h < p_.heads; ++h) {
      float mx = -INFINITY;
      for (size_t i = 0; i < sel.size(); ++i) {
        float dot = 0;
        for (int64_t d = 0; d < p_.latent; ++d) dot += p_.q_lat[size_t(h * p_.latent + d)] * p_.c_kv[size_t(sel[i] * p_.latent + d)];
        for (int64_t d = 0; d < p_.rope; ++d) dot += p_.q_pe[size_t(h * p_.rope + d)] * p_.k_pe[size_t(sel[i] * p_.rope + d)];
        mx = std::max(mx, s[i] = dot * p_.scale);
      }
      float sum = 0;
      for (float& v : s) sum += (v = std::exp(v - mx));
      float* o = &out[size_t(h * p_.latent)];
      std::fill(o, o + p_.latent, 0.0f);
      for (size_t i = 0; i < sel.size(); ++i) {
        const float w = s[i] / sum;
        const float* c = &p_.c_kv[size_t(sel[i] * p_.latent)];
        for (int64_t d = 0; d < p_.latent; ++d) o[d] += w * c[d];
      }
    }
  }

  Selector selector_;
  Problem p_, new_keys_;
  int64_t kv_len_ = 0, next_ = 0;
  std::unique_ptr<SelectorState> state_;
  Budget b_;
  std::vector<int64_t> selected_;
  std::vector<float> out_;
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
DSLAB_REGISTER_VARIANT(SparseOracleCpu, "sparse/oracle/cpu", dslab::Device::cpu,
                       "sparse MLA decode on the exact top keys by true attention mass (the fidelity bound for a budget)");
DSLAB_REGISTER_VARIANT(SparseQuestCpu, "sparse/quest/cpu", dslab::Device::cpu,
                       "sparse MLA decode on Quest's blocks (per-block min/max upper bound of q.k, best head)");
DSLAB_REGISTER_VARIANT(SparseInfllmCpu, "sparse/infllm/cpu", dslab::Device::cpu,
                       "sparse MLA decode on InfLLM's blocks (a mean representative key per block, best head)");
DSLAB_REGISTER_VARIANT(SparseDsaCpu, "sparse/dsa/cpu", dslab::Device::cpu,
                       "sparse MLA decode on DeepSeek-V3.2's lightning-indexer top tokens (64 index heads x 128, FP8 index keys)");
