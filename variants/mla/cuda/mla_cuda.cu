#include "variants/mla/cuda/mla_cuda.h"

#include <cuda_fp8.h>
#include <nvtx3/nvToolsExt.h>

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
#include "variants/common/device_random.h"
#include "variants/common/pdl.cuh"
#include "variants/common/rng.h"
#include "variants/mla/cuda/kernels.cuh"

namespace dslab::mla::cuda {

namespace {

struct NvtxRange {  // one named range per op, for Nsight timelines
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
};

const float kUnitScale = std::sqrt(3.0f);  // unit-variance uniform values, as ref::make_mla_inputs uses

// ---- kernels -------------------------------------------------------------------------------------------

// One warp per cached token: generate its latent and rope key with the CPU's counter-based generator and
// store them (quantised if asked) into the token's page slot.
__global__ void fill_cache_kernel(CacheView cache, const int32_t* lengths, const uint64_t* streams, int64_t r, float scale) {
  const int64_t b = blockIdx.y;
  const int64_t token = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (token >= lengths[b]) return;
  const int lane = threadIdx.x % 32;
  float v[kMaxValuesPerLane];
  for (int k = 0; k < kMaxValuesPerLane; ++k) {
    const int64_t i = lane + 32 * k;
    if (i >= cache.width) break;
    const bool latent = i < r;
    const uint64_t stream = streams[2 * b + (latent ? 0 : 1)];
    const uint64_t index = latent ? uint64_t(token * r + i) : uint64_t(token * (cache.width - r) + i - r);
    v[k] = __bfloat162float(__float2bfloat16_rn(scale * uniform_pm1(stream, index)));
  }
  store_token(cache, cache.slot(b, token), v, lane);
}

// DeepSeek RoPE on one pair of a head's rope part: the interleaved pair (x[2p], x[2p + 1]) in, with the
// position's cos / sin of pair p; out the de-interleaved elements p (.x) and p + half (.y).
__device__ inline float2 rope_pair(float2 pair, float cs, float sn) {
  return make_float2(pair.x * cs - pair.y * sn, pair.y * cs + pair.x * sn);
}

// RoPE of one (token, head) row of q (row = token * heads + head) by one warp, in place, and into q_cat's rope part
// behind the absorbed query where a form uses it; lane i takes pairs i, i + 32, ...
constexpr int kRopePairsPerLane = 4;  // rope parts up to 256 wide (DeepSeek: 64)
__device__ inline void rope_q_row(__nv_bfloat16* q, const float* cos_table, const float* sin_table, int64_t row, int64_t t, int nope, int rope,
                                  int r, __nv_bfloat16* q_cat) {
  const int lane = int(threadIdx.x) % 32, half = rope / 2;
  __nv_bfloat16* x = q + row * (nope + rope) + nope;
  __nv_bfloat16 lo[kRopePairsPerLane], hi[kRopePairsPerLane];
#pragma unroll
  for (int k = 0; k < kRopePairsPerLane; ++k) {
    const int p = lane + 32 * k;
    if (p >= half) break;
    const float2 y = rope_pair(__bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(x)[p]), cos_table[t * half + p], sin_table[t * half + p]);
    lo[k] = __float2bfloat16_rn(y.x);
    hi[k] = __float2bfloat16_rn(y.y);
  }
  __syncwarp();  // every lane has read its pairs before any lane writes over them
  __nv_bfloat16* y = q_cat ? q_cat + row * (r + rope) + r : nullptr;
#pragma unroll
  for (int k = 0; k < kRopePairsPerLane; ++k) {
    const int p = lane + 32 * k;
    if (p >= half) break;
    x[p] = lo[k];
    x[p + half] = hi[k];
    if (y) y[p] = lo[k], y[p + half] = hi[k];
  }
}

// After the q_a / kv_a projection, one block per new token: RMSNorm of q_a into qa (q_lora_rank models; ql 0
// skips it), and the token's latent (RMSNorm) and rope key (RoPE) into the cache at its position (and, bf16, into
// kv_new for the forms that decompress it). Every load is issued up front, each value is read once and held in
// registers, and both sums of squares share one reduction: the kernel is a short chain of latencies, not work.
// Models without q_lora_rank have their q (q_proj) before this kernel: given `q`, its warps also apply RoPE to the
// token's heads (rope_q_row), one launch less a layer than rope_q_kernel after it.
// The projection's output may come as K slices' partials (KSlices: kSlices of them, `slice_stride` apart) that this
// kernel adds up once every slice's value is in registers (predicated loads, then the sums: adding as it loaded
// waited out each value's loads in turn, and the kernel took 8.5 us instead of 3.5 - H100, session 31).
constexpr int kNormThreads = 256, kNormQPerThread = 8, kNormLatentPerThread = 4;  // q_lora_rank <= 2048, kv_lora_rank <= 1024
template <int kSlices>
__global__ void __launch_bounds__(kNormThreads) norm_and_cache_kernel(const float* qa_f32, int ql, const __nv_bfloat16* q_a_norm,
                                                                      __nv_bfloat16* qa, const float* kv_f32, int ld, int64_t slice_stride,
                                                                      const __nv_bfloat16* kv_norm, const float* cos_table,
                                                                      const float* sin_table, CacheView cache, const int32_t* lengths,
                                                                      int q_len, int r, float eps, __nv_bfloat16* kv_new, __nv_bfloat16* q,
                                                                      int heads, int nope, __nv_bfloat16* q_cat) {
  __shared__ float2 warp_sums[kNormThreads / 32];
  __shared__ float token[32 * kMaxValuesPerLane];  // int8 / fp8 caches: the row, bf16-rounded, for one warp to quantise
  const int t = blockIdx.x, b = t / q_len, s = t % q_len, width = int(cache.width), half = (width - r) / 2;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  // Before griddepcontrol.wait, what no kernel of the step writes (the norms' weights, the RoPE tables, the token's
  // cache slot from its length and page table: set before the step), so that only the projection's output is left
  // to load once the kernel before has finished.
  const int64_t slot = cache.slot(b, lengths[b] + s);  // (the same two loads in every thread: broadcasts)
  float qv[kNormQPerThread], qw[kNormQPerThread], lv[kNormLatentPerThread], lw[kNormLatentPerThread];
#pragma unroll
  for (int k = 0; k < kNormQPerThread; ++k) {
    const int i = int(threadIdx.x) + kNormThreads * k;
    qw[k] = i < ql ? __bfloat162float(q_a_norm[i]) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kNormLatentPerThread; ++k) {
    const int i = int(threadIdx.x) + kNormThreads * k;
    lw[k] = i < r ? __bfloat162float(kv_norm[i]) : 0.0f;
  }
  const bool has_pair = int(threadIdx.x) < half;  // this thread rotates rope pair threadIdx.x
  float2 pair{0, 0};
  float cs = 0, sn = 0;
  if (has_pair) {
    cs = cos_table[int64_t(t) * half + threadIdx.x];
    sn = sin_table[int64_t(t) * half + threadIdx.x];
  }
  pdl_wait();  // (launched with launch_pdl: see variants/common/pdl.cuh)
  pdl_launch_dependents();
  if (q) {
    const int rope = int(cache.width) - r;
    for (int h = int(threadIdx.x) / 32; h < heads; h += kNormThreads / 32)
      rope_q_row(q, cos_table, sin_table, int64_t(blockIdx.x) * heads + h, blockIdx.x, nope, rope, r, q_cat);
  }
  const float* q_row = qa_f32 + int64_t(t) * ld;  // (read only below ql)
  const float* kv = kv_f32 + int64_t(t) * ld;
  constexpr int kPair = kNormQPerThread + kNormLatentPerThread, kValues = kPair + 2;  // q, latent, the rope pair
  float raw[kSlices][kValues];
#pragma unroll
  for (int sl = 0; sl < kSlices; ++sl) {
    const int64_t at = sl * slice_stride;
#pragma unroll
    for (int k = 0; k < kNormQPerThread; ++k) {
      const int i = int(threadIdx.x) + kNormThreads * k;
      raw[sl][k] = i < ql ? q_row[at + i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kNormLatentPerThread; ++k) {
      const int i = int(threadIdx.x) + kNormThreads * k;
      raw[sl][kNormQPerThread + k] = i < r ? kv[at + i] : 0.0f;
    }
    raw[sl][kPair] = has_pair ? kv[at + r + 2 * threadIdx.x] : 0.0f;
    raw[sl][kPair + 1] = has_pair ? kv[at + r + 2 * threadIdx.x + 1] : 0.0f;
  }
  float sum[kValues];
#pragma unroll
  for (int v = 0; v < kValues; ++v) {
    sum[v] = raw[0][v];
#pragma unroll
    for (int sl = 1; sl < kSlices; ++sl) sum[v] += raw[sl][v];
  }
#pragma unroll
  for (int k = 0; k < kNormQPerThread; ++k) qv[k] = sum[k];
#pragma unroll
  for (int k = 0; k < kNormLatentPerThread; ++k) lv[k] = sum[kNormQPerThread + k];
  pair = make_float2(sum[kPair], sum[kPair + 1]);
  float2 ss{0, 0};
#pragma unroll
  for (int k = 0; k < kNormQPerThread; ++k) ss.x += qv[k] * qv[k];
#pragma unroll
  for (int k = 0; k < kNormLatentPerThread; ++k) ss.y += lv[k] * lv[k];
  for (int o = 16; o; o >>= 1) {
    ss.x += __shfl_xor_sync(0xffffffffu, ss.x, o);
    ss.y += __shfl_xor_sync(0xffffffffu, ss.y, o);
  }
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  float2 total{0, 0};
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total.x += warp_sums[w].x, total.y += warp_sums[w].y;
  const float inv_q = rsqrtf(total.x / float(max(ql, 1)) + eps), inv_kv = rsqrtf(total.y / float(r) + eps);
#pragma unroll
  for (int k = 0; k < kNormQPerThread; ++k) {
    const int i = int(threadIdx.x) + kNormThreads * k;
    if (i < ql) qa[int64_t(t) * ql + i] = __float2bfloat16_rn(qv[k] * inv_q * qw[k]);
  }
  const bool quantised = cache.dtype != KvDtype::bf16;
  __nv_bfloat16* const row = reinterpret_cast<__nv_bfloat16*>(cache.values) + slot * width;  // (bf16 caches)
  auto put = [&](int i, float y) {
    const __nv_bfloat16 v = __float2bfloat16_rn(y);
    if (quantised) token[i] = __bfloat162float(v);
    else row[i] = v;
    if (kv_new) kv_new[int64_t(t) * width + i] = v;
  };
#pragma unroll
  for (int k = 0; k < kNormLatentPerThread; ++k) {
    const int i = int(threadIdx.x) + kNormThreads * k;
    if (i < r) put(i, lv[k] * inv_kv * lw[k]);
  }
  if (has_pair) {
    const float2 y = rope_pair(pair, cs, sn);
    put(r + int(threadIdx.x), y.x);
    put(r + half + int(threadIdx.x), y.y);
  }
  if (!quantised) return;
  __syncthreads();
  if (warp == 0) {  // one warp quantises and stores the row group by group
    float v[kMaxValuesPerLane];
#pragma unroll
    for (int k = 0; k < kMaxValuesPerLane; ++k) v[k] = lane + 32 * k < width ? token[lane + 32 * k] : 0.0f;
    store_token(cache, slot, v, lane);
  }
}

// After q_b (or q_proj), which wrote q in bf16: RoPE on each head's rope part, in place, and behind the absorbed
// part of q_cat where a form uses it (rope_pair). One warp per (token, head); lane i takes pairs i, i + 32, ...
__global__ void rope_q_kernel(__nv_bfloat16* q, const float* cos_table, const float* sin_table, int64_t rows, int heads, int nope, int rope,
                              int r, __nv_bfloat16* q_cat) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/pdl.cuh)
  pdl_launch_dependents();
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // token * heads + head
  if (row >= rows) return;
  rope_q_row(q, cos_table, sin_table, row, row / heads, nope, rope, r, q_cat);
}

