// cuBLASLt GEMMs whose algorithm is chosen by timing, per shape, on the GPU they run on (as PyTorch's TunableOp
// and serving engines' tuned GEMM configs do): at decode sizes (16-128 rows of a 7168-wide input) cuBLAS's default
// heuristic picks a tile with too few CTAs for the weight to stream at HBM speed (session 22 on the H100: q_a_proj
// at 64 rows 14.8 us, 1.5 TB/s). The candidates are cuBLASLt's own heuristic list plus split-K variants of the
// algorithms that allow it; each is timed from a flushed L2, the fastest kept for the handle's lifetime.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace dslab::mla::cuda {

// One column-major strided-batched GEMM's description (cuBLAS's argument order), bf16 A and B, fp32 accumulation.
struct GemmShape {
  cublasOperation_t op_a, op_b;
  int64_t m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch;
  cudaDataType c_type;
  bool accumulate;  // beta != 0
  int alignment;    // the least of the three pointers' alignments, bytes (16 at most)
  auto tie() const {
    return std::tie(op_a, op_b, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch, c_type, accumulate, alignment);
  }
  bool operator<(const GemmShape& o) const { return tie() < o.tie(); }
};

// What tuning chose for a shape (for counters and reports).
struct TunedChoice {
  int algo_id = -1, tile = -1, split_k = 1, candidates = 0;
  double tuned_us = 0, heuristic_us = 0;  // the chosen one's and cuBLASLt's first heuristic pick's best cold time
};

class GemmTuner {
 public:
  GemmTuner(void* workspace, size_t workspace_bytes);
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // c = a·b (+ beta c) on `stream`. A shape seen for the first time is tuned first (synchronising the device),
  // unless `stream` is capturing a graph: then cuBLASLt's first heuristic pick runs, untuned and not remembered.
  void gemm(cudaStream_t stream, const GemmShape& s, const void* a, const void* b, void* c, float beta);
  // The choice for a tuned shape, or nullptr.
  const TunedChoice* choice(const GemmShape& s) const;

 private:
  // A shape's cuBLASLt descriptors and algorithm (tuned: the fastest measured; else the heuristic's first).
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace_bytes = 0;
    bool tuned = false;
    TunedChoice choice;
    ~Plan();
  };
  Plan& plan_for(const GemmShape& s);
  void tune(const GemmShape& s, Plan& p, const void* a, const void* b);
  void launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, size_t workspace_bytes, cudaStream_t stream, const void* a,
              const void* b, void* c, float beta) const;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<GemmShape, std::unique_ptr<Plan>> plans_;
};

}  // namespace dslab::mla::cuda
