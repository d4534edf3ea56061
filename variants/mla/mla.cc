#include "variants/mla/mla.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>

#include "variants/common/rng.h"
#include "variants/reference/model.h"

#include "harness/errors.h"
#include "harness/host.h"

namespace dslab::mla {

Shape shape_of(const ModelConfig& m, const Point& p) {
  Shape s;
  s.heads = p.has("heads") ? p.integer("heads") : m.num_attention_heads;
  s.batch = p.integer("batch");
  s.q_len = p.integer("q_len");
  s.kv_len = p.integer("kv_len");
  if (p.has("kv_dtype")) s.kv_dtype = parse_kv_dtype(p.text("kv_dtype"));
  if (p.has("kv_splits")) s.kv_splits = parse_kv_splits(p.text("kv_splits"));
  if (p.has("block_keys")) s.block_keys = parse_block_keys(p.text("block_keys"));
  if (p.has("l2_evict")) s.l2_evict = parse_l2_evict(p.text("l2_evict"));
  if (p.has("split_plan")) s.split_plan = parse_split_plan(p.text("split_plan"));
  if (p.has("fused_absorbs")) s.fused_absorbs = parse_on_off("fused_absorbs", p.text("fused_absorbs"));
  if (p.has("budget")) s.budget = p.integer("budget");
  if (p.has("local")) s.local = p.integer("local");
  return s;
}

int64_t parse_kv_splits(const std::string& text) {
  if (text == "auto") return 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || v < 1 || v > 4096)
    throw BadInput("axis kv_splits: '" + text + "' is not a split count (expected auto or an integer 1..4096)");
  return v;
}

int64_t parse_block_keys(const std::string& text) {
  if (text == "auto") return 0;
  if (text != "32" && text != "64")
    throw BadInput("axis block_keys: '" + text + "' is not a block size (expected auto, 32 or 64)");
  return std::stoll(text);
}

SplitPlan parse_split_plan(const std::string& text) {
  if (text == "auto") return SplitPlan::automatic;
  if (text == "packed") return SplitPlan::packed;
  if (text == "per_request") return SplitPlan::per_request;
  throw BadInput("axis split_plan: '" + text + "' is not a split plan (expected auto, packed or per_request)");
}

bool parse_on_off(const std::string& axis, const std::string& text) {
  if (text == "on") return true;
  if (text == "off") return false;
  throw BadInput("axis " + axis + ": '" + text + "' is not a switch (expected on or off)");
}

L2Evict parse_l2_evict(const std::string& text) {
  if (text == "auto") return L2Evict::automatic;
  if (text == "first") return L2Evict::first;
  if (text == "normal") return L2Evict::normal;
  throw BadInput("axis l2_evict: '" + text + "' is not an L2 hint (expected auto, first or normal)");
}

KvDtype parse_kv_dtype(const std::string& text) {
  if (text == "bf16") return KvDtype::bf16;
  if (text == "int8") return KvDtype::int8;
  if (text == "fp8_e4m3") return KvDtype::fp8_e4m3;
  throw BadInput("axis kv_dtype: '" + text + "' is not a KV-cache type (expected bf16, int8 or fp8_e4m3)");
}

const char* kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::int8:
      return "int8";
    case KvDtype::fp8_e4m3:
      return "fp8_e4m3";
    default:
      return "bf16";
  }
}

std::vector<std::pair<std::string, std::string>> axes() {
  return {{"batch", "1"}, {"q_len", "1"}, {"kv_len", "4096"}, {"heads", ""}};
}

double weight_elements(const ModelConfig& m, int64_t H) {
  const double hid = double(m.hidden_size), qhd = double(m.q_head_dim()), r = double(m.kv_lora_rank);
  const double q =
      m.q_lora_rank ? hid * double(*m.q_lora_rank) + double(*m.q_lora_rank) * double(H) * qhd : hid * double(H) * qhd;
  return q + hid * (r + double(m.qk_rope_head_dim)) + r * double(H) * double(m.qk_nope_head_dim + m.v_head_dim) +
         double(H) * double(m.v_head_dim) * hid;
}

double cache_bytes_per_token(const ModelConfig& m, Algo algo, int64_t H, KvDtype kv) {
  if (algo == Algo::cd) return 2.0 * double(H) * double(m.q_head_dim() + m.v_head_dim);
  const double width = double(m.kv_lora_rank + m.qk_rope_head_dim);
  if (kv == KvDtype::bf16) return 2.0 * width;
  return width + 4.0 * std::ceil(width / double(kQuantGroup));  // one byte each plus the fp32 group scales
}

