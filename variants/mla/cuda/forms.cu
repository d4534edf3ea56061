// The four unfused MLA forms on the GPU, written as the seed benchmark's PyTorch forms are: cuBLAS for every
// matmul, small kernels between them. They read the paged cache by gathering each request's pages into a
// contiguous buffer first (cuBLAS cannot follow a page table); that copy is part of their timed step. mla/cd_paged/cuda
// is cd with a kernel of ours that follows the page table instead, read beside it.
#include <algorithm>

#include "harness/host.h"
#include "variants/mla/cuda/kernels.cuh"
#include "variants/mla/cuda/mla_cuda.h"

namespace dslab::mla::cuda {
namespace {

void gemm_batched(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
                  const void** a, int64_t lda, const void** b, int64_t ldb, void** c, cudaDataType c_type, int64_t ldc,
                  int64_t batch) {
  const float alpha = 1.0f, beta = 0.0f;
  DSLAB_CUBLAS(cublasGemmBatchedEx(h, op_a, op_b, int(m), int(n), int(k), &alpha, a, CUDA_R_16BF, int(lda), b,
                                   CUDA_R_16BF, int(ldb), &beta, c, c_type, int(ldc), int(batch), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
}

// K of head h for every (request, key): [k_nope (from the decompressed rows) ‖ k_pe (shared by all heads)].
// decompressed: [rows][heads][nope + vd]; latent: [rows][width] (rope at r); k: [rows][heads][nope + rope].
__global__ void concat_key_kernel(const __nv_bfloat16* decompressed, const __nv_bfloat16* latent, int64_t rows,
                                  int64_t heads, int64_t nope, int64_t vd, int64_t rope, int64_t r, int64_t width,
                                  __nv_bfloat16* k) {
  const int64_t qhd = nope + rope, total = rows * heads * qhd;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / (heads * qhd), h = (i / qhd) % heads, d = i % qhd;
    k[i] = d < nope ? decompressed[(row * heads + h) * (nope + vd) + d] : latent[row * width + r + d - nope];
  }
}

// a_cc's per-head copy of the [latent ‖ rope] key: [batch][heads][keys][width] from [batch][keys][width].
__global__ void broadcast_heads_kernel(const uint4* latent, int64_t keys_x_width16, int64_t heads, int64_t batch,
                                       uint4* out) {
  const int64_t total = batch * heads * keys_x_width16;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / (heads * keys_x_width16), e = i % keys_x_width16;
    out[i] = latent[b * keys_x_width16 + e];
  }
}

// cd's cache: decompressed K [slot][heads][qhd] and V [slot][heads][vd] in the latent cache's pages. Row `row`
// of `decompressed`/`latent` is token j = row % rows_per_request of request b = row / rows_per_request; with
// new_tokens it sits at position lengths[b] + j, else at j (only j < lengths[b] are stored).
__global__ void store_decompressed_kernel(const __nv_bfloat16* decompressed, const __nv_bfloat16* latent,
                                          int64_t latent_ld, int64_t rows, int64_t rows_per_request, bool new_tokens,
                                          CacheView pages, const int32_t* lengths, int64_t heads, int64_t nope,
                                          int64_t vd, int64_t rope, int64_t r, __nv_bfloat16* k_pool,
                                          __nv_bfloat16* v_pool) {
  const int64_t qhd = nope + rope, per_row = heads * (qhd + vd);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * per_row;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, e = i % per_row, b = row / rows_per_request, j = row % rows_per_request;
    if (!new_tokens && j >= lengths[b]) continue;
    const int64_t slot = pages.slot(b, new_tokens ? lengths[b] + j : j);
    if (e < heads * qhd) {
      const int64_t h = e / qhd, d = e % qhd;
      k_pool[slot * heads * qhd + e] =
          d < nope ? decompressed[(row * heads + h) * (nope + vd) + d] : latent[row * latent_ld + r + d - nope];
    } else {
      const int64_t h = (e - heads * qhd) / vd, d = (e - heads * qhd) % vd;
      v_pool[slot * heads * vd + h * vd + d] = decompressed[(row * heads + h) * (nope + vd) + nope + d];
    }
  }
}

// cd's pages -> contiguous [batch][keys][heads][qhd] and [..][vd].
__global__ void gather_decompressed_kernel(CacheView pages, const int32_t* lengths, int64_t q_len, int64_t keys,
                                           int64_t k_row16, int64_t v_row16, const uint4* k_pool, const uint4* v_pool,
                                           uint4* k, uint4* v) {
  const int64_t b = blockIdx.y;
  for (int64_t token = blockIdx.x; token < lengths[b] + q_len; token += gridDim.x) {
    const int64_t slot = pages.slot(b, token), dst = b * keys + token;
    for (int64_t e = threadIdx.x; e < k_row16; e += blockDim.x) k[dst * k_row16 + e] = k_pool[slot * k_row16 + e];
    for (int64_t e = threadIdx.x; e < v_row16; e += blockDim.x) v[dst * v_row16 + e] = v_pool[slot * v_row16 + e];
  }
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 132 * 32)); }

