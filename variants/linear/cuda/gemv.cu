// linear(): the one place every decode- and prefill-sized nn.Linear of the GPU variants goes through, and the
// weight-streaming GEMV of our own that it picks for decode sizes when a handle's projections are `own`.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "harness/cuda_check.h"
#include "variants/common/pdl.cuh"
#include "variants/mla/cuda/mla_cuda.h"

namespace dslab::mla::cuda {

namespace {

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvUnroll = 8;  // 16-byte weight loads each lane keeps in flight

// y[m][n] (+ beta y) = sum_k x[m][k] w[n][k] for M rows; features n >= N1 (a second weight stacked under the
// first) go to y2[m][n - N1] in fp32 instead (N1 = N: none). `split` warps share one output feature, each streaming
// one K slice of its weight row, so that a small matrix (kv_a: 576 rows) still spreads over every SM with all of
// its bytes in flight at once; a CTA holds kGemvWarps / split output features.
//
// The first batch of weight loads is issued before pdl_wait(): the weights are constant for the whole step, so
// under programmatic dependent launch they stream in while the kernel before this one finishes (only x and y
// depend on it). That overlap is what cuBLAS's GEMMs, launched without the attribute, cannot have.
template <int M>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const __nv_bfloat16* x, int64_t K, const __nv_bfloat16* w,
                                                            int64_t N, int split, void* y, bool y_bf16, float beta, int64_t N1,
                                                            float* y2) {
  __shared__ float partial[kGemvWarps][M];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t n = int64_t(blockIdx.x) * (kGemvWarps / split) + warp / split;
  const int slice = warp % split;
  const int64_t chunks = K / 8;  // 16-byte chunks per row
  const int64_t per_slice = (chunks + split - 1) / split;
  const int64_t begin = min(chunks, slice * per_slice), end = min(chunks, begin + per_slice);
  const bool row_ok = n < N;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (row_ok ? n : 0) * K);
  const uint4* xr = reinterpret_cast<const uint4*>(x);

  uint4 v[kGemvUnroll];
  auto load = [&](int64_t c) {
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t at = c + 32 * u;
      v[u] = row_ok && at < end ? __ldcs(wr + at) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
    }
  };
  int64_t c = begin + lane;
  load(c);
  pdl_wait();  // x (and y, with beta) come from the kernels before this one
  pdl_launch_dependents();

  float acc[M] = {};
  while (true) {
    // All of the batch's input loads first, then the arithmetic: a load behind a bounds branch could not be
    // hoisted, and each would wait out its own L2 round trip. Lanes past the slice's end read a valid chunk and
    // multiply it by the zero weights loaded for them.
#pragma unroll
    for (int m = 0; m < M; ++m) {
      uint4 xv[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) xv[u] = __ldg(xr + m * chunks + min(c + 32 * u, end - 1));
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
        const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv[u]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 a = __bfloat1622float2(w2[i]), b = __bfloat1622float2(x2[i]);
          acc[m] = fmaf(a.x, b.x, fmaf(a.y, b.y, acc[m]));
        }
      }
    }
    c += 32 * kGemvUnroll;
    if (c >= end) break;
    load(c);
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
    for (int o = 16; o; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  if (split > 1) {
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < M; ++m) partial[warp][m] = acc[m];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = 0;
      for (int j = 0; j < split; ++j) s += partial[warp + j][m];
      acc[m] = s;
    }
  }
  if (!row_ok || lane >= M) return;
  float out = 0;
#pragma unroll
  for (int m = 0; m < M; ++m) out = lane == m ? acc[m] : out;
  if (n >= N1) {
    y2[int64_t(lane) * (N - N1) + (n - N1)] = out;
    return;
  }
  const int64_t at = int64_t(lane) * N1 + n;
  if (y_bf16) {
    __nv_bfloat16* yb = static_cast<__nv_bfloat16*>(y);
    yb[at] = __float2bfloat16_rn(beta != 0.0f ? out + beta * __bfloat162float(yb[at]) : out);
  } else {
    float* yf = static_cast<float*>(y);
    yf[at] = beta != 0.0f ? out + beta * yf[at] : out;
  }
}

