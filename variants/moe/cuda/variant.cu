// The family variant moe/<engine>/cuda: one point's weights and tokens, the op on them, verification against the
// fp64 reference, and the counters a GPU MoE result carries.
#include "variants/moe/cuda/moe_cuda.h"

#include "variants/reference/model.h"

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>

#include "harness/errors.h"
#include "variants/common/cuda/nvtx.h"
#include "harness/host.h"
#include "harness/op_registry.h"
#include "variants/common/cuda/device_random.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/moe/cuda/moe_kernels.cuh"

namespace dslab::moe::cuda {

using gpu::linear;

// ---- the family variant ----------------------------------------------------------------------------------

namespace {

// Weights shared by the variants of a point (and kept from one point to the next while model, seed and
// expert count stay): V3's 256 experts are 22.5 GB.
std::shared_ptr<const MoeWeights> shared_weights(const ModelConfig& m, int64_t experts, uint64_t seed,
                                                 bool routed_on_device, const std::string& checkpoint) {
  static std::mutex mu;
  static std::shared_ptr<const MoeWeights> last;
  static std::string key;
  std::lock_guard<std::mutex> lock(mu);
  const std::string k = m.source + "/" + std::to_string(experts) + "/" + std::to_string(seed) +
                        (routed_on_device ? "" : "/host") + (checkpoint.empty() ? "" : "/" + checkpoint);
  if (last && key == k) return last;
  last.reset();
  auto w = std::make_shared<MoeWeights>();
  if (checkpoint.empty()) {
    generate_moe_weights(m, experts, seed, w.get(), routed_on_device);
  } else {  // the checkpoint's first MoE layer (every expert: the variants refuse fewer with a checkpoint)
    static std::unique_ptr<Checkpoint> open;  // (kept: an op that runs the experts on the host reads them from it)
    open = std::make_unique<Checkpoint>(checkpoint);
    const auto started = std::chrono::steady_clock::now();
    load_moe_weights(*open, ref::first_moe_layer(m), w.get(), routed_on_device);
    open->report_load("the first MoE layer", std::chrono::steady_clock::now() - started);
  }
  last = w;
  key = k;
  return w;
}

constexpr int64_t kVerifiedTokens = 8;

}  // namespace

GpuMoeVariant::GpuMoeVariant(const std::string& op_name) : op_(make_moe_op(op_name)) {
  if (!op_) throw std::logic_error("no MoE op named " + op_name);
}

std::vector<std::pair<std::string, std::string>> GpuMoeVariant::axes() const {
  return {{"tokens", "1"},      {"experts", ""}, {"routing", "model"}, {"router", "auto"},
          {"moe_tile", "auto"}, {"proj", "own"}, {"cpu_threads", ""}};
}

std::string GpuMoeVariant::compute_ceiling() const {
  if (!op_->experts_on_host()) return "gpu.tensor_bf16_flops";
  return cpu_info().amx_bf16 ? "cpu.amx_bf16_flops" : "cpu.avx512_bf16_flops";
}

std::string GpuMoeVariant::bandwidth_ceiling() const {
  return op_->experts_on_host() ? "cpu.dram_read_bytes_per_s" : "";
}

Support GpuMoeVariant::supports(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  check_routing_name(s.routing);
  if (s.experts > m.n_routed_experts)
    throw BadInput("axis 'experts': value '" + std::to_string(s.experts) + "': expected at most n_routed_experts (" +
                   std::to_string(m.n_routed_experts) + ") of " + m.source);
  if (s.routing == "model" && s.experts != m.n_routed_experts)
    return Support::no("routing model needs all " + std::to_string(m.n_routed_experts) +
                       " experts (the router may pick any)");
  if (s.experts < s.topk) return Support::no("fewer experts than num_experts_per_tok");
  if (const std::string why = op_->unavailable(); !why.empty()) return Support::no(why);
  if (point.has("cpu_threads") && !op_->experts_on_host())
    return Support::no("cpu_threads: this op runs no experts on the CPU");
  if (point.has("moe_tile") && point.text("moe_tile") != "auto" && !op_->has_tiles())
    return Support::no("moe_tile " + point.text("moe_tile") + ": this op's experts are not grouped GEMMs of tiles");
  if (point.has("router") && point.text("router") != "auto" && s.routing != "model")
    return Support::no("router " + point.text("router") + ": routing " + s.routing + " is given, no router runs");
  if (!model.weights.empty() && s.experts != m.n_routed_experts)
    return Support::no("--weights: experts " + std::to_string(s.experts) + ": the checkpoint's layer has " +
                       std::to_string(m.n_routed_experts));
  return gpu_fits(device_memory_bytes(model, point));
}

Cost GpuMoeVariant::cost(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  // After prepare: the experts this point's routing reaches (the router's on random weights concentrates on
  // fewer experts than a uniform spread would reach). Before: the uniform expectation.
  if (active_experts_ > 0 && prepared_ == point.label() + "@" + m.source)
    return moe_layer_cost(m, s.tokens, active_experts_);
  double active = expected_active_experts(s.experts, s.topk, s.tokens);
  if (s.routing.rfind("zipf:", 0) == 0) {  // skewed: count the experts the synthetic routing reaches
    const ref::Routing r = synthetic_routing(m, s, 0);
    std::vector<char> hit(size_t(s.experts), 0);
    for (int e : r.expert) hit[size_t(e)] = 1;
    active = double(std::count(hit.begin(), hit.end(), 1));
  }
  return moe_layer_cost(m, s.tokens, active);
}

double GpuMoeVariant::host_memory_bytes(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  // x, and the reference's experts (at most tokens x topk of them, generated on the host as needed).
  const double experts = double(std::min<int64_t>(s.experts, kVerifiedTokens * s.topk));
  const double expert_bytes = 3 * double(m.hidden_size) * double(m.moe_intermediate_size) * 2;
  return double(s.tokens) * double(m.hidden_size) * 6 + experts * expert_bytes +
         (op_->experts_on_host() ? 2 * double(s.experts) * expert_bytes
                                 : 0);  // (the op's experts, generated and packed)
}

double GpuMoeVariant::device_memory_bytes(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  return moe_weight_bytes(m, op_->experts_on_host() ? 0 : s.experts) + MoeOp::scratch_bytes(m, s.tokens, s.experts) +
         double(s.tokens) * double(m.hidden_size) * 6;
}

void GpuMoeVariant::prepare(const ModelFile& model, const Point& point, uint64_t seed) {
  m_ = parse_model_config(model.config, model.name, model.path);
  s_ = shape_of(m_, point);
  seed_ = seed;
  weights_ = shared_weights(m_, s_.experts, seed, !op_->experts_on_host(), model.weights);
  checkpoint_.reset();
  if (!model.weights.empty()) checkpoint_ = std::make_unique<Checkpoint>(model.weights);
  if (!blas_) blas_ = std::make_unique<BlasHandle>();
  if (!side_blas_) side_blas_ = std::make_unique<BlasHandle>();
  blas_->set_projections(gpu::parse_projections(point.text("proj")));
  side_blas_->set_projections(gpu::parse_projections(point.text("proj")));
  x_host_ = ref::random_bf16(seed, "moe_hidden_states", size_t(s_.tokens * m_.hidden_size), std::sqrt(3.0f));
  x_.upload(x_host_);
  out_.resize(size_t(s_.tokens * m_.hidden_size));
  DSLAB_CUDA(cudaMemset(out_.get(), 0xff, out_.size() * 4));  // NaN: verification fails if run() leaves any unwritten
  MoeBuffers b;
  b.x = x_.get();
  b.out = out_.get();
  if (s_.routing != "model") {
    const ref::Routing r = synthetic_routing(m_, s_, seed);
    given_ids_.upload(std::vector<int32_t>(r.expert.begin(), r.expert.end()));
    given_weights_.upload(std::vector<float>(r.weight.begin(), r.weight.end()));
    b.topk_ids = given_ids_.get();
    b.topk_weights = given_weights_.get();
  }
  op_->set_cpu_threads(point.has("cpu_threads") ? int(point.integer("cpu_threads")) : 0);
  const std::string router = point.has("router") ? point.text("router") : "auto";
  op_->set_router_kernels(router == "one_kernel" ? MoeOp::RouterKernels::one_kernel
                          : router == "separate" ? MoeOp::RouterKernels::separate
                                                 : MoeOp::RouterKernels::automatic);
  const auto [tile_rows, tile_width] = parse_moe_tile(point.has("moe_tile") ? point.text("moe_tile") : "auto");
  op_->set_tile(tile_rows, tile_width);
  op_->prepare(m_, s_.tokens, *weights_, b, *blas_, side_blas_.get());
  op_->forward(0);  // the routing of this point, for cost()
  std::vector<int32_t> ids;
  std::vector<float> w;
  op_->routing(&ids, &w);
  std::vector<char> hit(size_t(s_.experts), 0);
  for (int32_t e : ids) hit[size_t(e)] = 1;
  active_experts_ = double(std::count(hit.begin(), hit.end(), 1));
  prepared_ = point.label() + "@" + m_.source;
}

void GpuMoeVariant::run() { op_->forward(0); }

Verification GpuMoeVariant::verify() {
  std::vector<float> out(out_.size());
  DSLAB_CUDA(cudaDeviceSynchronize());
  DSLAB_CUDA(cudaMemcpy(out.data(), out_.get(), out.size() * 4, cudaMemcpyDeviceToHost));
  const int64_t H = m_.hidden_size, I = m_.moe_intermediate_size, K = s_.topk, T = s_.tokens;
  const int64_t n = std::min(T, kVerifiedTokens);
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < n; ++i) tokens.push_back(n == 1 ? 0 : i * (T - 1) / (n - 1));
  // The reference routing: fp64 router for routing model (so the GPU router is checked too), else the given one.
  ref::Routing routing;
  if (s_.routing == "model") {
    const int64_t layer = checkpoint_ ? ref::first_moe_layer(m_) : 0;
    const auto gate = checkpoint_ ? ref::load_router(*checkpoint_, layer)
                                  : ref::random_bf16(seed_, "gate", size_t(m_.n_routed_experts * H), fan_in_scale(H));
    std::vector<float> bias;
    if (checkpoint_)
      bias = ref::load_router_bias(*checkpoint_, layer);
    else if (m_.topk_method == "noaux_tc")
      for (auto v : ref::random_bf16(seed_, "e_score_correction_bias", size_t(m_.n_routed_experts), 0.1f))
        bias.push_back(to_float(v));
    std::vector<double> logits(static_cast<size_t>(n * m_.n_routed_experts)), xt(static_cast<size_t>(H));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < H; ++j) xt[size_t(j)] = to_float(x_host_[size_t(tokens[size_t(i)] * H + j)]);
      ref::matvec(gate.data(), m_.n_routed_experts, H, xt.data(), &logits[size_t(i * m_.n_routed_experts)]);
    }
    routing = ref::route(m_, logits, bias, n);
  } else {
    const ref::Routing all = synthetic_routing(m_, s_, seed_);
    routing.tokens = n;
    routing.topk = K;
    for (int64_t t : tokens)
      for (int64_t k = 0; k < K; ++k) {
        routing.expert.push_back(all.expert[size_t(t * K + k)]);
        routing.weight.push_back(all.weight[size_t(t * K + k)]);
      }
  }
  std::map<int, ref::MlpParams> experts;
  const int64_t moe_layer = checkpoint_ ? ref::first_moe_layer(m_) : 0;
  for (int e : routing.expert)
    if (!experts.count(e))
      experts[e] = checkpoint_ ? ref::load_expert(*checkpoint_, moe_layer, e)
                               : ref::make_mlp_params(m_, I, seed_, "experts." + std::to_string(e));
  ref::MlpParams shared;
  if (m_.n_shared_experts > 0) {
    if (checkpoint_) {
      shared = ref::load_mlp(*checkpoint_, "model.layers." + std::to_string(moe_layer) + ".mlp.shared_experts.", H,
                             I * m_.n_shared_experts);
    } else {
      shared = ref::make_mlp_params(m_, I * m_.n_shared_experts, seed_, "shared_experts");
    }
  }
  std::vector<double> ref_out(size_t(n * H), 0.0);
  std::vector<float> got(size_t(n * H));
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tokens[size_t(i)];
    std::vector<double> xt(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) xt[size_t(j)] = to_float(x_host_[size_t(t * H + j)]);
    double* r = &ref_out[size_t(i * H)];
    if (m_.n_shared_experts > 0) {
      const auto y = ref::mlp(m_, shared, xt, 1);
      for (int64_t j = 0; j < H; ++j) r[j] += y[size_t(j)];
    }
    for (int64_t k = 0; k < K; ++k) {
      const auto y = ref::mlp(m_, experts.at(routing.expert[size_t(i * K + k)]), xt, 1);
      for (int64_t j = 0; j < H; ++j) r[j] += routing.weight[size_t(i * K + k)] * y[size_t(j)];
    }
    std::copy_n(&out[size_t(t * H)], H, &got[size_t(i * H)]);
  }
  return {ref::relative_l2_error(got.data(), ref_out.data(), ref_out.size()), 1e-2};
}

