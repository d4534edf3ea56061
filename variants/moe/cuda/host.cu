// moe/host/cuda: KTransformers' split of a MoE layer. The router and the shared experts run on the GPU; the routed
// experts run on the CPU (moe::HostExperts, the engine of moe/auto/cpu: AMX or AVX-512 per expert), their weights
// in host memory only. In the step's stream: the layer input and the routing copied to pinned host memory, a host
// function that runs the experts (the shared experts meanwhile run on the GPU's side stream), each token's
// weighted sum copied back and added to the shared experts' output. No host synchronisation of the caller: the
// host function is a node of the stream (and of a captured CUDA graph).
//
// Hot experts (set_hot_experts(N), the layer's gpu_experts=hot:N): the layer's N most routed experts (profiled at
// prepare) stay on the GPU and run there as moe/grouped/cuda runs them, on the side stream after the shared experts,
// while the CPU runs the rest: the choices of hot experts reach the CPU as id -1, the GPU's rows are the hot ones
// only, and the combine adds the CPU's per-token sum to the GPU's weighted rows.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <memory>
#include <tuple>
#include <mutex>
#include <map>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/op_registry.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/moe/cuda/moe_cuda.h"
#include "variants/reference/model.h"

namespace dslab::moe::cuda {
namespace {

// Page-locked host memory: copies to and from it run at the link's rate and can be queued asynchronously.
// After the router's scan: the row tiles of the hot experts' rows (their offsets and tile size as the scan left them),
// and per (token, k) the CPU's id (-1 for a hot expert's choice) and the GPU's row (-1 for a cold one). One block.
constexpr int kHotThreads = 1024;
struct HotArgs {
  const int32_t* ids;        // [rows]
  const int32_t* slot;       // [rows]: the permuted row of each choice
  const int32_t* offsets;    // [experts + 1]
  const int32_t* hot_ids;    // [hot]
  const int32_t* hot_index;  // [experts]: slab of a hot expert, -1 for the others
  int hot, rows, tile_rows;
  int2* tiles;
  int32_t *num_tiles, *cpu_ids, *hot_slot;
};
__global__ void __launch_bounds__(kHotThreads) hot_split_kernel(HotArgs a) {
  using Scan = cub::BlockScan<int, kHotThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int h = int(threadIdx.x);
  const int e = h < a.hot ? a.hot_ids[h] : 0;
  const int first_row = h < a.hot ? a.offsets[e] : 0, n = h < a.hot ? a.offsets[e + 1] - first_row : 0;
  const int mine = (n + a.tile_rows - 1) / a.tile_rows;
  int first, total;
  Scan(temp).ExclusiveSum(mine, first, total);
  for (int i = 0; i < mine; ++i) a.tiles[first + i] = make_int2(e, first_row + i * a.tile_rows);
  if (h == 0) *a.num_tiles = total;
  for (int i = h; i < a.rows; i += kHotThreads) {
    const int id = a.ids[i];
    const bool hot = a.hot_index[id] >= 0;
    a.cpu_ids[i] = hot ? -1 : id;
    a.hot_slot[i] = hot ? a.slot[i] : -1;
  }
}

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
  ~HostMoe() override {
    if (hot_ready_) cudaEventDestroy(hot_ready_);
  }
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
    if (w_->routed_on_device)
      throw std::logic_error("moe/host/cuda: its routed experts belong in host memory (MoeWeights::routed_on_device)");
    const int threads =
        cpu_threads_ > 0
            ? cpu_threads_
            : std::max(1, int(std::thread::hardware_concurrency()) - 1);  // one core left to the thread driving the GPU
    // AMX where the CPU has it and the process may use it (the kernel per expert by the measured crossover).
    const auto kernel = cpu_info().amx_bf16 && request_amx_permission().empty() ? HostExperts::Kernel::choose
                                                                                : HostExperts::Kernel::avx512;
    choose_hot_experts();
    // Ops on the same weights (a generation engine's programs: one op a layer for each step shape) share one packed
    // copy of them and its threads; the first packs it.
    static std::mutex shared_mutex;
    static std::map<std::tuple<const MoeWeights*, int, int64_t>, std::weak_ptr<HostExperts>> shared;
    std::lock_guard<std::mutex> lock(shared_mutex);
    const auto key = std::make_tuple(w_, threads, hot_experts_);
    if (auto found = shared[key].lock()) {
      engine_ = found;
    } else {
      engine_ = std::make_shared<HostExperts>(kernel, threads);
      pack_experts();
      shared[key] = engine_;
    }
    prepare_buffers();
  }