// Paged cache -> contiguous [batch][keys][width] bf16, one warp per token.
__global__ void gather_kernel(CacheView cache, const int32_t* lengths, int64_t q_len, int64_t keys, __nv_bfloat16* out) {
  const int64_t b = blockIdx.y;
  const int64_t token = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (token >= lengths[b] + q_len) return;
  const int lane = threadIdx.x % 32;
  float v[kMaxValuesPerLane];
  load_token(cache, cache.slot(b, token), v, lane);
  __nv_bfloat16* dst = out + (b * keys + token) * cache.width;
  for (int k = 0; k < kMaxValuesPerLane && lane + 32 * k < cache.width; ++k) dst[lane + 32 * k] = __float2bfloat16_rn(v[k]);
}

__global__ void softmax_kernel(const float* scores, __nv_bfloat16* probs, int64_t n, float scale, const int32_t* lengths,
                               int64_t rows_per_request, int64_t div, int64_t q_len) {
  const int64_t row = blockIdx.x, b = row / rows_per_request, s = (row / div) % q_len;
  const int64_t visible = lengths[b] + s + 1;
  const float* x = scores + row * n;
  __nv_bfloat16* y = probs + row * n;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = block_max(mx);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) sum += __expf((x[j] - mx) * scale);
  const float inv = 1.0f / block_sum(sum);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    y[j] = __float2bfloat16_rn(j < visible ? __expf((x[j] - mx) * scale) * inv : 0.0f);
}

}  // namespace