// FLOPs of one (query, key) pair across all heads.
double pair_flops(const ModelConfig& m, Algo algo, int64_t H) {
  if (algo == Algo::cd || algo == Algo::cc) return 2.0 * double(H) * double(m.q_head_dim() + m.v_head_dim);
  return 2.0 * double(H) * double(2 * m.kv_lora_rank + m.qk_rope_head_dim);
}

double decompress_flops(const ModelConfig& m, int64_t H) {
  return 2.0 * double(m.kv_lora_rank) * double(H) * double(m.qk_nope_head_dim + m.v_head_dim);
}

Cost cost_per_cached_token(const ModelConfig& m, Algo algo, int64_t heads) {
  Cost c;
  c.flops = pair_flops(m, algo, heads) + (algo == Algo::cc ? decompress_flops(m, heads) : 0.0);
  c.bytes = cache_bytes_per_token(m, algo, heads);
  return c;
}

Cost cost(const ModelConfig& m, Algo algo, const Shape& s) {
  const double H = double(s.heads), T = double(s.tokens()), hid = double(m.hidden_size), r = double(m.kv_lora_rank);
  const double S = double(s.q_len), L = double(s.kv_len);
  const double pairs = double(s.batch) * (S * L + S * (S + 1) / 2);                      // causal among the new tokens
  const double proj = 2.0 * weight_elements(m, s.heads) - decompress_flops(m, s.heads);  // kv_b_proj counted per form
  Cost c;
  c.flops = T * proj + pairs * pair_flops(m, algo, s.heads);
  switch (algo) {
    case Algo::cd:
      c.flops += T * decompress_flops(m, s.heads);
      break;  // new tokens into the K/V cache
    case Algo::cc:
      c.flops += double(s.batch) * double(s.keys()) * decompress_flops(m, s.heads);
      break;
    default:
      c.flops += T * 2.0 * H * r * double(m.qk_nope_head_dim + m.v_head_dim);
      break;  // W_UK into q, W_UV out
  }
  const double cache_tok = cache_bytes_per_token(m, algo, s.heads, s.kv_dtype);
  c.bytes = 2.0 * weight_elements(m, s.heads) + double(s.batch) * double(s.keys()) * cache_tok + T * cache_tok +
            T * hid * 2 /* bf16 in */ + T * hid * 4 /* fp32 out */;
  return c;
}

Cost attention_kernel_cost(const ModelConfig& m, Algo algo, const Shape& s, const std::vector<int64_t>& lengths,
                           bool fused) {
  const double H = double(s.heads), S = double(s.q_len), T = double(s.tokens()), r = double(m.kv_lora_rank);
  const double rope = double(m.qk_rope_head_dim), nope = double(m.qk_nope_head_dim), vd = double(m.v_head_dim);
  double pairs = 0, keys = 0;
  for (int64_t len : lengths) pairs += S * double(len) + S * (S + 1) / 2, keys += double(len) + S;
  const double per_token = cache_bytes_per_token(m, algo, s.heads, s.kv_dtype);
  Cost c;
  c.flops = pairs * pair_flops(m, algo, s.heads);
  if (fused) {
    c.bytes = keys * per_token + T * H * (r + rope) * 2 + T * H * r * 2;
    return c;
  }
  switch (algo) {
    case Algo::cd:
      break;  // (its K/V were decompressed when written)
    case Algo::cc:
      c.flops += keys * decompress_flops(m, s.heads);
      break;
    default:
      c.flops += T * 2 * H * r * (nope + vd);
      break;
  }
  c.bytes = 2 * r * H * (nope + vd) + keys * per_token + T * H * double(m.q_head_dim()) * 2 + T * H * vd * 2;
  return c;
}

double weight_bytes(const ModelConfig& m, int64_t heads) { return 2.0 * weight_elements(m, heads); }

