// One point's MLA problem on the device: deterministic weights, per-request lengths, the paged latent cache
// filled on the device with the CPU's counter-based values, RoPE tables, and the fp64 reference per request.
#include "variants/mla/cuda/mla_cuda.h"

#include "variants/reference/model.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <chrono>
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
#include "variants/common/cuda/nvtx.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/rng.h"
#include "variants/mla/cuda/kernels.cuh"

namespace dslab::mla::cuda {

namespace {

const float kUnitScale = std::sqrt(3.0f);  // unit-variance uniform values, as ref::make_mla_inputs uses

// One warp per cached token: generate its latent and rope key with the CPU's counter-based generator and
// store them (quantised if asked) into the token's page slot.
__global__ void fill_cache_kernel(CacheView cache, const int32_t* lengths, const uint64_t* streams, int64_t r,
                                  float scale) {
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

}  // namespace

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
    for (int64_t i = 0; i < r; ++i)
      out[size_t(j * (r + rope) + i)] = to_bf16(kUnitScale * uniform_pm1(ckv, uint64_t(j * r + i)));
    for (int64_t i = 0; i < rope; ++i)
      out[size_t(j * (r + rope) + r + i)] = to_bf16(kUnitScale * uniform_pm1(kpe, uint64_t(j * rope + i)));
  }
  return out;
}

std::vector<double> GpuProblem::reference_over(int64_t request, const std::vector<int64_t>* keys,
                                               double* mass_recall) const {
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

void allocate_paged_cache(const ModelConfig& m, KvDtype dtype, int64_t page_size, const std::vector<int64_t>& lengths,
                          int64_t room, uint64_t seed, PagedLatentCache* cache) {
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

void fill_paged_cache(PagedLatentCache& c, const int32_t* lengths_dev, int64_t batch, int64_t max_len,
                      const std::vector<uint64_t>& streams, int64_t kv_lora_rank) {
  if (max_len <= 0) return;
  DeviceArray<uint64_t> streams_dev;
  streams_dev.upload(streams);
  fill_cache_kernel<<<dim3(unsigned((max_len + 7) / 8), unsigned(batch)), 256>>>(
      cache_view(c), lengths_dev, streams_dev.get(), kv_lora_rank, kUnitScale);
  DSLAB_CHECK_LAUNCH();
  DSLAB_CUDA(cudaDeviceSynchronize());  // streams_dev is freed on return
}

void rope_tables(const ModelConfig& m, const std::vector<int64_t>& lengths, int64_t q_len,
                 std::vector<float>* cos_table, std::vector<float>* sin_table) {
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

std::shared_ptr<GpuProblem> gpu_problem(const ModelConfig& m, const Shape& s, int64_t page_size,
                                        const std::string& len_dist, uint64_t seed, const std::string& weights) {
  static std::mutex mu;
  static std::shared_ptr<GpuProblem> last;
  std::lock_guard<std::mutex> lock(mu);
  if (last && last->model.source == m.source && last->seed == seed && last->shape.heads == s.heads &&
      last->shape.batch == s.batch && last->shape.q_len == s.q_len && last->shape.kv_len == s.kv_len &&
      last->shape.kv_dtype == s.kv_dtype && last->page_size == page_size && last->len_dist == len_dist &&
      last->weights_dir == weights)
    return last;
  last.reset();  // free the old point's device memory first
  gpu::NvtxRange range("mla.problem");
  auto p = std::make_shared<GpuProblem>();
  p->model = m;
  p->shape = s;
  p->seed = seed;
  p->page_size = page_size;
  p->len_dist = len_dist;
  p->lengths = request_lengths(len_dist, s.batch, s.kv_len, seed);
  const int64_t B = s.batch, S = s.q_len, T = s.tokens();
  p->max_keys = *std::max_element(p->lengths.begin(), p->lengths.end()) + S;
  p->weights_dir = weights;
  if (weights.empty()) {
    p->params = ref::make_mla_params(m, s.heads, seed);
  } else {  // the checkpoint's first layer's attention (all heads: the variants refuse other head counts with it)
    const Checkpoint checkpoint(weights);
    const auto started = std::chrono::steady_clock::now();
    p->params = ref::load_mla_params(checkpoint, 0);
    checkpoint.report_load("layer 0 attention", std::chrono::steady_clock::now() - started);
  }
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
  std::vector<int64_t> candidates = {
      0, B - 1, int64_t(std::max_element(p->lengths.begin(), p->lengths.end()) - p->lengths.begin())};
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

double device_bytes(const MlaOp& op, const ModelConfig& m, const Shape& s, int64_t page_size,
                    const std::string& len_dist) {
  const double B = double(s.batch), S = double(s.q_len), w = double(m.kv_lora_rank + m.qk_rope_head_dim);
  const double total_keys = B * (double(s.kv_len) + S + double(page_size));
  // Unfused forms pad every request to the longest; mixed lengths put the longest at a few times kv_len.
  const int64_t max_keys = s.kv_len * (len_dist == "mixed" && s.batch > 1 ? 4 : 1) + s.q_len;
  // The cache, the weights (and q_a/kv_a stacked again), the op's scratch.
  return total_keys * w * 2 + 2 * weight_bytes(m, s.heads) + op.scratch_bytes(m, s, max_keys);
}

}  // namespace dslab::mla::cuda
