// sparse/oracle/cuda: the exact top keys by true attention mass on the GPU: the fidelity bound for a budget,
// beside the selectors that approximate it. Every key's score for every head (the request's keys gathered from the
// paged cache, one GEMM against the absorbed query), each head's softmax over them, each key's mass summed over the
// heads; the sinks (4 keys), the `local` window and the most massive others up to the `budget` kept, as
// sparse::select_oracle keeps them, and attended by mla/fused/cuda's kernel through their slots. It reads the whole
// cache and more each step: a bound to compare against, not a method to time.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/errors.h"
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/paged_select.h"
#include "variants/sparse/sparse.h"

namespace dslab::sparse::cuda {
namespace {

using gpu::DeviceArray;

// Request r's keys (lengths[r] + q_len of them) as rows [batch][max_keys][width]; keys[r] written once.
__global__ void gather_keys_kernel(const uint4* __restrict__ cache, int width16, const int32_t* __restrict__ lengths,
                                   int q_len, const int32_t* __restrict__ page_table, int pages_per_request,
                                   int page_size, int64_t max_keys, uint4* __restrict__ out,
                                   int32_t* __restrict__ keys) {
  const int r = int(blockIdx.y), n = lengths[r] + q_len;
  if (blockIdx.x == 0 && threadIdx.x == 0) keys[r] = n;
  const int64_t total = int64_t(n) * width16;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int k = int(i / width16), c = int(i % width16);
    const int64_t slot =
        int64_t(page_table[int64_t(r) * pages_per_request + k / page_size]) * page_size + k % page_size;
    out[(int64_t(r) * max_keys + k) * width16 + c] = cache[slot * width16 + c];
  }
}

// A block per (head, request): the max and the sum of exp over the request's keys of scale * score.
constexpr int kStatsThreads = 256;
__global__ void __launch_bounds__(kStatsThreads)
    softmax_stats_kernel(const float* __restrict__ scores, int heads, int64_t max_keys,
                         const int32_t* __restrict__ keys, float scale, float* __restrict__ row_max,
                         float* __restrict__ row_sum) {
  __shared__ float part[kStatsThreads / 32];
  const int h = int(blockIdx.x), r = int(blockIdx.y), n = keys[r], tid = int(threadIdx.x);
  const float* row = scores + (int64_t(r) * heads + h) * max_keys;
  auto block_reduce = [&](float v, bool is_max) {
    for (int o = 16; o; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, v, o);
      v = is_max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();
    if (tid % 32 == 0) part[tid / 32] = v;
    __syncthreads();
    v = part[0];
    for (int w = 1; w < kStatsThreads / 32; ++w) v = is_max ? fmaxf(v, part[w]) : v + part[w];
    return v;
  };
  float mx = -INFINITY;
  for (int k = tid; k < n; k += kStatsThreads) mx = fmaxf(mx, row[k] * scale);
  mx = block_reduce(mx, true);
  float sum = 0;
  for (int k = tid; k < n; k += kStatsThreads) sum += __expf(row[k] * scale - mx);
  sum = block_reduce(sum, false);
  if (tid == 0) row_max[r * heads + h] = mx, row_sum[r * heads + h] = sum;
}

// A thread per key: its softmax probability summed over the heads.
__global__ void mass_kernel(const float* __restrict__ scores, int heads, int64_t max_keys,
                            const int32_t* __restrict__ keys, float scale, const float* __restrict__ row_max,
                            const float* __restrict__ row_sum, float* __restrict__ mass) {
  const int r = int(blockIdx.y);
  const int k = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= keys[r]) return;
  float m = 0;
  for (int h = 0; h < heads; ++h)
    m += __expf(scores[(int64_t(r) * heads + h) * max_keys + k] * scale - row_max[r * heads + h]) /
         row_sum[r * heads + h];
  mass[int64_t(r) * max_keys + k] = m;
}

}  // namespace