  // The routed experts (not the hot ones: the GPU's) into host memory - a checkpoint's, or made as the reference makes
  // them - packed for the CPU kernels.
  void pack_experts() {
    const int64_t H = hidden_, I = inter_;
    std::vector<ref::MlpParams> experts(static_cast<size_t>(experts_));
    DeviceArray<__nv_bfloat16> scratch(size_t(3 * H * I));
    if (w_->checkpoint) {  // a checkpoint's, read straight into host memory, several at a time
      std::string error;
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t e = 0; e < experts_; ++e) {
        try {
          experts[size_t(e)] = ref::load_expert(*w_->checkpoint, w_->checkpoint_layer, e);
        } catch (const std::exception& x) {
#pragma omp critical
          if (error.empty()) error = x.what();
        }
      }
      if (!error.empty()) throw BadInput(error);
    }
    for (int64_t e = 0; e < experts_ && !w_->checkpoint; ++e) {
      if (hot_slab_[size_t(e)] >= 0) continue;  // the GPU's (made in its slab by choose_hot_experts)
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
  }

  void prepare_buffers() {
    const int64_t H = hidden_, I = inter_;
    x_.resize(size_t(tokens_ * H));
    ids_.resize(size_t(rows_));
    weights_.resize(size_t(rows_));
    y_host_.resize(size_t(tokens_ * H));
    if (hot_ids_.size() == 0) {
      combined_by_experts_ = true;  // y_ is left as [tokens][hidden], each token's weighted sum
      experts_sum_ = y_.get();
    } else {  // the GPU's rows in y_, the CPU's per-token sum beside them
      cpu_sum_.scratch(arena_, size_t(tokens_ * H));
      hot_h_.scratch(arena_, size_t(rows_ * I));
      experts_sum_ = cpu_sum_.get();
      combine_slot_ = hot_slot_.get();
    }
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
    std::map<std::string, double> c{{"cpu_experts_engine_s", double(kept[kept.size() / 2]) * 1e-9},
                                    {"cpu_experts_calls", double(calls)},
                                    {"cpu_experts_threads", double(engine_->threads())}};
    if (hot_ids_.size() >
        0) {  // the hot experts' share of the choices: in the profile, and in the last step (synchronises)
      std::vector<int32_t> ids(static_cast<size_t>(rows_));
      DSLAB_CUDA(cudaDeviceSynchronize());
      DSLAB_CUDA(cudaMemcpy(ids.data(), cpu_ids_.get(), size_t(rows_) * 4, cudaMemcpyDeviceToHost));
      c["gpu_hot_experts"] = double(hot_ids_.size());
      c["hot_share_profiled"] = profiled_hot_share_;
      c["hot_share"] = double(std::count(ids.begin(), ids.end(), -1)) / double(rows_);
    }
    return c;
  }

  std::vector<std::pair<const void*, size_t>> host_weights() const override {
    std::vector<int32_t> all(static_cast<size_t>(experts_));
    for (int64_t e = 0; e < experts_; ++e) all[size_t(e)] = hot_slab_[size_t(e)] >= 0 ? -1 : int32_t(e);
    return engine_ ? engine_->weights_of(all.data(), experts_) : std::vector<std::pair<const void*, size_t>>{};
  }

