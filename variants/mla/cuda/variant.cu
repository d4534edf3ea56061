// The family variant mla/<form>/cuda: one point's problem, the op on it (eager or one replayed CUDA graph),
// verification of every request against the fp64 reference, and the counters a GPU MLA result carries.
#include "variants/mla/cuda/mla_cuda.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "harness/errors.h"
#include "harness/gpu.h"
#include "harness/host.h"
#include "harness/op_registry.h"
#include "harness/tuning.h"
#include "variants/common/cuda/device_random.h"
#include "variants/common/cuda/nvtx.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/rng.h"
#include "variants/mla/cuda/kernels.cuh"

namespace dslab::mla::cuda {

// ---- the family variant ----------------------------------------------------------------------------------

GpuVariant::GpuVariant(const std::string& op_name) : op_(make_mla_op(op_name)) {
  if (!op_) throw std::logic_error("no MLA op named " + op_name);
}

GpuVariant::~GpuVariant() {
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
}

std::vector<std::pair<std::string, std::string>> GpuVariant::axes() const {
  std::vector<std::pair<std::string, std::string>> a = {
      {"batch", "1"},       {"q_len", "1"},
      {"kv_len", "4096"},   {"heads", ""},
      {"page_size", "64"},  {"len_dist", "uniform"},
      {"kv_dtype", "bf16"}, {"executor", op_->fused() ? "graph" : "eager"},
      {"proj", "own"}};
  if (op_->fused()) {
    a.push_back({"kv_splits", "auto"});    // the split-KV CTAs per row tile (auto: auto_kv_splits)
    a.push_back({"split_plan", "auto"});   // how the keys are cut among CTAs (auto: per_request where it applies)
    a.push_back({"block_keys", "auto"});   // keys a block (auto: the kernel's choice for the rows and cache type)
    a.push_back({"l2_evict", "auto"});     // the blocks' L2 hint (auto: evict_first in the 64-key kernel on short runs)
    a.push_back({"fused_absorbs", "on"});  // the absorbs inside the norm's and the merge's launches
  }
  if (op_->sparse()) a.insert(a.end(), {{"budget", "2048"}, {"local", "64"}});
  return a;
}

Support GpuVariant::available() const {
  if (const std::string why = op_->unavailable(); !why.empty()) return Support::no(why);
  return {};
}

Support GpuVariant::supports(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  request_lengths(point.text("len_dist"), 1, 1, 0);  // validates the name
  if (!model.weights.empty() && s.heads != m.num_attention_heads)
    return Support::no("--weights: heads " + std::to_string(s.heads) + ": the checkpoint's weights are for all " +
                       std::to_string(m.num_attention_heads) + " heads");
  const std::string why = op_->unsupported(m, s);
  if (!why.empty()) return Support::no(why);
  return gpu_fits(device_memory_bytes(model, point));
}

Cost GpuVariant::cost(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  Shape s = shape_of(m, point);
  if (!op_->sparse()) return mla::cost(m, op_->algo(), s);  // mixed lengths cache the same total, so the same cost
  // Sparse: the attention over the kept keys (of the longest request, as the dense cost counts every request's
  // keys at kv_len), plus the selection's own reads and work.
  const int64_t page_size = point.integer("page_size");
  const Cost select = op_->selection_cost(m, s, page_size);
  s.kv_len = op_->attended_keys(s.keys(), page_size, s) - s.q_len;
  Cost c = mla::cost(m, op_->algo(), s);
  c.flops += select.flops;
  c.bytes += select.bytes;
  return c;
}

double GpuVariant::host_memory_bytes(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  // The problem's host copy of the weights and their stacked q_a/kv_a upload, the inputs, the reference rows.
  return 2 * weight_bytes(m, s.heads) + double(s.tokens()) * double(m.hidden_size) * (2 + 4 + 8);
}

double GpuVariant::device_memory_bytes(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  return device_bytes(*op_, m, shape_of(m, point), point.integer("page_size"), point.text("len_dist"));
}

namespace {

// Seconds a step takes: the median of 5 rounds of 10 back-to-back steps (gpu::time_seconds), after 3 to warm up.
double time_steps(const std::function<void()>& step) {
  for (int i = 0; i < 3; ++i) step();
  const auto ten_steps = [&] {
    for (int i = 0; i < 10; ++i) step();
  };
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) rounds.push_back(gpu::time_seconds(ten_steps, /*flush_l2=*/false) / 10);
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

}  // namespace

void GpuVariant::prepare(const ModelFile& model, const Point& point, uint64_t seed) {
  m_ = parse_model_config(model.config, model.name, model.path);
  s_ = shape_of(m_, point);
  p_ = gpu_problem(m_, s_, point.integer("page_size"), point.text("len_dist"), seed, model.weights);
  if (graph_exec_) {  // a graph captured for an earlier point replays that point's buffers
    DSLAB_CUDA(cudaGraphExecDestroy(graph_exec_));
    graph_exec_ = nullptr;
  }
  if (!blas_) blas_ = std::make_unique<BlasHandle>();
  blas_->set_projections(parse_projections(point.text("proj")));
  out_.resize(size_t(s_.tokens() * m_.hidden_size));
  DSLAB_CUDA(cudaMemset(out_.get(), 0xff, out_.size() * 4));  // NaN: verification fails if run() leaves any unwritten
  MlaBuffers b;
  b.x = p_->x.get();
  b.out = out_.get();
  b.cache = &p_->cache;
  b.lengths = p_->lengths_dev.get();
  b.rope_cos = p_->rope_cos.get();
  b.rope_sin = p_->rope_sin.get();
  op_->use_tuned_launches(true);
  auto prepare_op = [&](const Shape& s) {
    op_->prepare(m_, s, p_->max_keys, p_->weights, b, *blas_, /*lengths_vary=*/false);
    schedule_ = op_->schedule(p_->lengths);
    if (!schedule_.blob.empty())
      DSLAB_CUDA(
          cudaMemcpy(op_->schedule_buffer(), schedule_.blob.data(), schedule_.blob.size() * 4, cudaMemcpyHostToDevice));
  };
  prepare_op(s_);
  // Each choice the op took from its default table where the tuning cache had none: measured now, each candidate's
  // step timed on this point (eager, the same inputs), the fastest kept in the cache; the op prepared again takes it.
  // In order: a later choice is timed with the earlier ones settled.
  for (size_t i = 0; TuningCache::instance().mode() != TuningCache::Mode::off; ++i) {
    const auto choices = op_->tuned_choices();
    if (i >= choices.size()) break;
    const auto& t = choices[i];
    if (t.from_cache) continue;
    double best_s = 0;
    int64_t best = -1;
    for (int64_t candidate : t.candidates) {
      Shape s = s_;
      s.*t.field = candidate;
      prepare_op(s);
      const double seconds = time_steps([&] { op_->forward(0); });
      if (best < 0 || seconds < best_s) best = candidate, best_s = seconds;
    }
    TuningCache::instance().record(t.family, t.key, best);
    prepare_op(s_);
  }
  if (point.text("executor") == "graph") capture_graph();
}

void GpuVariant::capture_graph() {
  op_->forward(
      0);  // once outside the capture: first-call initialisation (kernel attributes, cuBLAS heuristics) happens here
  DSLAB_CUDA(cudaDeviceSynchronize());
  cudaStream_t capture{};
  DSLAB_CUDA(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
  cudaGraph_t graph{};
  DSLAB_CUDA(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal));
  try {
    op_->forward(capture);
  } catch (...) {
    cudaStreamEndCapture(capture, &graph);
    throw;
  }
  DSLAB_CUDA(cudaStreamEndCapture(capture, &graph));
  DSLAB_CUDA(cudaGraphInstantiate(&graph_exec_, graph, 0));
  DSLAB_CUDA(cudaGraphDestroy(graph));
  DSLAB_CUDA(cudaStreamDestroy(capture));
  DSLAB_CUDA(cudaMemset(out_.get(), 0xff, out_.size() * 4));  // verification must see the timed runs' output
}

void GpuVariant::run() {
  if (graph_exec_) {
    DSLAB_CUDA(cudaGraphLaunch(graph_exec_, 0));
    return;
  }
  op_->forward(0);
}

Verification GpuVariant::verify() {
  host_out_.resize(out_.size());
  DSLAB_CUDA(cudaDeviceSynchronize());
  DSLAB_CUDA(cudaMemcpy(host_out_.data(), out_.get(), out_.size() * 4, cudaMemcpyDeviceToHost));
  const int64_t rows = s_.q_len * m_.hidden_size;
  std::vector<float> out;
  std::vector<double> ref, dense;
  // A sparse op against the reference over the keys it chose (what it computes), and against dense attention (what
  // the choice lost: rel_err_vs_dense, a counter).
  const std::vector<std::vector<int64_t>> chosen = op_->attended_key_indices();
  double mass = 0;
  for (int64_t b : p_->verified_requests) {
    const auto& r = p_->reference(b);
    out.insert(out.end(), host_out_.begin() + b * rows, host_out_.begin() + (b + 1) * rows);
    dense.insert(dense.end(), r.begin(), r.end());
    if (op_->sparse()) {
      double inside = 0;
      const auto sparse_ref = p_->reference_over(b, &chosen.at(size_t(b)), &inside);
      ref.insert(ref.end(), sparse_ref.begin(), sparse_ref.end());
      mass += inside / double(p_->verified_requests.size());
    }
  }
  if (op_->sparse()) {
    rel_err_vs_dense_ = ref::relative_l2_error(out.data(), dense.data(), dense.size());
    double kept = 0;
    for (const auto& k : chosen) kept += double(k.size());
    attended_keys_mean_ = kept / double(std::max<size_t>(1, chosen.size()));
    mass_recall_ = mass;
  } else {
    ref = std::move(dense);
  }
  // bf16 caches hold the reference's own values; int8 and fp8 caches add their quantisation error.
  const double threshold = s_.kv_dtype == KvDtype::bf16 ? 1e-2 : s_.kv_dtype == KvDtype::int8 ? 3e-2 : 8e-2;
  return {ref::relative_l2_error(out.data(), ref.data(), ref.size()), threshold};
}

std::map<std::string, double> GpuVariant::counters() {
  std::map<std::string, double> c = gpu::time_ops([&](gpu::OpMarks& marks) { op_->forward(0, &marks); });
  c["verified_requests"] = double(p_->verified_requests.size());
  c["cuda_graph"] = graph_exec_ ? 1.0 : 0.0;
  c["longest_request"] = double(p_->max_keys - s_.q_len);
  c["shortest_request"] = double(*std::min_element(p_->lengths.begin(), p_->lengths.end()));
  if (op_->fused()) {
    c["segments"] = double(schedule_.segments);
    c["merges"] = schedule_.merges ? 1.0 : 0.0;
  }
  for (const auto& [name, value] : op_->phase_counters()) c[name] = value;
  // The replayed step as the GPU ran it (CUPTI, from a flushed L2): each kernel's start and end from the first one's
  // start, numbered in start order (step_start_us.05_decode_kernel), and the kernels' busy time (their union) against
  // the span: where the graph loses time between kernels, which the eager op_us (an event between every two kernels)
  // cannot show. Absent where another tool holds CUPTI (compute-sanitizer).
  if (graph_exec_) {
    gpu::flush_l2();
    const gpu::KernelTimes t = gpu::kernel_times([&] { run(); });
    if (t.records) {
      c["step_gpu.span_us"] = t.span_s * 1e6;
      c["step_gpu.busy_us"] = t.busy_s * 1e6;
      for (size_t i = 0; i < t.timeline.size(); ++i) {
        const std::string key = (i < 10 ? "0" : "") + std::to_string(i) + "_" + t.timeline[i].name;
        c["step_start_us." + key] = t.timeline[i].start_s * 1e6;
        c["step_end_us." + key] = t.timeline[i].end_s * 1e6;
      }
    }
  }

  // The attention kernel's own numbers beside the step's (comparable with FlashMLA's and FlashInfer's): its time
  // (fused: decode + split merge, ending at o_lat as FlashInfer's kernel does - the step's merge also absorbs the
  // output where it can, attention_core_only; unfused: the attend op), work and traffic; the results add its
  // roofline fraction.
  // A sparse op's attention is its selection plus the decode over the kept keys (selection_share: the first's part).
  // Where the decode and its merge are two kernels (mla/fused/cuda), they are timed as one bracket, in steps of their
  // own with no mark between them (op_us.decode and op_us.combine stay, from the marked steps): that mark's event kept
  // the merge from launching early (PDL), which the graph-replayed step does not, and a core with its merge inside one
  // kernel (FlashInfer's) never paid it - 0.1-1.4% of the kernel at 16 heads, up to 3.6% at 128 heads (H100,
  // 29).
  auto op_us = [&](const char* op) { return c.count(op) ? c.at(op) : 0.0; };
  double kernel_us = op_->fused() ? op_us("op_us.decode") : op_us("op_us.attend");
  if (op_->fused() && c.count("op_us.combine")) {
    struct CoreOnly {  // (attention_core_only for these steps, off again however they end)
      MlaOp& op;
      explicit CoreOnly(MlaOp& o) : op(o) { op.attention_core_only(true); }
      ~CoreOnly() { op.attention_core_only(false); }
    } core_only(*op_);
    const std::map<std::string, double> core = gpu::time_ops([&](gpu::OpMarks& marks) {
      marks.leave_out("decode");
      op_->forward(0, &marks);
    });
    kernel_us = core.at("op_us.combine");
  }
  Cost k;
  if (op_->sparse()) {
    const int64_t page_size = p_->page_size;
    std::vector<int64_t> kept(p_->lengths);
    for (int64_t& l : kept) l = op_->attended_keys(l + s_.q_len, page_size, s_) - s_.q_len;
    k = attention_kernel_cost(m_, op_->algo(), s_, kept, true);
    const Cost select = op_->selection_cost(m_, s_, page_size);
    k.flops += select.flops, k.bytes += select.bytes;
    double select_us = 0;
    for (const auto& [name, value] : c)
      if (name.rfind("op_us.select", 0) == 0) select_us += value;
    kernel_us += select_us;
    if (kernel_us > 0) c["selection_share"] = select_us / kernel_us;
    for (const auto& [name, value] : op_->selection_counters()) c[name] = value;
  } else {
    k = attention_kernel_cost(m_, op_->algo(), s_, p_->lengths, op_->fused());
  }
  if (kernel_us > 0) {
    c["kernel_s"] = kernel_us * 1e-6;
    c["kernel_flops"] = k.flops;
    c["kernel_bytes"] = k.bytes;
    c["kernel_tflops_per_s"] = k.flops / (kernel_us * 1e-6) * 1e-12;
    c["kernel_tb_per_s"] = k.bytes / (kernel_us * 1e-6) * 1e-12;
  }
  return c;
}

std::map<std::string, double> GpuVariant::verification_counters() const {
  if (!op_->sparse() || attended_keys_mean_ == 0) return {};
  return {
      {"rel_err_vs_dense", rel_err_vs_dense_}, {"attended_keys", attended_keys_mean_}, {"mass_recall", mass_recall_}};
}

std::vector<DumpTensor> GpuVariant::tensors() const {
  std::vector<DumpTensor> t;
  if (!host_out_.empty())
    t.push_back({"output", "F32", {s_.batch, s_.q_len, m_.hidden_size}, host_out_.data(), host_out_.size() * 4});
  t.push_back(
      {"hidden_states", "BF16", {s_.batch, s_.q_len, m_.hidden_size}, p_->hidden.data(), p_->hidden.size() * 2});
  return t;
}

}  // namespace dslab::mla::cuda