// ---- GEMM ------------------------------------------------------------------------------------------------

void gemm(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k, const void* a,
          int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, void* c, cudaDataType c_type, int64_t ldc,
          int64_t stride_c, int64_t batch, float beta) {
  const float alpha = 1.0f;
  DSLAB_CUBLAS(cublasGemmStridedBatchedEx(h, op_a, op_b, int(m), int(n), int(k), &alpha, a, CUDA_R_16BF, int(lda), stride_a, b,
                                               CUDA_R_16BF, int(ldb), stride_b, &beta, c, c_type, int(ldc), stride_c, int(batch),
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

GemmShape gemm_shape(cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                     int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, const void* c, cudaDataType c_type, int64_t ldc,
                     int64_t stride_c, int64_t batch, float beta) {
  const auto alignment = [](const void* p) {
    const uintptr_t v = reinterpret_cast<uintptr_t>(p);
    return v % 16 == 0 ? 16 : v % 8 == 0 ? 8 : v % 4 == 0 ? 4 : 2;
  };
  const int align = std::min({alignment(a), alignment(b), alignment(c)});
  return {op_a, op_b, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch, c_type, beta != 0.0f, align};
}

void gemm(const BlasHandle& h, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k, const void* a,
          int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, void* c, cudaDataType c_type, int64_t ldc,
          int64_t stride_c, int64_t batch, float beta) {
  if (h.projections() != Projections::own) {
    gemm(h.get(), op_a, op_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, c_type, ldc, stride_c, batch, beta);
    return;
  }
  h.tuner().gemm(h.stream(), gemm_shape(op_a, op_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, c_type, ldc, stride_c, batch, beta), a, b,
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
  tuner_ = std::make_unique<GemmTuner>(workspace_.get(), workspace_.size());  // one stream at a time: cuBLAS's and its calls share it
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

void generate_mla_weights(const ModelConfig& m, int64_t heads, uint64_t seed, MlaWeights* w) {
  const int64_t H = m.hidden_size, qhd = m.q_head_dim(), r = m.kv_lora_rank, width = r + m.qk_rope_head_dim;
  if (m.q_lora_rank) {
    const int64_t ql = *m.q_lora_rank;
    w->qkv_a.resize(size_t((ql + width) * H));
    fill_random_bf16(w->qkv_a.get(), size_t(ql * H), seed, "q_a_proj", fan_in_scale(H));
    fill_random_bf16(w->qkv_a.get() + ql * H, size_t(width * H), seed, "kv_a_proj_with_mqa", fan_in_scale(H));
    w->q_a_norm.resize(size_t(ql));
    fill_random_bf16(w->q_a_norm.get(), size_t(ql), seed, "q_a_layernorm", 0.1f, 1.0f);
    w->q_b.resize(size_t(heads * qhd * ql));
    fill_random_bf16(w->q_b.get(), w->q_b.size(), seed, "q_b_proj", fan_in_scale(ql));
  } else {
    const int64_t q_out = heads * qhd;
    w->qkv_a.resize(size_t((q_out + width) * H));
    fill_random_bf16(w->qkv_a.get(), size_t(q_out * H), seed, "q_proj", fan_in_scale(H));
    fill_random_bf16(w->qkv_a.get() + q_out * H, size_t(width * H), seed, "kv_a_proj_with_mqa", fan_in_scale(H));
  }
  w->kv_a_norm.resize(size_t(r));
  fill_random_bf16(w->kv_a_norm.get(), size_t(r), seed, "kv_a_layernorm", 0.1f, 1.0f);
  w->kv_b.resize(size_t(heads * (m.qk_nope_head_dim + m.v_head_dim) * r));
  fill_random_bf16(w->kv_b.get(), w->kv_b.size(), seed, "kv_b_proj", fan_in_scale(r));
  w->o_proj.resize(size_t(H * heads * m.v_head_dim));
  fill_random_bf16(w->o_proj.get(), w->o_proj.size(), seed, "o_proj", fan_in_scale(heads * m.v_head_dim));
}

void upload_mla_weights(const ModelConfig& m, const ref::MlaParams& p, MlaWeights* w) {
  std::vector<bf16> stacked(m.q_lora_rank ? p.q_a_proj : p.q_proj);
  stacked.insert(stacked.end(), p.kv_a_proj_with_mqa.begin(), p.kv_a_proj_with_mqa.end());
  w->qkv_a.upload(stacked);
  w->q_a_norm.upload(p.q_a_layernorm);
  w->q_b.upload(p.q_b_proj);
  w->kv_a_norm.upload(p.kv_a_layernorm);
  w->kv_b.upload(p.kv_b_proj);
  w->o_proj.upload(p.o_proj);
}

// ---- the problem -----------------------------------------------------------------------------------------

uint64_t ckv_stream(uint64_t seed, int64_t request) { return stream_id(seed, "ckv_cache.r" + std::to_string(request)); }
uint64_t kpe_stream(uint64_t seed, int64_t request) { return stream_id(seed, "kpe_cache.r" + std::to_string(request)); }
uint64_t GpuProblem::ckv_stream(int64_t request) const { return cuda::ckv_stream(seed, request); }
uint64_t GpuProblem::kpe_stream(int64_t request) const { return cuda::kpe_stream(seed, request); }

std::vector<bf16> host_latent(const GpuProblem& p, int64_t request) {
  return host_latent(p.model, p.ckv_stream(request), p.kpe_stream(request), p.lengths[size_t(request)]);
}

std::vector<bf16> host_latent(const ModelConfig& m, uint64_t ckv, uint64_t kpe, int64_t L) {
  const int64_t r = m.kv_lora_rank, rope = m.qk_rope_head_dim;
  std::vector<bf16> out(static_cast<size_t>(L * (r + rope)));
  for (int64_t j = 0; j < L; ++j) {
    for (int64_t i = 0; i < r; ++i) out[size_t(j * (r + rope) + i)] = to_bf16(kUnitScale * uniform_pm1(ckv, uint64_t(j * r + i)));
    for (int64_t i = 0; i < rope; ++i)
      out[size_t(j * (r + rope) + r + i)] = to_bf16(kUnitScale * uniform_pm1(kpe, uint64_t(j * rope + i)));
  }
  return out;
}

std::vector<double> GpuProblem::reference_over(int64_t request, const std::vector<int64_t>* keys, double* mass_recall) const {
  // Requests are independent: the reference of one is a batch-1 step over its own cache.
  const int64_t S = shape.q_len, hid = model.hidden_size, r = model.kv_lora_rank, rope = model.qk_rope_head_dim;
  ref::MlaInputs in;
  in.batch = 1;
  in.q_len = S;
  in.kv_len = lengths[size_t(request)];
  in.hidden_states.assign(hidden.begin() + request * S * hid, hidden.begin() + (request + 1) * S * hid);
  const auto latent = host_latent(*this, request);
  in.ckv_cache.resize(size_t(in.kv_len * r));
  in.kpe_cache.resize(size_t(in.kv_len * rope));
  for (int64_t j = 0; j < in.kv_len; ++j) {
    std::copy_n(&latent[size_t(j * (r + rope))], r, &in.ckv_cache[size_t(j * r)]);
    std::copy_n(&latent[size_t(j * (r + rope) + r)], rope, &in.kpe_cache[size_t(j * rope)]);
  }
  if (!keys) return ref::mla_attention(model, params, in, ref::MlaForm::absorbed_split);
  const std::vector<std::vector<int64_t>> selection{*keys};
  return ref::mla_attention(model, params, in, ref::MlaForm::absorbed_split, &selection, mass_recall);
}

const std::vector<double>& GpuProblem::reference(int64_t request) const {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (reference_.empty()) reference_.resize(lengths.size());
  auto& out = reference_[size_t(request)];
  if (out.empty()) out = reference_over(request, nullptr);
  return out;
}

void allocate_paged_cache(const ModelConfig& m, KvDtype dtype, int64_t page_size, const std::vector<int64_t>& lengths, int64_t room,
                          uint64_t seed, PagedLatentCache* cache) {
  // Pages: each request gets the pages its cached and new tokens need, drawn in shuffled order from one pool
  // so consecutive pages of a request are scattered, as in a long-running server.
  PagedLatentCache& c = *cache;
  const int64_t B = int64_t(lengths.size()), width = m.kv_lora_rank + m.qk_rope_head_dim;
  c.dtype = dtype;
  c.page_size = page_size;
  c.width = width;
  c.groups = (width + kQuantGroup - 1) / kQuantGroup;
  c.pages_per_request = (*std::max_element(lengths.begin(), lengths.end()) + room + page_size - 1) / page_size;
  int64_t pages = 0;
  for (int64_t L : lengths) pages += (L + room + page_size - 1) / page_size;
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(splitmix64(seed ^ 0x9a6e5ull)));
  c.host_page_table.assign(size_t(B * c.pages_per_request), 0);
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < (lengths[size_t(b)] + room + page_size - 1) / page_size; ++i)
      c.host_page_table[size_t(b * c.pages_per_request + i)] = order[next++];
  c.page_table.upload(c.host_page_table);
  // Slots no token is written to (past each request's length, in its last page) keep 0xFF bytes: NaN in bf16,
  // fp8 and the fp32 scales (-1 in int8). A serving engine's pages hold whatever they held before; a kernel that
  // lets such a slot reach its output (say, a block copied whole and masked by its probabilities, 0 x NaN) then
  // fails verification instead of passing on a zeroed pool.
  c.values.resize(size_t(pages * page_size * width) * c.element_bytes());
  c.values.fill_bytes(0xFF);
  if (c.dtype != KvDtype::bf16) {
    c.scales.resize(size_t(pages * page_size * c.groups));
    c.scales.fill_bytes(0xFF);
  }
}

void fill_paged_cache(PagedLatentCache& c, const int32_t* lengths_dev, int64_t batch, int64_t max_len, const std::vector<uint64_t>& streams,
                      int64_t kv_lora_rank) {
  if (max_len <= 0) return;
  DeviceArray<uint64_t> streams_dev;
  streams_dev.upload(streams);
  fill_cache_kernel<<<dim3(unsigned((max_len + 7) / 8), unsigned(batch)), 256>>>(cache_view(c), lengths_dev, streams_dev.get(), kv_lora_rank,
                                                                                 kUnitScale);
  DSLAB_CHECK_LAUNCH();
  DSLAB_CUDA(cudaDeviceSynchronize());  // streams_dev is freed on return
}

void rope_tables(const ModelConfig& m, const std::vector<int64_t>& lengths, int64_t q_len, std::vector<float>* cos_table,
                 std::vector<float>* sin_table) {
  const auto inv_freq = ref::rope_inv_freq(m);
  const double ms = ref::rope_mscale(m);
  const int64_t half = m.qk_rope_head_dim / 2, T = int64_t(lengths.size()) * q_len;
  cos_table->resize(size_t(T * half));
  sin_table->resize(size_t(T * half));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(lengths[size_t(t / q_len)] + t % q_len) * inv_freq[size_t(i)];
      (*cos_table)[size_t(t * half + i)] = float(std::cos(angle) * ms);
      (*sin_table)[size_t(t * half + i)] = float(std::sin(angle) * ms);
    }
}

std::shared_ptr<GpuProblem> gpu_problem(const ModelConfig& m, const Shape& s, int64_t page_size, const std::string& len_dist,
                                        uint64_t seed) {
  static std::mutex mu;
  static std::shared_ptr<GpuProblem> last;
  std::lock_guard<std::mutex> lock(mu);
  if (last && last->model.source == m.source && last->seed == seed && last->shape.heads == s.heads && last->shape.batch == s.batch &&
      last->shape.q_len == s.q_len && last->shape.kv_len == s.kv_len && last->shape.kv_dtype == s.kv_dtype &&
      last->page_size == page_size && last->len_dist == len_dist)
    return last;
  last.reset();  // free the old point's device memory first
  NvtxRange range("mla.problem");
  auto p = std::make_shared<GpuProblem>();
  p->model = m;
  p->shape = s;
  p->seed = seed;
  p->page_size = page_size;
  p->len_dist = len_dist;
  p->lengths = request_lengths(len_dist, s.batch, s.kv_len, seed);
  const int64_t B = s.batch, S = s.q_len, T = s.tokens();
  p->max_keys = *std::max_element(p->lengths.begin(), p->lengths.end()) + S;
  p->params = ref::make_mla_params(m, s.heads, seed);
  p->hidden = ref::random_bf16(seed, "hidden_states", size_t(T * m.hidden_size), kUnitScale);
  upload_mla_weights(m, p->params, &p->weights);
  p->x.upload(p->hidden);
  allocate_paged_cache(m, s.kv_dtype, page_size, p->lengths, S, seed, &p->cache);
  std::vector<int32_t> len32(p->lengths.begin(), p->lengths.end());
  p->lengths_dev.upload(len32);
  std::vector<uint64_t> streams(static_cast<size_t>(2 * B));
  for (int64_t b = 0; b < B; ++b) {
    streams[size_t(2 * b)] = p->ckv_stream(b);
    streams[size_t(2 * b + 1)] = p->kpe_stream(b);
  }
  fill_paged_cache(p->cache, p->lengths_dev.get(), B, p->max_keys - S, streams, m.kv_lora_rank);
  std::vector<float> cs, sn;
  rope_tables(m, p->lengths, S, &cs, &sn);
  p->rope_cos.upload(cs);
  p->rope_sin.upload(sn);
  // Verify every request unless the fp64 reference of all of them would take minutes: then the first, the
  // last and the longest, which cover the page-table ends and the longest softmax.
  const double budget = double(1 << 24);  // (key, head) pairs of fp64 reference work
  double work = 0;
  std::vector<int64_t> candidates = {0, B - 1, int64_t(std::max_element(p->lengths.begin(), p->lengths.end()) - p->lengths.begin())};
  for (int64_t b = 1; b < B - 1; ++b) candidates.push_back(b);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const int64_t b = candidates[i];
    const double w = double(p->lengths[size_t(b)] + S) * double(s.heads);
    if (std::find(p->verified_requests.begin(), p->verified_requests.end(), b) != p->verified_requests.end()) continue;
    if (i >= 3 && work + w > budget) break;
    p->verified_requests.push_back(b);
    work += w;
  }
  DSLAB_CUDA(cudaDeviceSynchronize());
  last = p;
  return p;
}

double device_bytes(const MlaOp& op, const ModelConfig& m, const Shape& s, int64_t page_size, const std::string& len_dist) {
  const double B = double(s.batch), S = double(s.q_len), w = double(m.kv_lora_rank + m.qk_rope_head_dim);
  const double total_keys = B * (double(s.kv_len) + S + double(page_size));
  // Unfused forms pad every request to the longest; mixed lengths put the longest at a few times kv_len.
  const int64_t max_keys = s.kv_len * (len_dist == "mixed" && s.batch > 1 ? 4 : 1) + s.q_len;
  // The cache, the weights (and q_a/kv_a stacked again), the op's scratch.
  return total_keys * w * 2 + 2 * weight_bytes(m, s.heads) + op.scratch_bytes(m, s, max_keys);
}

// ---- the op ----------------------------------------------------------------------------------------------

std::string MlaOp::unsupported(const ModelConfig& m, const Shape& s) const {
  if (const std::string why = unavailable(); !why.empty()) return why;
  if (!supports_kv_dtype(s.kv_dtype)) return std::string("kv_dtype ") + kv_dtype_name(s.kv_dtype) + " not implemented by this form";
  if (fused_ && (s.heads * s.q_len) % 16) return "decode kernel: heads x q_len must be a multiple of 16";
  if (fused_ && s.q_len > 2) return "decode kernel: q_len 1 or 2 (MTP); extend runs on the unfused forms";
  if (m.q_lora_rank.value_or(0) > kNormThreads * kNormQPerThread || m.kv_lora_rank > kNormThreads * kNormLatentPerThread)
    return "norm kernel: q_lora_rank up to " + std::to_string(kNormThreads * kNormQPerThread) + ", kv_lora_rank up to " +
           std::to_string(kNormThreads * kNormLatentPerThread);
  if (m.qk_rope_head_dim > 64 * kRopePairsPerLane) return "RoPE kernel: qk_rope_head_dim up to " + std::to_string(64 * kRopePairsPerLane);
  if (m.kv_lora_rank + m.qk_rope_head_dim != 576 && fused_) return "fused kernel is built for a 512+64 latent";
  return form_unsupported(m, s);
}

double MlaOp::scratch_bytes(const ModelConfig& m, const Shape& s, int64_t max_keys) const {
  return mla::gpu_scratch_bytes(m, algo_, s, max_keys, fused_);
}

void MlaOp::prepare(const ModelConfig& m, const Shape& s, int64_t max_keys, const MlaWeights& w, const MlaBuffers& b, BlasHandle& blas,
                    bool lengths_vary, ScratchArena* arena) {
  m_ = m;
  arena_ = arena;
  s_ = s;
  w_ = &w;
  b_ = b;
  blas_handle_ = &blas;
  blas_ = blas.get();
  // A caller-held schedule is one this op never sees being made: it must be ready to merge in any step.
  lengths_vary_ = lengths_vary || b.schedule != nullptr;
  max_keys_ = max_keys;
  nh_ = s_.heads;
  nope_ = m_.qk_nope_head_dim;
  rope_ = m_.qk_rope_head_dim;
  qhd_ = m_.q_head_dim();
  vd_ = m_.v_head_dim;
  r_ = m_.kv_lora_rank;
  hid_ = m_.hidden_size;
  width_ = r_ + rope_;
  keys_ = (max_keys + kKeyAlign - 1) / kKeyAlign * kKeyAlign;
  scale_ = float(m_.softmax_scale());
  const int64_t T = s_.tokens();
  if (m_.q_lora_rank) {
    qa_f32_.scratch(arena_, size_t(T * (*m_.q_lora_rank + width_)));
    qa_.scratch(arena_, size_t(T * *m_.q_lora_rank));
  } else {
    kv_f32_.scratch(arena_, size_t(T * width_));
  }
  q_.scratch(arena_, size_t(T * nh_ * qhd_));
  attn_.scratch(arena_, size_t(T * nh_ * vd_));
  pointer_arrays_.clear();
  q_cat_ = nullptr;
  prepare_form();
  schedule_dev_.resize(b_.schedule ? 0 : schedule_ints());
  DSLAB_CUDA(cudaDeviceSynchronize());
}

MlaSchedule MlaOp::schedule(const std::vector<int64_t>&) const { return {}; }

void MlaOp::forward(cudaStream_t stream, gpu::OpMarks* marks) {
  stream_ = stream;
  marks_ = marks;
  blas_handle_->set_stream(stream);
  project();
  {
    NvtxRange range("mla.attend");
    attend();
    if (!fused_) mark("attend");  // the fused op marks its own pieces
  }
  NvtxRange range("mla.o_proj");
  linear(*blas_handle_, attn_.get(), s_.tokens(), nh_ * vd_, w_->o_proj.get(), hid_, b_.out, CUDA_R_32F);
  mark("o_proj");
  marks_ = nullptr;
}

void MlaOp::project() {
  NvtxRange range("mla.project");
  const int64_t T = s_.tokens();
  const int64_t ql = m_.q_lora_rank ? *m_.q_lora_rank : 0;
  KSlices qkv{kv_f32_.get(), 1, 0};
  const float* kv = kv_f32_.get();
  int ld = int(width_);
  if (ql) {
    // q_a_proj and kv_a_proj_with_mqa read the same input: one GEMM over their stacked weights, its K slices (where
    // tuning cuts K) summed by the norm kernel as it loads them.
    qkv = linear_unsummed(*blas_handle_, b_.x, T, hid_, w_->qkv_a.get(), ql + width_, qa_f32_.get());
    mark("qkv_a");
    kv = qkv.data + ql;
    ld = int(ql + width_);
  } else {
    // q_proj (bf16, for RoPE and the absorb) and kv_a_proj_with_mqa (fp32, for its RMSNorm) over their stacked weights.
    linear_pair(*blas_handle_, b_.x, T, hid_, w_->qkv_a.get(), nh_ * qhd_, q_.get(), CUDA_R_16BF, width_, kv_f32_.get());
    mark("qkv_a");
  }
  // (without q_lora_rank, q is here already: its RoPE rides in this kernel)
  const auto norm = [&](auto kernel) {
    launch_pdl(kernel, dim3(unsigned(T)), dim3(kNormThreads), 0, stream_, qkv.data, int(ql), w_->q_a_norm.get(), qa_.get(), kv, ld, qkv.stride,
               w_->kv_a_norm.get(), b_.rope_cos, b_.rope_sin, cache_view(*b_.cache), b_.lengths, int(s_.q_len), int(r_), float(m_.rms_norm_eps),
               kv_new_.get(), ql ? nullptr : q_.get(), int(nh_), int(nope_), q_cat_);
  };
  switch (qkv.count) {
    case 1: norm(norm_and_cache_kernel<1>); break;
    case 2: norm(norm_and_cache_kernel<2>); break;
    case 3: norm(norm_and_cache_kernel<3>); break;
    case 4: norm(norm_and_cache_kernel<4>); break;
    case 5: norm(norm_and_cache_kernel<5>); break;
    case 6: norm(norm_and_cache_kernel<6>); break;
    case 7: norm(norm_and_cache_kernel<7>); break;
    case 8: norm(norm_and_cache_kernel<8>); break;
    default: throw std::logic_error("norm kernel: more K slices than kMaxUnsummedSlices");
  }
  static_assert(kMaxUnsummedSlices == 8, "one norm kernel per slice count");
  DSLAB_CHECK_LAUNCH();
  mark("norm_cache_write");
  if (!ql) return;
  linear(*blas_handle_, qa_.get(), T, ql, w_->q_b.get(), nh_ * qhd_, q_.get(), CUDA_R_16BF);
  mark("q_b");
  if (q_cat_) return;  // (a form with q_cat rotates it in concat_query, after the absorb)
  rope_query();
  mark("rope_q");
}

void MlaOp::rope_query() const {
  const int64_t heads_x_tokens = s_.tokens() * nh_;
  launch_pdl(rope_q_kernel, dim3(unsigned((heads_x_tokens + 7) / 8)), dim3(256), 0, stream_, q_.get(), b_.rope_cos, b_.rope_sin, heads_x_tokens, int(nh_),
             int(nope_), int(rope_), int(r_), q_cat_);
  DSLAB_CHECK_LAUNCH();
}

void MlaOp::gather_latent(__nv_bfloat16* out) const {
  gather_kernel<<<dim3(unsigned((max_keys_ + 7) / 8), unsigned(s_.batch)), 256, 0, stream_>>>(cache_view(*b_.cache), b_.lengths, s_.q_len,
                                                                                               keys_, out);
  DSLAB_CHECK_LAUNCH();
}

void MlaOp::softmax(const float* scores, __nv_bfloat16* probs, int64_t rows, int64_t rows_per_request, int64_t div) const {
  softmax_kernel<<<unsigned(rows), 256, 0, stream_>>>(scores, probs, keys_, scale_, b_.lengths, rows_per_request, div, s_.q_len);
  DSLAB_CHECK_LAUNCH();
}

void MlaOp::decompress(const __nv_bfloat16* latent, int64_t rows, __nv_bfloat16* out) const {
  const int64_t dec = nh_ * (nope_ + vd_);
  gemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, dec, rows, r_, w_->kv_b.get(), r_, 0, latent, width_, 0, out, CUDA_R_16BF, dec, 0, 1);
}

