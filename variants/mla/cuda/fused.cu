// mla/fused/cuda: FlashMLA-style decode attention over the paged latent cache. All q heads (and the MTP
// token) of a request are rows of one MQA against the request's shared [c_kv ‖ k_pe] keys; the keys are split
// across SMs (split-KV), each split runs an online softmax with bf16 tensor-core MMAs (mma.sync m16n8k16),
// and a combine kernel merges the splits by their log-sum-exp. int8 / fp8 caches are dequantised in shared
// memory on the way in. The projections around it are the shared GPU ones (cuBLAS).
#include <algorithm>
#include <cmath>

#include "harness/errors.h"
#include "harness/host.h"
#include "variants/mla/cuda/kernels.cuh"
#include "variants/mla/cuda/mla_cuda.h"

namespace dslab::mla::cuda {
namespace {

constexpr int kWidth = 576;                // latent 512 ‖ rope 64: every DeepSeek config
constexpr int kLatent = 512;
constexpr int kChunks = kWidth / 8;        // 16-byte chunks per key row
constexpr int kBlockKeys = 64;             // keys per pipeline step
constexpr int kThreads = 256;              // 8 warps
constexpr int kGroups = kWidth / kQuantGroup;

// ---- PTX wrappers --------------------------------------------------------------------------------------

__device__ inline uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ inline void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// c[16x8] += a[16x16] · b[16x8], bf16 in, fp32 accumulate.
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory tiles are rows of 16-byte chunks with the chunk index XOR-ed by the row (mod 8): the 8 rows an
// ldmatrix reads then fall in 8 different bank groups instead of one (576-wide rows are 1152 bytes apart).
__device__ inline int swz(int row, int col, int row_elems) { return row * row_elems + (((col >> 3) ^ (row & 7)) << 3) + (col & 7); }

struct Params {
  const __nv_bfloat16* q;  // [tokens][heads][576]: [q_nope·W_UK ‖ q_pe]
  CacheView cache;
  const int32_t* lengths;
  const int4* work;        // per CTA column: request, first key, end key, -
  float* o_partial;        // [work items][rows][512], each split normalised by its own sum
  float* lse_partial;      // [work items][rows], log2 domain
  int rows, heads, q_len;  // rows = q_len * heads
  float scale_log2;        // softmax scale * log2(e)
};

template <int ROWS, KvDtype KV>
struct Layout {
  static constexpr int kWarpsM = ROWS / 16, kWarpsN = 8 / kWarpsM;
  static constexpr int kKeysPerWarp = kBlockKeys / kWarpsN, kColsPerWarp = kLatent / kWarpsN;
  static constexpr int kStages = KV == KvDtype::bf16 ? 2 : 1;  // quantised: the raw staging buffer is the second stage
  static constexpr size_t q_bytes = size_t(ROWS) * kWidth * 2, k_bytes = size_t(kStages) * kBlockKeys * kWidth * 2;
  static constexpr size_t p_bytes = size_t(ROWS) * kBlockKeys * 2, red_bytes = size_t(2) * kWarpsN * ROWS * 4;
  static constexpr size_t raw_bytes = KV == KvDtype::bf16 ? 0 : size_t(kBlockKeys) * kWidth + size_t(kBlockKeys) * kGroups * 4;
  static constexpr size_t total = q_bytes + k_bytes + p_bytes + red_bytes + raw_bytes;
};

template <int ROWS, KvDtype KV>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(Params p) {
  using L = Layout<ROWS, KV>;
  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem + L::q_bytes);
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + L::q_bytes + L::k_bytes);
  float* sMax = reinterpret_cast<float*>(smem + L::q_bytes + L::k_bytes + L::p_bytes);
  float* sSum = sMax + L::kWarpsN * ROWS;
  uint8_t* sRaw = smem + L::q_bytes + L::k_bytes + L::p_bytes + L::red_bytes;
  float* sScale = reinterpret_cast<float*>(sRaw + kBlockKeys * kWidth);

  const int4 work = p.work[blockIdx.x];
  const int b = work.x, k_begin = work.y, k_end = work.z;
  const int row0 = blockIdx.y * ROWS;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp % L::kWarpsM, wn = warp / L::kWarpsM;
  const int length = p.lengths[b];

