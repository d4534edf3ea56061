#include "variants/moe/moe.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/team_thread.h"
#include "variants/common/rng.h"
#include "variants/reference/model.h"
#include "variants/moe/cpu/kernels.h"

namespace dslab::moe {

std::vector<std::pair<std::string, std::string>> axes() {
  return {{"tokens", "1"}, {"experts", ""}, {"threads", ""}, {"routing", "model"}};
}

Shape shape_of(const ModelConfig& m, const Point& p) {
  Shape s;
  s.tokens = p.integer("tokens");
  s.experts = p.has("experts") ? p.integer("experts") : m.n_routed_experts;
  s.topk = m.num_experts_per_tok;
  s.threads = p.has("threads") ? p.integer("threads") : omp_get_max_threads();
  s.routing = p.text("routing");
  return s;
}

namespace {

double zipf_exponent(const std::string& routing) {  // "zipf:S" -> S; BadInput otherwise
  size_t used = 0;
  double s = -1;
  try {
    s = std::stod(routing.substr(5), &used);
  } catch (const std::exception&) {}
  if (used != routing.size() - 5 || !(s > 0))
    throw BadInput("axis 'routing': value '" + routing + "': expected zipf:S with S > 0");
  return s;
}

void check_routing(const std::string& r) {
  if (r == "model" || r == "uniform") return;
  if (r.rfind("zipf:", 0) == 0) {
    zipf_exponent(r);
    return;
  }
  throw BadInput("axis 'routing': value '" + r + "': expected model | uniform | zipf:S");
}

double uniform01(uint64_t stream, uint64_t i) { return (double(uniform_pm1(stream, i)) + 1.0) / 2.0; }

}  // namespace

ref::Routing synthetic_routing(const ModelConfig& m, const Shape& s, uint64_t seed) {
  std::vector<double> popularity(static_cast<size_t>(s.experts), 1.0);
  if (s.routing != "uniform") {
    const double a = zipf_exponent(s.routing);
    for (int64_t e = 0; e < s.experts; ++e) popularity[size_t(e)] = 1.0 / std::pow(double(e + 1), a);
  }
  const uint64_t stream = stream_id(seed, "routing." + s.routing);
  ref::Routing r;
  r.tokens = s.tokens;
  r.topk = s.topk;
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<double> left = popularity;
    std::vector<double> w;
    for (int64_t k = 0; k < s.topk; ++k) {
      double total = 0;
      for (double p : left) total += p;
      double u = uniform01(stream, uint64_t(t * 128 + k)) * total;
      int64_t e = 0;
      while (e + 1 < s.experts && (u -= left[size_t(e)]) > 0) ++e;
      while (left[size_t(e)] == 0) e = (e + 1) % s.experts;  // rounding landed on a taken expert
      left[size_t(e)] = 0;
      r.expert.push_back(int(e));
      w.push_back(0.1 + uniform01(stream, uint64_t(t * 128 + 64 + k)));
    }
    double sum = 0;
    for (double v : w) sum += v;
    for (double v : w) r.weight.push_back(v / sum * m.routed_scaling_factor);
  }
  return r;
}

void check_routing_name(const std::string& routing) { check_routing(routing); }