// cd's attention read straight from its K/V pages (no gather): flash-decoding per (request, head, split of the
// keys, block of up to Q new tokens). Each warp walks keys U at a time (their loads issued together,
// so enough bytes are in flight), a key's score by lanes over bf16 pairs and a shuffle sum, an online softmax per
// query; the warps' states merge in shared memory into the split's normalised output and log-sum-exp, which
// cd_merge_kernel combines across splits.
constexpr int kCdWarps = 4, kCdMaxQPairs = 4, kCdMaxVPairs = 2;  // qhd <= 256, vd <= 128
// Q new tokens a block, U keys a warp's group. A decode step's one token gets a kernel that holds one query (96
// registers, 2 KB of shared state) and eight keys in flight a warp: its attention ran 1.08-1.13x faster than four
// queries' with four keys in the same run (16 heads, batch 32, 4K-16K; H100; at 128 heads, 4K, 3735 us
// against 4421 before); one query with four keys was 6-7% slower than four queries'. MTP and extend steps keep
// four of each (four queries' registers with eight keys ran 10-21% slower).
struct CdShape {
  int queries, unroll;
};
constexpr CdShape kCdOneToken{1, 8}, kCdTokens{4, 4};
CdShape cd_shape(int64_t q_len) { return q_len == 1 ? kCdOneToken : kCdTokens; }
template <int Q, int U>
__global__ void __launch_bounds__(kCdWarps * 32)
    cd_decode_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k_pool,
                     const __nv_bfloat16* __restrict__ v_pool, CacheView pages, const int32_t* __restrict__ lengths,
                     int heads, int qhd, int vd, int q_len, float scale, int chunk, int splits,
                     float* __restrict__ o_part, float* __restrict__ lse_part) {
  __shared__ float state_m[kCdWarps][Q], state_l[kCdWarps][Q];
  __shared__ float state_o[kCdWarps][Q][2 * 32 * kCdMaxVPairs];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int split = int(blockIdx.x), h = int(blockIdx.y) % heads, b = int(blockIdx.y) / heads, q0 = int(blockIdx.z) * Q;
  const int nq = min(Q, q_len - q0), L = lengths[b];
  const int first = split * chunk, last = min(L + q0 + nq, first + chunk);  // (keys the block's last query sees)
  const int q_pairs = qhd / 2, v_pairs = vd / 2;
  // This lane's query pairs, as floats.
  float2 qv[Q][kCdMaxQPairs];
#pragma unroll
  for (int i = 0; i < Q; ++i)
#pragma unroll
    for (int j = 0; j < kCdMaxQPairs; ++j) {
      const int pair = lane + 32 * j;
      qv[i][j] = i < nq && pair < q_pairs ? __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(
                                                q + ((int64_t(b) * q_len + q0 + i) * heads + h) * qhd)[pair])
                                          : make_float2(0.0f, 0.0f);
    }
  float m[Q], l[Q];
  float2 acc[Q][kCdMaxVPairs];
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    m[i] = -INFINITY, l[i] = 0;
#pragma unroll
    for (int j = 0; j < kCdMaxVPairs; ++j) acc[i][j] = make_float2(0.0f, 0.0f);
  }
  // A group's keys are consecutive slots of one page where pages and splits hold whole groups (chunk is a multiple
  // of U): one page-table lookup a group, in 32-bit arithmetic (CacheView::slot's 64-bit division per key
  // cost more instructions than the key's dot product and softmax).
  const int P = int(pages.page_size);
  const int32_t* table = pages.page_table + int64_t(b) * pages.pages_per_request;
  const bool group_in_page = P % U == 0 && chunk % U == 0;
  for (int base = first + warp * U; base < last; base += kCdWarps * U) {
    __nv_bfloat162 kr[U][kCdMaxQPairs], vr[U][kCdMaxVPairs];
    const int64_t group_slot = group_in_page ? int64_t(table[base / P]) * P + base % P : 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of the group first
      const int key = base + u;
      const int64_t slot = key >= last ? 0 : group_in_page ? group_slot + u : int64_t(table[key / P]) * P + key % P;
      const auto* krow = reinterpret_cast<const __nv_bfloat162*>(k_pool + (slot * heads + h) * qhd);
      const auto* vrow = reinterpret_cast<const __nv_bfloat162*>(v_pool + (slot * heads + h) * vd);
#pragma unroll
      for (int j = 0; j < kCdMaxQPairs; ++j)
        kr[u][j] = key < last && lane + 32 * j < q_pairs ? krow[lane + 32 * j] : __float2bfloat162_rn(0.0f);
#pragma unroll
      for (int j = 0; j < kCdMaxVPairs; ++j)
        vr[u][j] = key < last && lane + 32 * j < v_pairs ? vrow[lane + 32 * j] : __float2bfloat162_rn(0.0f);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = base + u;
      if (key >= last) break;  // (uniform over the warp)
#pragma unroll
      for (int i = 0; i < Q; ++i) {
        if (i >= nq) break;
        float dot = 0;
#pragma unroll
        for (int j = 0; j < kCdMaxQPairs; ++j) {
          const float2 kf = __bfloat1622float2(kr[u][j]);
          dot += qv[i][j].x * kf.x + qv[i][j].y * kf.y;
        }
        for (int o = 16; o; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (key > L + q0 + i) continue;  // causal: query i sees keys up to its own position
        const float s = dot * scale, m_new = fmaxf(m[i], s), alpha = __expf(m[i] - m_new), p = __expf(s - m_new);
        l[i] = l[i] * alpha + p, m[i] = m_new;
#pragma unroll
        for (int j = 0; j < kCdMaxVPairs; ++j) {
          const float2 vf = __bfloat1622float2(vr[u][j]);
          acc[i][j].x = acc[i][j].x * alpha + p * vf.x, acc[i][j].y = acc[i][j].y * alpha + p * vf.y;
        }
      }
    }
  }
  // The warps' states merged: each query's max, sum and weighted values over the split's keys.
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    if (lane == 0) state_m[warp][i] = m[i], state_l[warp][i] = l[i];
#pragma unroll
    for (int j = 0; j < kCdMaxVPairs; ++j) {
      state_o[warp][i][2 * (lane + 32 * j)] = acc[i][j].x;
      state_o[warp][i][2 * (lane + 32 * j) + 1] = acc[i][j].y;
    }
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < nq * vd; e += kCdWarps * 32) {
    const int i = e / vd, d = e % vd;
    float top = -INFINITY;
    for (int w = 0; w < kCdWarps; ++w) top = fmaxf(top, state_m[w][i]);
    float sum = 0, out = 0;
    if (top > -INFINITY)
      for (int w = 0; w < kCdWarps; ++w) {
        const float f = __expf(state_m[w][i] - top);
        sum += state_l[w][i] * f, out += state_o[w][i][d] * f;
      }
    const int64_t row = (int64_t(b) * q_len + q0 + i) * heads + h;  // (token, head)
    o_part[(row * splits + split) * vd + d] = sum > 0 ? out / sum : 0.0f;
    if (d == 0) lse_part[row * splits + split] = sum > 0 ? top + __logf(sum) : -INFINITY;
  }
}