double gpu_forward_scratch_bytes(const ModelConfig& m, Algo algo, const Shape& s, int64_t max_keys, bool fused) {
  const double B = double(s.batch), H = double(s.heads), S = double(s.q_len), T = double(s.tokens());
  const double padded = B * (double(max_keys) + double(kGpuKeyAlign));  // (keys_ per request)
  const double r = double(m.kv_lora_rank), w = r + double(m.qk_rope_head_dim);
  // q_a / kv_a outputs (fp32) and q_a normed (bf16); the query with RoPE and the attention output (bf16)
  double bytes = T * (double(m.q_lora_rank.value_or(0)) + w) * 6 + T * H * double(m.q_head_dim() + m.v_head_dim) * 2;
  if (fused) {  // query [latent ‖ rope], latent output, and per split-KV segment a 64-row tile's 512 partials + LSE
    const double row_tiles = std::ceil(S * H / 64.0);
    const double parts = s.kv_splits > 0 ? double(std::min<int64_t>(s.kv_splits, 1023))
                                         : std::max(1.0, std::floor(double(kFusedMaxSms) / row_tiles));
    // (mla/flashinfer/cuda, also a fused op: FlashInfer's partial outputs, bf16, for two 64-row tiles per SM)
    const double flashinfer = 2.0 * double(kFusedMaxSms) * 64 * (r * 2 + 4) + 256;
    return bytes + T * H * (w + r) * 2 + std::max((B + parts) * row_tiles * 64 * 513 * 4, flashinfer);
  }
  bytes += padded * H * S * 4;  // scores fp32
  switch (algo) {
    case Algo::cd:
      bytes += T * w * 2 + T * H * double(m.qk_nope_head_dim + m.v_head_dim) * 2;
      break;  // new rows, decompressed
    case Algo::cc:
      bytes += padded * H * double(m.q_head_dim()) * 2;
      break;  // K = [nope ‖ rope]
    case Algo::a_cc:
      bytes += padded * H * S * 2 + padded * H * w * 2 + T * H * (w + r) * 2;
      break;  // probs, K_cat, q_cat, o_lat
    case Algo::a_cc_me:
      bytes += padded * H * S * 2 + T * H * r * 4;
      break;  // probs, q_abs, o_lat
  }
  return bytes;
}

double gpu_owned_scratch_bytes(const ModelConfig& m, Algo algo, const Shape& s, int64_t max_keys, bool fused) {
  if (fused) return 0;
  const double B = double(s.batch), H = double(s.heads), S = double(s.q_len);
  const double padded = B * (double(max_keys) + double(kGpuKeyAlign));
  const double w = double(m.kv_lora_rank + m.qk_rope_head_dim);
  switch (algo) {   // (the gathered buffers' padding is zeroed once, in prepare)
    case Algo::cd:  // the decompressed K/V pages (one slot per cached token, whole pages), the gathered K/V, probs
      return (padded + B * 64) * H * double(m.q_head_dim() + m.v_head_dim) * 2 +
             padded * H * double(m.q_head_dim() + m.v_head_dim) * 2 + padded * H * S * 2;
    case Algo::cc:
      return padded * w * 2 + padded * H * double(m.qk_nope_head_dim + m.v_head_dim) * 2 + padded * H * S * 2;
    case Algo::a_cc:
    case Algo::a_cc_me:
      return padded * w * 2;  // the gathered latent
  }
  return 0;
}

double cpu_memory_bytes(const ModelConfig& m, Algo algo, const Shape& s) {
  const double H = double(s.heads), N = double(s.keys()), B = double(s.batch), S = double(s.q_len);
  const double r = double(m.kv_lora_rank), rope = double(m.qk_rope_head_dim);
  double bytes = 3 * 2.0 * weight_elements(m, s.heads)  // generated, packed, and the problem's copy
                 + 2 * B * N * (r + rope) * 2.0         // the problem's cache and the variant's
                 + H * S * N * 6.0;                     // scores (fp32) and probabilities (bf16) of one request
  switch (algo) {
    case Algo::cd:
      bytes += B * N * H * double(m.q_head_dim() + m.v_head_dim) * 2;
      break;
    case Algo::cc:
      bytes += N * H * double(m.qk_nope_head_dim + m.v_head_dim + m.q_head_dim()) * 2;
      break;
    case Algo::a_cc:
      bytes += H * N * (r + rope) * 2;
      break;
    case Algo::a_cc_me:
      break;
  }
  return bytes;
}