std::shared_ptr<const Problem> problem(const ModelConfig& m, const Shape& s, uint64_t seed, const std::string& from) {
  static std::mutex mu;
  static std::shared_ptr<Problem> last;
  std::lock_guard<std::mutex> lock(mu);
  if (last && last->model.source == m.source && last->seed == seed && last->weights == from &&
      last->shape.tokens == s.tokens && last->shape.experts == s.experts && last->shape.routing == s.routing)
    return last;
  std::shared_ptr<const std::vector<ref::MlpParams>> weights;
  if (last && last->model.source == m.source && last->seed == seed && last->weights == from &&
      last->shape.experts == s.experts)
    weights = last->experts;
  last.reset();
  std::unique_ptr<Checkpoint> checkpoint;
  const int64_t layer = ref::first_moe_layer(m);
  if (!from.empty() && (!weights || s.routing == "model"))  // (the experts kept from the last point need no reading)
    checkpoint = std::make_unique<Checkpoint>(from);
  if (!weights) {
    const auto started = std::chrono::steady_clock::now();
    auto w = std::make_shared<std::vector<ref::MlpParams>>();
    for (int64_t e = 0; e < s.experts; ++e)
      w->push_back(checkpoint ? ref::load_expert(*checkpoint, layer, e)
                              : ref::make_mlp_params(m, m.moe_intermediate_size, seed, "experts." + std::to_string(e)));
    weights = w;
    if (checkpoint)
      checkpoint->report_load("layer " + std::to_string(layer) + "'s " + std::to_string(s.experts) + " routed experts",
                              std::chrono::steady_clock::now() - started);
  }
  auto p = std::make_shared<Problem>();
  p->model = m;
  p->shape = s;
  p->seed = seed;
  p->weights = from;
  p->experts = weights;
  p->x = ref::random_bf16(seed, "moe_hidden_states", size_t(s.tokens * m.hidden_size), std::sqrt(3.0f));
  if (s.routing == "model") {  // the model's own gate (same tensors as ref::make_moe_params) on these inputs
    std::vector<bf16> gate;
    std::vector<float> bias;
    if (checkpoint) {
      gate = ref::load_router(*checkpoint, layer);
      bias = ref::load_router_bias(*checkpoint, layer);
    } else {
      gate = ref::random_bf16(seed, "gate", size_t(m.n_routed_experts * m.hidden_size),
                              std::sqrt(3.0f / float(m.hidden_size)));
      if (m.topk_method == "noaux_tc")
        for (auto b : ref::random_bf16(seed, "e_score_correction_bias", size_t(m.n_routed_experts), 0.1f))
          bias.push_back(to_float(b));
    }
    std::vector<double> xt(static_cast<size_t>(m.hidden_size)),
        logits(static_cast<size_t>(s.tokens * m.n_routed_experts));
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t i = 0; i < m.hidden_size; ++i) xt[size_t(i)] = to_float(p->x[size_t(t * m.hidden_size + i)]);
      ref::matvec(gate.data(), m.n_routed_experts, m.hidden_size, xt.data(), &logits[size_t(t * m.n_routed_experts)]);
    }
    p->routing = ref::route(m, logits, bias, s.tokens);
  } else {
    p->routing = synthetic_routing(m, s, seed);
  }
  p->rows.assign(size_t(s.experts), {});
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t k = 0; k < s.topk; ++k) p->rows[size_t(p->routing.expert[size_t(t * s.topk + k)])].push_back(int(t));
  const int64_t n = std::min(s.tokens, Problem::kVerifiedTokens);
  for (int64_t i = 0; i < n; ++i) p->verified_tokens.push_back(n == 1 ? 0 : i * (s.tokens - 1) / (n - 1));
  last = p;
  return p;
}

const std::vector<double>& Problem::reference() const {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!reference_.empty()) return reference_;
  const int64_t H = model.hidden_size, K = shape.topk;
  reference_.assign(verified_tokens.size() * size_t(H), 0.0);
  for (size_t i = 0; i < verified_tokens.size(); ++i) {
    const int64_t t = verified_tokens[i];
    std::vector<double> xt(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) xt[size_t(j)] = to_float(x[size_t(t * H + j)]);
    for (int64_t k = 0; k < K; ++k) {
      const auto y = ref::mlp(model, (*experts)[size_t(routing.expert[size_t(t * K + k)])], xt, 1);
      for (int64_t j = 0; j < H; ++j)
        reference_[i * size_t(H) + size_t(j)] += routing.weight[size_t(t * K + k)] * y[size_t(j)];
    }
  }
  return reference_;
}

double expected_active_experts(int64_t experts, int64_t topk, int64_t tokens) {
  return double(experts) * (1.0 - std::pow(1.0 - double(topk) / double(experts), double(tokens)));
}