// The splits of each (token, head) combined by their log-sum-exps into the attention output [tokens][heads][vd].
__global__ void cd_merge_kernel(const float* __restrict__ o_part, const float* __restrict__ lse_part, int splits,
                                int vd, __nv_bfloat16* __restrict__ attn) {
  const int64_t row = blockIdx.x;
  float top = -INFINITY;
  for (int s = 0; s < splits; ++s) top = fmaxf(top, lse_part[row * splits + s]);
  for (int d = int(threadIdx.x); d < vd; d += int(blockDim.x)) {
    float sum = 0, out = 0;
    for (int s = 0; s < splits; ++s) {
      const float lse = lse_part[row * splits + s];
      if (lse == -INFINITY) continue;
      const float w = __expf(lse - top);
      sum += w, out += w * o_part[(row * splits + s) * vd + d];
    }
    attn[row * vd + d] = __float2bfloat16(out / sum);
  }
}

// cd and cc: multi-head attention over contiguous per-request K [keys][heads][qhd] and V (token stride v_ld,
// head stride v_head), cuBLAS batched over (request, head) through pointer arrays built once.
class MhaForm : public MlaOp {
 public:
  using MlaOp::MlaOp;

 protected:
  void prepare_mha(const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t v_ld, int64_t v_head, int64_t v_request) {
    const int64_t B = s_.batch, S = s_.q_len, N = keys_;
    scores_.scratch(arena_, size_t(B * nh_ * S * N));
    probs_.resize(scores_.size());  // (owned: its padding stays zero)
    probs_.zero();
    std::vector<const void*> k_ptr, q_ptr, v_ptr, p_ptr;
    std::vector<const void*> s_ptr, o_ptr;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < nh_; ++h) {
        k_ptr.push_back(k + (b * N * nh_ + h) * qhd_);
        q_ptr.push_back(q_.get() + (b * S * nh_ + h) * qhd_);
        s_ptr.push_back(scores_.get() + (b * nh_ + h) * S * N);
        v_ptr.push_back(v + b * v_request + h * v_head);
        p_ptr.push_back(probs_.get() + (b * nh_ + h) * S * N);
        o_ptr.push_back(attn_.get() + (b * S * nh_ + h) * vd_);
      }
    k_ptrs_ = pointer_array(k_ptr);
    q_ptrs_ = pointer_array(q_ptr);
    s_ptrs_ = pointer_array(s_ptr);
    v_ptrs_ = pointer_array(v_ptr);
    p_ptrs_ = pointer_array(p_ptr);
    o_ptrs_ = pointer_array(o_ptr);
    v_ld_ = v_ld;
  }
  void attend_mha() {
    const int64_t B = s_.batch, S = s_.q_len, N = keys_;
    // scores[b][h] [S x N] = q[b][h] [S x qhd] · K[b][h]^T
    gemm_batched(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, S, qhd_, k_ptrs_, nh_ * qhd_, q_ptrs_, nh_ * qhd_,
                 const_cast<void**>(s_ptrs_), CUDA_R_32F, N, B * nh_);
    softmax(scores_.get(), probs_.get(), B * nh_ * S, nh_ * S, 1);
    // attn[b][h] [S x vd] = P [S x N] · V [N x vd]
    gemm_batched(blas_, CUBLAS_OP_N, CUBLAS_OP_N, vd_, S, N, v_ptrs_, v_ld_, p_ptrs_, N, const_cast<void**>(o_ptrs_),
                 CUDA_R_16BF, nh_ * vd_, B * nh_);
  }
  DeviceArray<float> scores_;
  DeviceArray<__nv_bfloat16> probs_;

 private:
  const void **k_ptrs_ = nullptr, **q_ptrs_ = nullptr, **s_ptrs_ = nullptr, **v_ptrs_ = nullptr, **p_ptrs_ = nullptr,
             **o_ptrs_ = nullptr;
  int64_t v_ld_ = 0;
};