std::map<std::string, double> GpuMoeVariant::counters() {
  std::map<std::string, double> c = op_->own_counters();  // (of the timed runs: before the runs below add theirs)
  const auto ops = gpu::time_ops([&](gpu::OpMarks& marks) { op_->forward(0, &marks); });
  c.insert(ops.begin(), ops.end());
  gpu::flush_l2();
  const gpu::KernelTimes kt = gpu::kernel_times([&] { op_->forward(0); });
  if (kt.records > 0) {
    c["kernel_time_s"] = kt.busy_s;  // CUPTI: the union of the step's kernel intervals
    for (const auto& [name, s] : kt.by_kernel_s) c["kernel_us." + name] = s * 1e6;
  }
  std::vector<int32_t> ids;
  std::vector<float> w;
  op_->routing(&ids, &w);
  std::vector<int64_t> rows(size_t(s_.experts), 0);
  for (int32_t e : ids) ++rows[size_t(e)];
  const double active = double(std::count_if(rows.begin(), rows.end(), [](int64_t r) { return r > 0; }));
  c["active_experts"] = active;
  c["tokens_per_active_expert"] = double(ids.size()) / std::max(1.0, active);
  c["max_tokens_per_expert"] = double(*std::max_element(rows.begin(), rows.end()));
  c["graph_safe"] = op_->graph_safe() ? 1.0 : 0.0;
  c["tile_rows"] = double(op_->tile_rows());
  if (op_->tile_rows() == 16) c["tile_width"] = double(op_->tile_width());
  c["one_kernel_router"] = op_->one_kernel_router() ? 1.0 : 0.0;
  return c;
}

}  // namespace dslab::moe::cuda