Cost cost(const ModelConfig& m, const Problem& p) {
  const double H = double(m.hidden_size), I = double(m.moe_intermediate_size), T = double(p.shape.tokens);
  Cost c;
  double active = 0;
  for (const auto& rows : p.rows) active += !rows.empty();
  c.flops = T * double(p.shape.topk) * 6.0 * H * I;                  // gate, up, down: 2*H*I each per (token, expert)
  c.bytes = active * 3.0 * H * I * 2.0 + T * H * 2.0 + T * H * 4.0;  // active experts' weights, x in, out
  return c;
}

Packed pack(const bf16* w, int64_t n, int64_t k) {
  Packed p;
  p.n_blocks = (n + 31) / 32 * 2;  // whole pairs of 16-column blocks: kernels take two at a time
  p.k_blocks = (k + 31) / 32;
  p.data.assign(size_t(p.n_blocks * p.k_blocks * 512), bf16{});
  for (int64_t nb = 0; nb < p.n_blocks; ++nb)
    for (int64_t kb = 0; kb < p.k_blocks; ++kb) {
      bf16* tile = p.data.data() + (nb * p.k_blocks + kb) * 512;
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t c = 0; c < 16; ++c)
          for (int64_t q = 0; q < 2; ++q) {
            const int64_t row = nb * 16 + c, col = kb * 32 + 2 * r + q;
            if (row < n && col < k) tile[r * 32 + 2 * c + q] = w[row * k + col];
          }
    }
  return p;
}

// ------------------------------------------------------------------------------------------------------

Support Base::supports(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  check_routing(s.routing);
  if (s.experts > m.n_routed_experts || s.experts < s.topk)
    throw BadInput("axis 'experts': value " + std::to_string(s.experts) + ": expected between num_experts_per_tok (" +
                   std::to_string(s.topk) + ") and n_routed_experts (" + std::to_string(m.n_routed_experts) + ")");
  if (!model.weights.empty() && ref::first_moe_layer(m) < 0)
    return Support::no("--weights: the checkpoint's model has no MoE layer");
  if (s.routing == "model" && s.experts != m.n_routed_experts)
    return Support::no("routing=model routes over all " + std::to_string(m.n_routed_experts) +
                       " experts (use routing=uniform or zipf:S with fewer)");
  const double weights = double(s.experts) * 3.0 * double(m.hidden_size) * double(m.moe_intermediate_size) * 2.0;
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (2.2 * weights > 0.6 * have)  // generated + packed copies
    return Support::no("expert weights " + std::to_string(int64_t(weights / double(1 << 30))) +
                       " GiB twice exceed memory (" + std::to_string(int64_t(have / double(1 << 30))) +
                       " GiB); reduce the experts axis");
  return {};
}

double Base::host_memory_bytes(const ModelFile& model, const Point& point) const {
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m, point);
  const double weights = double(s.experts) * 3.0 * double(m.hidden_size) * double(m.moe_intermediate_size) * 2.0;
  return 2.0 * weights;  // its packed copy, and (counted with each variant, to be safe) the shared generated one
}

Cost Base::cost(const ModelFile& model, const Point& point) const {
  if (p_) return moe::cost(m_, *p_);  // prepared: this seed's routing decides which experts are active
  const ModelConfig m = parse_model_config(model.config, model.name, model.path);
  return moe::cost(m, *problem(m, shape_of(m, point), 1, model.weights));
}

double gpu_moe_forward_scratch_bytes(const ModelConfig& m, int64_t tokens) {
  const double T = double(tokens), K = double(m.num_experts_per_tok), H = double(m.hidden_size),
               I = double(m.moe_intermediate_size);
  // per permuted row: its token and weight; its expert's output (fp32); the loop op's gathered input (bf16),
  // gate|up (fp32) and product (bf16), which also covers the grouped op's product
  return T * K * (8 + H * 4 + H * 2 + 2 * I * 4 + I * 2) +
         gpu_mlp_scratch_bytes(tokens, m.moe_intermediate_size * m.n_shared_experts);
}

