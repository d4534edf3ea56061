// Peers of the MLA family, each in a process of its own (scripts/peers/mla.py), at the MLA family's points, on the same
// weights, inputs and cache (a safetensors file dslab writes from the point's shared problem), verified against the
// fp64 reference like every variant: the four forms as the seed's PyTorch benchmark computes them
// (peer/pytorch_<form>/{cpu,cuda}: one module call a step, bf16) and NumPy's a_cc_me (peer/numpy_a_cc_me/cpu: float32
// einsums; no PyTorch needed, so the peer runner is exercised on every machine).

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/safetensors.h"
#include "harness/variant.h"
#include "variants/mla/mla.h"
#include "variants/peers/peer_process.h"

namespace dslab::peers {
namespace {

const char* algo_name(mla::Algo a) {
  switch (a) {
    case mla::Algo::cd:
      return "cd";
    case mla::Algo::cc:
      return "cc";
    case mla::Algo::a_cc:
      return "a_cc";
    case mla::Algo::a_cc_me:
      return "a_cc_me";
  }
  return "?";
}

class PeerMla final : public Variant {
 public:
  PeerMla(std::string backend, mla::Algo algo, Device device)
      : backend_(std::move(backend)), algo_(algo), device_(device) {}
  ~PeerMla() override {
    process_.reset();
    if (!inputs_.empty()) std::filesystem::remove(inputs_);
    if (!outputs_.empty()) std::filesystem::remove(outputs_);
  }

  std::vector<std::pair<std::string, std::string>> axes() const override { return mla::axes(); }
  bool reads_weights() const override { return true; }

  // Whether the peer's library is there (asked of the peer itself, once a process).
  Support available() const override {
    return probe_support(command(), {{"op", "probe"}, {"device", device_name(device_)}});
  }

  Support supports(const ModelFile& model, const Point& point) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const mla::Shape s = mla::shape_of(m, point);
    if (!model.weights.empty() && s.heads != m.num_attention_heads)
      return Support::no("--weights: heads " + std::to_string(s.heads) + ": the checkpoint's weights are for all " +
                         std::to_string(m.num_attention_heads) + " heads");
    if (device_ == Device::cuda) return gpu_fits(3 * host_memory_bytes(model, point));
    return {};
  }
  Cost cost(const ModelFile& model, const Point& point) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    return mla::cost(m, algo_, mla::shape_of(m, point));
  }
  double host_memory_bytes(const ModelFile& model, const Point& point) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const mla::Shape s = mla::shape_of(m, point);
    // The problem and its copy in the peer (float32 there: twice the bf16 file), the decompressed keys of cd / cc.
    const double cache = double(s.batch) * double(s.kv_len + s.q_len) * double(m.kv_lora_rank + m.qk_rope_head_dim);
    return 6.0 * (mla::weight_bytes(m, s.heads) + 2 * cache) +
           (algo_ == mla::Algo::cd || algo_ == mla::Algo::cc
                ? 4.0 * double(s.batch) * double(s.kv_len + s.q_len) * double(s.heads) *
                      double(m.qk_nope_head_dim + m.v_head_dim + m.qk_rope_head_dim)
                : 0.0);
  }
  std::string compute_ceiling() const override {
    return device_ == Device::cuda ? "gpu.tensor_bf16_flops"
           : cpu_info().amx_bf16   ? "cpu.amx_bf16_flops"
                                   : "cpu.avx512_bf16_flops";
  }

  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override {
    m_ = parse_model_config(model.config, model.name, model.path);
    s_ = mla::shape_of(m_, point);
    problem_ = mla::problem(m_, s_, seed, model.weights);
    write_inputs();
    if (!process_) process_ = std::make_unique<PeerProcess>(command());
    process_->request({{"op", "prepare"},
                       {"inputs", inputs_},
                       {"form", algo_name(algo_)},
                       {"device", device_name(device_)},
                       {"threads", cpu_info().logical_cpus}});
  }

  void run() override { last_s_ = process_->request({{"op", "run"}, {"flush", true}}).at("seconds").get<double>(); }
  std::optional<double> own_time_s() const override { return last_s_; }

  Verification verify() override {
    if (outputs_.empty()) outputs_ = peer_temp_file(this, "out", ".f32");
    const auto& want = problem_->reference();
    std::vector<float> got(want.size());
    process_->output(outputs_, got.data(), got.size());
    return {ref::relative_l2_error(got.data(), want.data(), want.size()), bar()};
  }

 private:
  std::vector<std::string> command() const { return {python(), peer_script("mla.py"), "--backend", backend_}; }
  // The seed's PyTorch forms round every intermediate (the absorbed query, the scores' inputs, the attention output
  // before o_proj) to bf16 as they are written, where dslab's kernels keep fp32 between ops: on the H200 at DeepSeek-V3
  // dims they land 1.0-1.2e-2 from the fp64 reference (4K keys), so they are held to 2e-2. NumPy's float32: 1e-2.
  double bar() const { return backend_ == "torch" ? 2e-2 : 1e-2; }

  // The point's weights, hidden states and cache, the RoPE of each new token's position as a matrix
  // ([q_len][rope][rope]: the reference's YaRN rotation, whatever its layout, applied as M x) and the softmax scale.
  void write_inputs() {
    const int64_t H = s_.heads, rope = m_.qk_rope_head_dim, nope = m_.qk_nope_head_dim, vd = m_.v_head_dim;
    rope_.assign(size_t(s_.q_len * rope * rope), 0.0f);
    for (int64_t s = 0; s < s_.q_len; ++s)
      for (int64_t i = 0; i < rope; ++i) {
        std::vector<double> e(static_cast<size_t>(rope), 0.0);
        e[size_t(i)] = 1;
        ref::apply_rope(m_, s_.kv_len + s, e.data());
        for (int64_t o = 0; o < rope; ++o) rope_[size_t((s * rope + o) * rope + i)] = float(e[size_t(o)]);
      }
    scale_ = float(m_.softmax_scale());
    std::vector<DumpTensor> t = mla::input_tensors(*problem_);
    t.push_back({"rope", "F32", {s_.q_len, rope, rope}, rope_.data(), rope_.size() * 4});
    t.push_back({"softmax_scale", "F32", {1}, &scale_, 4});
    if (inputs_.empty()) inputs_ = peer_temp_file(this, "in", ".safetensors");
    write_safetensors(inputs_, t,
                      {{"heads", std::to_string(H)},
                       {"rms_norm_eps", std::to_string(m_.rms_norm_eps)},
                       {"qk_nope_head_dim", std::to_string(nope)},
                       {"qk_rope_head_dim", std::to_string(rope)},
                       {"v_head_dim", std::to_string(vd)}});
  }

  std::string backend_;
  mla::Algo algo_;
  Device device_;
  ModelConfig m_;
  mla::Shape s_;
  std::shared_ptr<const mla::Problem> problem_;
  std::unique_ptr<PeerProcess> process_;
  std::string inputs_, outputs_;
  std::vector<float> rope_;
  float scale_ = 0;
  std::optional<double> last_s_;
};

