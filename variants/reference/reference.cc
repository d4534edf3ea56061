#include "variants/reference/reference.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <limits>
#include <map>
#include <numeric>

#include "variants/common/rng.h"

namespace dslab::ref {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Unit-variance outputs for unit-variance inputs: uniform(-a, a) has variance a^2/3.
float fan_in_scale(int64_t fan_in) { return float(std::sqrt(3.0 / double(fan_in))); }

double silu(double v) { return v / (1.0 + std::exp(-v)); }

std::vector<double> to_double(const std::vector<bf16>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = to_float(v[i]);
  return d;
}

// Indices of the k largest values, ties broken towards the lower index.
std::vector<int> topk_indices(const std::vector<double>& v, int64_t k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
  idx.resize(size_t(k));
  return idx;
}

// Per new token (0 .. q_len - 1): whether its output is computed (MlaInputs::rows; empty: every one).
std::vector<char> wanted_rows(const MlaInputs& in) {
  std::vector<char> wanted(static_cast<size_t>(in.q_len), in.rows.empty() ? 1 : 0);
  for (int64_t s : in.rows) {
    if (s < 0 || s >= in.q_len)
      throw std::invalid_argument("MlaInputs::rows: new token " + std::to_string(s) + " of " +
                                  std::to_string(in.q_len));
    wanted[size_t(s)] = 1;
  }
  return wanted;
}

}  // namespace

std::vector<bf16> random_bf16(uint64_t seed, const std::string& name, size_t n, float scale, float offset) {
  std::vector<bf16> out(n);
  const uint64_t stream = stream_id(seed, name);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) out[size_t(i)] = to_bf16(offset + scale * uniform_pm1(stream, uint64_t(i)));
  return out;
}

MlaParams make_mla_params(const ModelConfig& m, int64_t heads, uint64_t seed) {
  MlaParams p;
  p.heads = heads;
  const int64_t H = m.hidden_size, qhd = m.q_head_dim(), r = m.kv_lora_rank;
  if (m.q_lora_rank) {
    const int64_t ql = *m.q_lora_rank;
    p.q_a_proj = random_bf16(seed, "q_a_proj", size_t(ql * H), fan_in_scale(H));
    p.q_a_layernorm = random_bf16(seed, "q_a_layernorm", size_t(ql), 0.1f, 1.0f);
    p.q_b_proj = random_bf16(seed, "q_b_proj", size_t(heads * qhd * ql), fan_in_scale(ql));
  } else {
    p.q_proj = random_bf16(seed, "q_proj", size_t(heads * qhd * H), fan_in_scale(H));
  }
  p.kv_a_proj_with_mqa = random_bf16(seed, "kv_a_proj_with_mqa", size_t((r + m.qk_rope_head_dim) * H), fan_in_scale(H));
  p.kv_a_layernorm = random_bf16(seed, "kv_a_layernorm", size_t(r), 0.1f, 1.0f);
  p.kv_b_proj =
      random_bf16(seed, "kv_b_proj", size_t(heads * (m.qk_nope_head_dim + m.v_head_dim) * r), fan_in_scale(r));
  p.o_proj = random_bf16(seed, "o_proj", size_t(H * heads * m.v_head_dim), fan_in_scale(heads * m.v_head_dim));
  return p;
}

MlpParams make_mlp_params(const ModelConfig& m, int64_t intermediate, uint64_t seed, const std::string& prefix) {
  MlpParams p;
  p.intermediate = intermediate;
  const int64_t H = m.hidden_size;
  p.gate_proj = random_bf16(seed, prefix + ".gate_proj", size_t(intermediate * H), fan_in_scale(H));
  p.up_proj = random_bf16(seed, prefix + ".up_proj", size_t(intermediate * H), fan_in_scale(H));
  p.down_proj = random_bf16(seed, prefix + ".down_proj", size_t(H * intermediate), fan_in_scale(intermediate));
  return p;
}

