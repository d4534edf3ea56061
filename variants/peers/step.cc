// The whole-step peer: Hugging Face transformers' DeepSeek model (scripts/peers/step_hf.py) decoding one token per
// request over its own prefill of the same prompts, in a process of its own, on a checkpoint (--weights; transformers
// needs the weights in a file, so random-weight points are not its): peer/transformers/{cpu,cuda}, and
// peer/transformers_compiled/cuda (its forward through torch.compile). Its logits are checked against dslab's
// own: the fp64 reference model (ref::Request) where it is affordable, else dslab's GPU engine (the generation
// engine, bf16) on the same checkpoint, prompts and step tokens.

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "harness/engine.h"
#include "harness/errors.h"
#include "harness/host.h"
#include "harness/safetensors.h"
#include "harness/serving.h"
#include "harness/variant.h"
#include "variants/common/checkpoint.h"
#include "variants/common/model_config.h"
#include "variants/reference/model.h"
#include "variants/reference/reference.h"
#include "variants/peers/peer_process.h"

namespace dslab::peers {
namespace {

// The fp64 reference decodes the step itself where its work, batch x (kv_len + 1) tokens through every layer's
// hidden x hidden projections, stays under this many multiply-adds (about a minute on one core); beyond, the GPU
// engine is the comparison.
constexpr double kReferenceWork = 5e10;

class PeerTransformersStep final : public Variant {
 public:
  PeerTransformersStep(Device device, bool compiled) : device_(device), compiled_(compiled) {}
  ~PeerTransformersStep() override {
    process_.reset();
    for (const auto& f : {inputs_, outputs_})
      if (!f.empty()) std::filesystem::remove(f);
  }

  std::vector<std::pair<std::string, std::string>> axes() const override {
    // (layers: as layer/deepseek/cuda's axis, so that its whole-model points and the peer's share a suite)
    return {{"batch", "1"}, {"q_len", "1"}, {"kv_len", "4096"}, {"layers", "all"}};
  }
  bool reads_weights() const override { return true; }

  Support available() const override {
    return probe_support(command(), {{"op", "probe"}, {"device", device_name(device_)}});
  }

  Support supports(const ModelFile& model, const Point& point) const override {
    if (model.weights.empty())
      return Support::no("needs --weights: transformers runs a checkpoint (random weights live only in dslab)");
    if (point.integer("q_len") != 1) return Support::no("q_len " + point.text("q_len") + ": a decode step is q_len 1");
    if (point.text("layers") != "all")
      return Support::no("layers " + point.text("layers") + ": transformers runs the whole model (layers all)");
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    if (!reference_affordable(m, point) && !gpu_info().present)
      return Support::no("its check needs the fp64 reference (too long at this point) or dslab's GPU engine (no GPU)");
    return {};
  }
  Cost cost(const ModelFile&, const Point&) const override { return {}; }
  double host_memory_bytes(const ModelFile& model, const Point&) const override {
    // The checkpoint's bytes: transformers' load (and, on the CPU, its model), and the reference's copy.
    double bytes = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(model.weights, ec))
      if (e.path().extension() == ".safetensors") bytes += double(e.file_size(ec));
    return (device_ == Device::cpu ? 3.0 : 2.0) * bytes;
  }
  std::string compute_ceiling() const override {
    return device_ == Device::cuda ? "gpu.tensor_bf16_flops" : "cpu.avx512_bf16_flops";
  }

  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override {
    m_ = parse_model_config(model.config, model.name, model.path);
    model_ = model;
    batch_ = point.integer("batch");
    kv_len_ = point.integer("kv_len");
    seed_ = seed;
    // The prompts and step tokens: uniform over the vocabulary from the seed (the serving module's draw).
    prompts_.assign(size_t(batch_), {});
    steps_.assign(size_t(batch_), 0);
    std::vector<int32_t> flat;
    for (int64_t r = 0; r < batch_; ++r) {
      serving::RequestSpec q;
      q.input_len = kv_len_ + 1;
      std::vector<int32_t> ids = serving::prompt_tokens(q, r, seed, m_.vocab_size);
      steps_[size_t(r)] = ids.back();
      ids.pop_back();
      flat.insert(flat.end(), ids.begin(), ids.end());
      prompts_[size_t(r)] = std::move(ids);
    }
    if (inputs_.empty()) inputs_ = peer_temp_file(this, "in", ".safetensors");
    write_safetensors(inputs_,
                      {{"prompt", "I32", {batch_, kv_len_}, flat.data(), flat.size() * 4},
                       {"step", "I32", {batch_}, steps_.data(), steps_.size() * 4}},
                      {});
    against_ = reference_affordable(m_, batch_, kv_len_) ? "reference" : "gpu_engine";
    if (!process_) process_ = std::make_unique<PeerProcess>(command());
    process_->request({{"op", "prepare"},
                       {"weights", model.weights},
                       {"inputs", inputs_},
                       {"device", device_name(device_)},
                       {"threads", cpu_info().logical_cpus},
                       {"compile", compiled_}});
  }

  void run() override { last_s_ = process_->request({{"op", "run"}}).at("seconds").get<double>(); }
  std::optional<double> own_time_s() const override { return last_s_; }

