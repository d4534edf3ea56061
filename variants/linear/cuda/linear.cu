// linear/{own,cublas}/cuda: one DeepSeek nn.Linear (a projection, an expert-free MLP half, the router gate or the
// LM head) on `tokens` rows, through linear() with the handle's projections set to own or cublas — the same
// call every GPU layer makes, so the sweep that compares them per weight shape measures what the layers run.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "harness/gpu.h"
#include "harness/measure.h"
#include "harness/variant.h"
#include "variants/common/bf16.h"
#include "variants/common/cuda/device_random.h"
#include "variants/common/model_config.h"
#include "variants/common/cuda/blas.h"
#include "variants/reference/reference.h"

namespace dslab::linear_cuda {
using namespace dslab::gpu;
namespace {

struct LinearShape {
  int64_t in = 0, out = 0;
};

const char* const kWeights =
    "q_proj | q_a_proj | q_b_proj | kv_a_proj_with_mqa | o_proj | shared_gate_up | shared_down_proj | dense_gate_up | "
    "dense_down_proj | gate | lm_head";

// The weight's [out][in] shape in model m, or a reason it has none (q_proj only without q_lora_rank, ...).
LinearShape linear_shape(const ModelConfig& m, const std::string& weight, std::string* why_not) {
  const int64_t H = m.hidden_size, heads = m.num_attention_heads,
                shared_I = m.moe_intermediate_size * m.n_shared_experts;
  const int64_t kv_a_out = m.kv_lora_rank + m.qk_rope_head_dim;
  if (weight == "q_proj") {
    if (m.q_lora_rank) *why_not = m.name + " has q_lora_rank: its queries come from q_a_proj and q_b_proj";
    return {H, heads * m.q_head_dim()};
  }
  if (weight == "q_a_proj" || weight == "q_b_proj") {
    if (!m.q_lora_rank) {
      *why_not = m.name + " has no q_lora_rank: its queries come from q_proj";
      return {};
    }
    return weight == "q_a_proj" ? LinearShape{H, *m.q_lora_rank} : LinearShape{*m.q_lora_rank, heads * m.q_head_dim()};
  }
  if (weight == "kv_a_proj_with_mqa") return {H, kv_a_out};
  if (weight == "o_proj") return {heads * m.v_head_dim, H};
  if (weight == "shared_gate_up" || weight == "shared_down_proj") {
    if (shared_I == 0) *why_not = m.name + " has no shared experts";
    return weight == "shared_gate_up" ? LinearShape{H, 2 * shared_I} : LinearShape{shared_I, H};
  }
  if (weight == "dense_gate_up") return {H, 2 * m.intermediate_size};
  if (weight == "dense_down_proj") return {m.intermediate_size, H};
  if (weight == "gate") return {H, m.n_routed_experts};
  if (weight == "lm_head") {
    if (m.vocab_size == 0) *why_not = m.name + " has no vocab_size";
    return {H, m.vocab_size};
  }
  throw BadInput("axis 'weight': value '" + weight + "': expected " + kWeights);
}

struct LinearPoint {
  ModelConfig m;
  std::string weight;
  LinearShape shape;
  int64_t tokens = 0;
  std::string why_not;
};

LinearPoint linear_point(const ModelFile& model, const Point& point) {
  LinearPoint p;
  p.m = parse_model_config(model.config, model.name, model.path);
  p.weight = point.text("weight");
  p.tokens = point.integer("tokens");
  if (p.tokens < 1)
    throw BadInput("axis 'tokens': value " + std::to_string(p.tokens) + ": expected a positive row count");
  p.shape = linear_shape(p.m, p.weight, &p.why_not);
  return p;
}

// Rows verified against the fp64 product: all up to kGemvRows, else kGemvRows spread over the batch (first and last
// included) — a full fp64 check of the LM head at 128 rows would take the host tens of seconds per point.
std::vector<int64_t> verified_rows(int64_t tokens) {
  std::vector<int64_t> rows;
  const int64_t n = std::min(tokens, kGemvRows);
  for (int64_t i = 0; i < n; ++i) rows.push_back(n == 1 ? 0 : i * (tokens - 1) / (n - 1));
  return rows;
}

class LinearVariant : public Variant {
 public:
  explicit LinearVariant(Projections projections) : projections_(projections) {}