void attention_mass(cublasHandle_t blas, const __nv_bfloat16* cache, int64_t width, const int32_t* lengths,
                    int64_t q_len, const int32_t* page_table, int64_t pages_per_request, int64_t page_size,
                    int64_t batch, const __nv_bfloat16* q, int64_t heads, float scale, int64_t max_keys,
                    __nv_bfloat16* gathered, float* head_scores, float* row_max, float* row_sum, int32_t* keys,
                    float* mass, cudaStream_t stream) {
  if (width % 8)
    throw std::invalid_argument("sparse attention_mass: the key width must be a multiple of 8 (16-byte rows)");
  const int width16 = int(width / 8);
  gather_keys_kernel<<<dim3(unsigned(std::min<int64_t>((max_keys * width16 + 255) / 256, 2048)), unsigned(batch)), 256,
                       0, stream>>>(reinterpret_cast<const uint4*>(cache), width16, lengths, int(q_len), page_table,
                                    int(pages_per_request), int(page_size), max_keys,
                                    reinterpret_cast<uint4*>(gathered), keys);
  DSLAB_CHECK_LAUNCH();
  // Column-major per request: scores (max_keys x heads) = gathered (max_keys x width) . q^T (width x heads), so
  // row-major [heads][max_keys].
  gpu::gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, max_keys, heads, width, gathered, width, max_keys * width, q, width,
            heads * width, head_scores, CUDA_R_32F, max_keys, heads * max_keys, batch);
  softmax_stats_kernel<<<dim3(unsigned(heads), unsigned(batch)), kStatsThreads, 0, stream>>>(
      head_scores, int(heads), max_keys, keys, scale, row_max, row_sum);
  DSLAB_CHECK_LAUNCH();
  mass_kernel<<<dim3(unsigned((max_keys + 255) / 256), unsigned(batch)), 256, 0, stream>>>(
      head_scores, int(heads), max_keys, keys, scale, row_max, row_sum, mass);
  DSLAB_CHECK_LAUNCH();
}

namespace {

class OracleSelector final : public TokenSelector {
 public:
  OracleSelector() : TokenSelector("sparse/oracle/cuda") {}
  Cost cost(const ModelConfig& m, const mla::Shape& s, int64_t) const override {
    // Per request: every key gathered (read, written, read by the GEMM), scored by every head, the scores written and
    // read twice by the softmax and once by the mass, the mass written and read by the top-k's passes.
    const double keys = double(s.keys()), width = double(m.kv_lora_rank + m.qk_rope_head_dim), H = double(s.heads),
                 B = double(s.batch);
    Cost c;
    c.flops = B * keys * H * width * 2;
    c.bytes = B * keys * (width * 2 * 3 + H * 4 * 4 + 4 * 7);
    return c;
  }

 private:
  void prepare_scores(const ModelConfig& m) override {
    scale_ = float(m.softmax_scale());
    const int64_t max_keys = scores_per_request();
    gathered_.resize(size_t(s_.batch * max_keys * width_));
    head_scores_.resize(size_t(s_.batch * s_.heads * max_keys));
    row_max_.resize(size_t(s_.batch * s_.heads));
    row_sum_.resize(size_t(s_.batch * s_.heads));
  }
  void score(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t blas, const Mark& mark) override {
    attention_mass(blas, bf16_values(*cache_), width_, lengths_in_, s_.q_len, page_table_of(*cache_),
                   cache_->pages_per_request, cache_->page_size, s_.batch, q_cat, s_.heads, scale_,
                   scores_per_request(), gathered_.get(), head_scores_.get(), row_max_.get(), row_sum_.get(),
                   keys_.get(), scores_.get(), stream);
    mark("select_scores");
  }

  float scale_ = 1;
  DeviceArray<__nv_bfloat16> gathered_;                 // [batch][max_keys][width]
  DeviceArray<float> head_scores_, row_max_, row_sum_;  // [batch][heads][max_keys], [batch][heads] x 2
};

const bool registered =
    mla::cuda::register_mla_op("sparse/oracle/cuda",
                               "exact top keys by true attention mass (every head's softmax over every key, summed "
                               "over heads; sinks + window kept): the "
                               "fidelity bound for a budget, attended by mla/fused/cuda's kernel through their slots; "
                               "reads the whole cache, not a method to time",
                               [] { return mla::cuda::make_fused_op(std::make_unique<OracleSelector>()); });

}  // namespace
}  // namespace dslab::sparse::cuda