MoeParams make_moe_params(const ModelConfig& m, uint64_t seed) {
  MoeParams p;
  p.gate = random_bf16(seed, "gate", size_t(m.n_routed_experts * m.hidden_size), fan_in_scale(m.hidden_size));
  if (m.topk_method == "noaux_tc") {
    auto b = random_bf16(seed, "e_score_correction_bias", size_t(m.n_routed_experts), 0.1f);
    for (auto v : b) p.e_score_correction_bias.push_back(to_float(v));
  }
  for (int64_t e = 0; e < m.n_routed_experts; ++e)
    p.experts.push_back(make_mlp_params(m, m.moe_intermediate_size, seed, "experts." + std::to_string(e)));
  if (m.n_shared_experts > 0)
    p.shared = make_mlp_params(m, m.moe_intermediate_size * m.n_shared_experts, seed, "shared_experts");
  return p;
}

MoeParams make_moe_params_lazy(const ModelConfig& m, uint64_t seed) {
  ModelConfig none = m;
  none.n_routed_experts = 0;  // the shared experts only
  MoeParams p = make_moe_params(none, seed);
  p.gate = random_bf16(seed, "gate", size_t(m.n_routed_experts * m.hidden_size), fan_in_scale(m.hidden_size));
  p.e_score_correction_bias.clear();
  if (m.topk_method == "noaux_tc")
    for (auto v : random_bf16(seed, "e_score_correction_bias", size_t(m.n_routed_experts), 0.1f))
      p.e_score_correction_bias.push_back(to_float(v));
  p.make_expert = [m, seed](int e) {
    return make_mlp_params(m, m.moe_intermediate_size, seed, "experts." + std::to_string(e));
  };
  return p;
}

LayerParams make_layer_params(const ModelConfig& m, int64_t layer_index, uint64_t seed, bool lazy_experts) {
  LayerParams p;
  p.input_layernorm = random_bf16(seed, "input_layernorm", size_t(m.hidden_size), 0.1f, 1.0f);
  p.post_attention_layernorm = random_bf16(seed, "post_attention_layernorm", size_t(m.hidden_size), 0.1f, 1.0f);
  p.attn = make_mla_params(m, m.num_attention_heads, seed);
  if (!m.is_moe_layer(layer_index))
    p.dense = make_mlp_params(m, m.intermediate_size, seed, "mlp");
  else if (!lazy_experts)
    p.moe = make_moe_params(m, seed);
  else
    p.moe = make_moe_params_lazy(m, seed);
  return p;
}

MlaInputs make_mla_inputs(const ModelConfig& m, int64_t batch, int64_t q_len, int64_t kv_len, uint64_t seed) {
  MlaInputs in;
  in.batch = batch;
  in.q_len = q_len;
  in.kv_len = kv_len;
  const float unit = std::sqrt(3.0f);  // unit variance, like normalised activations
  in.hidden_states = random_bf16(seed, "hidden_states", size_t(batch * q_len * m.hidden_size), unit);
  in.ckv_cache = random_bf16(seed, "ckv_cache", size_t(batch * kv_len * m.kv_lora_rank), unit);
  in.kpe_cache = random_bf16(seed, "kpe_cache", size_t(batch * kv_len * m.qk_rope_head_dim), unit);
  return in;
}

void rms_norm(const double* x, const bf16* weight, int64_t n, double eps, double* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * to_float(weight[i]);
}

void matvec(const bf16* w, int64_t rows, int64_t cols, const double* x, double* y) {
  // Eight partial sums per row: fp64 either way, but independent sums vectorise (a prefill's reference over a
  // whole stack is trillions of these products).
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const bf16* row = w + r * cols;
    double acc[8] = {};
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8)
      for (int j = 0; j < 8; ++j) acc[j] += double(to_float(row[c + j])) * x[c + j];
    for (; c < cols; ++c) acc[0] += double(to_float(row[c])) * x[c];
    y[r] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}