  std::vector<std::pair<std::string, std::string>> axes() const override {
    return {{"weight", "o_proj"}, {"tokens", "1"}};
  }

  Support supports(const ModelFile& model, const Point& point) const override {
    const LinearPoint p = linear_point(model, point);
    if (!p.why_not.empty()) return Support::no(p.why_not);
    return gpu_fits(device_memory_bytes(model, point));
  }

  Cost cost(const ModelFile& model, const Point& point) const override {
    const LinearPoint p = linear_point(model, point);
    const double in = double(p.shape.in), out = double(p.shape.out), t = double(p.tokens);
    return {2 * t * in * out, 2 * in * out + 2 * t * in + 4 * t * out};
  }

  double device_memory_bytes(const ModelFile& model, const Point& point) const override {
    const LinearPoint p = linear_point(model, point);
    return 2.0 * double(p.shape.in) * double(p.shape.out) +
           (2.0 * double(p.shape.in) + 4.0 * double(p.shape.out)) * double(p.tokens);
  }

  double host_memory_bytes(const ModelFile& model, const Point& point) const override {
    const LinearPoint p = linear_point(model, point);  // the host copy of the weight that verify() rebuilds
    return 2.0 * double(p.shape.in) * double(p.shape.out);
  }

  std::string compute_ceiling() const override { return "gpu.tensor_bf16_flops"; }

  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override {
    p_ = linear_point(model, point);
    seed_ = seed;
    if (!blas_) blas_ = std::make_unique<BlasHandle>();
    blas_->set_projections(projections_);
    const size_t in = size_t(p_.shape.in), out = size_t(p_.shape.out), t = size_t(p_.tokens);
    w_.resize(in * out);
    x_.resize(t * in);
    y_.resize(t * out);
    fill_random_bf16(w_.get(), w_.size(), seed, "linear." + p_.weight, fan_in_scale(p_.shape.in));
    fill_random_bf16(x_.get(), x_.size(), seed, "linear.x", std::sqrt(3.0f));
    DSLAB_CUDA(cudaMemset(y_.get(), 0xff, y_.size() * 4));  // NaN: verification fails if run() leaves any unwritten
    DSLAB_CUDA(cudaDeviceSynchronize());
  }

  void run() override {
    linear(*blas_, x_.get(), p_.tokens, p_.shape.in, w_.get(), p_.shape.out, y_.get(), CUDA_R_32F);
  }

  Verification verify() override {
    const int64_t in = p_.shape.in, out = p_.shape.out;
    std::vector<float> y(size_t(p_.tokens * out));
    DSLAB_CUDA(cudaDeviceSynchronize());
    DSLAB_CUDA(cudaMemcpy(y.data(), y_.get(), y.size() * 4, cudaMemcpyDeviceToHost));
    const std::vector<bf16> w = ref::random_bf16(seed_, "linear." + p_.weight, size_t(in * out), fan_in_scale(in));
    const std::vector<bf16> x = ref::random_bf16(seed_, "linear.x", size_t(p_.tokens * in), std::sqrt(3.0f));
    std::vector<float> got;
    std::vector<double> want;
    std::vector<double> xr(static_cast<size_t>(in));
    for (int64_t r : verified_rows(p_.tokens)) {
      for (int64_t k = 0; k < in; ++k) xr[size_t(k)] = to_float(x[size_t(r * in + k)]);
      for (int64_t n = 0; n < out; ++n) {
        const bf16* wr = w.data() + n * in;
        double s = 0;
        for (int64_t k = 0; k < in; ++k) s += xr[size_t(k)] * double(to_float(wr[k]));
        want.push_back(s);
        got.push_back(y[size_t(r * out + n)]);
      }
    }
    // Exact bf16 products summed in fp32 (both backends): the fp32 threshold, 1e-5, up to K = 6250; past it, 4 sqrt(K)
    // fp32 roundings (2^-24 each), as a K-long fp32 sum's error grows with sqrt(K) - at V3's o_proj (K = 16384) a
    // tuned cuBLASLt algorithm measured 1.78e-5 and the default one 8.5e-6 (H100): 3.1e-5 there.
    const double threshold = std::max(1e-5, 4.0 * std::sqrt(double(in)) * std::ldexp(1.0, -24));
    return {ref::relative_l2_error(got.data(), want.data(), want.size()), threshold};
  }

