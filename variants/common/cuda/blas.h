// The GEMMs every GPU family shares: a cuBLAS handle with its own workspace, the strided-batch GEMM, and
// nn.Linear at decode and prefill sizes (own GEMVs, cuBLASLt tuned per shape, or cuBLAS's default: the proj axis).
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <memory>
#include <string>

#include "variants/common/cuda/device_array.h"
#include "variants/common/cuda/tuned_gemm.h"

namespace dslab::gpu {

// A cuBLAS handle with a workspace of its own (cuBLAS must not allocate inside a graph capture).
enum class Projections { own, cublas };
class BlasHandle {
 public:
  BlasHandle();
  ~BlasHandle();
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  cublasHandle_t get() const { return h_; }
  // Every call goes to `stream` from here on, with this handle's workspace (cublasSetStream resets it).
  void set_stream(cudaStream_t stream);
  cudaStream_t stream() const;  // the one set last (cuBLAS's: 0 until then)
  // Which backend linear() takes for decode-sized products on this handle (the `proj` axis sets it; a new handle starts
  // with cublas).
  void set_projections(Projections p) { projections_ = p; }
  Projections projections() const { return projections_; }
  // cuBLASLt with the algorithm timed fastest per shape (tuned_gemm.h): the own projections' path above kGemvRows.
  GemmTuner& tuner() const { return *tuner_; }

 private:
  cublasHandle_t h_ = nullptr;
  DeviceArray<uint8_t> workspace_;
  std::unique_ptr<GemmTuner> tuner_;
  Projections projections_ = Projections::cublas;
};

// One layer's attention weights on the device (HF names). The two projections of the layer input are stacked
// into qkv_a, since both read the same input: q_a_proj and kv_a_proj_with_mqa for q_lora_rank models, q_proj and

// cuBLAS column-major GEMM over a strided batch with fp32 accumulation; every MLA matmul goes through here.
void gemm(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, void* c,
          cudaDataType c_type, int64_t ldc, int64_t stride_c, int64_t batch, float beta = 0.0f);
// The same on a handle's stream, by its projections: own, cuBLASLt with the algorithm tuned for the shape
// (h.tuner()); cublas, the call above (cuBLAS's default heuristic: the baseline).
void gemm(const BlasHandle& h, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, void* c,
          cudaDataType c_type, int64_t ldc, int64_t stride_c, int64_t batch, float beta = 0.0f);
// The GemmShape that gemm(h, ...) tunes for these arguments (for a tuned choice's counters).
GemmShape gemm_shape(cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k, const void* a,
                     int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, const void* c,
                     cudaDataType c_type, int64_t ldc, int64_t stride_c, int64_t batch, float beta);
// linear()'s GEMM above kGemvRows, in gemm()'s column-major terms: y^T [out x rows] = w [in x out]^T · x^T [in x rows].
GemmShape linear_gemm_shape(const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out,
                            const void* y, cudaDataType y_type, float beta);
// Row-major nn.Linear: y[rows][out] = x[rows][in] · w[out][in]^T (+ beta y), on the handle's stream
// (variants/common/cuda/gemv.cu). With the handle's projections set to own, decode sizes (rows up to kGemvRows)
// go to a weight-streaming GEMV of ours (gemv_split warps per output feature, weights prefetched under PDL), more
// rows to cuBLASLt tuned for the shape (gemm(const BlasHandle&, ...)); with cublas, to cuBLAS's default heuristic.
// `linear/{own,cublas}/cuda` time both per weight shape in one sweep: on the H100 the GEMV's per-row FMAs and input
// loads made it 0.5-0.8x cuBLAS from 4 rows on, hence the limit of 2.
void linear(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out,
            void* y, cudaDataType y_type, float beta = 0.0f);
// linear() into fp32 y, but where the tuned cuBLASLt way cuts K into slices their partials are left unsummed for
// the caller's next kernel to add up (GemmTuner::gemm_unsummed); otherwise y itself, count 1.
KSlices linear_unsummed(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w,
                        int64_t out, float* y);
// Two nn.Linears of one input whose weights are stacked, w = [out1 + out2][in]: y1[rows][out1] (y1_type) from the
// first out1 rows, y2[rows][out2] (fp32) from the rest. Where linear() would take the own GEMV, one launch streams
// both (a decode step's kv_a_proj_with_mqa alone, 2.4 MB at V2-Lite, took ~10 us, mostly the launch's ramp and
// tail); otherwise two linear() calls.
void linear_pair(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w,
                 int64_t out1, void* y1, cudaDataType y1_type, int64_t out2, float* y2);
constexpr int64_t kGemvRows = 2;
// Per-head products of the absorbed forms at decode sizes, batched over `batch` heads: y[m][b][0..N) (bf16) =
// sum_k x[m][b][k] w_b(k, n) for rows m < rows, x's rows ldx apart (batch b at x + b x_batch), y's ldy apart (at
// y + b y_batch), w_b at w + b w_batch: [N][K] rows (W_UV into the output) or, w_k_major, [K][N] rows (W_UK into the
// query). The own kernels of gemv.cu (weights prefetched under PDL as linear()'s) where the handle's projections
// are own, rows <= kGemvRows and the operands allow 16-byte loads; otherwise nothing is launched and the result is
// false (the caller's cuBLAS batched GEMM then does it).
struct BatchedGemv {
  const __nv_bfloat16* x;
  int64_t ldx, x_batch, K;
  const __nv_bfloat16* w;
  int64_t w_batch, N;
  bool w_k_major;
  __nv_bfloat16* y;
  int64_t ldy, y_batch;
};
bool batched_gemv(const BlasHandle& h, const BatchedGemv& g, int64_t rows, int64_t batch);
// Whether batched_gemv would launch an own kernel for these operands (no launch).
bool batched_gemv_fits(const BlasHandle& h, const BatchedGemv& g, int64_t rows);
// Warps per output feature of the own GEMV (1..8, one CTA at most): for a small matrix the most that keep the grid
// within one wave of `resident_warps`, for a long row enough that each lane loads about one batch; at least one
// 16-byte chunk of the row per lane.
int gemv_split(int64_t out, int64_t in, int64_t resident_warps);
// The split linear() uses on this GPU for `rows` (1..kGemvRows) rows.
int own_gemv_split(int64_t rows, int64_t out, int64_t in);
Projections parse_projections(const std::string& text);  // BadInput unless own | cublas

}  // namespace dslab::gpu