double gpu_moe_owned_bytes(const ModelConfig& m, int64_t tokens, int64_t experts, int64_t hot_experts) {
  const double T = double(tokens), rows = T * double(m.num_experts_per_tok), N = double(hot_experts);
  // logits; top-k ids and weights, each row's slot, the tiles (at most rows/16 + experts), counts and offsets; with hot
  // experts, each choice's CPU id and GPU row, the hot tiles, the expert -> slab map and the slabs' ids
  const double hot = hot_experts > 0 ? rows * 8 + (rows / 16 + N) * 8 + 4 + double(experts) * 4 + N * 4 : 0;
  return T * double(m.n_routed_experts) * 4 + rows * 12 + (rows / 16 + double(experts)) * 8 + double(experts + 2) * 8 +
         hot;
}

std::string Base::compute_ceiling() const {
  return cpu_info().amx_bf16 ? "cpu.amx_bf16_flops" : "cpu.avx512_bf16_flops";
}

std::string Engine::compute_ceiling() const {
  return kernel_ == Kernel::avx512 ? "cpu.avx512_bf16_flops" : Base::compute_ceiling();
}

void Base::prepare(const ModelFile& model, const Point& point, uint64_t seed) {
  m_ = parse_model_config(model.config, model.name, model.path);
  const Shape s = shape_of(m_, point);
  p_ = problem(m_, s, seed, model.weights);
  threads_ = int(s.threads);
  std::vector<int> next_row(static_cast<size_t>(s.experts), 0);
  slot_.assign(size_t(s.tokens), std::vector<int>(size_t(s.topk)));
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t k = 0; k < s.topk; ++k)
      slot_[size_t(t)][size_t(k)] = next_row[size_t(p_->routing.expert[size_t(t * s.topk + k)])]++;
  out_.assign(size_t(s.tokens * m_.hidden_size), std::nanf(""));  // poisoned until run() writes it
}

std::map<std::string, double> Base::counters() {
  double active = 0, hottest = 0;
  for (const auto& r : p_->rows) {
    active += !r.empty();
    hottest = std::max(hottest, double(r.size()));
  }
  return {{"active_experts", active},
          {"tokens_per_expert", double(p_->shape.tokens * p_->shape.topk) / std::max(active, 1.0)},
          {"hottest_expert_tokens", hottest},
          {"experts", double(p_->shape.experts)},
          {"threads", double(threads_)}};
}

std::map<std::string, double> Engine::counters() {
  auto c = Base::counters();
  c["amx_experts"] = double(op_->amx_experts());
  if (kernel_ == Kernel::choose) c["amx_crossover_tokens"] = double(op_->amx_crossover());
  return c;
}

Verification Base::verify() {
  const auto& ref = p_->reference();
  const int64_t H = m_.hidden_size;
  std::vector<float> got;
  for (int64_t t : p_->verified_tokens) got.insert(got.end(), out_.begin() + t * H, out_.begin() + (t + 1) * H);
  return {ref::relative_l2_error(got.data(), ref.data(), ref.size()), 1e-2};
}

std::vector<DumpTensor> expert_tensors(const Problem& p) {
  std::vector<DumpTensor> t;
  const int64_t H = p.model.hidden_size, I = p.model.moe_intermediate_size;
  for (size_t e = 0; e < p.experts->size(); ++e) {
    const auto& x = (*p.experts)[e];
    const std::string n = "experts." + std::to_string(e);
    t.push_back({n + ".gate_proj.weight", "BF16", {I, H}, x.gate_proj.data(), x.gate_proj.size() * 2});
    t.push_back({n + ".up_proj.weight", "BF16", {I, H}, x.up_proj.data(), x.up_proj.size() * 2});
    t.push_back({n + ".down_proj.weight", "BF16", {H, I}, x.down_proj.data(), x.down_proj.size() * 2});
  }
  return t;
}