// Warps of gemv_kernel<M> the whole GPU holds at once (its occupancy, from its registers, times the SMs).
template <int M>
int64_t resident_warps() {
  static const int64_t warps = [] {
    int device = 0, sms = 0, ctas_per_sm = 0;
    DSLAB_CUDA(cudaGetDevice(&device));
    DSLAB_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    DSLAB_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, gemv_kernel<M>, kGemvThreads, 0));
    return int64_t(sms) * ctas_per_sm * kGemvWarps;
  }();
  return warps;
}

// (out2 > 0: the last out2 of the `out` features into y2, see gemv_kernel)
template <int M>
void launch_gemv(const __nv_bfloat16* x, int64_t in, const __nv_bfloat16* w, int64_t out, void* y, bool bf16, float beta,
                 cudaStream_t stream, int64_t out2 = 0, float* y2 = nullptr) {
  const int split = gemv_split(out, in, resident_warps<M>());
  const int64_t features_per_cta = kGemvWarps / split;
  const unsigned blocks = unsigned((out + features_per_cta - 1) / features_per_cta);
  launch_pdl(gemv_kernel<M>, dim3(blocks), dim3(kGemvThreads), 0, stream, x, in, w, out, split, y, bf16, beta, out - out2, y2);
}

// Whether linear() takes the own GEMV for these operands.
bool own_gemv(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, cudaDataType y_type) {
  const bool aligned = in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  return rows <= kGemvRows && h.projections() == Projections::own && aligned && (y_type == CUDA_R_32F || y_type == CUDA_R_16BF);
}
cudaStream_t stream_of(const BlasHandle& h) {
  cudaStream_t stream{};
  DSLAB_CUBLAS(cublasGetStream(h.get(), &stream));
  return stream;
}

}  // namespace

int gemv_split(int64_t out, int64_t in, int64_t resident_warps) {
  // Two regimes. A small matrix: the most warps per feature that still fit one wave (a second wave is a second
  // round of memory latency for its share of the bytes). A large one (many waves anyway): about one batch of
  // kGemvUnroll loads per lane, so a warp issues everything it reads at once and leaves (long rows streamed
  // batch after batch by one warp ran at 0.87x cuBLAS on V3's o_proj; short-lived warps at 1.1-1.2x). Always at
  // least one 16-byte chunk of the row per lane.
  const int64_t chunks = in / 8;
  int split = 1;
  while (split < kGemvWarps && chunks / (split * 2) >= 32 &&
         (out * split * 2 <= resident_warps || chunks / (split * 2) >= 32 * kGemvUnroll))
    split *= 2;
  return split;
}

int own_gemv_split(int64_t rows, int64_t out, int64_t in) {
  return gemv_split(out, in, rows == 1 ? resident_warps<1>() : resident_warps<2>());
}

void linear(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out, void* y,
            cudaDataType y_type, float beta) {
  if (own_gemv(h, x, rows, in, w, y_type)) {
    const cudaStream_t stream = stream_of(h);
    const bool bf16 = y_type == CUDA_R_16BF;
    switch (rows) {
      case 1: launch_gemv<1>(x, in, w, out, y, bf16, beta, stream); break;
      case 2: launch_gemv<2>(x, in, w, out, y, bf16, beta, stream); break;
      default: launch_gemv<2>(x, in, w, out, y, bf16, beta, stream); break;
    }
    DSLAB_CHECK_LAUNCH();
    return;
  }
  // Column-major view: y^T [out x rows] = w [in x out]^T · x^T [in x rows].
  gemm(h.get(), CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, w, in, 0, x, in, 0, y, y_type, out, 0, 1, beta);
}

void linear_pair(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out1, void* y1,
                 cudaDataType y1_type, int64_t out2, float* y2) {
  if (own_gemv(h, x, rows, in, w, y1_type)) {
    const cudaStream_t stream = stream_of(h);
    const bool bf16 = y1_type == CUDA_R_16BF;
    if (rows == 1) launch_gemv<1>(x, in, w, out1 + out2, y1, bf16, 0.0f, stream, out2, y2);
    else launch_gemv<2>(x, in, w, out1 + out2, y1, bf16, 0.0f, stream, out2, y2);
    DSLAB_CHECK_LAUNCH();
    return;
  }
  linear(h, x, rows, in, w, out1, y1, y1_type);
  linear(h, x, rows, in, w + out1 * in, out2, y2, CUDA_R_32F);
}

}  // namespace dslab::mla::cuda
