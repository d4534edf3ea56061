// linear(): the one place every decode- and prefill-sized nn.Linear of the GPU variants goes through, and the
// weight-streaming GEMV of our own that it picks for decode sizes when a handle's projections are `own`.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/gpu.h"
#include "harness/tuning.h"
#include "variants/common/cuda/device_array.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/cuda/blas.h"
#include "variants/common/cuda/gemv_kernels.cuh"

namespace dslab::gpu {

namespace {

using namespace gemv;

constexpr int kGemvUnroll = 8;  // 16-byte weight loads each lane keeps in flight

// y[m][n] (+ beta y) = sum_k x[m][k] w[n][k] for M rows; features n >= N1 (a second weight stacked under the
// first) go to y2[m][n - N1] in fp32 instead (N1 = N: none). `split` warps share one output feature, each streaming
// one K slice of its weight row, so that a small matrix (kv_a: 576 rows) still spreads over every SM with all of
// its bytes in flight at once; a CTA holds kGemvWarps / split output features.
//
// The first batch of weight loads is issued before pdl_wait(): the weights are constant for the whole step, so
// under programmatic dependent launch they stream in while the kernel before this one finishes (only x and y
// depend on it). That overlap is what cuBLAS's GEMMs, launched without the attribute, cannot have.
//
// Batched (gridDim.y > 1: the absorbed forms' per-head W_UV): batch b reads x + b * x_batch, w + b * w_batch and
// writes y + b * y_batch; x's rows are ldx apart, y's ldy (linear(): K and N1).
template <int M>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvArgs a) {
  __shared__ float partial[kGemvWarps][M];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t K = a.K, N = a.N, N1 = a.N1;
  const int split = a.split;
  const __nv_bfloat16* x = a.x + int64_t(blockIdx.y) * a.x_batch;
  const __nv_bfloat16* w = a.w + int64_t(blockIdx.y) * a.w_batch;
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
      for (int u = 0; u < kGemvUnroll; ++u) xv[u] = __ldg(xr + m * (a.ldx / 8) + min(c + 32 * u, end - 1));
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
    a.y2[int64_t(lane) * (N - N1) + (n - N1)] = out;
    return;
  }
  const int64_t at = int64_t(blockIdx.y) * a.y_batch + int64_t(lane) * a.ldy + n;
  const float beta = a.beta;
  if (a.y_bf16) {
    __nv_bfloat16* yb = static_cast<__nv_bfloat16*>(a.y);
    yb[at] = __float2bfloat16_rn(beta != 0.0f ? out + beta * __bfloat162float(yb[at]) : out);
  } else {
    float* yf = static_cast<float*>(a.y);
    yf[at] = beta != 0.0f ? out + beta * yf[at] : out;
  }
}