void MlaOp::absorb_query(__nv_bfloat16* q_abs, int64_t ld) const {
  // Per head h: q_abs[t][h][0..r) = q_nope[t][h] · W_UK[h] (W_UK[h]: rows h*(nope+vd) .. +nope of kv_b_proj, [nope][r]).
  const BatchedGemv own{q_.get(), nh_ * qhd_, qhd_, nope_, w_->kv_b.get(), (nope_ + vd_) * r_, r_, true, q_abs, nh_ * ld, ld};
  if (batched_gemv(*blas_handle_, own, s_.tokens(), nh_)) return;
  gemm(*blas_handle_, CUBLAS_OP_N, CUBLAS_OP_N, r_, s_.tokens(), nope_, w_->kv_b.get(), r_, (nope_ + vd_) * r_, q_.get(), nh_ * qhd_, qhd_,
       q_abs, CUDA_R_16BF, nh_ * ld, ld, nh_);
}

void MlaOp::concat_query() const {
  if (!q_cat_) throw std::logic_error("concat_query: the form did not allocate q_cat_ in prepare_form");
  absorb_query(q_cat_, width_);
  if (fused_) mark("absorb_q");  // (an unfused form's attend op is timed whole)
  // The rope part after the absorbed one (they are independent): the kernel after concat_query (the fused decode)
  // then follows a kernel of ours launched with PDL, so its CTAs start, and copy their first cache blocks, while the
  // RoPE runs - behind cuBLAS's absorb GEMM (no PDL) they started only once it had finished. (H100, session 30: the
  // step 0.3-0.8% shorter at 16 heads, batch 64-128, 4K-8K; the same at 128 heads.) q_lora_rank models; the others
  // rotate q in norm_and_cache_kernel (project()).
  if (!m_.q_lora_rank) return;
  rope_query();
  if (fused_) mark("rope_q");
}