#define DSLAB_REGISTER_PEER(id, name, backend, algo, device, summary) \
  static const bool dslab_peer_##id = ::dslab::register_variant(      \
      {name, device, summary, [] { return std::unique_ptr<Variant>(new PeerMla(backend, algo, device)); }})

DSLAB_REGISTER_PEER(numpy_a_cc_me, "peer/numpy_a_cc_me/cpu", "numpy", mla::Algo::a_cc_me, Device::cpu,
                    "peer: NumPy's absorbed MLA (float32 einsums) in its own process; runs wherever NumPy does");
DSLAB_REGISTER_PEER(torch_cd_cpu, "peer/pytorch_cd/cpu", "torch", mla::Algo::cd, Device::cpu,
                    "peer: the seed's PyTorch CacheDecompressed form (bf16), in its own process");
DSLAB_REGISTER_PEER(torch_cc_cpu, "peer/pytorch_cc/cpu", "torch", mla::Algo::cc, Device::cpu,
                    "peer: the seed's PyTorch CacheCompressed form (bf16), in its own process");
DSLAB_REGISTER_PEER(torch_a_cc_cpu, "peer/pytorch_a_cc/cpu", "torch", mla::Algo::a_cc, Device::cpu,
                    "peer: the seed's PyTorch Absorbed form (bf16), in its own process");
DSLAB_REGISTER_PEER(torch_a_cc_me_cpu, "peer/pytorch_a_cc_me/cpu", "torch", mla::Algo::a_cc_me, Device::cpu,
                    "peer: the seed's PyTorch Absorbed + MoveElision form (bf16), in its own process");
DSLAB_REGISTER_PEER(torch_cd_cuda, "peer/pytorch_cd/cuda", "torch", mla::Algo::cd, Device::cuda,
                    "peer: the seed's PyTorch CacheDecompressed form (bf16, CUDA), in its own process");
DSLAB_REGISTER_PEER(torch_cc_cuda, "peer/pytorch_cc/cuda", "torch", mla::Algo::cc, Device::cuda,
                    "peer: the seed's PyTorch CacheCompressed form (bf16, CUDA), in its own process");
DSLAB_REGISTER_PEER(torch_a_cc_cuda, "peer/pytorch_a_cc/cuda", "torch", mla::Algo::a_cc, Device::cuda,
                    "peer: the seed's PyTorch Absorbed form (bf16, CUDA), in its own process");
DSLAB_REGISTER_PEER(torch_a_cc_me_cuda, "peer/pytorch_a_cc_me/cuda", "torch", mla::Algo::a_cc_me, Device::cuda,
                    "peer: the seed's PyTorch Absorbed + MoveElision form (bf16, CUDA), in its own process");

}  // namespace
}  // namespace dslab::peers