  Verification verify() override {
    if (outputs_.empty()) outputs_ = peer_temp_file(this, "out", ".f32");
    const size_t V = size_t(m_.vocab_size);
    std::vector<float> got(size_t(batch_) * V);
    process_->output(outputs_, got.data(), got.size());
    // Two bf16 runs of the whole model each land up to sqrt(layers / 4) x 2e-2 from exact arithmetic (the layer
    // step's bar): against the reference (bf16 stream) that bar; against the GPU engine, twice it.
    const double per_side = 2e-2 * std::sqrt(std::max(1.0, double(m_.num_hidden_layers) / 4.0));
    std::vector<double> want;
    if (against_ == "reference") {
      const ref::ModelParams params = ref::load_model_params(Checkpoint(model_.weights));
      for (int64_t r = 0; r < batch_; ++r) {
        ref::Request request(m_, params);
        request.forward(prompts_[size_t(r)]);
        const std::vector<double> logits = request.forward({steps_[size_t(r)]});
        want.insert(want.end(), logits.begin(), logits.end());
      }
      return {ref::relative_l2_error(got.data(), want.data(), want.size()), per_side};
    }
    const std::vector<float> engine = engine_logits();
    want.assign(engine.begin(), engine.end());
    return {ref::relative_l2_error(got.data(), want.data(), want.size()), 2 * per_side};
  }
  std::map<std::string, double> counters() override {
    return {{"checked_against_reference", against_ == "reference" ? 1.0 : 0.0},
            {"checked_against_gpu_engine", against_ == "gpu_engine" ? 1.0 : 0.0}};
  }

 private:
  static bool reference_affordable(const ModelConfig& m, int64_t batch, int64_t kv_len) {
    return double(batch) * double(kv_len + 1) * double(m.num_hidden_layers) * double(m.hidden_size) *
               double(m.hidden_size) <=
           kReferenceWork;
  }
  static bool reference_affordable(const ModelConfig& m, const Point& p) {
    return reference_affordable(m, p.integer("batch"), p.integer("kv_len"));
  }
  // dslab's generation engine on the same checkpoint: each prompt prefilled, then the step tokens decoded together.
  std::vector<float> engine_logits() const {
    std::unique_ptr<Engine> engine = EngineRegistry::instance().make("layer/deepseek/cuda");
    if (!engine) throw std::runtime_error("peer transformers: no GPU engine in this build to check it against");
    Point axes;
    for (const auto& [name, value] : engine->axes()) axes.set(name, {value, 0, false});
    EngineLimits l;
    l.max_running = batch_;
    l.max_context = kv_len_ + 1;
    l.chunk_tokens = 512;
    const int64_t per_request = (l.max_context + l.page_size - 1) / l.page_size;
    l.pages = per_request * batch_;
    if (const Support s = engine->supports(model_, axes, l); !s.ok)
      throw std::runtime_error("peer transformers: dslab's GPU engine cannot check it here: " + s.reason);
    engine->prepare(model_, axes, l, seed_);
    std::vector<std::vector<int32_t>> pages(static_cast<size_t>(batch_));
    for (int64_t r = 0; r < batch_; ++r)
      for (int64_t i = 0; i < per_request; ++i) pages[size_t(r)].push_back(int32_t(r * per_request + i));
    for (int64_t r = 0; r < batch_; ++r)
      for (int64_t at = 0; at < kv_len_; at += l.chunk_tokens) {
        EnginePiece chunk;
        chunk.request = r;
        chunk.position = at;
        const int64_t n = std::min(l.chunk_tokens, kv_len_ - at);
        chunk.tokens.assign(prompts_[size_t(r)].begin() + at, prompts_[size_t(r)].begin() + at + n);
        chunk.pages = &pages[size_t(r)];
        engine->step({chunk});
      }
    std::vector<EnginePiece> decodes(static_cast<size_t>(batch_));
    for (int64_t r = 0; r < batch_; ++r) {
      EnginePiece& d = decodes[size_t(r)];
      d.request = r;
      d.position = kv_len_;
      d.tokens = {steps_[size_t(r)]};
      d.pages = &pages[size_t(r)];
      d.decode = true;
      d.wants_token = true;
    }
    std::vector<std::vector<float>> logits;
    engine->step(decodes, &logits);
    std::vector<float> flat;
    for (const auto& row : logits) flat.insert(flat.end(), row.begin(), row.end());
    return flat;
  }
  std::vector<std::string> command() const { return {python(), peer_script("step_hf.py")}; }

  Device device_;
  bool compiled_;
  ModelConfig m_;
  ModelFile model_;
  int64_t batch_ = 0, kv_len_ = 0;
  uint64_t seed_ = 0;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<int32_t> steps_;
  std::unique_ptr<PeerProcess> process_;
  std::string inputs_, outputs_, against_;
  std::optional<double> last_s_;
};

#define DSLAB_REGISTER_HF_PEER(id, name, device, compiled, summary) \
  static const bool dslab_peer_hf_##id = ::dslab::register_variant( \
      {name, device, summary, [] { return std::unique_ptr<Variant>(new PeerTransformersStep(device, compiled)); }})

DSLAB_REGISTER_HF_PEER(
    cpu, "peer/transformers/cpu", Device::cpu, false,
    "peer: Hugging Face transformers' DeepSeek decode step (eager, bf16) on a checkpoint, own process");
DSLAB_REGISTER_HF_PEER(cuda, "peer/transformers/cuda", Device::cuda, false,
                       "peer: Hugging Face transformers' DeepSeek decode step (eager, bf16, CUDA) on a checkpoint");
DSLAB_REGISTER_HF_PEER(compiled_cuda, "peer/transformers_compiled/cuda", Device::cuda, true,
                       "peer: transformers' DeepSeek decode step through torch.compile (bf16, CUDA) on a checkpoint");

}  // namespace
}  // namespace dslab::peers