  // Q tile: rows row0.. of request b.
  const __nv_bfloat16* q = p.q + (int64_t(b) * p.rows + row0) * kWidth;
  for (int c = tid; c < ROWS * kChunks; c += kThreads) {
    const int row = c / kChunks, col = (c % kChunks) * 8;
    cp_async16(sQ + swz(row, col, kWidth), q + int64_t(row) * kWidth + col, true);
  }
  auto key_slot = [&](int key) { return p.cache.slot(b, key); };
  auto load_block = [&](int key0, int stage) {  // bf16: straight into the K tile; quantised: into the staging area
    if constexpr (KV == KvDtype::bf16) {
      const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(p.cache.values);
      __nv_bfloat16* dst = sK + stage * kBlockKeys * kWidth;
      for (int c = tid; c < kBlockKeys * kChunks; c += kThreads) {
        const int k = c / kChunks, col = (c % kChunks) * 8, key = key0 + k;
        const bool valid = key < k_end;
        cp_async16(dst + swz(k, col, kWidth), values + (valid ? key_slot(key) * kWidth + col : 0), valid);
      }
    } else {
      for (int c = tid; c < kBlockKeys * (kWidth / 16); c += kThreads) {
        const int k = c / (kWidth / 16), col = (c % (kWidth / 16)) * 16, key = key0 + k;
        const bool valid = key < k_end;
        cp_async16(sRaw + k * kWidth + col, p.cache.values + (valid ? key_slot(key) * kWidth + col : 0), valid);
      }
      for (int c = tid; c < kBlockKeys * kGroups; c += kThreads) {
        const int k = c / kGroups, g = c % kGroups, key = key0 + k;
        const bool valid = key < k_end;
        cp_async4(sScale + c, p.cache.scales + (valid ? key_slot(key) * kGroups + g : 0), valid);
      }
    }
    cp_async_commit();
  };
  auto dequantize_block = [&]() {  // staging -> K tile (bf16), 16 values per thread step
    for (int c = tid; c < kBlockKeys * (kWidth / 16); c += kThreads) {
      const int k = c / (kWidth / 16), col = (c % (kWidth / 16)) * 16;
      const float scale = sScale[k * kGroups + col / kQuantGroup];
      const uint4 raw = *reinterpret_cast<const uint4*>(sRaw + k * kWidth + col);
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&raw);
      __align__(16) __nv_bfloat16 out[16];
      for (int i = 0; i < 16; ++i) out[i] = __float2bfloat16_rn(dequantize(KV, bytes[i], scale));
      *reinterpret_cast<uint4*>(sK + swz(k, col, kWidth)) = *reinterpret_cast<const uint4*>(out);
      *reinterpret_cast<uint4*>(sK + swz(k, col + 8, kWidth)) = *reinterpret_cast<const uint4*>(out + 8);
    }
  };

  // Each thread owns rows r_lo = lane/4 and r_hi = r_lo + 8 of its warp's 16; m and l per row.
  const int r_lo = wm * 16 + lane / 4, r_hi = r_lo + 8;
  const int last_lo = length + (row0 + r_lo) / p.heads, last_hi = length + (row0 + r_hi) / p.heads;  // causal among new tokens
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0, l_hi = 0;
  float o[L::kColsPerWarp / 8][4];
  for (auto& t : o) t[0] = t[1] = t[2] = t[3] = 0;

  const int blocks = (k_end - k_begin + kBlockKeys - 1) / kBlockKeys;
  load_block(k_begin, 0);
  for (int i = 0; i < blocks; ++i) {
    const int key0 = k_begin + i * kBlockKeys;
    int stage = 0;
    if constexpr (KV == KvDtype::bf16) {
      stage = i % 2;
      if (i + 1 < blocks) {
        load_block(key0 + kBlockKeys, (i + 1) % 2);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    } else {
      cp_async_wait<0>();
      __syncthreads();
      dequantize_block();
      __syncthreads();
      if (i + 1 < blocks) load_block(key0 + kBlockKeys, 0);  // lands in the staging area while this block computes
    }
    const __nv_bfloat16* K = sK + stage * kBlockKeys * kWidth;

    // S = Q K^T for this warp's 16 rows x kKeysPerWarp keys.
    constexpr int kTiles = L::kKeysPerWarp / 8;
    float s[kTiles][4];
    for (auto& t : s) t[0] = t[1] = t[2] = t[3] = 0;
    const int kbase = wn * L::kKeysPerWarp;
#pragma unroll 4
    for (int ks = 0; ks < kWidth / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, sQ + swz(wm * 16 + lane % 16, ks * 16 + (lane / 16) * 8, kWidth));
      if constexpr (kTiles == 1) {
        uint32_t bb[2];
        ldmatrix_x2(bb, K + swz(kbase + (lane & 7), ks * 16 + ((lane >> 3) & 1) * 8, kWidth));
        mma(s[0], a, bb[0], bb[1]);
      } else {
#pragma unroll
        for (int np = 0; np < kTiles / 2; ++np) {
          uint32_t bb[4];
          ldmatrix_x4(bb, K + swz(kbase + np * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 16 + ((lane >> 3) & 1) * 8, kWidth));
          mma(s[2 * np], a, bb[0], bb[1]);
          mma(s[2 * np + 1], a, bb[2], bb[3]);
        }
      }
    }
    // Mask keys past the split or past the row's own position, then the block's row maxima.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + kbase + t * 8 + (lane % 4) * 2 + e;
        if (key >= k_end || key > last_lo) s[t][e] = -INFINITY;
        if (key >= k_end || key > last_hi) s[t][2 + e] = -INFINITY;
        mx_lo = fmaxf(mx_lo, s[t][e]);
        mx_hi = fmaxf(mx_hi, s[t][2 + e]);
      }
    for (int off = 1; off < 4; off <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
    }
    if (lane % 4 == 0) {
      sMax[wn * ROWS + r_lo] = mx_lo;
      sMax[wn * ROWS + r_hi] = mx_hi;
    }
    __syncthreads();
    float new_lo = m_lo, new_hi = m_hi;