// cd's K/V pages: every cached token decompressed once at prepare; each step's tokens decompressed into them.
class CdForm : public MhaForm {
 public:
  using MhaForm::MhaForm;

 protected:
  void prepare_pages() {
    const int64_t B = s_.batch, N = keys_, T = s_.tokens(), dec = nh_ * (nope_ + vd_);
    const int64_t slots = int64_t((*b_.cache).values.size() / (*b_.cache).element_bytes()) / width_;
    k_pool_.resize(size_t(slots * nh_ * qhd_));
    v_pool_.resize(size_t(slots * nh_ * vd_));
    {  // The cached tokens' K and V, decompressed once from the problem's latent cache.
      DeviceArray<__nv_bfloat16> latent(size_t(B * N * width_)), decompressed(size_t(B * N * dec));
      latent.zero();
      gather_latent(latent.get());
      decompress_into_pages(latent.get(), B * N, N, false, decompressed.get(), 0);
      DSLAB_CUDA(cudaDeviceSynchronize());
    }
    kv_new_.scratch(arena_, size_t(T * width_));
    new_decompressed_.scratch(arena_, size_t(T * dec));
  }
  void store_step() {  // this step's tokens decompressed into the K/V pages
    decompress_into_pages(kv_new_.get(), s_.tokens(), s_.q_len, true, new_decompressed_.get(), stream_);
  }
  // Latent rows (`per_request` a request, in request order; step: this step's new tokens, after each request's cached
  // ones) decompressed through `decompressed` and stored as K and V at their slots in the pages.
  void decompress_into_pages(const __nv_bfloat16* latent, int64_t rows, int64_t per_request, bool step,
                             __nv_bfloat16* decompressed, cudaStream_t stream) {
    decompress(latent, rows, decompressed);
    store_decompressed_kernel<<<grid_for(rows * nh_ * (qhd_ + vd_)), 256, 0, stream>>>(
        decompressed, latent, width_, rows, per_request, step, cache_view(*b_.cache), b_.lengths, nh_, nope_, vd_,
        rope_, r_, k_pool_.get(), v_pool_.get());
    DSLAB_CHECK_LAUNCH();
  }
  DeviceArray<__nv_bfloat16> k_pool_, v_pool_, new_decompressed_;
};

