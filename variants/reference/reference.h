// The reference DeepSeek decoder layer: CPU, double precision, written to be read, not to be fast.
// Every variant is verified against these functions on the same (bf16-representable) weights and inputs.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "variants/common/bf16.h"
#include "variants/common/model_config.h"

namespace dslab::ref {

// ---- parameters (HF tensor names; row-major [out_features][in_features] as nn.Linear stores them) ----

struct MlaParams {
  int64_t heads = 0;                     // num_attention_heads, or fewer per GPU under tensor parallelism
  std::vector<bf16> q_a_proj;            // [q_lora_rank][hidden]          (q_lora_rank models)
  std::vector<bf16> q_a_layernorm;       // [q_lora_rank]
  std::vector<bf16> q_b_proj;            // [heads*q_head_dim][q_lora_rank]
  std::vector<bf16> q_proj;              // [heads*q_head_dim][hidden]     (q_lora_rank == null)
  std::vector<bf16> kv_a_proj_with_mqa;  // [kv_lora_rank + qk_rope_head_dim][hidden]
  std::vector<bf16> kv_a_layernorm;      // [kv_lora_rank]
  std::vector<bf16>
      kv_b_proj;  // [heads*(qk_nope_head_dim + v_head_dim)][kv_lora_rank]; per head: W_UK rows, then W_UV rows
  std::vector<bf16> o_proj;  // [hidden][heads*v_head_dim]
};

struct MlpParams {  // SwiGLU: down(silu(gate(x)) * up(x))
  int64_t intermediate = 0;
  std::vector<bf16> gate_proj, up_proj;  // [intermediate][hidden]
  std::vector<bf16> down_proj;           // [hidden][intermediate]
};

struct MoeParams {
  std::vector<bf16> gate;                      // router weight [n_routed_experts][hidden]
  std::vector<float> e_score_correction_bias;  // [n_routed_experts], noaux_tc only
  std::vector<MlpParams> experts;              // n_routed_experts, or empty: then make_expert builds each as needed
  std::function<MlpParams(int)> make_expert;  // (a V3 layer's experts are 22.5 GB: the reference makes the few it uses)
  // Another implementation's choice of experts ([tokens][topk]) to follow, weights from this router's scores: a
  // stack of layers checks the arithmetic, not which side of a near-tie a float landed on. Where the choices
  // differ, `check` records how far apart the swapped experts' selection scores were (a tie or a bug).
  std::vector<int> forced_experts;
  struct RoutingCheck {
    int tokens_differing = 0;
    double max_gap = 0;  // largest (own k-th best - worst forced) selection score, relative to the former
  };
  RoutingCheck* check = nullptr;
  MlpParams shared;  // intermediate = moe_intermediate_size * n_shared_experts (absent if 0)
};

// Deterministic random weights: the same (model, seed) gives the same tensors on every backend.
MlaParams make_mla_params(const ModelConfig& m, int64_t heads, uint64_t seed);
MlpParams make_mlp_params(const ModelConfig& m, int64_t intermediate, uint64_t seed, const std::string& prefix);
MoeParams make_moe_params(const ModelConfig& m, uint64_t seed);
// The router, bias and shared experts, with the routed experts made on demand (MoeParams::make_expert).
MoeParams make_moe_params_lazy(const ModelConfig& m, uint64_t seed);
std::vector<bf16> random_bf16(uint64_t seed, const std::string& name, size_t n, float scale, float offset = 0);

// ---- pieces ----

void rms_norm(const double* x, const bf16* weight, int64_t n, double eps, double* y);
// y[r] = sum_c W[r][c] x[c]
void matvec(const bf16* w, int64_t rows, int64_t cols, const double* x, double* y);

// YaRN-corrected inverse frequencies (qk_rope_head_dim / 2 of them) and the cos/sin magnitude (_mscale).
std::vector<double> rope_inv_freq(const ModelConfig& m);
double rope_mscale(const ModelConfig& m);
// DeepSeek's RoPE, in place on qk_rope_head_dim values at `position`: pairs (x[2i], x[2i+1]) rotate by
// position*inv_freq[i]; the result is stored de-interleaved (x'[i], x'[i + d/2]), as HF's apply_rotary_pos_emb does.
void apply_rope(const ModelConfig& m, int64_t position, double* x);

// ---- attention ----

// One step of MLA for `batch` requests, each with `kv_len` cached tokens and `q_len` new ones (causal
// among the new ones; new token s sits at position kv_len + s).
struct MlaInputs {
  int64_t batch = 0, q_len = 0, kv_len = 0;
  std::vector<bf16> hidden_states;  // [batch*q_len][hidden]: the attention module's input (after input_layernorm)
  std::vector<bf16> ckv_cache;      // [batch][kv_len][kv_lora_rank]: normalised latent of cached tokens
  std::vector<bf16> kpe_cache;      // [batch][kv_len][qk_rope_head_dim]: rotated rope key of cached tokens
  // The new tokens (0 .. q_len - 1 of each request, ascending) whose outputs are computed; empty: all. The others'
  // rows of the output are left 0: every new token's key is still made (later tokens attend to it), but queries,
  // attention, o_proj and the layer's MLP / MoE only for these - a long prefill chunk checked on a sample of rows.
  std::vector<int64_t> rows;
  // Exact arithmetic, for the cross-check against an fp32 model (transformers): the attention's input and the cache
  // in double, not rounded to bf16 as a bf16 engine holds them. Set, these stand in for hidden_states / the caches.
  std::vector<double> hidden_exact, ckv_exact, kpe_exact;
  bool bf16_stream = true;  // decoder_layer: the normalised stream rounded to bf16 before attention and MLP/MoE
};
MlaInputs make_mla_inputs(const ModelConfig& m, int64_t batch, int64_t q_len, int64_t kv_len, uint64_t seed);

// The four cache/compute forms are one function; these three orders of arithmetic are the distinct ones:
// decompressed (cd, cc): K/V from kv_b_proj per cached token; absorbed_concat (a_cc): W_UK folded into q,
// dot with [c_kv ‖ k_pe]; absorbed_split (a_cc_me): q_pe·k_pe + q_abs·c_kv as two sums.
enum class MlaForm { decompressed, absorbed_concat, absorbed_split };

// Output [batch*q_len][hidden] (after o_proj). keys (sparse attention: the selection a retrieval method made), when
// given: per request, the key indices (0 .. kv_len + q_len - 1, the new tokens last) that request attends to; the
// others are masked out of every new token's softmax (causality still applies). mass_recall, when given with keys: the
// mean over requests, new tokens and heads of dense attention's softmax mass inside the selection.
std::vector<double> mla_attention(const ModelConfig& m, const MlaParams& p, const MlaInputs& in, MlaForm form,
                                  const std::vector<std::vector<int64_t>>* keys = nullptr,
                                  double* mass_recall = nullptr);

// ---- feed-forward ----

std::vector<double> mlp(const ModelConfig& m, const MlpParams& p, const std::vector<double>& x, int64_t tokens);

struct Routing {
  int64_t tokens = 0, topk = 0;
  std::vector<int> expert;     // [tokens][topk]
  std::vector<double> weight;  // [tokens][topk], normalised and scaled as the model says
};
// logits: [tokens][n_routed_experts] from the router gate.
Routing route(const ModelConfig& m, const std::vector<double>& logits, const std::vector<float>& bias, int64_t tokens,
              const std::vector<int>* forced = nullptr, MoeParams::RoutingCheck* check = nullptr);
std::vector<double> moe(const ModelConfig& m, const MoeParams& p, const std::vector<double>& x, int64_t tokens);

// ---- the whole layer ----

struct LayerParams {
  std::vector<bf16> input_layernorm, post_attention_layernorm;  // [hidden]
  MlaParams attn;
  MlpParams dense;  // a layer without routed experts (ModelConfig::is_moe_layer)
  MoeParams moe;    // otherwise
};
// lazy_experts: routed experts made on demand (MoeParams::make_expert) instead of all up front.
LayerParams make_layer_params(const ModelConfig& m, int64_t layer_index, uint64_t seed, bool lazy_experts = false);
// in.hidden_states: [batch*q_len][hidden] residual stream in; returns the residual stream out (with in.rows: those
// new tokens' rows, the others 0).
std::vector<double> decoder_layer(const ModelConfig& m, int64_t layer_index, const LayerParams& p, const MlaInputs& in,
                                  MlaForm form);
// The same with the residual stream in double (in.hidden_states unused), as a stack of layers carries it.
std::vector<double> decoder_layer(const ModelConfig& m, int64_t layer_index, const LayerParams& p,
                                  const std::vector<double>& x, const MlaInputs& in, MlaForm form);

double relative_l2_error(const float* out, const double* ref, size_t n);

}  // namespace dslab::ref