std::vector<double> rope_inv_freq(const ModelConfig& m) {
  const int64_t d = m.qk_rope_head_dim, half = d / 2;
  const double base = m.rope_theta;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = 1.0 / std::pow(base, double(2 * i) / double(d));
  if (!m.rope_scaling.yarn) return inv;
  const auto& y = m.rope_scaling;
  // The dimension at which a frequency completes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return double(d) * std::log(y.original_max_position_embeddings / (rotations * 2 * kPi)) / (2 * std::log(base));
  };
  double low = std::max(std::floor(correction_dim(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(y.beta_slow)), double(d - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_mask = 1.0 - ramp;  // 1: keep the original frequency; 0: interpolate by factor
    const double extra = inv[size_t(i)], inter = inv[size_t(i)] / y.factor;
    inv[size_t(i)] = inter * (1 - extrapolation_mask) + extra * extrapolation_mask;
  }
  return inv;
}

double rope_mscale(const ModelConfig& m) {
  if (!m.rope_scaling.yarn) return 1.0;
  const auto& y = m.rope_scaling;
  return yarn_get_mscale(y.factor, y.mscale) / yarn_get_mscale(y.factor, y.mscale_all_dim);
}

void apply_rope(const ModelConfig& m, int64_t position, double* x) {
  const int64_t half = m.qk_rope_head_dim / 2;
  const auto inv = rope_inv_freq(m);
  const double ms = rope_mscale(m);
  std::vector<double> out(static_cast<size_t>(2 * half));
  for (int64_t i = 0; i < half; ++i) {
    const double angle = double(position) * inv[size_t(i)];
    const double c = std::cos(angle) * ms, s = std::sin(angle) * ms;
    const double a = x[2 * i], b = x[2 * i + 1];
    out[size_t(i)] = a * c - b * s;
    out[size_t(i + half)] = b * c + a * s;
  }
  std::copy(out.begin(), out.end(), x);
}

std::vector<double> mla_attention(const ModelConfig& m, const MlaParams& p, const MlaInputs& in, MlaForm form,
                                  const std::vector<std::vector<int64_t>>* keys, double* mass_recall) {
  const int64_t hid = m.hidden_size, nh = p.heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
  const int64_t qhd = nope + rope, vd = m.v_head_dim, r = m.kv_lora_rank;
  const int64_t B = in.batch, S = in.q_len, L = in.kv_len, T = B * S, N = L + S;
  if (keys && int64_t(keys->size()) != B)
    throw std::invalid_argument("mla_attention: a key selection per request expected");
  const double scale = m.softmax_scale();
  const auto x = in.hidden_exact.empty() ? to_double(in.hidden_states) : in.hidden_exact;
  const std::vector<char> wanted = wanted_rows(in);

  // Projections of the new tokens: every one's key, the wanted ones' queries.
  std::vector<double> q(static_cast<size_t>(T * nh * qhd)), ckv_new(static_cast<size_t>(T * r)),
      kpe_new(static_cast<size_t>(T * rope));
#pragma omp parallel for schedule(dynamic) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    const double* xt = &x[size_t(t * hid)];
    const int64_t pos = L + t % S;
    double* qt = &q[size_t(t * nh * qhd)];
    if (wanted[size_t(t % S)]) {
      if (m.q_lora_rank) {
        std::vector<double> qa(static_cast<size_t>(*m.q_lora_rank));
        matvec(p.q_a_proj.data(), *m.q_lora_rank, hid, xt, qa.data());
        rms_norm(qa.data(), p.q_a_layernorm.data(), *m.q_lora_rank, m.rms_norm_eps, qa.data());
        matvec(p.q_b_proj.data(), nh * qhd, *m.q_lora_rank, qa.data(), qt);
      } else {
        matvec(p.q_proj.data(), nh * qhd, hid, xt, qt);
      }
      for (int64_t h = 0; h < nh; ++h) apply_rope(m, pos, qt + h * qhd + nope);
    }
    std::vector<double> kv(static_cast<size_t>(r + rope));
    matvec(p.kv_a_proj_with_mqa.data(), r + rope, hid, xt, kv.data());
    rms_norm(kv.data(), p.kv_a_layernorm.data(), r, m.rms_norm_eps, &ckv_new[size_t(t * r)]);
    apply_rope(m, pos, kv.data() + r);
    std::copy(kv.begin() + r, kv.end(), kpe_new.begin() + t * rope);
  }

  auto latent = [&](int64_t b, int64_t j) -> std::vector<double> {  // c_kv of key j of request b
    if (j < L) {
      std::vector<double> c(static_cast<size_t>(r));
      for (int64_t i = 0; i < r; ++i)
        c[size_t(i)] = in.ckv_exact.empty() ? to_float(in.ckv_cache[size_t((b * L + j) * r + i)])
                                            : in.ckv_exact[size_t((b * L + j) * r + i)];
      return c;
    }
    return {ckv_new.begin() + (b * S + j - L) * r, ckv_new.begin() + (b * S + j - L + 1) * r};
  };
  auto rope_key = [&](int64_t b, int64_t j) -> std::vector<double> {
    if (j < L) {
      std::vector<double> k(static_cast<size_t>(rope));
      for (int64_t i = 0; i < rope; ++i)
        k[size_t(i)] = in.kpe_exact.empty() ? to_float(in.kpe_cache[size_t((b * L + j) * rope + i)])
                                            : in.kpe_exact[size_t((b * L + j) * rope + i)];
      return k;
    }
    return {kpe_new.begin() + (b * S + j - L) * rope, kpe_new.begin() + (b * S + j - L + 1) * rope};
  };
  auto w_uk = [&](int64_t h, int64_t d, int64_t i) {
    return double(to_float(p.kv_b_proj[size_t((h * (nope + vd) + d) * r + i)]));
  };
  auto w_uv = [&](int64_t h, int64_t d, int64_t i) {
    return double(to_float(p.kv_b_proj[size_t((h * (nope + vd) + nope + d) * r + i)]));
  };

  std::vector<double> attn(static_cast<size_t>(T * nh * vd));
  // Dense attention's softmax mass inside the selection, per (request, new token, head); their mean is mass_recall.
  std::vector<double> inside(static_cast<size_t>(B * S * nh), 1.0);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<std::vector<double>> c(static_cast<size_t>(N)), kpe(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j) {
      c[size_t(j)] = latent(b, j);
      kpe[size_t(j)] = rope_key(b, j);
    }
    std::vector<char> attended(static_cast<size_t>(N), keys ? 0 : 1);  // (sparse: the request's selection)
    if (keys)
      for (int64_t j : (*keys)[size_t(b)]) {
        if (j < 0 || j >= N)
          throw std::invalid_argument("mla_attention: selected key " + std::to_string(j) + " of " + std::to_string(N));
        attended[size_t(j)] = 1;
      }
#pragma omp parallel for schedule(dynamic)
    for (int64_t h = 0; h < nh; ++h) {
      // Decompressed keys/values of this head, only in the decompressed form.
      std::vector<double> k_nope, v;
      if (form == MlaForm::decompressed) {
        k_nope.assign(size_t(N * nope), 0);
        v.assign(size_t(N * vd), 0);
        for (int64_t j = 0; j < N; ++j)
          for (int64_t d = 0; d < nope + vd; ++d) {
            double acc = 0;
            for (int64_t i = 0; i < r; ++i)
              acc += (d < nope ? w_uk(h, d, i) : w_uv(h, d - nope, i)) * c[size_t(j)][size_t(i)];
            (d < nope ? k_nope[size_t(j * nope + d)] : v[size_t(j * vd + d - nope)]) = acc;
          }
      }
      for (int64_t s = 0; s < S; ++s) {
        if (!wanted[size_t(s)]) continue;
        const int64_t t = b * S + s;
        const double* qh = &q[size_t((t * nh + h) * qhd)];
        const int64_t visible = L + s + 1;  // causal among the new tokens
        std::vector<double> q_abs;
        if (form != MlaForm::decompressed) {  // fold W_UK into the query: q_abs = W_UK^T q_nope
          q_abs.assign(size_t(r), 0);
          for (int64_t d = 0; d < nope; ++d)
            for (int64_t i = 0; i < r; ++i) q_abs[size_t(i)] += qh[d] * w_uk(h, d, i);
        }
        std::vector<double> score(static_cast<size_t>(visible));
        for (int64_t j = 0; j < visible; ++j) {
          double sc = 0;
          if (form == MlaForm::decompressed) {
            for (int64_t d = 0; d < nope; ++d) sc += qh[d] * k_nope[size_t(j * nope + d)];
            for (int64_t d = 0; d < rope; ++d) sc += qh[nope + d] * kpe[size_t(j)][size_t(d)];
          } else if (form == MlaForm::absorbed_concat) {
            for (int64_t i = 0; i < r + rope; ++i)
              sc += (i < r ? q_abs[size_t(i)] * c[size_t(j)][size_t(i)]
                           : qh[nope + i - r] * kpe[size_t(j)][size_t(i - r)]);
          } else {
            double s_pe = 0, s_nope = 0;
            for (int64_t d = 0; d < rope; ++d) s_pe += qh[nope + d] * kpe[size_t(j)][size_t(d)];
            for (int64_t i = 0; i < r; ++i) s_nope += q_abs[size_t(i)] * c[size_t(j)][size_t(i)];
            sc = s_pe + s_nope;
          }
          score[size_t(j)] = sc * scale;
        }
        if (keys && mass_recall) {  // (dense attention's softmax, before the mask)
          const double top = *std::max_element(score.begin(), score.end());
          double all = 0, kept = 0;
          for (int64_t j = 0; j < visible; ++j) {
            const double e = std::exp(score[size_t(j)] - top);
            all += e, kept += attended[size_t(j)] ? e : 0.0;
          }
          inside[size_t(t * nh + h)] = kept / all;
        }
        for (int64_t j = 0; j < visible; ++j)
          if (!attended[size_t(j)]) score[size_t(j)] = -INFINITY;  // (a masked key: no weight)
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (auto& e : score) sum += (e = std::exp(e - mx));
        for (auto& e : score) e /= sum;
        double* out = &attn[size_t((t * nh + h) * vd)];
        if (form == MlaForm::decompressed) {
          for (int64_t d = 0; d < vd; ++d) {
            double acc = 0;
            for (int64_t j = 0; j < visible; ++j) acc += score[size_t(j)] * v[size_t(j * vd + d)];
            out[d] = acc;
          }
        } else {  // attend in latent space, then apply W_UV
          std::vector<double> o_lat(static_cast<size_t>(r), 0);
          for (int64_t j = 0; j < visible; ++j)
            for (int64_t i = 0; i < r; ++i) o_lat[size_t(i)] += score[size_t(j)] * c[size_t(j)][size_t(i)];
          for (int64_t d = 0; d < vd; ++d) {
            double acc = 0;
            for (int64_t i = 0; i < r; ++i) acc += w_uv(h, d, i) * o_lat[size_t(i)];
            out[d] = acc;
          }
        }
      }
    }
  }
  if (mass_recall) *mass_recall = std::accumulate(inside.begin(), inside.end(), 0.0) / double(inside.size());
  std::vector<double> y(static_cast<size_t>(T * hid));
  for (int64_t t = 0; t < T; ++t)
    if (wanted[size_t(t % S)]) matvec(p.o_proj.data(), hid, nh * vd, &attn[size_t(t * nh * vd)], &y[size_t(t * hid)]);
  return y;
}