std::vector<int64_t> request_lengths(const std::string& len_dist, int64_t batch, int64_t kv_len, uint64_t seed) {
  if (len_dist == "uniform") return std::vector<int64_t>(static_cast<size_t>(batch), kv_len);
  if (len_dist != "mixed")
    throw BadInput("axis len_dist: '" + len_dist + "' is not a length distribution (expected uniform or mixed)");
  // Log-normal weights (sigma 1: a few long requests, many short ones), scaled so the batch caches exactly
  // batch * kv_len tokens: the cost is that of the uniform point, only its distribution differs.
  std::mt19937_64 gen(splitmix64(seed ^ 0x1e2d3c4b5a697887ull));
  std::lognormal_distribution<double> dist(0.0, 1.0);
  std::vector<double> w(static_cast<size_t>(batch));
  for (double& x : w) x = dist(gen);
  const double total = double(batch) * double(kv_len), sum = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<int64_t> len(static_cast<size_t>(batch));
  int64_t assigned = 0;
  for (size_t i = 0; i < len.size(); ++i) {
    len[i] = std::max<int64_t>(1, int64_t(std::llround(w[i] / sum * total)));
    assigned += len[i];
  }
  auto longest = std::max_element(len.begin(), len.end());
  *longest = std::max<int64_t>(1, *longest + int64_t(total) - assigned);
  return len;
}

namespace {
// Whole requests, consecutive ones per part, when that keeps every part within 1/kWholeSlack of the balanced
// run (per_part blocks): no request is split, so no partial outputs need merging. Empty where they do not fit.
std::optional<SplitKv> whole_request_plan(const std::vector<int64_t>& lengths, int64_t q_len,
                                          const std::vector<int64_t>& first_block, int64_t per_part, int parts) {
  const int64_t capacity = per_part + std::max<int64_t>(1, per_part / kWholeSlack);
  SplitKv s;
  s.parts.assign(size_t(parts), {0, 0});
  s.requests.resize(lengths.size());
  int part = 0;
  int64_t load = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    const int64_t blocks = first_block[r + 1] - first_block[r];
    if (load > 0 && load + blocks > capacity) ++part, load = 0;
    if (blocks > capacity || part >= parts) return std::nullopt;
    if (s.parts[size_t(part)].count == 0) s.parts[size_t(part)].first = int32_t(s.segments.size());
    ++s.parts[size_t(part)].count;
    s.requests[r] = {int32_t(s.segments.size()), 1};
    s.segments.push_back({int32_t(r), 0, int32_t(lengths[r] + q_len)});
    load += blocks;
  }
  for (auto& g : s.parts)  // idle parts start where the segments end
    if (g.count == 0) g.first = int32_t(s.segments.size());
  return s;
}

// A request's blocks of block_keys keys: its cached keys and this step's, a part-filled last block counted whole.
int64_t request_blocks(int64_t length, int64_t q_len, int64_t block_keys) {
  return (length + q_len + block_keys - 1) / block_keys;
}
}  // namespace

int auto_kv_splits(const std::vector<int64_t>& lengths, int64_t q_len, int64_t block_keys, int grid_parts) {
  int64_t blocks = 0;
  for (int64_t len : lengths) blocks += request_blocks(len, q_len, block_keys);
  const int64_t wanted = (blocks + kAutoBlocksPerPart - 1) / kAutoBlocksPerPart;
  return int(std::clamp<int64_t>(wanted, std::min<int64_t>(kAutoMinParts, grid_parts), grid_parts));
}

SplitKv split_kv(const std::vector<int64_t>& lengths, int64_t q_len, int64_t block_keys, int parts,
                 bool whole_requests) {
  const int64_t B = int64_t(lengths.size());
  std::vector<int64_t> first_block(static_cast<size_t>(B) + 1, 0);
  for (int64_t b = 0; b < B; ++b)
    first_block[size_t(b) + 1] = first_block[size_t(b)] + request_blocks(lengths[size_t(b)], q_len, block_keys);
  const int64_t total = first_block.back(), per_part = (total + parts - 1) / parts;
  if (whole_requests)
    if (auto whole = whole_request_plan(lengths, q_len, first_block, per_part, parts)) return *whole;
  SplitKv s;
  s.parts.assign(size_t(parts), {0, 0});
  s.requests.assign(size_t(B), {0, 0});
  int64_t b = 0;
  for (int part = 0; part < parts; ++part) {
    const int64_t lo = std::min(total, part * per_part), hi = std::min(total, lo + per_part);
    s.parts[size_t(part)] = {int32_t(s.segments.size()), 0};
    for (int64_t g = lo; g < hi;) {
      while (first_block[size_t(b) + 1] <= g) ++b;
      const int64_t end = std::min(hi, first_block[size_t(b) + 1]), keys = lengths[size_t(b)] + q_len;
      if (s.requests[size_t(b)].count == 0) s.requests[size_t(b)].first = int32_t(s.segments.size());
      ++s.requests[size_t(b)].count;
      s.segments.push_back({int32_t(b), int32_t((g - first_block[size_t(b)]) * block_keys),
                            int32_t(std::min(keys, (end - first_block[size_t(b)]) * block_keys))});
      ++s.parts[size_t(part)].count;
      g = end;
    }
  }
  return s;
}