  void experts() override {
    if (!error_.empty())
      throw std::runtime_error("moe/host/cuda: the CPU experts failed in an earlier step: " + error_);
    const int32_t* ids = b_.topk_ids ? b_.topk_ids : topk_ids_.get();
    const float* weights = b_.topk_weights ? b_.topk_weights : topk_weights_.get();
    if (hot_ids_.size() > 0) {
      const HotArgs a{
          ids,        slot_.get(), offsets_.get(),   hot_ids_.get(),       hot_slab_device_.get(), int(hot_ids_.size()),
          int(rows_), tile_rows_,  hot_tiles_.get(), hot_num_tiles_.get(), cpu_ids_.get(),         hot_slot_.get()};
      hot_split_kernel<<<1, kHotThreads, 0, stream_>>>(a);
      DSLAB_CHECK_LAUNCH();
      mark("hot_split");
      // The GPU's share beside the CPU's: on the side stream after the shared experts (or first, without one).
      cudaStream_t gpu = side_ ? side_->stream : stream_;
      if (side_) {
        DSLAB_CUDA(cudaEventRecord(hot_ready_, stream_));
        DSLAB_CUDA(cudaStreamWaitEvent(gpu, hot_ready_, 0));
      }
      const GroupedExperts e{hot_tiles_.get(),
                             hot_num_tiles_.get(),
                             offsets_.get(),
                             perm_token_.get(),
                             hot_max_tiles_,
                             tile_rows_,
                             b_.x,
                             hot_gate_.get(),
                             hot_up_.get(),
                             hot_down_.get(),
                             hot_slab_device_.get(),
                             hidden_,
                             inter_,
                             hot_h_.get(),
                             y_.get()};
      {
        // Behind the event wait on the side stream, launched plainly (pdl.cuh: a kernel right behind another
        // stream's event wait gets no programmatic dependent launch); on the layer's own stream with it.
        const ProgrammaticLaunchScope plain_on_side_stream(side_ ? false : programmatic_launch());
        grouped_gate_up(e, gpu);
        grouped_down(e, gpu);
      }
      if (!side_) mark("hot_experts");
      ids = cpu_ids_.get();
    }
    DSLAB_CUDA(cudaMemcpyAsync(x_.get(), b_.x, size_t(tokens_ * hidden_) * 2, cudaMemcpyDeviceToHost, stream_));
    DSLAB_CUDA(cudaMemcpyAsync(ids_.get(), ids, size_t(rows_) * 4, cudaMemcpyDeviceToHost, stream_));
    DSLAB_CUDA(cudaMemcpyAsync(weights_.get(), weights, size_t(rows_) * 4, cudaMemcpyDeviceToHost, stream_));
    mark("to_host");
    DSLAB_CUDA(cudaLaunchHostFunc(stream_, &HostMoe::run_on_host, this));
    mark("cpu_experts");
    DSLAB_CUDA(cudaMemcpyAsync(hot_ids_.size() == 0 ? y_.get() : cpu_sum_.get(), y_host_.get(),
                               size_t(tokens_ * hidden_) * 4, cudaMemcpyHostToDevice, stream_));
    mark("to_device");
  }