std::vector<DumpTensor> Base::tensors() const {
  std::vector<DumpTensor> t = expert_tensors(*p_);
  const int64_t H = m_.hidden_size, T = p_->shape.tokens, K = p_->shape.topk;
  t.push_back({"hidden_states", "BF16", {T, H}, p_->x.data(), p_->x.size() * 2});
  t.push_back({"topk_weight", "F64", {T, K}, p_->routing.weight.data(), p_->routing.weight.size() * 8});
  t.push_back({"topk_idx", "I32", {T, K}, p_->routing.expert.data(), p_->routing.expert.size() * 4});
  t.push_back({"output", "F32", {T, H}, out_.data(), out_.size() * 4});
  return t;
}

// ------------------------------------------------------------------------------------------------------

Support Engine::available() const {
  const CpuInfo& c = cpu_info();
  if (!c.avx512_bf16) return Support::no("needs AVX512_BF16");
  if (kernel_ != Kernel::avx512) {
    if (!c.amx_bf16) return Support::no("needs AMX");
    if (std::string why = request_amx_permission(); !why.empty()) return Support::no(why);
  }
  return {};
}

void Engine::prepare(const ModelFile& model, const Point& point, uint64_t seed) {
  Base::prepare(model, point, seed);
  if (!op_ || op_->threads() != threads_) op_ = std::make_unique<HostExperts>(kernel_, threads_);
  op_->set_weights(m_, *p_->experts);
  ids_.assign(p_->routing.expert.begin(), p_->routing.expert.end());
  weights_.assign(p_->routing.weight.begin(), p_->routing.weight.end());
  op_->forward(p_->x.data(), p_->shape.tokens, ids_.data(), weights_.data(), p_->shape.topk,
               out_.data());                           // sizes the buffers
  std::fill(out_.begin(), out_.end(), std::nanf(""));  // poisoned again: verification must see run()'s output
}

std::vector<std::pair<const void*, size_t>> Engine::cold_buffers() const {
  return op_->weights_of(ids_.data(), int64_t(ids_.size()));
}

std::vector<std::pair<const void*, size_t>> HostExperts::weights_of(const int32_t* ids, int64_t count) const {
  std::vector<char> reached(size_t(experts_), 0);
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] >= 0) reached[size_t(ids[i])] = 1;
  std::vector<std::pair<const void*, size_t>> out;
  for (int64_t e = 0; e < experts_; ++e)
    if (reached[size_t(e)])
      for (const Packed* w : {&gate_[size_t(e)], &up_[size_t(e)], &down_[size_t(e)]})
        out.emplace_back(w->data.data(), w->data.size() * sizeof(bf16));
  return out;
}

void Engine::run() {
  op_->forward(p_->x.data(), p_->shape.tokens, ids_.data(), weights_.data(), p_->shape.topk, out_.data());
}

void HostExperts::set_weights(const ModelConfig& m, const std::vector<ref::MlpParams>& experts) {
  // AMX tiles need the process's permission first (else the first tile instruction is an illegal instruction).
  if (kernel_ != Kernel::avx512)
    if (const std::string why = request_amx_permission(); !why.empty())
      throw std::runtime_error("HostExperts: AMX: " + why);
  hidden_ = m.hidden_size;
  inter_ = m.moe_intermediate_size;
  experts_ = int64_t(experts.size());
  hidden_blocks_ = (hidden_ + 31) / 32;
  inter_blocks_ = (inter_ + 31) / 32;
  y_stride_ = hidden_blocks_ * 32 + 16;  // not a multiple of 4 KiB: rows would share L1 sets
  gate_.resize(size_t(experts_));
  up_.resize(size_t(experts_));
  down_.resize(size_t(experts_));
  run_on_team_thread([&] {
#pragma omp parallel for schedule(dynamic) num_threads(threads_)
    for (int64_t e = 0; e < experts_; ++e) {  // packed once: the tile/VNNI order both kernels read
      const auto& x = experts[size_t(e)];
      if (x.gate_proj.empty()) continue;  // (not this engine's: see set_weights)
      gate_[size_t(e)] = pack(x.gate_proj.data(), inter_, hidden_);
      up_[size_t(e)] = pack(x.up_proj.data(), inter_, hidden_);
      down_[size_t(e)] = pack(x.down_proj.data(), hidden_, inter_);
    }
    crossover_ = kernel_ == Kernel::choose ? moe::amx_crossover(hidden_, inter_, threads_) : 0;
  });
}