std::optional<SplitKv> split_kv_per_request(const std::vector<int64_t>& lengths, int64_t q_len, int64_t block_keys,
                                            int parts) {
  const size_t B = lengths.size();
  if (B == 0 || int64_t(B) > parts) return std::nullopt;
  std::vector<int64_t> blocks(B);
  int64_t longest = 0;
  for (size_t r = 0; r < B; ++r) {
    blocks[r] = request_blocks(lengths[r], q_len, block_keys);
    longest = std::max(longest, blocks[r]);
  }
  // The smallest longest part L that sum_r ceil(blocks_r / L) parts reach, by bisection (the sum falls as L grows).
  auto parts_for = [&](int64_t most) {
    int64_t n = 0;
    for (int64_t b : blocks) n += (b + most - 1) / most;
    return n;
  };
  int64_t lo = 1, hi = longest;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (parts_for(mid) <= parts)
      hi = mid;
    else
      lo = mid + 1;
  }
  SplitKv s;
  s.parts.assign(size_t(parts), {0, 0});
  s.requests.resize(B);
  int part = 0;
  for (size_t r = 0; r < B; ++r) {
    const int64_t n = (blocks[r] + lo - 1) / lo, keys = lengths[r] + q_len;
    s.requests[r] = {int32_t(s.segments.size()), int32_t(n)};
    for (int64_t i = 0, first = 0; i < n; ++i, ++part) {  // the first blocks_r % n parts take one block more
      const int64_t size = blocks[r] / n + (i < blocks[r] % n ? 1 : 0);
      s.parts[size_t(part)] = {int32_t(s.segments.size()), 1};
      s.segments.push_back(
          {int32_t(r), int32_t(first * block_keys), int32_t(std::min(keys, (first + size) * block_keys))});
      first += size;
    }
  }
  for (; part < parts; ++part) s.parts[size_t(part)] = {int32_t(s.segments.size()), 0};  // idle: past the end
  return s;
}

double mean_segment_blocks(const SplitKv& plan, int64_t block_keys) {
  if (plan.segments.empty()) return 0;
  int64_t blocks = 0;
  for (const auto& g : plan.segments) blocks += (g.end_key - g.first_key + block_keys - 1) / block_keys;
  return double(blocks) / double(plan.segments.size());
}

const std::vector<double>& Problem::reference() const {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (reference_.empty()) reference_ = ref::mla_attention(model, params, inputs, ref::MlaForm::absorbed_split);
  return reference_;
}

std::shared_ptr<const Problem> problem(const ModelConfig& m, const Shape& s, uint64_t seed,
                                       const std::string& weights) {
  // Variants at one point run back to back: keep the last problem so they share weights and reference.
  static std::mutex mu;
  static std::shared_ptr<Problem> last;
  std::lock_guard<std::mutex> lock(mu);
  if (last && last->model.source == m.source && last->seed == seed && last->weights == weights &&
      last->shape.heads == s.heads && last->shape.batch == s.batch && last->shape.q_len == s.q_len &&
      last->shape.kv_len == s.kv_len)
    return last;
  last.reset();  // free the old one before generating the new one
  auto p = std::make_shared<Problem>();
  p->model = m;
  p->shape = s;
  p->seed = seed;
  p->weights = weights;
  if (weights.empty()) {
    p->params = ref::make_mla_params(m, s.heads, seed);
  } else {
    const Checkpoint checkpoint(weights);
    const auto started = std::chrono::steady_clock::now();
    p->params = ref::load_mla_params(checkpoint, 0);
    checkpoint.report_load("layer 0 attention", std::chrono::steady_clock::now() - started);
  }
  p->inputs = ref::make_mla_inputs(m, s.batch, s.q_len, s.kv_len, seed);
  last = p;
  return p;
}

// ---------------------------------------------------------------------------------------------------------

