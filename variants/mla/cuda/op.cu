// The MLA op every GPU form derives from: projections, the new token's cache write, the query's RoPE, the
// unfused forms' gather / softmax / absorbs, o_proj, and the registry the layers pick ops from.
#include "variants/mla/cuda/mla_cuda.h"

#include <cuda_fp8.h>

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
#include "variants/common/cuda/device_random.h"
#include "variants/common/cuda/gemv_kernels.cuh"
#include "variants/common/cuda/nvtx.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/rng.h"
#include "variants/mla/cuda/kernels.cuh"

namespace dslab::mla::cuda {

namespace {

// ---- kernels -------------------------------------------------------------------------------------------

// DeepSeek RoPE on one pair of a head's rope part: the interleaved pair (x[2p], x[2p + 1]) in, with the
// position's cos / sin of pair p; out the de-interleaved elements p (.x) and p + half (.y).
__device__ inline float2 rope_pair(float2 pair, float cs, float sn) {
  return make_float2(pair.x * cs - pair.y * sn, pair.y * cs + pair.x * sn);
}

// RoPE of one (token, head) row of q (row = token * heads + head) by one warp, in place, and into q_cat's rope part
// behind the absorbed query where a form uses it; lane i takes pairs i, i + 32, ...
constexpr int kRopePairsPerLane = 4;  // rope parts up to 256 wide (DeepSeek: 64)
__device__ inline void rope_q_row(__nv_bfloat16* q, const float* cos_table, const float* sin_table, int64_t row,
                                  int64_t t, int nope, int rope, int r, __nv_bfloat16* q_cat) {
  const int lane = int(threadIdx.x) % 32, half = rope / 2;
  __nv_bfloat16* x = q + row * (nope + rope) + nope;
  __nv_bfloat16 lo[kRopePairsPerLane], hi[kRopePairsPerLane];
#pragma unroll
  for (int k = 0; k < kRopePairsPerLane; ++k) {
    const int p = lane + 32 * k;
    if (p >= half) break;
    const float2 y = rope_pair(__bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(x)[p]),
                               cos_table[t * half + p], sin_table[t * half + p]);
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
// waited out each value's loads in turn, and the kernel took 8.5 us instead of 3.5 - H100).
constexpr int kNormThreads = 256, kNormQPerThread = 8,
              kNormLatentPerThread = 4;  // q_lora_rank <= 2048, kv_lora_rank <= 1024
struct NormCacheArgs {
  const float* qa_f32;
  int ql;
  const __nv_bfloat16* q_a_norm;
  __nv_bfloat16* qa;
  const float* kv_f32;
  int ld;
  int64_t slice_stride;
  const __nv_bfloat16* kv_norm;
  const float *cos_table, *sin_table;
  CacheView cache;
  const int32_t* lengths;
  int q_len, r;
  float eps;
  __nv_bfloat16* kv_new;
  __nv_bfloat16* q;
  int heads, nope;
  __nv_bfloat16* q_cat;
  int tokens;  // blocks of the launch that are the norm's (one a token)
};
// Token t's norms, RoPE and cache write (the block's whole work; every thread of the block calls it).
template <int kSlices>
__device__ __forceinline__ void norm_and_cache_block(const NormCacheArgs& a, int t) {
  const float* qa_f32 = a.qa_f32;
  const int ql = a.ql, ld = a.ld, q_len = a.q_len, r = a.r, heads = a.heads, nope = a.nope;
  const int64_t slice_stride = a.slice_stride;
  const float *cos_table = a.cos_table, *sin_table = a.sin_table;
  const CacheView& cache = a.cache;
  __nv_bfloat16 *kv_new = a.kv_new, *q = a.q, *q_cat = a.q_cat;
  __shared__ float2 warp_sums[kNormThreads / 32];
  __shared__ float token[32 * kMaxValuesPerLane];  // int8 / fp8 caches: the row, bf16-rounded, for one warp to quantise
  const int b = t / q_len, s = t % q_len, width = int(cache.width), half = (width - r) / 2;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  // Before griddepcontrol.wait, what no kernel of the step writes (the norms' weights, the RoPE tables, the token's
  // cache slot from its length and page table: set before the step), so that only the projection's output is left
  // to load once the kernel before has finished.
  const int64_t slot = cache.slot(b, a.lengths[b] + s);  // (the same two loads in every thread: broadcasts)
  float qv[kNormQPerThread], qw[kNormQPerThread], lv[kNormLatentPerThread], lw[kNormLatentPerThread];
#pragma unroll
  for (int k = 0; k < kNormQPerThread; ++k) {
    const int i = int(threadIdx.x) + kNormThreads * k;
    qw[k] = i < ql ? __bfloat162float(a.q_a_norm[i]) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kNormLatentPerThread; ++k) {
    const int i = int(threadIdx.x) + kNormThreads * k;
    lw[k] = i < r ? __bfloat162float(a.kv_norm[i]) : 0.0f;
  }
  const bool has_pair = int(threadIdx.x) < half;  // this thread rotates rope pair threadIdx.x
  float2 pair{0, 0};
  float cs = 0, sn = 0;
  if (has_pair) {
    cs = cos_table[int64_t(t) * half + threadIdx.x];
    sn = sin_table[int64_t(t) * half + threadIdx.x];
  }
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  if (q) {
    const int rope = int(cache.width) - r;
    for (int h = int(threadIdx.x) / 32; h < heads; h += kNormThreads / 32)
      rope_q_row(q, cos_table, sin_table, int64_t(t) * heads + h, t, nope, rope, r, q_cat);
  }
  const float* q_row = qa_f32 + int64_t(t) * ld;  // (read only below ql)
  const float* kv = a.kv_f32 + int64_t(t) * ld;
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
  const float inv_q = rsqrtf(total.x / float(max(ql, 1)) + a.eps), inv_kv = rsqrtf(total.y / float(r) + a.eps);
#pragma unroll
  for (int k = 0; k < kNormQPerThread; ++k) {
    const int i = int(threadIdx.x) + kNormThreads * k;
    if (i < ql) a.qa[int64_t(t) * ql + i] = __float2bfloat16_rn(qv[k] * inv_q * qw[k]);
  }
  const bool quantised = cache.dtype != KvDtype::bf16;
  __nv_bfloat16* const row = reinterpret_cast<__nv_bfloat16*>(cache.values) + slot * width;  // (bf16 caches)
  auto put = [&](int i, float y) {
    const __nv_bfloat16 v = __float2bfloat16_rn(y);
    if (quantised)
      token[i] = __bfloat162float(v);
    else
      row[i] = v;
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
template <int kSlices>
__global__ void __launch_bounds__(kNormThreads) norm_and_cache_kernel(const NormCacheArgs a) {
  norm_and_cache_block<kSlices>(a, int(blockIdx.x));
}

// The norm kernel and the W_UK absorb (q_nope·W_UK per head into q_cat, gemv_kn_block) in one launch: blocks
// 0 .. a.tokens - 1 are the norm's, the rest the absorb's (column block fastest, then head). The two read the q /
// kv_a GEMV's outputs and write disjoint parts of q_cat (the norm its rope part), so they need not run one after
// the other: the decode kernel then waits for one launch where it waited for two in a chain. (Models without
// q_lora_rank, at the own GEMV's 1-2 rows: their q is ready when the norm runs.)
template <int M>
__global__ void __launch_bounds__(kNormThreads)
    norm_cache_absorb_kernel(const NormCacheArgs a, const gpu::gemv::GemvArgs absorb, int column_blocks) {
  static_assert(kNormThreads == gpu::gemv::kGemvThreads, "one block size for both halves");
  const int block = int(blockIdx.x);
  if (block < a.tokens) return norm_and_cache_block<1>(a, block);
  const int i = block - a.tokens;
  gpu::gemv::gemv_kn_block<M>(absorb, i % column_blocks, i / column_blocks);
}

// After q_b (or q_proj), which wrote q in bf16: RoPE on each head's rope part, in place, and behind the absorbed
// part of q_cat where a form uses it (rope_pair). One warp per (token, head); lane i takes pairs i, i + 32, ...
__global__ void rope_q_kernel(__nv_bfloat16* q, const float* cos_table, const float* sin_table, int64_t rows, int heads,
                              int nope, int rope, int r, __nv_bfloat16* q_cat) {
  pdl_wait();  // (launched with launch_pdl: see variants/common/cuda/pdl.cuh)
  pdl_launch_dependents();
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // token * heads + head
  if (row >= rows) return;
  rope_q_row(q, cos_table, sin_table, row, row / heads, nope, rope, r, q_cat);
}

// Paged cache -> contiguous [batch][keys][width] bf16, one warp per token.
__global__ void gather_kernel(CacheView cache, const int32_t* lengths, int64_t q_len, int64_t keys,
                              __nv_bfloat16* out) {
  const int64_t b = blockIdx.y;
  const int64_t token = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (token >= lengths[b] + q_len) return;
  const int lane = threadIdx.x % 32;
  float v[kMaxValuesPerLane];
  load_token(cache, cache.slot(b, token), v, lane);
  __nv_bfloat16* dst = out + (b * keys + token) * cache.width;
  for (int k = 0; k < kMaxValuesPerLane && lane + 32 * k < cache.width; ++k)
    dst[lane + 32 * k] = __float2bfloat16_rn(v[k]);
}

__global__ void softmax_kernel(const float* scores, __nv_bfloat16* probs, int64_t n, float scale,
                               const int32_t* lengths, int64_t rows_per_request, int64_t div, int64_t q_len) {
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

// ---- the op ----------------------------------------------------------------------------------------------

std::string MlaOp::unsupported(const ModelConfig& m, const Shape& s) const {
  if (const std::string why = unavailable(); !why.empty()) return why;
  if (!supports_kv_dtype(s.kv_dtype))
    return std::string("kv_dtype ") + kv_dtype_name(s.kv_dtype) + " not implemented by this form";
  if (fused_ && (s.heads * s.q_len) % 16) return "decode kernel: heads x q_len must be a multiple of 16";
  if (fused_ && s.q_len > 2) return "decode kernel: q_len 1 or 2 (MTP); extend runs on the unfused forms";
  if (m.q_lora_rank.value_or(0) > kNormThreads * kNormQPerThread ||
      m.kv_lora_rank > kNormThreads * kNormLatentPerThread)
    return "norm kernel: q_lora_rank up to " + std::to_string(kNormThreads * kNormQPerThread) +
           ", kv_lora_rank up to " + std::to_string(kNormThreads * kNormLatentPerThread);
  if (m.qk_rope_head_dim > 64 * kRopePairsPerLane)
    return "RoPE kernel: qk_rope_head_dim up to " + std::to_string(64 * kRopePairsPerLane);
  if (m.kv_lora_rank + m.qk_rope_head_dim != 576 && fused_) return "fused kernel is built for a 512+64 latent";
  return form_unsupported(m, s);
}

double MlaOp::scratch_bytes(const ModelConfig& m, const Shape& s, int64_t max_keys) const {
  return mla::gpu_scratch_bytes(m, algo_, s, max_keys, fused_);
}

void MlaOp::prepare(const ModelConfig& m, const Shape& s, int64_t max_keys, const MlaWeights& w, const MlaBuffers& b,
                    BlasHandle& blas, bool lengths_vary, ScratchArena* arena) {
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
    gpu::NvtxRange range("mla.attend");
    attend();
    if (!fused_) mark("attend");  // the fused op marks its own pieces
  }
  gpu::NvtxRange range("mla.o_proj");
  linear(*blas_handle_, attn_.get(), s_.tokens(), nh_ * vd_, w_->o_proj.get(), hid_, b_.out, CUDA_R_32F);
  mark("o_proj");
  marks_ = nullptr;
}

void MlaOp::project() {
  gpu::NvtxRange range("mla.project");
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
    linear_pair(*blas_handle_, b_.x, T, hid_, w_->qkv_a.get(), nh_ * qhd_, q_.get(), CUDA_R_16BF, width_,
                kv_f32_.get());
    mark("qkv_a");
  }
  // (without q_lora_rank, q is here already: its RoPE rides in this kernel)
  const NormCacheArgs norm_args{qkv.data,
                                int(ql),
                                w_->q_a_norm.get(),
                                qa_.get(),
                                kv,
                                ld,
                                qkv.stride,
                                w_->kv_a_norm.get(),
                                b_.rope_cos,
                                b_.rope_sin,
                                cache_view(*b_.cache),
                                b_.lengths,
                                int(s_.q_len),
                                int(r_),
                                float(m_.rms_norm_eps),
                                kv_new_.get(),
                                ql ? nullptr : q_.get(),
                                int(nh_),
                                int(nope_),
                                q_cat_,
                                int(T)};
  query_absorbed_ = false;
  if (fused_ && s_.fused_absorbs && !ql && q_cat_ && qkv.count == 1 &&
      gpu::batched_gemv_fits(*blas_handle_, query_absorb(q_cat_, width_), T)) {
    // The W_UK absorb in the norm's launch (norm_cache_absorb_kernel); concat_query() then has nothing left to do.
    const BatchedGemv g = query_absorb(q_cat_, width_);
    const gpu::gemv::GemvArgs absorb = gpu::gemv::batched_args(g);
    const int column_blocks = int((g.N + gpu::gemv::kKnColumns - 1) / gpu::gemv::kKnColumns);
    const dim3 grid(unsigned(T + int64_t(column_blocks) * nh_));
    if (T == 1)
      launch_pdl(norm_cache_absorb_kernel<1>, grid, dim3(kNormThreads), 0, stream_, norm_args, absorb, column_blocks);
    else
      launch_pdl(norm_cache_absorb_kernel<2>, grid, dim3(kNormThreads), 0, stream_, norm_args, absorb, column_blocks);
    DSLAB_CHECK_LAUNCH();
    query_absorbed_ = true;
    mark("norm_cache_write");  // (the absorb's time too: there is no op_us.absorb_q)
    return;
  }
  const auto norm = [&](auto kernel) {
    launch_pdl(kernel, dim3(unsigned(T)), dim3(kNormThreads), 0, stream_, norm_args);
  };
  switch (qkv.count) {
    case 1:
      norm(norm_and_cache_kernel<1>);
      break;
    case 2:
      norm(norm_and_cache_kernel<2>);
      break;
    case 3:
      norm(norm_and_cache_kernel<3>);
      break;
    case 4:
      norm(norm_and_cache_kernel<4>);
      break;
    case 5:
      norm(norm_and_cache_kernel<5>);
      break;
    case 6:
      norm(norm_and_cache_kernel<6>);
      break;
    case 7:
      norm(norm_and_cache_kernel<7>);
      break;
    case 8:
      norm(norm_and_cache_kernel<8>);
      break;
    default:
      throw std::logic_error("norm kernel: more K slices than kMaxUnsummedSlices");
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
  launch_pdl(rope_q_kernel, dim3(unsigned((heads_x_tokens + 7) / 8)), dim3(256), 0, stream_, q_.get(), b_.rope_cos,
             b_.rope_sin, heads_x_tokens, int(nh_), int(nope_), int(rope_), int(r_), q_cat_);
  DSLAB_CHECK_LAUNCH();
}

void MlaOp::gather_latent(__nv_bfloat16* out) const {
  gather_kernel<<<dim3(unsigned((max_keys_ + 7) / 8), unsigned(s_.batch)), 256, 0, stream_>>>(
      cache_view(*b_.cache), b_.lengths, s_.q_len, keys_, out);
  DSLAB_CHECK_LAUNCH();
}

void MlaOp::softmax(const float* scores, __nv_bfloat16* probs, int64_t rows, int64_t rows_per_request,
                    int64_t div) const {
  softmax_kernel<<<unsigned(rows), 256, 0, stream_>>>(scores, probs, keys_, scale_, b_.lengths, rows_per_request, div,
                                                      s_.q_len);
  DSLAB_CHECK_LAUNCH();
}

void MlaOp::decompress(const __nv_bfloat16* latent, int64_t rows, __nv_bfloat16* out) const {
  const int64_t dec = nh_ * (nope_ + vd_);
  gemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, dec, rows, r_, w_->kv_b.get(), r_, 0, latent, width_, 0, out, CUDA_R_16BF, dec,
       0, 1);
}

BatchedGemv MlaOp::query_absorb(__nv_bfloat16* q_abs, int64_t ld) const {
  // Per head h: q_abs[t][h][0..r) = q_nope[t][h] · W_UK[h] (W_UK[h]: rows h*(nope+vd) .. +nope of kv_b_proj,
  // [nope][r]).
  return {q_.get(), nh_ * qhd_, qhd_, nope_, w_->kv_b.get(), (nope_ + vd_) * r_, r_, true, q_abs, nh_ * ld, ld};
}

void MlaOp::absorb_query(__nv_bfloat16* q_abs, int64_t ld) const {
  if (batched_gemv(*blas_handle_, query_absorb(q_abs, ld), s_.tokens(), nh_)) return;
  gemm(*blas_handle_, CUBLAS_OP_N, CUBLAS_OP_N, r_, s_.tokens(), nope_, w_->kv_b.get(), r_, (nope_ + vd_) * r_,
       q_.get(), nh_ * qhd_, qhd_, q_abs, CUDA_R_16BF, nh_ * ld, ld, nh_);
}

void MlaOp::concat_query() const {
  if (!q_cat_) throw std::logic_error("concat_query: the form did not allocate q_cat_ in prepare_form");
  if (!query_absorbed_) {  // (else done in the norm's launch: project())
    absorb_query(q_cat_, width_);
    if (fused_) mark("absorb_q");  // (an unfused form's attend op is timed whole)
  }
  // The rope part after the absorbed one (they are independent): the kernel after concat_query (the fused decode)
  // then follows a kernel of ours launched with PDL, so its CTAs start, and copy their first cache blocks, while the
  // RoPE runs - behind cuBLAS's absorb GEMM (no PDL) they started only once it had finished. (H100: the
  // step 0.3-0.8% shorter at 16 heads, batch 64-128, 4K-8K; the same at 128 heads.) q_lora_rank models; the others
  // rotate q in norm_and_cache_kernel (project()).
  if (!m_.q_lora_rank) return;
  rope_query();
  if (fused_) mark("rope_q");
}

void MlaOp::absorb_output(const __nv_bfloat16* o_lat) const {
  // Per head h: attn[t][h] = o_lat[t][h] · W_UV[h]^T (W_UV[h]: [vd][r] after the W_UK rows).
  const BatchedGemv own{o_lat, nh_ * r_,    r_,        r_, w_->kv_b.get() + nope_ * r_, (nope_ + vd_) * r_, vd_,
                        false, attn_.get(), nh_ * vd_, vd_};
  if (batched_gemv(*blas_handle_, own, s_.tokens(), nh_)) return;
  gemm(*blas_handle_, CUBLAS_OP_T, CUBLAS_OP_N, vd_, s_.tokens(), r_, w_->kv_b.get() + nope_ * r_, r_,
       (nope_ + vd_) * r_, o_lat, nh_ * r_, r_, attn_.get(), CUDA_R_16BF, nh_ * vd_, vd_, nh_);
}

const void** MlaOp::pointer_array(const std::vector<const void*>& host) {
  pointer_arrays_.emplace_back();
  pointer_arrays_.back().upload(host);
  return pointer_arrays_.back().get();
}

// ---- the registry ----------------------------------------------------------------------------------------

bool register_mla_op(const char* name, const char* summary, MlaOpFactory make) {
  return register_op_and_variant<MlaOp, GpuVariant>(name, summary, make);
}

std::unique_ptr<MlaOp> make_mla_op(const std::string& name) { return OpRegistry<MlaOp>::instance().make(name); }
std::vector<std::string> mla_op_names() { return OpRegistry<MlaOp>::instance().names(); }

}  // namespace dslab::mla::cuda
