// moe/host/cuda: KTransformers' split of a MoE layer. The router and the shared experts run on the GPU; the routed
// experts run on the CPU (moe::HostExperts, the engine of moe/auto/cpu: AMX or AVX-512 per expert), their weights
// in host memory only. In the step's stream: the layer input and the routing copied to pinned host memory, a host
// function that runs the experts (the shared experts meanwhile run on the GPU's side stream), each token's
// weighted sum copied back and added to the shared experts' output. No host synchronisation of the caller: the
// host function is a node of the stream (and of a captured CUDA graph).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/op_registry.h"
#include "variants/moe/cuda/moe_cuda.h"

namespace dslab::moe::cuda {
namespace {

// Page-locked host memory: copies to and from it run at the link's rate and can be queued asynchronously.
template <class T>
class PinnedArray {
 public:
  PinnedArray() = default;
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() {
    if (p_) cudaFreeHost(p_);
  }
  void resize(size_t n) {
    if (n <= n_) return;
    if (p_) DSLAB_CUDA(cudaFreeHost(p_));
    p_ = nullptr;
    DSLAB_CUDA(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    n_ = n;
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

class HostMoe final : public MoeOp {
 public:
  bool graph_safe() const override { return true; }
  bool experts_on_host() const override { return true; }
  std::string unavailable() const override {
    if (!cpu_info().avx512_bf16) return "the CPU experts need AVX512_BF16 (moe::HostExperts)";
    return "";
  }

 protected:
  // The layer's experts, made as the reference makes them (on the device, then copied here: the counter-based
  // generator is the GPU's fastest way to make gigabytes), packed for the CPU kernels, and the pinned buffers.
  void prepare_experts() override {
    if (w_->routed_on_device) throw std::logic_error("moe/host/cuda: its routed experts belong in host memory (MoeWeights::routed_on_device)");
    const int64_t H = hidden_, I = inter_;
    const int threads = cpu_threads_ > 0 ? cpu_threads_ : std::max(1, int(std::thread::hardware_concurrency()) - 1);  // one core left to the thread driving the GPU
    // AMX where the CPU has it and the process may use it (the kernel per expert by the measured crossover).
    const auto kernel = cpu_info().amx_bf16 && request_amx_permission().empty() ? HostExperts::Kernel::choose : HostExperts::Kernel::avx512;
    if (!engine_ || engine_->threads() != threads) engine_ = std::make_unique<HostExperts>(kernel, threads);
    std::vector<ref::MlpParams> experts(static_cast<size_t>(experts_));
    DeviceArray<__nv_bfloat16> scratch(size_t(3 * H * I));
    for (int64_t e = 0; e < experts_; ++e) {
      generate_expert_weights(m_, w_->seed, e, scratch.get(), scratch.get() + I * H, scratch.get() + 2 * I * H);
      ref::MlpParams& p = experts[size_t(e)];
      p.gate_proj.resize(size_t(I * H));
      p.up_proj.resize(size_t(I * H));
      p.down_proj.resize(size_t(H * I));
      DSLAB_CUDA(cudaMemcpy(p.gate_proj.data(), scratch.get(), size_t(I * H) * 2, cudaMemcpyDeviceToHost));
      DSLAB_CUDA(cudaMemcpy(p.up_proj.data(), scratch.get() + I * H, size_t(I * H) * 2, cudaMemcpyDeviceToHost));
      DSLAB_CUDA(cudaMemcpy(p.down_proj.data(), scratch.get() + 2 * I * H, size_t(H * I) * 2, cudaMemcpyDeviceToHost));
    }
    engine_->set_weights(m_, experts);
    x_.resize(size_t(tokens_ * H));
    ids_.resize(size_t(rows_));
    weights_.resize(size_t(rows_));
    y_host_.resize(size_t(tokens_ * H));
    combined_by_experts_ = true;  // y_ comes back as [tokens][hidden], each token's weighted sum
    call_ns_.assign(kKeptCalls, 0);
    engine_calls_ = 0;
  }

  // The engine's own wall time per call inside the host function (median of the last calls), against which the
  // stream's view of the `cpu_experts` op (the host function's wake and hand-off, then the engine) can be read.
  std::map<std::string, double> own_counters() const override {
    const int64_t calls = engine_calls_.load();
    if (calls == 0) return {};
    std::vector<int64_t> kept(call_ns_.begin(), call_ns_.begin() + std::min<int64_t>(calls, kKeptCalls));
    std::nth_element(kept.begin(), kept.begin() + kept.size() / 2, kept.end());
    return {{"cpu_experts_engine_s", double(kept[kept.size() / 2]) * 1e-9},
            {"cpu_experts_calls", double(calls)},
            {"cpu_experts_threads", double(engine_->threads())}};
  }

  void experts() override {
    if (!error_.empty()) throw std::runtime_error("moe/host/cuda: the CPU experts failed in an earlier step: " + error_);
    const int32_t* ids = b_.topk_ids ? b_.topk_ids : topk_ids_.get();
    const float* weights = b_.topk_weights ? b_.topk_weights : topk_weights_.get();
    DSLAB_CUDA(cudaMemcpyAsync(x_.get(), b_.x, size_t(tokens_ * hidden_) * 2, cudaMemcpyDeviceToHost, stream_));
    DSLAB_CUDA(cudaMemcpyAsync(ids_.get(), ids, size_t(rows_) * 4, cudaMemcpyDeviceToHost, stream_));
    DSLAB_CUDA(cudaMemcpyAsync(weights_.get(), weights, size_t(rows_) * 4, cudaMemcpyDeviceToHost, stream_));
    mark("to_host");
    DSLAB_CUDA(cudaLaunchHostFunc(stream_, &HostMoe::run_on_host, this));
    mark("cpu_experts");
    DSLAB_CUDA(cudaMemcpyAsync(y_.get(), y_host_.get(), size_t(tokens_ * hidden_) * 4, cudaMemcpyHostToDevice, stream_));
    mark("to_device");
  }

 private:
  // (A host function must not throw into the CUDA runtime's thread: a failure is kept, the output poisoned, and the
  // next step's experts() reports it.)
  static void CUDART_CB run_on_host(void* self) {
    auto* op = static_cast<HostMoe*>(self);
    try {
      const auto start = std::chrono::steady_clock::now();
      op->engine_->forward(reinterpret_cast<const bf16*>(op->x_.get()), op->tokens_, op->ids_.get(), op->weights_.get(), op->topk_,
                           op->y_host_.get());
      const int64_t call = op->engine_calls_.load(std::memory_order_relaxed);
      op->call_ns_[size_t(call % kKeptCalls)] = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      op->engine_calls_.store(call + 1, std::memory_order_release);
    } catch (const std::exception& e) {
      op->error_ = e.what();
      std::fill_n(op->y_host_.get(), size_t(op->tokens_ * op->hidden_), std::nanf(""));
    }
  }

  std::unique_ptr<HostExperts> engine_;
  PinnedArray<__nv_bfloat16> x_;
  PinnedArray<int32_t> ids_;
  PinnedArray<float> weights_, y_host_;
  std::string error_;
  // Written by the CUDA runtime's host-function thread, read after the stream is synchronised.
  static constexpr int64_t kKeptCalls = 1024;
  std::vector<int64_t> call_ns_;
  std::atomic<int64_t> engine_calls_{0};
};

}  // namespace

DSLAB_REGISTER_MOE_OP(HostMoe, "moe/host/cuda",
                      "KTransformers' split: router and shared experts on the GPU, routed experts on the CPU (AMX/AVX-512 engine) "
                      "through pinned memory and a host function in the stream (graph-capturable)");

}  // namespace dslab::moe::cuda