  std::map<std::string, double> counters() override {
    std::map<std::string, double> c;
    c["in_features"] = double(p_.shape.in);
    c["out_features"] = double(p_.shape.out);
    c["verified_rows"] = double(verified_rows(p_.tokens).size());
    const bool own = projections_ == Projections::own && p_.tokens <= kGemvRows;
    c["own_kernel"] = own ? 1.0 : 0.0;
    if (own) c["gemv_split"] = double(own_gemv_split(p_.tokens, p_.shape.out, p_.shape.in));
    const TunedChoice* tuned = nullptr;
    if (projections_ == Projections::own && !own)
      tuned = blas_->tuner().choice(
          linear_gemm_shape(x_.get(), p_.tokens, p_.shape.in, w_.get(), p_.shape.out, y_.get(), CUDA_R_32F, 0.0f));
    if (tuned) {  // what tuning chose, and its cold time against cuBLASLt's first heuristic pick in the same tuning
      c["tuned_candidates"] = tuned->candidates;
      c["tuned_algo_id"] = tuned->algo_id;
      c["tuned_tile_id"] = tuned->tile;
      c["tuned_split_k"] = tuned->split_k;
      c["tuned_k_slices"] = tuned->k_slices;
      c["tuned_own_kernel"] = tuned->own_kernel ? 1.0 : 0.0;
      if (tuned->own_us > 0)
        c["tuned_own_over_tuned"] = tuned->own_us / tuned->tuned_us;  // dslab's streaming GEMM's best, cold
      c["tuned_heuristic_over_tuned"] = tuned->heuristic_us / tuned->tuned_us;
    }
    // The kernels' own time (CUPTI busy time of a cold call, median of 9): the run's mean also holds a launch.
    std::vector<double> busy;
    for (int i = 0; i < 9; ++i) {
      gpu::flush_l2();
      const gpu::KernelTimes k = gpu::kernel_times([&] { run(); });
      if (k.records == 0) break;
      busy.push_back(k.busy_s);
    }
    if (!busy.empty()) {
      const double kernel_s = summarize(busy).median;
      c["kernel_s"] = kernel_s;
      c["kernel_tb_per_s"] = 2.0 * double(p_.shape.in) * double(p_.shape.out) / kernel_s / 1e12;
    }
    return c;
  }

 private:
  Projections projections_;
  LinearPoint p_;
  uint64_t seed_ = 0;
  std::unique_ptr<BlasHandle> blas_;
  DeviceArray<__nv_bfloat16> w_, x_;
  DeviceArray<float> y_;
};

class LinearOwn : public LinearVariant {
 public:
  LinearOwn() : LinearVariant(Projections::own) {}
};
class LinearCublas : public LinearVariant {
 public:
  LinearCublas() : LinearVariant(Projections::cublas) {}
};

DSLAB_REGISTER_VARIANT(LinearOwn, "linear/own/cuda", Device::cuda,
                       "nn.Linear by dslab's weight-streaming GEMV up to 2 rows, above the fastest measured of "
                       "cuBLASLt's algorithms and dslab's streaming MMA GEMM: the layers' proj=own");
DSLAB_REGISTER_VARIANT(
    LinearCublas, "linear/cublas/cuda", Device::cuda,
    "nn.Linear by one cuBLAS GEMM, default heuristic (bf16, fp32 accumulation): the layers' proj=cublas baseline");

}  // namespace
}  // namespace dslab::linear_cuda
