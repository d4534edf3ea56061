// MoE and dense-MLP weights made on the device from counter-based streams (the CPU reference makes the same), and
// the dense MLP the first layers and the shared experts run.
#include "variants/moe/cuda/moe_cuda.h"

#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "harness/errors.h"
#include "variants/common/checkpoint.h"
#include "variants/common/cuda/nvtx.h"
#include "harness/host.h"
#include "harness/op_registry.h"
#include "variants/common/cuda/device_random.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/moe/cuda/moe_kernels.cuh"

namespace dslab::moe::cuda {

using gpu::linear;

// ---- weights ---------------------------------------------------------------------------------------------

void generate_mlp_weights(const ModelConfig& m, int64_t intermediate, uint64_t seed, const std::string& prefix,
                          MlpWeights* w) {
  const int64_t H = m.hidden_size, I = intermediate;
  w->intermediate = I;
  w->gate_up.resize(size_t(2 * I * H));
  w->down.resize(size_t(H * I));
  fill_random_bf16(w->gate_up.get(), size_t(I * H), seed, prefix + ".gate_proj", fan_in_scale(H));
  fill_random_bf16(w->gate_up.get() + I * H, size_t(I * H), seed, prefix + ".up_proj", fan_in_scale(H));
  fill_random_bf16(w->down.get(), size_t(H * I), seed, prefix + ".down_proj", fan_in_scale(I));
}

void generate_expert_weights(const ModelConfig& m, uint64_t seed, int64_t e, __nv_bfloat16* gate, __nv_bfloat16* up,
                             __nv_bfloat16* down) {
  const int64_t H = m.hidden_size, I = m.moe_intermediate_size;
  const std::string prefix = "experts." + std::to_string(e);
  fill_random_bf16(gate, size_t(I * H), seed, prefix + ".gate_proj", fan_in_scale(H));
  fill_random_bf16(up, size_t(I * H), seed, prefix + ".up_proj", fan_in_scale(H));
  fill_random_bf16(down, size_t(H * I), seed, prefix + ".down_proj", fan_in_scale(I));
}

void generate_moe_weights(const ModelConfig& m, int64_t experts, uint64_t seed, MoeWeights* w, bool routed_on_device) {
  const int64_t H = m.hidden_size, I = m.moe_intermediate_size, E = m.n_routed_experts;
  w->experts = experts;
  w->seed = seed;
  w->routed_on_device = routed_on_device;
  w->gate.resize(size_t(E * H));
  fill_random_bf16(w->gate.get(), size_t(E * H), seed, "gate", fan_in_scale(H));
  if (m.topk_method == "noaux_tc") {
    DeviceArray<__nv_bfloat16> b{size_t(E)};
    fill_random_bf16(b.get(), size_t(E), seed, "e_score_correction_bias", 0.1f);
    std::vector<bf16> host{};
    host.resize(size_t(E));
    DSLAB_CUDA(cudaMemcpy(host.data(), b.get(), size_t(E) * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f;
    for (auto v : host) f.push_back(to_float(v));
    w->bias.upload(f);
  }
  const int64_t on_device = routed_on_device ? experts : 0;
  w->w_gate.resize(size_t(on_device * I * H));
  w->w_up.resize(size_t(on_device * I * H));
  w->w_down.resize(size_t(on_device * H * I));
  for (int64_t e = 0; e < on_device; ++e)
    generate_expert_weights(m, seed, e, w->w_gate.get() + e * I * H, w->w_up.get() + e * I * H,
                            w->w_down.get() + e * H * I);
  if (m.n_shared_experts > 0) generate_mlp_weights(m, I * m.n_shared_experts, seed, "shared_experts", &w->shared);
  DSLAB_CUDA(cudaDeviceSynchronize());
}

void load_mlp_weights(const Checkpoint& c, const std::string& prefix, int64_t intermediate, MlpWeights* w) {
  const int64_t H = c.config().hidden_size, I = intermediate;
  std::vector<bf16> gate_up(size_t(2 * I * H)), down(size_t(H * I));
  c.read_bf16(prefix + "gate_proj.weight", {I, H}, gate_up.data());
  c.read_bf16(prefix + "up_proj.weight", {I, H}, gate_up.data() + I * H);
  c.read_bf16(prefix + "down_proj.weight", {H, I}, down.data());
  w->intermediate = I;
  w->gate_up.upload(gate_up);
  w->down.upload(down);
}

void load_moe_weights(const Checkpoint& c, int64_t layer, MoeWeights* w, bool routed_on_device) {
  const ModelConfig& m = c.config();
  const int64_t H = m.hidden_size, I = m.moe_intermediate_size, E = m.n_routed_experts;
  const std::string M = "model.layers." + std::to_string(layer) + ".mlp.";
  w->experts = E;
  w->routed_on_device = routed_on_device;
  w->gate.upload(c.bf16_tensor(M + "gate.weight", {E, H}));
  if (m.topk_method == "noaux_tc") w->bias.upload(c.f32_tensor(M + "gate.e_score_correction_bias", {E}));
  if (m.n_shared_experts > 0) load_mlp_weights(c, M + "shared_experts.", I * m.n_shared_experts, &w->shared);
  if (!routed_on_device) {
    w->checkpoint = &c;
    w->checkpoint_layer = layer;
    return;
  }
  // The experts in groups: each group's read several at a time out of the mapped shards (copies out of the page
  // cache, or the disk's read-ahead) into a pinned staging buffer, then copied to its place in the stacked layout.
  // The buffer (up to kStagingBytes) is pinned once and kept: page-locking a layer's gigabyte per load costs more
  // than the copy, and pageable copies run at a fraction of the link.
  constexpr size_t kStagingBytes = size_t(512) << 20;
  static std::mutex staging_mutex;
  static bf16* staging = nullptr;
  static size_t staging_bytes = 0;
  std::lock_guard<std::mutex> lock(staging_mutex);
  const size_t expert_bytes = size_t(3 * I * H) * 2;
  const int64_t group = std::max<int64_t>(1, std::min<int64_t>(E, int64_t(kStagingBytes / expert_bytes)));
  if (staging_bytes < size_t(group) * expert_bytes) {
    if (staging) DSLAB_CUDA(cudaFreeHost(staging));
    staging_bytes = size_t(group) * expert_bytes;
    DSLAB_CUDA(cudaMallocHost(&staging, staging_bytes));
  }
  w->w_gate.resize(size_t(E * I * H));
  w->w_up.resize(size_t(E * I * H));
  w->w_down.resize(size_t(E * H * I));
  std::string error;
  for (int64_t first = 0; first < E; first += group) {
    const int64_t n = std::min(group, E - first);
    bf16 *gate = staging, *up = gate + n * I * H, *down = up + n * I * H;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < n; ++k) {
      const std::string X = M + "experts." + std::to_string(first + k) + ".";
      try {
        c.read_bf16(X + "gate_proj.weight", {I, H}, gate + k * I * H);
        c.read_bf16(X + "up_proj.weight", {I, H}, up + k * I * H);
        c.read_bf16(X + "down_proj.weight", {H, I}, down + k * H * I);
      } catch (const std::exception& x) {
#pragma omp critical
        if (error.empty()) error = x.what();
      }
    }
    if (!error.empty()) throw BadInput(error);
    DSLAB_CUDA(cudaMemcpy(w->w_gate.get() + first * I * H, gate, size_t(n * I * H) * 2, cudaMemcpyHostToDevice));
    DSLAB_CUDA(cudaMemcpy(w->w_up.get() + first * I * H, up, size_t(n * I * H) * 2, cudaMemcpyHostToDevice));
    DSLAB_CUDA(cudaMemcpy(w->w_down.get() + first * H * I, down, size_t(n * H * I) * 2, cudaMemcpyHostToDevice));
  }
}

double moe_weight_bytes(const ModelConfig& m, int64_t experts) {
  const double H = double(m.hidden_size), I = double(m.moe_intermediate_size);
  return 2.0 *
         (double(m.n_routed_experts) * H + 3.0 * double(experts) * H * I + 3.0 * H * I * double(m.n_shared_experts));
}

// ---- MLP ---------------------------------------------------------------------------------------------------

void MlpRunner::prepare(const ModelConfig& m, const MlpWeights& w, int64_t tokens, gpu::ScratchArena* arena) {
  w_ = &w;
  hidden_ = m.hidden_size;
  tokens_ = tokens;
  gate_up_.scratch(arena, size_t(tokens * 2 * w.intermediate));
  h_.scratch(arena, size_t(tokens * w.intermediate));
}

void MlpRunner::forward(BlasHandle& blas, const __nv_bfloat16* x, float* out, float beta, cudaStream_t stream) const {
  const int64_t I = w_->intermediate;
  linear(blas, x, tokens_, hidden_, w_->gate_up.get(), 2 * I, gate_up_.get(), CUDA_R_32F);
  silu_mul(gate_up_.get(), tokens_, I, h_.get(), stream);
  linear(blas, h_.get(), tokens_, I, w_->down.get(), hidden_, out, CUDA_R_32F, beta);
}

}  // namespace dslab::moe::cuda