class CdCuda final : public CdForm {
 public:
  CdCuda() : CdForm(Algo::cd, false) {}

 protected:
  void prepare_form() override {
    const int64_t B = s_.batch, N = keys_;
    prepare_pages();
    k_.resize(size_t(B * N * nh_ * qhd_));
    v_.resize(size_t(B * N * nh_ * vd_));
    k_.zero();
    v_.zero();
    prepare_mha(k_.get(), v_.get(), nh_ * vd_, vd_, N * nh_ * vd_);
  }
  void attend() override {
    // Every request's pages gathered for cuBLAS.
    store_step();
    gather_decompressed_kernel<<<dim3(unsigned(std::min<int64_t>(keys_, 4096)), unsigned(s_.batch)), 128, 0, stream_>>>(
        cache_view((*b_.cache)), b_.lengths, s_.q_len, keys_, nh_ * qhd_ / 8, nh_ * vd_ / 8,
        reinterpret_cast<const uint4*>(k_pool_.get()), reinterpret_cast<const uint4*>(v_pool_.get()),
        reinterpret_cast<uint4*>(k_.get()), reinterpret_cast<uint4*>(v_.get()));
    DSLAB_CHECK_LAUNCH();
    attend_mha();
  }

 private:
  DeviceArray<__nv_bfloat16> k_, v_;
};