#pragma unroll
    for (int w = 0; w < L::kWarpsN; ++w) {
      new_lo = fmaxf(new_lo, sMax[w * ROWS + r_lo]);
      new_hi = fmaxf(new_hi, sMax[w * ROWS + r_hi]);
    }
    // A row that has seen no key yet keeps m = -inf: its probabilities are 0 and its rescale factor 1.
    const float base_lo = new_lo == -INFINITY ? 0.0f : new_lo * p.scale_log2;
    const float base_hi = new_hi == -INFINITY ? 0.0f : new_hi * p.scale_log2;
    const float alpha_lo = exp2f(m_lo * p.scale_log2 - base_lo), alpha_hi = exp2f(m_hi * p.scale_log2 - base_hi);
    m_lo = new_lo;
    m_hi = new_hi;
    l_lo *= alpha_lo;
    l_hi *= alpha_hi;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const float p0 = exp2f(s[t][0] * p.scale_log2 - base_lo), p1 = exp2f(s[t][1] * p.scale_log2 - base_lo);
      const float p2 = exp2f(s[t][2] * p.scale_log2 - base_hi), p3 = exp2f(s[t][3] * p.scale_log2 - base_hi);
      const __nv_bfloat162 lo = __floats2bfloat162_rn(p0, p1), hi = __floats2bfloat162_rn(p2, p3);
      // The sums use the bf16-rounded probabilities the PV product will use.
      l_lo += __low2float(lo) + __high2float(lo);
      l_hi += __low2float(hi) + __high2float(hi);
      const int col = kbase + t * 8 + (lane % 4) * 2;
      *reinterpret_cast<__nv_bfloat162*>(sP + swz(r_lo, col, kBlockKeys)) = lo;
      *reinterpret_cast<__nv_bfloat162*>(sP + swz(r_hi, col, kBlockKeys)) = hi;
    }
#pragma unroll
    for (auto& t : o) {
      t[0] *= alpha_lo;
      t[1] *= alpha_lo;
      t[2] *= alpha_hi;
      t[3] *= alpha_hi;
    }
    __syncthreads();
    // O += P V: this warp's 16 rows x kColsPerWarp latent columns over the block's 64 keys.
    const int cbase = wn * L::kColsPerWarp;
#pragma unroll
    for (int ks = 0; ks < kBlockKeys / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, sP + swz(wm * 16 + lane % 16, ks * 16 + (lane / 16) * 8, kBlockKeys));