void HostExperts::forward(const bf16* x, int64_t tokens, const int32_t* ids, const float* weights, int64_t topk,
                          float* out) {
  const int64_t H = hidden_, E = experts_;
  // Plan: each expert's (token, k) pairs in token order, their padded row ranges, the tasks of active experts.
  rows_.resize(size_t(E));
  for (auto& r : rows_) r.clear();
  for (int64_t i = 0; i < tokens * topk; ++i) {
    const int32_t e = ids[i];
    if (e < 0) continue;  // run elsewhere
    if (e >= E) throw std::logic_error("HostExperts: expert id " + std::to_string(e) + " out of range");
    if (gate_[size_t(e)].data.empty())
      throw std::logic_error("HostExperts: expert " + std::to_string(e) + " was routed here but not given");
    rows_[size_t(e)].push_back(int32_t(i));
  }
  first_row_.assign(size_t(E) + 1, 0);
  use_amx_.assign(size_t(E), 0);
  slot_.resize(size_t(tokens * topk));
  gate_up_tasks_.clear();
  down_tasks_.clear();
  int64_t max_rows = 16;
  amx_experts_ = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = int64_t(rows_[size_t(e)].size()), rows = m ? padded_rows(m) : 0;
    first_row_[size_t(e) + 1] = first_row_[size_t(e)] + rows;
    if (m == 0) continue;  // an expert no token chose costs nothing
    max_rows = std::max(max_rows, rows);
    use_amx_[size_t(e)] = kernel_ == Kernel::amx || (kernel_ == Kernel::choose && m >= crossover_);
    amx_experts_ += use_amx_[size_t(e)];
    for (int64_t r = 0; r < m; ++r) slot_[size_t(rows_[size_t(e)][size_t(r)])] = int32_t(first_row_[size_t(e)] + r);
    for (int64_t nb = 0; nb < gate_[size_t(e)].n_blocks; ++nb) gate_up_tasks_.push_back({int32_t(e), int32_t(nb)});
    for (int64_t nb = 0; nb < down_[size_t(e)].n_blocks; nb += 2) down_tasks_.push_back({int32_t(e), int32_t(nb)});
  }
  const int64_t total_rows = first_row_.back();
  // Arenas: grown to the largest call so far, never shrunk (a decode loop allocates nothing after its first step).
  auto at_least = [](auto& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  at_least(a_, size_t(total_rows * hidden_blocks_ * 32));
  at_least(h_, size_t(total_rows * inter_blocks_ * 32));
  at_least(y_, size_t(total_rows * y_stride_));
  if (scratch_.size() != size_t(threads_) || scratch_.front().size() < size_t(max_rows * 32))
    scratch_.assign(size_t(threads_), std::vector<float>(size_t(max_rows * 32)));
  const bool any_amx = amx_experts_ > 0;
  std::atomic<int64_t> next_gate_up{0}, next_down{0};
  run_on_team_thread([&] {
#pragma omp parallel num_threads(threads_)
    {
      float* c0 = scratch_[size_t(omp_get_thread_num())].data();
      float* c1 = c0 + max_rows * 16;
      if (any_amx) kernels::amx_configure();
#pragma omp for schedule(dynamic)
      for (int64_t e = 0; e < E;
           ++e) {  // pack activations: each expert's tokens into 16 x 32 tiles (padding rows zero)
        const auto& rows = rows_[size_t(e)];
        if (rows.empty()) continue;
        bf16* a = &a_[size_t(first_row_[size_t(e)] * hidden_blocks_ * 32)];
        const int64_t padded = first_row_[size_t(e) + 1] - first_row_[size_t(e)];
        for (int64_t r = 0; r < padded; ++r) {
          bf16* dst = a + (r / 16) * hidden_blocks_ * 512 + (r % 16) * 32;
          if (r < int64_t(rows.size())) {
            const bf16* src = x + int64_t(rows[size_t(r)] / topk) * H;
            for (int64_t kb = 0; kb < hidden_blocks_; ++kb) {
              const int64_t n = std::min<int64_t>(32, H - kb * 32);
              std::copy_n(src + kb * 32, n, dst + kb * 512);
              std::fill_n(dst + kb * 512 + n, 32 - n, bf16{});
            }
          } else {
            for (int64_t kb = 0; kb < hidden_blocks_; ++kb) std::fill_n(dst + kb * 512, 32, bf16{});
          }
        }
      }
      // Gate and up of the same 16 columns in one pass over the expert's activations; SiLU(gate)*up on the way out.
      for (int64_t i; (i = next_gate_up.fetch_add(1, std::memory_order_relaxed)) < int64_t(gate_up_tasks_.size());) {
        const Task t = gate_up_tasks_[size_t(i)];
        const int64_t m = int64_t(rows_[size_t(t.expert)].size()), row0 = first_row_[size_t(t.expert)];
        const Packed &g = gate_[size_t(t.expert)], &u = up_[size_t(t.expert)];
        const bf16* a = &a_[size_t(row0 * hidden_blocks_ * 32)];
        if (use_amx_[size_t(t.expert)])
          kernels::amx_two_blocks(a, padded_rows(m), g.block(t.block), u.block(t.block), g.k_blocks, c0, c1, 16);
        else
          kernels::avx512_two_blocks(a, m, g.block(t.block), u.block(t.block), g.k_blocks, c0, c1, 16);
        kernels::swiglu_block(c0, c1, m,
                              &h_[size_t(row0 * inter_blocks_ * 32)] + (t.block / 2) * 512 + (t.block % 2) * 16,
                              inter_blocks_ * 512);
      }
#pragma omp barrier
      for (int64_t i; (i = next_down.fetch_add(1, std::memory_order_relaxed)) < int64_t(down_tasks_.size());) {
        const Task t = down_tasks_[size_t(i)];
        const int64_t m = int64_t(rows_[size_t(t.expert)].size()), row0 = first_row_[size_t(t.expert)];
        const Packed& d = down_[size_t(t.expert)];
        const bf16* h = &h_[size_t(row0 * inter_blocks_ * 32)];
        float* y = &y_[size_t(row0 * y_stride_)] + t.block * 16;
        if (use_amx_[size_t(t.expert)])
          kernels::amx_two_blocks(h, padded_rows(m), d.block(t.block), d.block(t.block + 1), d.k_blocks, y, y + 16,
                                  y_stride_);
        else
          kernels::avx512_two_blocks(h, m, d.block(t.block), d.block(t.block + 1), d.k_blocks, y, y + 16, y_stride_);
      }
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tokens; ++t) {  // the weighted combine
        float* o = out + t * H;
        bool first = true;
        for (int64_t k = 0; k < topk; ++k) {
          if (ids[t * topk + k] < 0) continue;
          const float w = weights[t * topk + k];
          const float* y = &y_[size_t(slot_[size_t(t * topk + k)]) * size_t(y_stride_)];
          for (int64_t j = 0; j < H; ++j) o[j] = (first ? 0.0f : o[j]) + w * y[j];
          first = false;
        }
        if (first) std::fill_n(o, H, 0.0f);
      }
      if (any_amx) kernels::amx_release();
    }
  });
}

