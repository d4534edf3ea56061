// The shared GEMM entry points (blas.h): cuBLAS's strided batch, the tuned path, and the handle.
#include "variants/common/cuda/blas.h"

#include <algorithm>

#include "harness/errors.h"

namespace dslab::gpu {

// ---- GEMM ------------------------------------------------------------------------------------------------

void gemm(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, void* c,
          cudaDataType c_type, int64_t ldc, int64_t stride_c, int64_t batch, float beta) {
  const float alpha = 1.0f;
  DSLAB_CUBLAS(cublasGemmStridedBatchedEx(h, op_a, op_b, int(m), int(n), int(k), &alpha, a, CUDA_R_16BF, int(lda),
                                          stride_a, b, CUDA_R_16BF, int(ldb), stride_b, &beta, c, c_type, int(ldc),
                                          stride_c, int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

GemmShape gemm_shape(cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k, const void* a,
                     int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, const void* c,
                     cudaDataType c_type, int64_t ldc, int64_t stride_c, int64_t batch, float beta) {
  const auto alignment = [](const void* p) {
    const uintptr_t v = reinterpret_cast<uintptr_t>(p);
    return v % 16 == 0 ? 16 : v % 8 == 0 ? 8 : v % 4 == 0 ? 4 : 2;
  };
  const int align = std::min({alignment(a), alignment(b), alignment(c)});
  return {op_a, op_b, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch, c_type, beta != 0.0f, align};
}

void gemm(const BlasHandle& h, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, void* c,
          cudaDataType c_type, int64_t ldc, int64_t stride_c, int64_t batch, float beta) {
  if (h.projections() != Projections::own) {
    gemm(h.get(), op_a, op_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, c_type, ldc, stride_c, batch, beta);
    return;
  }
  h.tuner().gemm(
      h.stream(),
      gemm_shape(op_a, op_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, c_type, ldc, stride_c, batch, beta), a, b,
      c, beta);
}

Projections parse_projections(const std::string& text) {
  if (text == "own") return Projections::own;
  if (text == "cublas") return Projections::cublas;
  throw BadInput("axis 'proj': value '" + text + "': expected own | cublas");
}

BlasHandle::BlasHandle() {
  DSLAB_CUBLAS(cublasCreate(&h_));
  workspace_.resize(size_t(32) << 20);
  DSLAB_CUBLAS(cublasSetWorkspace(h_, workspace_.get(), workspace_.size()));
  tuner_ = std::make_unique<GemmTuner>(workspace_.get(),
                                       workspace_.size());  // one stream at a time: cuBLAS's and its calls share it
}

void BlasHandle::set_stream(cudaStream_t stream) {
  DSLAB_CUBLAS(cublasSetStream(h_, stream));
  DSLAB_CUBLAS(cublasSetWorkspace(h_, workspace_.get(), workspace_.size()));
}

cudaStream_t BlasHandle::stream() const {
  cudaStream_t stream{};
  DSLAB_CUBLAS(cublasGetStream(h_, &stream));
  return stream;
}

BlasHandle::~BlasHandle() {
  tuner_.reset();
  if (h_) cublasDestroy(h_);
}

}  // namespace dslab::gpu