// cd without the gather: its own flash-decoding kernel reads each key's K and V once, from the pages.
class CdPagedCuda final : public CdForm {
 public:
  CdPagedCuda() : CdForm(Algo::cd, false) {}
  double scratch_bytes(const ModelConfig& m, const Shape& s, int64_t max_keys) const override {
    // cd's, less what it never allocates (the gathered K/V, the scores and probabilities), plus the splits' partials.
    const double padded = double(s.batch) * double(max_keys + kGpuKeyAlign), H = double(s.heads), S = double(s.q_len);
    const double splits = double(std::max<int64_t>(1, max_keys / 256));
    return mla::gpu_scratch_bytes(m, Algo::cd, s, max_keys, false) -
           padded * H * double(m.q_head_dim() + m.v_head_dim) * 2 - padded * H * S * 6 +
           double(s.tokens()) * H * splits * double(m.v_head_dim + 1) * 4;
  }

 protected:
  std::string form_unsupported(const ModelConfig& m, const Shape&) const override {
    if (m.q_head_dim() % 2 || m.v_head_dim % 2 || m.q_head_dim() > 64 * kCdMaxQPairs ||
        m.v_head_dim > 64 * kCdMaxVPairs)
      return "mla/cd_paged/cuda: head dims even, q_head_dim <= " + std::to_string(64 * kCdMaxQPairs) +
             " and v_head_dim <= " + std::to_string(64 * kCdMaxVPairs);
    return "";
  }
  void prepare_form() override {
    prepare_pages();
    // Splits of each request's keys: about four CTAs per SM over the step's (request, head, query block) triples,
    // at least 256 keys each; fixed here so one captured graph serves steps of any length up to keys_.
    shape_ = cd_shape(s_.q_len);
    const int64_t blocks = s_.batch * nh_ * ((s_.q_len + shape_.queries - 1) / shape_.queries);
    splits_ = int(
        std::clamp<int64_t>((4 * int64_t(gpu_info().sms) + blocks - 1) / blocks, 1, std::max<int64_t>(1, keys_ / 256)));
    chunk_ = int((keys_ + splits_ - 1) / splits_ + shape_.unroll - 1) / shape_.unroll *
             shape_.unroll;  // (whole key groups: see cd_decode_kernel)
    o_part_.scratch(arena_, size_t(s_.tokens() * nh_ * splits_ * vd_));
    lse_part_.scratch(arena_, size_t(s_.tokens() * nh_ * splits_));
  }
  void attend() override {
    store_step();
    const dim3 grid(unsigned(splits_), unsigned(s_.batch * nh_),
                    unsigned((s_.q_len + shape_.queries - 1) / shape_.queries));
    const auto kernel = shape_.queries == 1 ? cd_decode_kernel<kCdOneToken.queries, kCdOneToken.unroll>
                                            : cd_decode_kernel<kCdTokens.queries, kCdTokens.unroll>;
    kernel<<<grid, kCdWarps * 32, 0, stream_>>>(q_.get(), k_pool_.get(), v_pool_.get(), cache_view(*b_.cache),
                                                b_.lengths, int(nh_), int(qhd_), int(vd_), int(s_.q_len), scale_,
                                                chunk_, splits_, o_part_.get(), lse_part_.get());
    DSLAB_CHECK_LAUNCH();
    cd_merge_kernel<<<unsigned(s_.tokens() * nh_), 128, 0, stream_>>>(o_part_.get(), lse_part_.get(), splits_, int(vd_),
                                                                      attn_.get());
    DSLAB_CHECK_LAUNCH();
  }