Support CpuVariant::supports(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  if (!model.weights.empty() && s.heads != m.num_attention_heads)
    return Support::no("--weights: heads " + std::to_string(s.heads) + ": the checkpoint's weights are for all " +
                       std::to_string(m.num_attention_heads) + " heads");
  const double need = cpu_memory_bytes(m, algo_, s);
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (need > 0.7 * have)
    return Support::no("needs ~" + std::to_string(int64_t(need / double(1 << 30))) + " GiB, this machine has " +
                       std::to_string(int64_t(have / double(1 << 30))) + " GiB");
  return {};
}

Cost CpuVariant::cost(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  return mla::cost(m, algo_, shape_of(m, point));
}

double CpuVariant::host_memory_bytes(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  return cpu_memory_bytes(m, algo_, shape_of(m, point));
}

std::string CpuVariant::compute_ceiling() const {
  return cpu_info().amx_bf16 ? "cpu.amx_bf16_flops" : "cpu.avx512_bf16_flops";
}

void CpuVariant::prepare(const ModelFile& model, const Point& point, uint64_t seed) {
  m_ = parse_model_config(model.config, model.name, model.path);
  s_ = shape_of(m_, point);
  problem_ = problem(m_, s_, seed, model.weights);
  nh_ = s_.heads;
  nope_ = m_.qk_nope_head_dim;
  rope_ = m_.qk_rope_head_dim;
  qhd_ = m_.q_head_dim();
  vd_ = m_.v_head_dim;
  r_ = m_.kv_lora_rank;
  hid_ = m_.hidden_size;
  scale_ = float(m_.softmax_scale());
  const int64_t T = s_.tokens(), B = s_.batch, L = s_.kv_len, N = s_.keys();
  const auto& p = problem_->params;
  using onednn::dt;
  if (m_.q_lora_rank) {
    const int64_t ql = *m_.q_lora_rank;
    q_a_ = onednn::Linear(T, hid_, ql, p.q_a_proj.data(), dt::f32);
    q_b_ = onednn::Linear(T, ql, nh_ * qhd_, p.q_b_proj.data(), dt::f32);
    qa_f32_.resize(size_t(T * ql));
    qa_.resize(size_t(T * ql));
  } else {
    q_proj_ = onednn::Linear(T, hid_, nh_ * qhd_, p.q_proj.data(), dt::f32);
  }
  kv_a_ = onednn::Linear(T, hid_, r_ + rope_, p.kv_a_proj_with_mqa.data(), dt::f32);
  o_proj_ = onednn::Linear(T, nh_ * vd_, hid_, p.o_proj.data(), dt::f32);
  q_f32_.resize(size_t(T * nh_ * qhd_));
  kv_f32_.resize(size_t(T * (r_ + rope_)));
  q_.resize(size_t(T * nh_ * qhd_));
  attn_.resize(size_t(T * nh_ * vd_));
  out_.assign(size_t(T * hid_), std::nanf(""));  // poisoned: verification fails if run() leaves any unwritten
  // The caches, with room for this step's tokens after each request's kv_len cached ones.
  ckv_cache_.resize(size_t(B * N * r_));
  kpe_cache_.resize(size_t(B * N * rope_));
  const auto& in = problem_->inputs;
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(in.ckv_cache.begin() + b * L * r_, L * r_, ckv_cache_.begin() + b * N * r_);
    std::copy_n(in.kpe_cache.begin() + b * L * rope_, L * rope_, kpe_cache_.begin() + b * N * rope_);
  }
  const auto inv_freq = ref::rope_inv_freq(m_);
  const double ms = ref::rope_mscale(m_);
  cos_.resize(size_t(s_.q_len * rope_ / 2));
  sin_.resize(cos_.size());
  for (int64_t s = 0; s < s_.q_len; ++s)
    for (int64_t i = 0; i < rope_ / 2; ++i) {
      const double angle = double(L + s) * inv_freq[size_t(i)];
      cos_[size_t(s * rope_ / 2 + i)] = float(std::cos(angle) * ms);
      sin_[size_t(s * rope_ / 2 + i)] = float(std::sin(angle) * ms);
    }
  prepare_form();
}

namespace {

void rms_norm_to_bf16(const float* x, const bf16* w, int64_t n, double eps, bf16* y) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(n) + float(eps));
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i] * inv * to_float(w[i]));
}