void MlaOp::absorb_output(const __nv_bfloat16* o_lat) const {
  // Per head h: attn[t][h] = o_lat[t][h] · W_UV[h]^T (W_UV[h]: [vd][r] after the W_UK rows).
  const BatchedGemv own{o_lat, nh_ * r_, r_, r_, w_->kv_b.get() + nope_ * r_, (nope_ + vd_) * r_, vd_, false, attn_.get(), nh_ * vd_, vd_};
  if (batched_gemv(*blas_handle_, own, s_.tokens(), nh_)) return;
  gemm(*blas_handle_, CUBLAS_OP_T, CUBLAS_OP_N, vd_, s_.tokens(), r_, w_->kv_b.get() + nope_ * r_, r_, (nope_ + vd_) * r_, o_lat, nh_ * r_,
       r_, attn_.get(), CUDA_R_16BF, nh_ * vd_, vd_, nh_);
}

const void** MlaOp::pointer_array(const std::vector<const void*>& host) {
  pointer_arrays_.emplace_back();
  pointer_arrays_.back().upload(host);
  return pointer_arrays_.back().get();
}

// ---- the registry ----------------------------------------------------------------------------------------

bool register_mla_op(const char* name, const char* summary, MlaOpFactory make) {
  OpRegistry<MlaOp>::instance().add(name, make);
  const std::string n = name;
  return register_variant({n, Device::cuda, summary, [n] { return std::unique_ptr<Variant>(new GpuVariant(n)); }});
}