#pragma unroll
      for (int np = 0; np < L::kColsPerWarp / 16; ++np) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, K + swz(ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, cbase + np * 16 + (lane >> 4) * 8, kWidth));
        mma(o[2 * np], a, bb[0], bb[1]);
        mma(o[2 * np + 1], a, bb[2], bb[3]);
      }
    }
    if constexpr (KV == KvDtype::bf16) __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  // Row sums across the quad and across the warps that split the keys.
  for (int off = 1; off < 4; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  if (lane % 4 == 0) {
    sSum[wn * ROWS + r_lo] = l_lo;
    sSum[wn * ROWS + r_hi] = l_hi;
  }
  __syncthreads();
  float sum_lo = 0, sum_hi = 0;
  for (int w = 0; w < L::kWarpsN; ++w) {
    sum_lo += sSum[w * ROWS + r_lo];
    sum_hi += sSum[w * ROWS + r_hi];
  }
  const float inv_lo = sum_lo > 0 ? 1.0f / sum_lo : 0.0f, inv_hi = sum_hi > 0 ? 1.0f / sum_hi : 0.0f;
  float* out = p.o_partial + (int64_t(blockIdx.x) * p.rows + row0) * kLatent;
  const int cbase = wn * L::kColsPerWarp;
#pragma unroll
  for (int t = 0; t < L::kColsPerWarp / 8; ++t) {
    const int col = cbase + t * 8 + (lane % 4) * 2;
    *reinterpret_cast<float2*>(out + r_lo * kLatent + col) = make_float2(o[t][0] * inv_lo, o[t][1] * inv_lo);
    *reinterpret_cast<float2*>(out + r_hi * kLatent + col) = make_float2(o[t][2] * inv_hi, o[t][3] * inv_hi);
  }
  if (wn == 0 && lane % 4 == 0) {
    float* lse = p.lse_partial + int64_t(blockIdx.x) * p.rows + row0;
    lse[r_lo] = sum_lo > 0 ? m_lo * p.scale_log2 + log2f(sum_lo) : -INFINITY;
    lse[r_hi] = sum_hi > 0 ? m_hi * p.scale_log2 + log2f(sum_hi) : -INFINITY;
  }
}

// Merge a request's splits: o = sum_i 2^(lse_i - max) o_i / sum_i 2^(lse_i - max). One block per (row, request).
__global__ void combine_kernel(const float* o_partial, const float* lse_partial, const int2* splits, int rows, __nv_bfloat16* o_lat) {
  const int row = blockIdx.x, b = blockIdx.y;
  const int2 range = splits[b];  // first work item, count
  float mx = -INFINITY;
  for (int i = 0; i < range.y; ++i) mx = fmaxf(mx, lse_partial[int64_t(range.x + i) * rows + row]);
  float total = 0;
  float acc[kLatent / 128] = {};
  for (int i = 0; i < range.y; ++i) {
    const float lse = lse_partial[int64_t(range.x + i) * rows + row];
    const float w = lse == -INFINITY ? 0.0f : exp2f(lse - mx);
    total += w;
    const float* src = o_partial + (int64_t(range.x + i) * rows + row) * kLatent;
    for (int j = 0; j < kLatent / 128; ++j) acc[j] += w * src[threadIdx.x + 128 * j];
  }
  __nv_bfloat16* dst = o_lat + (int64_t(b) * rows + row) * kLatent;
  for (int j = 0; j < kLatent / 128; ++j) dst[threadIdx.x + 128 * j] = __float2bfloat16_rn(acc[j] / total);
}

template <int ROWS, KvDtype KV>
void launch_decode(const Params& params, int work_items, int row_tiles) {
  using L = Layout<ROWS, KV>;
  static bool configured = false;
  if (!configured) {
    DSLAB_CUDA(cudaFuncSetAttribute(mla_decode_kernel<ROWS, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(L::total)));
    configured = true;
  }
  mla_decode_kernel<ROWS, KV><<<dim3(unsigned(work_items), unsigned(row_tiles)), kThreads, L::total>>>(params);
  DSLAB_CHECK_LAUNCH();
}