// DeepSeek's RoPE (see ref::apply_rope): rotate interleaved pairs, store de-interleaved.
void rope_to_bf16(const float* x, const float* cos, const float* sin, int64_t d, bf16* y) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    y[i] = to_bf16(a * cos[i] - b * sin[i]);
    y[i + half] = to_bf16(b * cos[i] + a * sin[i]);
  }
}

}  // namespace

void CpuVariant::project() {
  const int64_t T = s_.tokens(), S = s_.q_len, L = s_.kv_len, N = s_.keys();
  const auto& p = problem_->params;
  const bf16* x = problem_->inputs.hidden_states.data();
  if (m_.q_lora_rank) {
    const int64_t ql = *m_.q_lora_rank;
    q_a_.run(x, qa_f32_.data());
    for (int64_t t = 0; t < T; ++t)
      rms_norm_to_bf16(&qa_f32_[size_t(t * ql)], p.q_a_layernorm.data(), ql, m_.rms_norm_eps, &qa_[size_t(t * ql)]);
    q_b_.run(qa_.data(), q_f32_.data());
  } else {
    q_proj_.run(x, q_f32_.data());
  }
  kv_a_.run(x, kv_f32_.data());
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t b = t / S, s = t % S;
    const float* cs = &cos_[size_t(s * rope_ / 2)];
    const float* sn = &sin_[size_t(s * rope_ / 2)];
    for (int64_t h = 0; h < nh_; ++h) {
      const float* qf = &q_f32_[size_t((t * nh_ + h) * qhd_)];
      bf16* q = &q_[size_t((t * nh_ + h) * qhd_)];
      for (int64_t d = 0; d < nope_; ++d) q[d] = to_bf16(qf[d]);
      rope_to_bf16(qf + nope_, cs, sn, rope_, q + nope_);
    }
    // This step's token enters the cache at position kv_len + s of its request.
    const float* kv = &kv_f32_[size_t(t * (r_ + rope_))];
    rms_norm_to_bf16(kv, p.kv_a_layernorm.data(), r_, m_.rms_norm_eps, &ckv_cache_[size_t((b * N + L + s) * r_)]);
    rope_to_bf16(kv + r_, cs, sn, rope_, &kpe_cache_[size_t((b * N + L + s) * rope_)]);
  }
}

void CpuVariant::run() {
  project();
  attend();
  o_proj_.run(attn_.data(), out_.data());
}

onednn::Linear CpuVariant::decompressor(int64_t rows) const {
  return onednn::Linear(rows, r_, nh_ * (nope_ + vd_), problem_->params.kv_b_proj.data(), onednn::dt::bf16);
}

void CpuVariant::softmax(const float* scores, bf16* probs, int64_t rows, int64_t div) const {
  const int64_t N = s_.keys(), S = s_.q_len, L = s_.kv_len;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t visible = L + (row / div) % S + 1;
    const float* x = scores + row * N;
    bf16* y = probs + row * N;
    float mx = -INFINITY;
    for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, x[j]);
    float sum = 0;
    for (int64_t j = 0; j < visible; ++j) sum += std::exp((x[j] - mx) * scale_);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < visible; ++j) y[j] = to_bf16(std::exp((x[j] - mx) * scale_) * inv);
    for (int64_t j = visible; j < N; ++j) y[j] = bf16{};  // masked: future tokens of this step
  }
}

void CpuVariant::prepare_mha(int64_t v_head_stride, int64_t v_token_stride) {
  using onednn::dt;
  const int64_t S = s_.q_len, N = s_.keys();
  scores_.resize(size_t(nh_ * S * N));
  probs_.resize(scores_.size());
  const onednn::View q{nh_, S, qhd_, qhd_, nh_ * qhd_, 1, dt::bf16};
  const onednn::View k_t{nh_, qhd_, N, qhd_, 1, nh_ * qhd_, dt::bf16};
  const onednn::View v{nh_, N, vd_, v_head_stride, v_token_stride, 1, dt::bf16};
  const onednn::View out{nh_, S, vd_, vd_, nh_ * vd_, 1, dt::bf16};
  mha_qk_ = onednn::Matmul(q, k_t, onednn::dense(S, N, dt::f32, nh_));
  mha_pv_ = onednn::Matmul(onednn::dense(S, N, dt::bf16, nh_), v, out);
}