 private:
  int splits_ = 1, chunk_ = 0;
  CdShape shape_ = kCdTokens;
  DeviceArray<float> o_part_, lse_part_;
};

class CcCuda final : public MhaForm {
 public:
  CcCuda() : MhaForm(Algo::cc, false) {}

 protected:
  void prepare_form() override {
    const int64_t B = s_.batch, N = keys_, dec = nh_ * (nope_ + vd_);
    latent_.resize(size_t(B * N * width_));
    latent_.zero();
    decompressed_.resize(size_t(B * N * dec));
    decompressed_.zero();
    k_.scratch(arena_, size_t(B * N * nh_ * qhd_));
    prepare_mha(k_.get(), decompressed_.get() + nope_, dec, nope_ + vd_, N * dec);
  }
  void attend() override {
    const int64_t B = s_.batch, N = keys_;
    gather_latent(latent_.get());
    decompress(latent_.get(), B * N, decompressed_.get());  // every cached token again, every step
    concat_key_kernel<<<grid_for(B * N * nh_ * qhd_), 256, 0, stream_>>>(decompressed_.get(), latent_.get(), B * N, nh_,
                                                                         nope_, vd_, rope_, r_, width_, k_.get());
    DSLAB_CHECK_LAUNCH();
    attend_mha();
  }

 private:
  DeviceArray<__nv_bfloat16> latent_, decompressed_, k_;
};

class ACcCuda final : public MlaOp {
 public:
  ACcCuda() : MlaOp(Algo::a_cc, false) {}

 protected:
  void prepare_form() override {
    const int64_t B = s_.batch, S = s_.q_len, N = keys_, T = s_.tokens();
    latent_.resize(size_t(B * N * width_));
    latent_.zero();
    k_cat_.scratch(arena_, size_t(B * nh_ * N * width_));
    q_cat_buffer_.scratch(arena_, size_t(T * nh_ * width_));
    q_cat_ = q_cat_buffer_.get();
    o_lat_.scratch(arena_, size_t(T * nh_ * r_));
    scores_.scratch(arena_, size_t(B * nh_ * S * N));
    probs_.scratch(arena_, scores_.size());
    std::vector<const void*> k, q, sc, pr, o;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < nh_; ++h) {
        k.push_back(k_cat_.get() + (b * nh_ + h) * N * width_);
        q.push_back(q_cat_ + (b * S * nh_ + h) * width_);
        sc.push_back(scores_.get() + (b * nh_ + h) * S * N);
        pr.push_back(probs_.get() + (b * nh_ + h) * S * N);
        o.push_back(o_lat_.get() + (b * S * nh_ + h) * r_);
      }
    k_ptrs_ = pointer_array(k);
    q_ptrs_ = pointer_array(q);
    s_ptrs_ = pointer_array(sc);
    p_ptrs_ = pointer_array(pr);
    o_ptrs_ = pointer_array(o);
  }
  void attend() override {
    const int64_t B = s_.batch, S = s_.q_len, N = keys_;
    gather_latent(latent_.get());
    // The concatenated [latent ‖ rope] key materialised once per head, as the unfused absorbed form does.
    broadcast_heads_kernel<<<grid_for(B * nh_ * N * width_ / 8), 256, 0, stream_>>>(
        reinterpret_cast<const uint4*>(latent_.get()), N * width_ / 8, nh_, B, reinterpret_cast<uint4*>(k_cat_.get()));
    DSLAB_CHECK_LAUNCH();
    concat_query();
    gemm_batched(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, S, width_, k_ptrs_, width_, q_ptrs_, nh_ * width_,
                 const_cast<void**>(s_ptrs_), CUDA_R_32F, N, B * nh_);
    softmax(scores_.get(), probs_.get(), B * nh_ * S, nh_ * S, 1);
    gemm_batched(blas_, CUBLAS_OP_N, CUBLAS_OP_N, r_, S, N, k_ptrs_, width_, p_ptrs_, N, const_cast<void**>(o_ptrs_),
                 CUDA_R_16BF, nh_ * r_, B * nh_);
    absorb_output(o_lat_.get());
  }

 private:
  DeviceArray<__nv_bfloat16> latent_, k_cat_, q_cat_buffer_, o_lat_, probs_;
  DeviceArray<float> scores_;
  const void **k_ptrs_ = nullptr, **q_ptrs_ = nullptr, **s_ptrs_ = nullptr, **p_ptrs_ = nullptr, **o_ptrs_ = nullptr;
};

