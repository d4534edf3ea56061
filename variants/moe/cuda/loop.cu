// moe/loop/cuda: the naive baseline, as a model's Python loop over experts runs it: the router's counts come
// back to the host (a synchronisation per layer), then one cuBLAS GEMM each for gate, up and down of every
// expert that received tokens. Not graph-capturable: the launches depend on the routing.
#include <cuda_bf16.h>

#include "harness/cuda_check.h"
#include "variants/moe/cuda/moe_cuda.h"
#include "variants/moe/cuda/moe_kernels.cuh"

namespace dslab::moe::cuda {
namespace {

__global__ void gather_rows_kernel(const __nv_bfloat16* x, const int32_t* perm_token, int64_t rows, int64_t hidden,
                                   __nv_bfloat16* out) {
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(perm_token[r]) * hidden);
  uint4* dst = reinterpret_cast<uint4*>(out + r * hidden);
  for (int64_t i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = src[i];
}

class MoeLoopCuda final : public MoeOp {
 public:
  ~MoeLoopCuda() override {
    if (host_offsets_) cudaFreeHost(host_offsets_);
  }
  bool graph_safe() const override { return false; }

 protected:
  void prepare_experts() override {
    xg_.scratch(arena_, size_t(rows_ * hidden_));
    gate_up_.scratch(arena_, size_t(rows_ * 2 * inter_));
    h_.scratch(arena_, size_t(rows_ * inter_));
    if (!host_offsets_) DSLAB_CUDA(cudaMallocHost(&host_offsets_, size_t(experts_ + 1) * 4));
  }
  void experts() override {
    gather_rows_kernel<<<unsigned(rows_), 128, 0, stream_>>>(b_.x, perm_token_.get(), rows_, hidden_, xg_.get());
    DSLAB_CHECK_LAUNCH();
    DSLAB_CUDA(
        cudaMemcpyAsync(host_offsets_, offsets_.get(), size_t(experts_ + 1) * 4, cudaMemcpyDeviceToHost, stream_));
    DSLAB_CUDA(cudaStreamSynchronize(stream_));  // the baseline's defining cost: the host reads the routing
    const int64_t H = hidden_, I = inter_;
    for (int64_t e = 0; e < experts_; ++e) {
      const int64_t first = host_offsets_[e], n = host_offsets_[e + 1] - first;
      if (n == 0) continue;
      // gate and up into the two halves of each row of gate_up_ [rows][2I] (ldc 2I)
      gpu::gemm(blas_->get(), CUBLAS_OP_T, CUBLAS_OP_N, I, n, H, w_->gate_experts() + e * I * H, H, 0,
                xg_.get() + first * H, H, 0, gate_up_.get() + first * 2 * I, CUDA_R_32F, 2 * I, 0, 1);
      gpu::gemm(blas_->get(), CUBLAS_OP_T, CUBLAS_OP_N, I, n, H, w_->up_experts() + e * I * H, H, 0,
                xg_.get() + first * H, H, 0, gate_up_.get() + first * 2 * I + I, CUDA_R_32F, 2 * I, 0, 1);
    }
    silu_mul(gate_up_.get(), rows_, I, h_.get(), stream_);
    for (int64_t e = 0; e < experts_; ++e) {
      const int64_t first = host_offsets_[e], n = host_offsets_[e + 1] - first;
      if (n == 0) continue;
      gpu::linear(*blas_, h_.get() + first * I, n, I, w_->down_experts() + e * H * I, H, y_.get() + first * H,
                  CUDA_R_32F);
    }
  }

 private:
  DeviceArray<__nv_bfloat16> xg_, h_;
  DeviceArray<float> gate_up_;
  int32_t* host_offsets_ = nullptr;
};

}  // namespace

DSLAB_REGISTER_MOE_OP(
    MoeLoopCuda, "moe/loop/cuda",
    "naive baseline: routing read back by the host, then cuBLAS GEMMs for gate, up, down of each active expert");

}  // namespace dslab::moe::cuda