std::vector<double> mlp(const ModelConfig& m, const MlpParams& p, const std::vector<double>& x, int64_t tokens) {
  const int64_t H = m.hidden_size, I = p.intermediate;
  std::vector<double> y(static_cast<size_t>(tokens * H));
  // Tokens in parallel when there are several (each token's products serial); one token: the products in parallel.
#pragma omp parallel for schedule(dynamic) if (tokens > 1)
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> g(static_cast<size_t>(I)), u(static_cast<size_t>(I));
    matvec(p.gate_proj.data(), I, H, &x[size_t(t * H)], g.data());
    matvec(p.up_proj.data(), I, H, &x[size_t(t * H)], u.data());
    for (int64_t i = 0; i < I; ++i) g[size_t(i)] = silu(g[size_t(i)]) * u[size_t(i)];
    matvec(p.down_proj.data(), H, I, g.data(), &y[size_t(t * H)]);
  }
  return y;
}

Routing route(const ModelConfig& m, const std::vector<double>& logits, const std::vector<float>& bias, int64_t tokens,
              const std::vector<int>* forced, MoeParams::RoutingCheck* check) {
  const int64_t E = m.n_routed_experts, k = m.num_experts_per_tok;
  Routing out;
  out.tokens = tokens;
  out.topk = k;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> score(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    if (m.scoring_func == "softmax") {
      const double mx = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (auto& s : score) sum += (s = std::exp(s - mx));
      for (auto& s : score) s /= sum;
    } else {
      for (auto& s : score) s = 1.0 / (1.0 + std::exp(-s));
    }
    std::vector<int> chosen;
    std::vector<double> group_score;  // (group-limited routing: each group's rank score, biased)
    if (m.topk_method == "greedy") {
      chosen = topk_indices(score, k);
    } else {
      // Restrict the choice to the topk_group best groups of n_routed_experts / n_group experts.
      const bool noaux = m.topk_method == "noaux_tc";
      std::vector<double> choice = score;
      if (noaux)
        for (int64_t e = 0; e < E; ++e) choice[size_t(e)] += bias[size_t(e)];
      const int64_t per_group = E / m.n_group;
      group_score.assign(static_cast<size_t>(m.n_group), 0.0);
      for (int64_t g = 0; g < m.n_group; ++g) {
        std::vector<double> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
        std::sort(members.rbegin(), members.rend());
        // noaux_tc ranks a group by its two best biased scores; group_limited_greedy by its best score.
        group_score[size_t(g)] = noaux ? members[0] + (per_group > 1 ? members[1] : 0.0) : members[0];
      }
      std::vector<bool> allowed(static_cast<size_t>(E), false);
      for (int g : topk_indices(group_score, m.topk_group))
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) allowed[size_t(e)] = true;
      const double masked = noaux ? -std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t e = 0; e < E; ++e)
        if (!allowed[size_t(e)]) choice[size_t(e)] = masked;
      chosen = topk_indices(choice, k);
    }
    if (forced) {
      const std::vector<int> theirs(forced->begin() + t * k, forced->begin() + (t + 1) * k);
      std::vector<int> a = chosen, b = theirs;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b && check) {
        // How near a tie the choice that differs was: the selection score (biased) of our k-th choice against their
        // worst. Where their experts lie in a group we did not pick, the decision that differed was the group's:
        // then the gap of the groups' rank scores (our worst group's against their worst), and the experts' gap
        // within their groups (the k best there against theirs) - a group flipped by a near-tie brings experts whose
        // own scores may lie well below ours.
        std::vector<double> sel = score;
        if (m.topk_method == "noaux_tc")
          for (int64_t e = 0; e < E; ++e) sel[size_t(e)] += bias[size_t(e)];
        auto relative = [](double ours, double worst) { return (ours - worst) / std::max(std::abs(ours), 1e-30); };
        double worst = 1e300;
        for (int e : theirs) worst = std::min(worst, sel[size_t(e)]);
        double gap = 0;
        std::vector<bool> their_group(group_score.size(), false), our_group(group_score.size(), false);
        const int64_t per_group = group_score.empty() ? E : E / m.n_group;
        bool group_differs = false;
        if (!group_score.empty()) {
          for (int e : theirs) their_group[size_t(e / per_group)] = true;
          for (int e : chosen) our_group[size_t(e / per_group)] = true;
          for (size_t g = 0; g < group_score.size(); ++g)
            group_differs = group_differs || (their_group[g] && !our_group[g]);
        }
        if (group_differs) {
          double ours_g = 1e300, worst_g = 1e300;
          for (int g : topk_indices(group_score, m.topk_group)) ours_g = std::min(ours_g, group_score[size_t(g)]);
          for (size_t g = 0; g < group_score.size(); ++g)
            if (their_group[g]) worst_g = std::min(worst_g, group_score[g]);
          std::vector<double> within(static_cast<size_t>(E), -1e300);
          for (int64_t e = 0; e < E; ++e)
            if (their_group[size_t(e / per_group)]) within[size_t(e)] = sel[size_t(e)];
          double best_within = 1e300;
          for (int e : topk_indices(within, k)) best_within = std::min(best_within, within[size_t(e)]);
          gap = std::max(relative(ours_g, worst_g), relative(best_within, worst));
        } else {
          double ours = 1e300;
          for (int e : chosen) ours = std::min(ours, sel[size_t(e)]);
          gap = relative(ours, worst);
        }
        ++check->tokens_differing;
        check->max_gap = std::max(check->max_gap, gap);
      }
      chosen = theirs;
    }
    std::vector<double> w;
    for (int e : chosen) w.push_back(score[size_t(e)]);  // weights from the unbiased scores
    if (k > 1 && m.norm_topk_prob) {
      const double denom = std::accumulate(w.begin(), w.end(), 0.0) + 1e-20;
      for (auto& v : w) v /= denom;
    }
    for (auto& v : w) v *= m.routed_scaling_factor;
    out.expert.insert(out.expert.end(), chosen.begin(), chosen.end());
    out.weight.insert(out.weight.end(), w.begin(), w.end());
  }
  return out;
}