void CpuVariant::attend_mha(int64_t request, const bf16* k, const bf16* v) {
  const int64_t S = s_.q_len;
  mha_qk_.run(&q_[size_t(request * S * nh_ * qhd_)], k, scores_.data());
  softmax(scores_.data(), probs_.data(), nh_ * S, 1);
  mha_pv_.run(probs_.data(), v, &attn_[size_t(request * S * nh_ * vd_)]);
}

void CpuVariant::prepare_absorbed() {
  using onednn::dt;
  const int64_t T = s_.tokens(), w = r_ + rope_, head_rows = (nope_ + vd_) * r_;
  q_abs_.resize(size_t(T * nh_ * w));
  o_lat_.resize(size_t(T * nh_ * r_));
  const onednn::View q_nope{nh_, T, nope_, qhd_, nh_ * qhd_, 1, dt::bf16};
  const onednn::View w_uk{nh_, nope_, r_, head_rows, r_, 1, dt::bf16};
  const onednn::View q_abs{nh_, T, r_, w, nh_ * w, 1, dt::bf16};
  absorb_q_ = onednn::Matmul(q_nope, w_uk, q_abs);
  const onednn::View o_lat{nh_, T, r_, r_, nh_ * r_, 1, dt::bf16};
  const onednn::View w_uv_t{nh_, r_, vd_, head_rows, 1, r_, dt::bf16};
  const onednn::View out{nh_, T, vd_, vd_, nh_ * vd_, 1, dt::bf16};
  absorb_o_ = onednn::Matmul(o_lat, w_uv_t, out);
}

void CpuVariant::absorb_query() {
  const int64_t T = s_.tokens(), w = r_ + rope_;
  absorb_q_.run(q_.data(), problem_->params.kv_b_proj.data(), q_abs_.data());
  for (int64_t th = 0; th < T * nh_; ++th)
    std::copy_n(&q_[size_t(th * qhd_ + nope_)], rope_, &q_abs_[size_t(th * w + r_)]);
}

void CpuVariant::absorb_output() {
  absorb_o_.run(o_lat_.data(), problem_->params.kv_b_proj.data() + nope_ * r_, attn_.data());
}

Verification CpuVariant::verify() {
  const auto& ref = problem_->reference();
  return {ref::relative_l2_error(out_.data(), ref.data(), ref.size()), 1e-2};
}

std::vector<DumpTensor> input_tensors(const Problem& problem) {
  std::vector<DumpTensor> t;
  auto bf = [&](const std::string& name, const std::vector<bf16>& v, std::vector<int64_t> shape) {
    if (!v.empty()) t.push_back({name, "BF16", std::move(shape), v.data(), v.size() * 2});
  };
  const ModelConfig& m = problem.model;
  const Shape& s = problem.shape;
  const auto& p = problem.params;
  const auto& in = problem.inputs;
  const int64_t ql = m.q_lora_rank.value_or(0), hid = m.hidden_size, H = s.heads, qhd = m.q_head_dim();
  const int64_t r = m.kv_lora_rank, rope = m.qk_rope_head_dim, nope = m.qk_nope_head_dim, vd = m.v_head_dim;
  bf("q_a_proj.weight", p.q_a_proj, {ql, hid});
  bf("q_a_layernorm.weight", p.q_a_layernorm, {ql});
  bf("q_b_proj.weight", p.q_b_proj, {H * qhd, ql});
  bf("q_proj.weight", p.q_proj, {H * qhd, hid});
  bf("kv_a_proj_with_mqa.weight", p.kv_a_proj_with_mqa, {r + rope, hid});
  bf("kv_a_layernorm.weight", p.kv_a_layernorm, {r});
  bf("kv_b_proj.weight", p.kv_b_proj, {H * (nope + vd), r});
  bf("o_proj.weight", p.o_proj, {hid, H * vd});
  bf("hidden_states", in.hidden_states, {s.batch, s.q_len, hid});
  bf("ckv_cache", in.ckv_cache, {s.batch, s.kv_len, r});
  bf("kpe_cache", in.kpe_cache, {s.batch, s.kv_len, rope});
  return t;
}

std::vector<DumpTensor> CpuVariant::tensors() const {
  std::vector<DumpTensor> t = input_tensors(*problem_);
  t.push_back({"output", "F32", {s_.batch, s_.q_len, hid_}, out_.data(), out_.size() * 4});
  const auto& ref = problem_->reference();
  t.push_back({"reference_output", "F64", {s_.batch, s_.q_len, hid_}, ref.data(), ref.size() * 8});
  return t;
}

}  // namespace dslab::mla