int64_t amx_crossover(int64_t hidden, int64_t intermediate, int threads) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int>, int64_t> measured;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(hidden, intermediate, threads);
  if (auto it = measured.find(key); it != measured.end()) return it->second;
  // Synthetic experts of this shape, with distinct gate, up and down weights, as many copies as it takes to
  // stream twice the LLC: the layer's decision is made with weights coming from DRAM, and a probe run on
  // cache-resident weights put the crossover too low (AMX won at 2 tokens hot but lost at 3 cold).
  const int64_t h_pad = (hidden + 31) / 32 * 32,
                i_pad = (intermediate + 31) / 32 * 32;  // packed A: rows x K, zero padded
  const double expert_bytes = 3.0 * double(hidden) * double(intermediate) * 2.0;
  const int copies = int(std::clamp(std::ceil(2.0 * double(cpu_info().llc_bytes) / expert_bytes), 1.0, 64.0));
  struct Expert {
    Packed gate, up, down;
  };
  std::vector<Expert> experts(static_cast<size_t>(copies));
  const float scale = 0.05f;
  for (int i = 0; i < copies; ++i) {
    const std::string tag = "crossover." + std::to_string(i);
    const auto gw = ref::random_bf16(11, tag + ".gate", size_t(intermediate * hidden), scale);
    const auto uw = ref::random_bf16(11, tag + ".up", size_t(intermediate * hidden), scale);
    const auto dw = ref::random_bf16(11, tag + ".down", size_t(hidden * intermediate), scale);
    experts[size_t(i)] = {pack(gw.data(), intermediate, hidden), pack(uw.data(), intermediate, hidden),
                          pack(dw.data(), hidden, intermediate)};
  }
  auto step_seconds = [&](bool amx, int64_t m) {  // seconds per expert, best of three passes over all copies
    const int64_t rows = padded_rows(m);
    const auto a = ref::random_bf16(11, "crossover.a", size_t(rows * h_pad), 1.0f);
    std::vector<bf16> h(static_cast<size_t>(rows * i_pad), to_bf16(0.5f));
    std::vector<float> y(static_cast<size_t>(rows * h_pad)), c(static_cast<size_t>(threads) * size_t(rows) * 32);
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
      {
        float* c0 = &c[size_t(omp_get_thread_num()) * size_t(rows) * 32];
        if (amx) kernels::amx_configure();
        for (const Expert& x : experts) {
#pragma omp for schedule(dynamic)
          for (int64_t nb = 0; nb < x.gate.n_blocks; ++nb)
            amx ? kernels::amx_two_blocks(a.data(), rows, x.gate.block(nb), x.up.block(nb), x.gate.k_blocks, c0,
                                          c0 + rows * 16, 16)
                : kernels::avx512_two_blocks(a.data(), m, x.gate.block(nb), x.up.block(nb), x.gate.k_blocks, c0,
                                             c0 + rows * 16, 16);
#pragma omp for schedule(dynamic)
          for (int64_t nb = 0; nb < x.down.n_blocks; nb += 2)
            amx ? kernels::amx_two_blocks(h.data(), rows, x.down.block(nb), x.down.block(nb + 1), x.down.k_blocks,
                                          &y[size_t(nb * 16)], &y[size_t(nb * 16 + 16)], h_pad)
                : kernels::avx512_two_blocks(h.data(), m, x.down.block(nb), x.down.block(nb + 1), x.down.k_blocks,
                                             &y[size_t(nb * 16)], &y[size_t(nb * 16 + 16)], h_pad);
        }
        if (amx) kernels::amx_release();
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / copies);
    }
    return best;
  };
  int64_t crossover = int64_t(1) << 40;  // never, unless measured
  std::string trace;
  for (int64_t m : {1, 2, 4, 8, 16, 32, 64, 128}) {
    const double t_amx = step_seconds(true, m), t_avx = step_seconds(false, m);
    trace += " " + std::to_string(m) + ":" + std::to_string(int(t_avx / t_amx * 100)) + "%";
    if (t_amx <= t_avx) {
      crossover = m;
      break;
    }
  }
  std::fprintf(stderr,
               "moe: AMX beats AVX-512 from %lld tokens per expert (hidden %lld, intermediate %lld, %d threads; "
               "%d cold copies; AVX-512/AMX time by tokens:%s)\n",
               static_cast<long long>(crossover), static_cast<long long>(hidden), static_cast<long long>(intermediate),
               threads, copies, trace.c_str());
  measured[key] = crossover;
  return crossover;
}

}  // namespace dslab::moe