namespace {

// moe() with `forced` ([tokens][topk], or null) in place of p.forced_experts.
std::vector<double> moe_forced(const ModelConfig& m, const MoeParams& p, const std::vector<double>& x, int64_t tokens,
                               const std::vector<int>* forced) {
  const int64_t H = m.hidden_size, E = m.n_routed_experts;
  std::vector<double> logits(static_cast<size_t>(tokens * E));
  for (int64_t t = 0; t < tokens; ++t) matvec(p.gate.data(), E, H, &x[size_t(t * H)], &logits[size_t(t * E)]);
  const Routing routing = route(m, logits, p.e_score_correction_bias, tokens, forced, p.check);
  std::vector<double> y =
      m.n_shared_experts > 0 ? mlp(m, p.shared, x, tokens) : std::vector<double>(size_t(tokens * H), 0);
  // Lazily built experts (p.experts empty): the ones the routing reached, made in parallel before they are used.
  std::map<int, MlpParams> made;
  if (p.experts.empty()) {
    std::vector<int> reached(routing.expert.begin(), routing.expert.end());
    std::sort(reached.begin(), reached.end());
    reached.erase(std::unique(reached.begin(), reached.end()), reached.end());
    std::vector<MlpParams> built(reached.size());
#pragma omp parallel for schedule(dynamic) if (reached.size() > 1)
    for (size_t i = 0; i < reached.size(); ++i) built[i] = p.make_expert(reached[i]);
    for (size_t i = 0; i < reached.size(); ++i) made.emplace(reached[i], std::move(built[i]));
  }
#pragma omp parallel for schedule(dynamic) if (tokens > 1)
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<double> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    for (int64_t k = 0; k < routing.topk; ++k) {
      const auto e = size_t(routing.expert[size_t(t * routing.topk + k)]);
      const auto ye = mlp(m, p.experts.empty() ? made.at(int(e)) : p.experts[e], xt, 1);
      for (int64_t i = 0; i < H; ++i)
        y[size_t(t * H + i)] += routing.weight[size_t(t * routing.topk + k)] * ye[size_t(i)];
    }
  }
  return y;
}

}  // namespace