class ACcMeCuda final : public MlaOp {
 public:
  ACcMeCuda() : MlaOp(Algo::a_cc_me, false) {}

 protected:
  bool supports_kv_dtype(KvDtype) const override { return true; }
  void prepare_form() override {
    const int64_t B = s_.batch, N = keys_, T = s_.tokens();
    latent_.resize(size_t(B * N * width_));
    latent_.zero();
    q_abs_.scratch(arena_, size_t(T * nh_ * r_));
    o_lat_.scratch(arena_, size_t(T * nh_ * r_));
    scores_.scratch(arena_, size_t(T * nh_ * N));
    probs_.scratch(arena_, scores_.size());
  }
  void attend() override {
    // One request's heads and new tokens are the rows M = q_len*heads of an MQA over its shared latent.
    const int64_t B = s_.batch, N = keys_, M = s_.q_len * nh_;
    gather_latent(latent_.get());  // int8/fp8 caches are dequantised here
    absorb_query(q_abs_.get(), r_);
    // scores[b] [M x N] = q_abs[b] · c_kv[b]^T + q_pe[b] · k_pe[b]^T: two sums, no concatenated key.
    gemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, r_, latent_.get(), width_, N * width_, q_abs_.get(), r_, M * r_,
         scores_.get(), CUDA_R_32F, N, M * N, B);
    gemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, rope_, latent_.get() + r_, width_, N * width_, q_.get() + nope_, qhd_,
         M * qhd_, scores_.get(), CUDA_R_32F, N, M * N, B, 1.0f);
    softmax(scores_.get(), probs_.get(), B * M, M, nh_);
    // o_lat[b] [M x r] = P[b] · c_kv[b]
    gemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, r_, M, N, latent_.get(), width_, N * width_, probs_.get(), N, M * N,
         o_lat_.get(), CUDA_R_16BF, r_, M * r_, B);
    absorb_output(o_lat_.get());
  }

 private:
  DeviceArray<__nv_bfloat16> latent_, q_abs_, o_lat_, probs_;
  DeviceArray<float> scores_;
};

}  // namespace

DSLAB_REGISTER_MLA_OP(CdCuda, "mla/cd/cuda", "CacheDecompressed on the GPU: paged K/V, gathered, cuBLAS batched MHA");
DSLAB_REGISTER_MLA_OP(
    CdPagedCuda, "mla/cd_paged/cuda",
    "CacheDecompressed on the GPU, its K/V read once from the pages by a flash-decoding kernel of ours (no gather)");
DSLAB_REGISTER_MLA_OP(CcCuda, "mla/cc/cuda",
                      "CacheCompressed on the GPU: the whole latent cache re-decompressed by cuBLAS every step");
DSLAB_REGISTER_MLA_OP(ACcCuda, "mla/a_cc/cuda",
                      "Absorbed on the GPU: [latent ‖ rope] key materialised per head, cuBLAS batched");
DSLAB_REGISTER_MLA_OP(ACcMeCuda, "mla/a_cc_me/cuda",
                      "Absorbed + MoveElision on the GPU: MQA over the gathered latent, two-sum scores, cuBLAS");

}  // namespace dslab::mla::cuda