 private:
  // The layer's hot_experts_ most routed experts (by profiled_counts; ties to the lower id), their weights made in
  // their slabs on the GPU, and the per-step buffers of the split.
  void choose_hot_experts() {
    hot_slab_.assign(size_t(experts_), -1);
    hot_ids_.resize(0);
    if (hot_experts_ <= 0) return;
    if (w_->checkpoint)
      throw BadInput(
          "moe/host/cuda: hot experts with --weights: the hot set is profiled on the seed's router (not a "
          "checkpoint's) so far");
    if (hot_experts_ >= experts_ || hot_experts_ > kHotThreads)
      throw BadInput("moe/host/cuda: hot experts: " + std::to_string(hot_experts_) + ": expected 1.." +
                     std::to_string(std::min<int64_t>(experts_ - 1, kHotThreads)));
    const std::vector<int64_t> counts = profiled_counts(kProfileTokens, w_->seed);
    std::vector<int32_t> order(static_cast<size_t>(experts_));
    for (int64_t e = 0; e < experts_; ++e) order[size_t(e)] = int32_t(e);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return counts[size_t(a)] > counts[size_t(b)]; });
    order.resize(size_t(hot_experts_));
    int64_t hot_choices = 0, all_choices = 0;
    for (int64_t e = 0; e < experts_; ++e) all_choices += counts[size_t(e)];
    for (size_t h = 0; h < order.size(); ++h)
      hot_slab_[size_t(order[h])] = int32_t(h), hot_choices += counts[size_t(order[h])];
    profiled_hot_share_ = all_choices ? double(hot_choices) / double(all_choices) : 0;
    hot_ids_.upload(order);
    hot_slab_device_.upload(hot_slab_);
    const int64_t H = hidden_, I = inter_, N = hot_experts_;
    hot_gate_.resize(size_t(N * I * H));
    hot_up_.resize(size_t(N * I * H));
    hot_down_.resize(size_t(N * H * I));
    for (int64_t h = 0; h < N; ++h)
      generate_expert_weights(m_, w_->seed, order[size_t(h)], hot_gate_.get() + h * I * H, hot_up_.get() + h * I * H,
                              hot_down_.get() + h * H * I);
    hot_max_tiles_ = int(rows_ / tile_rows_ + std::min(N, rows_));
    hot_tiles_.resize(size_t(hot_max_tiles_));
    hot_num_tiles_.resize(1);
    cpu_ids_.resize(size_t(rows_));
    hot_slot_.resize(size_t(rows_));
    if (!hot_ready_) DSLAB_CUDA(cudaEventCreateWithFlags(&hot_ready_, cudaEventDisableTiming));
  }

  // (A host function must not throw into the CUDA runtime's thread: a failure is kept, the output poisoned, and the
  // next step's experts() reports it.)
  static void CUDART_CB run_on_host(void* self) {
    auto* op = static_cast<HostMoe*>(self);
    try {
      const auto start = std::chrono::steady_clock::now();
      op->engine_->forward(reinterpret_cast<const bf16*>(op->x_.get()), op->tokens_, op->ids_.get(), op->weights_.get(),
                           op->topk_, op->y_host_.get());
      const int64_t call = op->engine_calls_.load(std::memory_order_relaxed);
      op->call_ns_[size_t(call % kKeptCalls)] =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      op->engine_calls_.store(call + 1, std::memory_order_release);
    } catch (const std::exception& e) {
      op->error_ = e.what();
      std::fill_n(op->y_host_.get(), size_t(op->tokens_ * op->hidden_), std::nanf(""));
    }
  }

  std::shared_ptr<HostExperts> engine_;  // (shared by the ops on the same weights)
  // Hot experts: expert -> slab (-1: the CPU's), on the host and the device; the slabs' ids; their weights.
  static constexpr int64_t kProfileTokens = 4096;
  std::vector<int32_t> hot_slab_;
  DeviceArray<int32_t> hot_ids_, hot_slab_device_;
  DeviceArray<__nv_bfloat16> hot_gate_, hot_up_, hot_down_;  // [hot][I][H], [hot][I][H], [hot][H][I]
  double profiled_hot_share_ = 0;                            // of the profile's choices, those of the hot experts
  int hot_max_tiles_ = 0;
  DeviceArray<int2> hot_tiles_;
  DeviceArray<int32_t> hot_num_tiles_, cpu_ids_, hot_slot_;  // [1], [rows], [rows]
  DeviceArray<__nv_bfloat16> hot_h_;                         // [rows][I] (scratch)
  DeviceArray<float> cpu_sum_;                               // [tokens][hidden] (scratch)
  cudaEvent_t hot_ready_{};
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

DSLAB_REGISTER_MOE_OP(
    HostMoe, "moe/host/cuda",
    "KTransformers' split: router and shared experts on the GPU, routed experts on the CPU (AMX/AVX-512 engine) "
    "through pinned memory and a host function in the stream (graph-capturable)");

}  // namespace dslab::moe::cuda