template <int ROWS>
void launch_decode(KvDtype kv, const Params& params, int work_items, int row_tiles) {
  switch (kv) {
    case KvDtype::bf16: return launch_decode<ROWS, KvDtype::bf16>(params, work_items, row_tiles);
    case KvDtype::int8: return launch_decode<ROWS, KvDtype::int8>(params, work_items, row_tiles);
    case KvDtype::fp8_e4m3: return launch_decode<ROWS, KvDtype::fp8_e4m3>(params, work_items, row_tiles);
  }
}

class FusedCuda final : public GpuVariant {
 public:
  FusedCuda() : GpuVariant(Algo::a_cc_me, /*fused=*/true) {}
  std::map<std::string, double> counters() const override {
    auto c = GpuVariant::counters();
    c["splits"] = double(work_items_);
    c["rows_per_cta"] = double(rows_per_cta_);
    return c;
  }

 protected:
  bool supports_kv_dtype(KvDtype) const override { return true; }
  void prepare_form() override {
    const int64_t B = s_.batch, T = s_.tokens(), M = s_.q_len * nh_;
    if (M % 16) throw BadInput("mla/fused/cuda: heads x q_len must be a multiple of 16, got " + std::to_string(M));
    rows_per_cta_ = M % 64 == 0 ? 64 : M % 32 == 0 ? 32 : 16;
    row_tiles_ = int(M / rows_per_cta_);
    // Split-KV: cut the batch's key blocks into about two CTAs per SM, each request into equal splits.
    const int sms = gpu_info().sms;
    int64_t total_blocks = 0;
    for (int64_t L : p_->lengths) total_blocks += (L + s_.q_len + kBlockKeys - 1) / kBlockKeys;
    const int64_t target = std::max<int64_t>(1, 2 * sms / row_tiles_);
    const int64_t chunk = std::max<int64_t>(1, (total_blocks + target - 1) / target);
    std::vector<int4> work;
    std::vector<int2> splits(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t keys = p_->lengths[size_t(b)] + s_.q_len, blocks = (keys + kBlockKeys - 1) / kBlockKeys;
      const int64_t n = std::max<int64_t>(1, (blocks + chunk - 1) / chunk);
      splits[size_t(b)] = make_int2(int(work.size()), int(n));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t first = blocks * i / n * kBlockKeys, end = std::min(keys, blocks * (i + 1) / n * kBlockKeys);
        work.push_back(make_int4(int(b), int(first), int(end), 0));
      }
    }
    work_items_ = int(work.size());
    work_.upload(work);
    splits_.upload(splits);
    q_cat_.resize(size_t(T * nh_ * width_));
    o_lat_.resize(size_t(T * nh_ * r_));
    o_partial_.resize(size_t(work_items_) * size_t(M) * kLatent);
    lse_partial_.resize(size_t(work_items_) * size_t(M));
  }
  void attend() override {
    const int M = int(s_.q_len * nh_);
    concat_query(q_cat_.get());
    Params params{q_cat_.get(), cache_view(p_->cache), p_->lengths_dev.get(), work_.get(), o_partial_.get(), lse_partial_.get(),
                  M, int(nh_), int(s_.q_len), float(scale_ * M_LOG2E)};
    switch (rows_per_cta_) {
      case 64: launch_decode<64>(s_.kv_dtype, params, work_items_, row_tiles_); break;
      case 32: launch_decode<32>(s_.kv_dtype, params, work_items_, row_tiles_); break;
      default: launch_decode<16>(s_.kv_dtype, params, work_items_, row_tiles_); break;
    }
    combine_kernel<<<dim3(unsigned(M), unsigned(s_.batch)), 128>>>(o_partial_.get(), lse_partial_.get(), splits_.get(), M, o_lat_.get());
    DSLAB_CHECK_LAUNCH();
    absorb_output(o_lat_.get());
  }

 private:
  int rows_per_cta_ = 64, row_tiles_ = 1, work_items_ = 0;
  DeviceArray<int4> work_;
  DeviceArray<int2> splits_;
  DeviceArray<__nv_bfloat16> q_cat_, o_lat_;
  DeviceArray<float> o_partial_, lse_partial_;
};

}  // namespace

DSLAB_REGISTER_VARIANT(FusedCuda, "mla/fused/cuda", dslab::Device::cuda,
                       "fused decode: split-KV online-softmax MQA over the paged latent (mma.sync), bf16/int8/fp8 cache");

}  // namespace dslab::mla::cuda
