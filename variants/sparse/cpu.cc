// sparse/{oracle,quest,infllm,dsa}/cpu: one decode step of MLA attention (its MQA form over the latent cache) on
// the keys a selector chooses. run() = the selection + attention over the selected keys; verify() = that attention
// against fp64 over the same keys; counters = the selection's fidelity against dense attention (mass_recall,
// rel_err_vs_dense, needle_recall) and the selection's own time beside the attention's.
#include <chrono>
#include <cmath>

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
    // The attention over the selected keys (scores and the weighted sum), then what the selector reads and computes.
    c.flops = 2 * H * B * (width + double(m.kv_lora_rank));
    c.bytes = B * width * 4;
    switch (selector_) {
      case Selector::oracle: c.flops += 2 * H * N * width, c.bytes += N * width * 4; break;
      case Selector::quest: c.flops += 2 * H * blocks * width * 2, c.bytes += N * width * 4; break;  // min/max made here
      case Selector::infllm: c.flops += 2 * H * blocks * width, c.bytes += N * width * 4; break;     // means made here
      case Selector::dsa: {
        const Indexer ix;
        c.flops += 2 * double(ix.heads) * N * double(ix.dim) + 2 * N * width * double(ix.dim);
        c.bytes += N * double(ix.dim) + N * width * 4;
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
    out_.assign(size_t(p_.heads * p_.latent), std::nanf(""));
  }
  void run() override {
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
    const auto sel = select();
    const double select_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    attend(sel, scratch);
    const double attend_s = seconds_since(t1);
    std::map<std::string, double> c = {{"mass_recall", f.mass_recall},
                                       {"rel_err_vs_dense", f.rel_err},
                                       {"selected_tokens", double(selected_.size())},
                                       {"select_s", select_s},
                                       {"attend_s", attend_s}};
    if (p_.needle >= 0) c["needle_recall"] = f.needle_found ? 1.0 : 0.0;
    return c;
  }

 private:
  std::vector<int64_t> select() const {
    switch (selector_) {
      case Selector::oracle: return select_oracle(p_, b_);
      case Selector::quest: return select_quest(p_, b_);
      case Selector::infllm: return select_infllm(p_, b_);
      case Selector::dsa: return select_dsa(p_, b_, Indexer{});
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
  Problem p_;
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
