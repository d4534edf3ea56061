// Peers of the CPU MoE family: KTransformers' own MoE kernels (kt-kernel, scripts/peers/moe_kt.py) in a process of
// their own, at the MoE family's points, on the same experts, hidden states and routing (safetensors files dslab
// writes from the point's shared problem), verified against the fp64 reference like every MoE variant:
// peer/ktransformers_amx_bf16/cpu (AMXBF16_MOE), peer/ktransformers_amx_int8/cpu (AMXInt8_MOE: its own int8
// quantisation of the bf16 weights) and peer/ktransformers_avx2_bf16/cpu (AVX2BF16_MOE, its BF16 class on a CPU
// without AMX).

#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/safetensors.h"
#include "harness/variant.h"
#include "variants/moe/moe.h"
#include "variants/peers/peer_process.h"

namespace dslab::peers {
namespace {

class PeerKtMoe final : public moe::Base {
 public:
  // kt_step: the multiple kt-kernel's class needs of the hidden and intermediate sizes (its AMX tiles' K step: 32
  // bf16 or 64 int8 values; the classes fault or refuse otherwise, as the tiny model's 24-wide experts showed); 1:
  // any.
  PeerKtMoe(std::string method, double bar, int64_t kt_step) : method_(std::move(method)), bar_(bar), step_(kt_step) {}
  ~PeerKtMoe() override {
    process_.reset();
    for (const auto& f : {experts_file_, inputs_, outputs_})
      if (!f.empty()) std::filesystem::remove(f);
  }

  Support available() const override { return probe_support(command(), {{"op", "probe"}}); }
  Support supports(const ModelFile& model, const Point& point) const override {
    if (Support base = Base::supports(model, point); !base.ok) return base;
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    if (m.hidden_size % step_ != 0 || m.moe_intermediate_size % step_ != 0)
      return Support::no("kt-kernel's " + method_ + " class takes hidden and expert sizes in multiples of " +
                         std::to_string(step_) + " (this model: " + std::to_string(m.hidden_size) + " and " +
                         std::to_string(m.moe_intermediate_size) + ")");
    return {};
  }
  double host_memory_bytes(const ModelFile& model, const Point& point) const override {
    // The problem, the experts file in the page cache, the peer's stacked copy and its own packed one.
    return 4.0 * Base::host_memory_bytes(model, point);
  }

  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override {
    Base::prepare(model, point, seed);
    const moe::Shape& s = p_->shape;
    if (p_->experts.get() != experts_written_) write_experts();
    write_inputs();
    if (!process_) process_ = std::make_unique<PeerProcess>(command());
    // The largest token count the experts object is sized for: this point's, or more (so that a sweep's growing
    // token counts rebuild it rarely: the peer rebuilds it only where a point needs more).
    max_tokens_ = std::max(max_tokens_, std::max<int64_t>(s.tokens, 256));
    const auto reply = process_->request({{"op", "prepare"},
                                          {"experts", experts_file_},
                                          {"inputs", inputs_},
                                          {"max_tokens", max_tokens_},
                                          {"threads", s.threads}});
    peer_threads_ = reply.value("threads", 0);
  }

  void run() override { last_s_ = process_->request({{"op", "run"}}).at("seconds").get<double>(); }
  std::optional<double> own_time_s() const override { return last_s_; }

  Verification verify() override {
    if (outputs_.empty()) outputs_ = peer_temp_file(this, "out", ".f32");
    process_->output(outputs_, out_.data(), out_.size());
    Verification v = Base::verify();
    v.threshold = bar_;
    return v;
  }
  std::map<std::string, double> counters() override {
    auto c = Base::counters();
    c["threads"] = double(peer_threads_);  // the peer's pool (the CPU's cores less one at most: moe_kt.py says why)
    return c;
  }

 private:
  std::vector<std::string> command() const { return {python(), peer_script("moe_kt.py"), "--method", method_}; }
  // The experts (written once for the points that share them): Hugging Face names, the expert count and top-k.
  void write_experts() {
    if (experts_file_.empty()) experts_file_ = peer_temp_file(this, "experts", ".safetensors");
    write_safetensors(experts_file_, moe::expert_tensors(*p_),
                      {{"experts", std::to_string(p_->experts->size())}, {"topk", std::to_string(p_->shape.topk)}});
    experts_written_ = p_->experts.get();
  }
  void write_inputs() {
    const int64_t H = m_.hidden_size, T = p_->shape.tokens, K = p_->shape.topk;
    if (inputs_.empty()) inputs_ = peer_temp_file(this, "in", ".safetensors");
    write_safetensors(inputs_,
                      {{"hidden_states", "BF16", {T, H}, p_->x.data(), p_->x.size() * 2},
                       {"topk_weight", "F64", {T, K}, p_->routing.weight.data(), p_->routing.weight.size() * 8},
                       {"topk_idx", "I32", {T, K}, p_->routing.expert.data(), p_->routing.expert.size() * 4}},
                      {});
  }

  std::string method_;
  double bar_;
  int64_t step_;
  std::unique_ptr<PeerProcess> process_;
  const void* experts_written_ = nullptr;
  std::string experts_file_, inputs_, outputs_;
  int64_t max_tokens_ = 0;
  int peer_threads_ = 0;
  std::optional<double> last_s_;
};

// int8: kt-kernel's per-row symmetric quantisation of weights and activations lands ~1-2% from the exact result
// (dslab's own moe/amx_int8/cpu is held to the same 5e-2).
#define DSLAB_REGISTER_KT_PEER(id, name, method, bar, step, summary) \
  static const bool dslab_peer_kt_##id = ::dslab::register_variant(  \
      {name, Device::cpu, summary, [] { return std::unique_ptr<Variant>(new PeerKtMoe(method, bar, step)); }})

DSLAB_REGISTER_KT_PEER(amx_bf16, "peer/ktransformers_amx_bf16/cpu", "amx_bf16", 1e-2, 32,
                       "peer: KTransformers' AMX BF16 MoE kernel (kt-kernel, pinned PyPI release), in its own process");
DSLAB_REGISTER_KT_PEER(amx_int8, "peer/ktransformers_amx_int8/cpu", "amx_int8", 5e-2, 64,
                       "peer: KTransformers' AMX INT8 MoE kernel (kt-kernel; weights quantised on load), own process");
DSLAB_REGISTER_KT_PEER(avx2_bf16, "peer/ktransformers_avx2_bf16/cpu", "avx2_bf16", 1e-2, 1,
                       "peer: KTransformers' BF16 MoE kernel for CPUs without AMX (kt-kernel), in its own process");

}  // namespace
}  // namespace dslab::peers