// gemv_kn_block (gemv_kernels.cuh) as a kernel of its own: one CTA a (column block, batch).
template <int M>
__global__ void __launch_bounds__(kGemvThreads) gemv_kn_kernel(GemvArgs a) {
  gemv_kn_block<M>(a, int(blockIdx.x), int(blockIdx.y));
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
void launch_gemv_split(const __nv_bfloat16* x, int64_t in, const __nv_bfloat16* w, int64_t out, void* y, bool bf16,
                       float beta, cudaStream_t stream, int64_t out2, float* y2, int split) {
  const int64_t features_per_cta = kGemvWarps / split;
  const unsigned blocks = unsigned((out + features_per_cta - 1) / features_per_cta);
  const GemvArgs a{x, in, in, 0, w, out, 0, split, y, bf16, beta, out - out2, 0, out - out2, y2};
  launch_pdl(gemv_kernel<M>, dim3(blocks), dim3(kGemvThreads), 0, stream, a);
}

// The split launch_gemv<M> takes for a shape: the tuning cache's measured choice for this GPU (family "gemv_split",
// key "rows M out N in K"), else measured now (outside a capture: every power-of-two split that leaves each lane a
// 16-byte chunk of the row, on the caller's weights and input into a scratch output, each from a flushed L2, the
// best of three runs after a warm-up) and kept; inside a capture or with DSLAB_TUNE=off, gemv_split's rule. The
// rule fits the occupancy it reads from the GPU; the measurement also sees the GPU's memory latency and bandwidth.
// A launch after the first of its shape costs a map lookup (this runs inside timed steps).
template <int M>
int tuned_gemv_split(const __nv_bfloat16* x, int64_t in, const __nv_bfloat16* w, int64_t out, bool bf16, int64_t out2,
                     cudaStream_t stream) {
  int device = 0;
  DSLAB_CUDA(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::tuple<int, int64_t, int64_t, int64_t, bool>, int> chosen;  // by device and shape, this process
  std::lock_guard<std::mutex> lock(mutex);
  const auto shape = std::make_tuple(device, out, in, out2, bf16);
  if (const auto it = chosen.find(shape); it != chosen.end()) return it->second;
  const int rule = gemv_split(out, in, resident_warps<M>());
  std::vector<int> candidates;
  for (int split = 1; split <= kGemvWarps && in / 8 / split >= 32; split *= 2) candidates.push_back(split);
  if (candidates.size() < 2) return chosen[shape] = rule;
  const std::string key = "rows " + std::to_string(M) + " out " + std::to_string(out) + " in " + std::to_string(in) +
                          (out2 > 0 ? " out2 " + std::to_string(out2) : "") + (bf16 ? " bf16" : " fp32");
  TuningCache& cache = TuningCache::instance();
  if (const auto v = cache.lookup("gemv_split", key); v && v->is_object() && v->contains("split")) {
    const int split = v->at("split").get<int>();
    if (std::find(candidates.begin(), candidates.end(), split) != candidates.end()) return chosen[shape] = split;
  }
  const bool off = cache.mode() == TuningCache::Mode::off;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DSLAB_CUDA(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone || off) {
    cache.use_default("gemv_split", key, nlohmann::json{{"split", rule}});
    return off ? chosen[shape] = rule : rule;  // (inside a capture not remembered: a later call outside it measures)
  }
  DSLAB_CUDA(cudaDeviceSynchronize());
  DeviceArray<float> scratch(size_t(M * out)), scratch2(size_t(std::max<int64_t>(1, M * out2)));
  int best = rule;
  double best_us = 0, rule_us = 0;
  for (const int split : candidates) {
    const double us = 1e6 * fastest_seconds([&] {
                        launch_gemv_split<M>(x, in, w, out, scratch.get(), bf16, 0.0f, 0, out2,
                                             out2 > 0 ? scratch2.get() : nullptr, split);
                        DSLAB_CHECK_LAUNCH();
                      });
    if (split == rule) rule_us = us;
    if (best_us == 0 || us < best_us) best = split, best_us = us;
  }
  cache.record("gemv_split", key,
               nlohmann::json{{"split", best}, {"us", best_us}, {"rule", rule}, {"rule_us", rule_us}});
  return chosen[shape] = best;
}

template <int M>
void launch_gemv(const __nv_bfloat16* x, int64_t in, const __nv_bfloat16* w, int64_t out, void* y, bool bf16,
                 float beta, cudaStream_t stream, int64_t out2 = 0, float* y2 = nullptr) {
  launch_gemv_split<M>(x, in, w, out, y, bf16, beta, stream, out2, y2,
                       tuned_gemv_split<M>(x, in, w, out, bf16, out2, stream));
}

// The batched forms (see batched_gemv in mla_cuda.h): gemv_kernel over `batch` (its split from all batch * N
// features), or gemv_kn_kernel.
template <int M>
void launch_batched(const BatchedGemv& g, int64_t batch, cudaStream_t stream) {
  const GemvArgs a = batched_args(g);
  if (g.w_k_major) {
    launch_pdl(gemv_kn_kernel<M>, dim3(unsigned((g.N + kKnColumns - 1) / kKnColumns), unsigned(batch)),
               dim3(kGemvThreads), 0, stream, a);
    return;
  }
  GemvArgs b = a;
  b.split = gemv_split(batch * g.N, g.K, resident_warps<M>());
  const int64_t features_per_cta = kGemvWarps / b.split;
  launch_pdl(gemv_kernel<M>, dim3(unsigned((g.N + features_per_cta - 1) / features_per_cta), unsigned(batch)),
             dim3(kGemvThreads), 0, stream, b);
}

// Whether linear() takes the own GEMV for these operands.
bool own_gemv(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w,
              cudaDataType y_type) {
  const bool aligned =
      in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  return rows <= kGemvRows && h.projections() == Projections::own && aligned &&
         (y_type == CUDA_R_32F || y_type == CUDA_R_16BF);
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

void linear(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out,
            void* y, cudaDataType y_type, float beta) {
  if (own_gemv(h, x, rows, in, w, y_type)) {
    const cudaStream_t stream = h.stream();
    const bool bf16 = y_type == CUDA_R_16BF;
    switch (rows) {
      case 1:
        launch_gemv<1>(x, in, w, out, y, bf16, beta, stream);
        break;
      case 2:
        launch_gemv<2>(x, in, w, out, y, bf16, beta, stream);
        break;
      default:
        launch_gemv<2>(x, in, w, out, y, bf16, beta, stream);
        break;
    }
    DSLAB_CHECK_LAUNCH();
    return;
  }
  // Column-major view: y^T [out x rows] = w [in x out]^T · x^T [in x rows]; own: cuBLASLt, tuned for the shape.
  gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, w, in, 0, x, in, 0, y, y_type, out, 0, 1, beta);
}

KSlices linear_unsummed(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w,
                        int64_t out, float* y) {
  if (own_gemv(h, x, rows, in, w, CUDA_R_32F) || h.projections() != Projections::own) {
    linear(h, x, rows, in, w, out, y, CUDA_R_32F);
    return {y, 1, 0};
  }
  return h.tuner().gemm_unsummed(h.stream(), linear_gemm_shape(x, rows, in, w, out, y, CUDA_R_32F, 0.0f), w, x, y);
}

GemmShape linear_gemm_shape(const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out,
                            const void* y, cudaDataType y_type, float beta) {
  return gemm_shape(CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, w, in, 0, x, in, 0, y, y_type, out, 0, 1, beta);
}

void linear_pair(const BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w,
                 int64_t out1, void* y1, cudaDataType y1_type, int64_t out2, float* y2) {
  if (own_gemv(h, x, rows, in, w, y1_type)) {
    const cudaStream_t stream = h.stream();
    const bool bf16 = y1_type == CUDA_R_16BF;
    if (rows == 1)
      launch_gemv<1>(x, in, w, out1 + out2, y1, bf16, 0.0f, stream, out2, y2);
    else
      launch_gemv<2>(x, in, w, out1 + out2, y1, bf16, 0.0f, stream, out2, y2);
    DSLAB_CHECK_LAUNCH();
    return;
  }
  linear(h, x, rows, in, w, out1, y1, y1_type);
  linear(h, x, rows, in, w + out1 * in, out2, y2, CUDA_R_32F);
}

bool batched_gemv_fits(const BlasHandle& h, const BatchedGemv& g, int64_t rows) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // 16-byte loads: gemv_kernel along each weight row and x row (K), gemv_kn_kernel along each weight row (N)
  const int64_t step = g.w_k_major ? g.N : g.K;
  return rows >= 1 && rows <= kGemvRows && h.projections() == Projections::own && aligned(g.w) && step % 8 == 0 &&
         g.w_batch % 8 == 0 && (g.w_k_major || (aligned(g.x) && g.ldx % 8 == 0 && g.x_batch % 8 == 0));
}

bool batched_gemv(const BlasHandle& h, const BatchedGemv& g, int64_t rows, int64_t batch) {
  if (!batched_gemv_fits(h, g, rows)) return false;
  const cudaStream_t stream = h.stream();
  if (rows == 1)
    launch_batched<1>(g, batch, stream);
  else
    launch_batched<2>(g, batch, stream);
  DSLAB_CHECK_LAUNCH();
  return true;
}

}  // namespace dslab::gpu