std::vector<double> moe(const ModelConfig& m, const MoeParams& p, const std::vector<double>& x, int64_t tokens) {
  return moe_forced(m, p, x, tokens, p.forced_experts.empty() ? nullptr : &p.forced_experts);
}

std::vector<double> decoder_layer(const ModelConfig& m, int64_t layer_index, const LayerParams& p, const MlaInputs& in,
                                  MlaForm form) {
  return decoder_layer(m, layer_index, p, to_double(in.hidden_states), in, form);
}

std::vector<double> decoder_layer(const ModelConfig& m, int64_t layer_index, const LayerParams& p,
                                  const std::vector<double>& x, const MlaInputs& in, MlaForm form) {
  const int64_t H = m.hidden_size, T = in.batch * in.q_len;
  std::vector<double> normed(x.size());
  for (int64_t t = 0; t < T; ++t)
    rms_norm(&x[size_t(t * H)], p.input_layernorm.data(), H, m.rms_norm_eps, &normed[size_t(t * H)]);
  MlaInputs attn_in = in;  // the attention module sees the normalised stream (rounded to bf16, as a bf16 model would)
  if (in.bf16_stream) {
    attn_in.hidden_states.resize(normed.size());
    for (size_t i = 0; i < normed.size(); ++i) attn_in.hidden_states[i] = to_bf16(float(normed[i]));
  } else {
    attn_in.hidden_exact = normed;
  }
  const auto a = mla_attention(m, p.attn, attn_in, form);
  std::vector<double> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = x[i] + a[i];
  // The MLP / MoE sees it rounded to bf16 too (the router's top-k is then decided on the values a bf16 model has).
  for (int64_t t = 0; t < T; ++t)
    rms_norm(&h[size_t(t * H)], p.post_attention_layernorm.data(), H, m.rms_norm_eps, &normed[size_t(t * H)]);
  if (in.bf16_stream)
    for (auto& v : normed) v = double(round_to_bf16(float(v)));
  // The MLP / MoE of the wanted rows (all, or MlaInputs::rows), each with its forced experts; the others' rows 0.
  const bool dense = !m.is_moe_layer(layer_index);
  const std::vector<char> wanted = wanted_rows(in);
  const int64_t K = m.num_experts_per_tok;
  std::vector<int64_t> tokens;
  for (int64_t t = 0; t < T; ++t)
    if (wanted[size_t(t % in.q_len)]) tokens.push_back(t);
  const int64_t n = int64_t(tokens.size());
  std::vector<double> rows(static_cast<size_t>(n * H));
  std::vector<int> forced;
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(&normed[size_t(tokens[size_t(i)] * H)], H, &rows[size_t(i * H)]);
    if (!dense && !p.moe.forced_experts.empty())
      forced.insert(forced.end(), p.moe.forced_experts.begin() + tokens[size_t(i)] * K,
                    p.moe.forced_experts.begin() + (tokens[size_t(i)] + 1) * K);
  }
  const auto f = dense ? mlp(m, p.dense, rows, n) : moe_forced(m, p.moe, rows, n, forced.empty() ? nullptr : &forced);
  std::vector<double> out(h.size(), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < H; ++j)
      out[size_t(tokens[size_t(i)] * H + j)] = h[size_t(tokens[size_t(i)] * H + j)] + f[size_t(i * H + j)];
  return out;
}

double relative_l2_error(const float* out, const double* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(out[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (!std::isfinite(num)) return std::numeric_limits<double>::infinity();  // NaN never passes
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace dslab::ref