std::unique_ptr<MlaOp> make_mla_op(const std::string& name) { return OpRegistry<MlaOp>::instance().make(name); }
std::vector<std::string> mla_op_names() { return OpRegistry<MlaOp>::instance().names(); }

// ---- the family variant ----------------------------------------------------------------------------------

GpuVariant::GpuVariant(const std::string& op_name) : op_(make_mla_op(op_name)) {
  if (!op_) throw std::logic_error("no MLA op named " + op_name);
}

GpuVariant::~GpuVariant() {
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
}

std::vector<std::pair<std::string, std::string>> GpuVariant::axes() const {
  std::vector<std::pair<std::string, std::string>> a = {{"batch", "1"}, {"q_len", "1"}, {"kv_len", "4096"}, {"heads", ""}, {"page_size", "64"}, {"len_dist", "uniform"},
          {"kv_dtype", "bf16"}, {"executor", op_->fused() ? "graph" : "eager"}, {"proj", "own"}};
  if (op_->fused()) a.push_back({"kv_splits", "auto"});  // the split-KV CTAs per row tile (auto: auto_kv_splits)
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

void GpuVariant::prepare(const ModelFile& model, const Point& point, uint64_t seed) {
  m_ = parse_model_config(model.config, model.name, model.path);
  s_ = shape_of(m_, point);
  p_ = gpu_problem(m_, s_, point.integer("page_size"), point.text("len_dist"), seed);
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
  op_->prepare(m_, s_, p_->max_keys, p_->weights, b, *blas_, /*lengths_vary=*/false);
  schedule_ = op_->schedule(p_->lengths);
  if (!schedule_.blob.empty())
    DSLAB_CUDA(cudaMemcpy(op_->schedule_buffer(), schedule_.blob.data(), schedule_.blob.size() * 4, cudaMemcpyHostToDevice));
  if (point.text("executor") == "graph") capture_graph();
}

void GpuVariant::capture_graph() {
  op_->forward(0);  // once outside the capture: first-call initialisation (kernel attributes, cuBLAS heuristics) happens here
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
  // kernel (FlashInfer's) never paid it - 0.1-1.4% of the kernel at 16 heads, up to 3.6% at 128 heads (H100, session 29).
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
  return {{"rel_err_vs_dense", rel_err_vs_dense_}, {"attended_keys", attended_keys_mean_}, {"mass_recall", mass_recall_}};
}

std::vector<DumpTensor> GpuVariant::tensors() const {
  std::vector<DumpTensor> t;
  if (!host_out_.empty()) t.push_back({"output", "F32", {s_.batch, s_.q_len, m_.hidden_size}, host_out_.data(), host_out_.size() * 4});
  t.push_back({"hidden_states", "BF16", {s_.batch, s_.q_len, m_.hidden_size}, p_->hidden.data(), p_->hidden.size() * 2});
  return t;
}

}  // namespace dslab::mla::cuda
