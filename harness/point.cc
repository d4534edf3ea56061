#include "harness/point.h"

#include <algorithm>
#include <stdexcept>

#include "harness/errors.h"

namespace dslab {

const std::vector<AxisInfo>& known_axes() {
  static const std::vector<AxisInfo> axes = {
      {"batch", AxisKind::positive_int, "requests decoded together"},
      {"q_len", AxisKind::positive_int, "new tokens per request in this step (1: decode, >1: extend/prefill, causal)"},
      {"kv_len", AxisKind::nonneg_int, "tokens already cached per request"},
      {"heads", AxisKind::positive_int, "attention heads on this device (tensor parallelism); 0/absent: the model's"},
      {"page_size", AxisKind::positive_int, "tokens per KV-cache page"},
      {"len_dist", AxisKind::text, "per-request length distribution: uniform | mixed", {"uniform", "mixed"}},
      {"kv_dtype", AxisKind::text, "KV-cache element type: bf16 | int8 | fp8_e4m3", {"bf16", "int8", "fp8_e4m3"}},
      {"tokens", AxisKind::positive_int, "tokens entering the MoE layer (or the linear op: its rows)"},
      {"experts", AxisKind::positive_int, "routed experts instantiated (to fit memory)"},
      {"threads", AxisKind::positive_int, "CPU threads"},
      {"cpu_threads", AxisKind::positive_int,
       "CPU threads of routed experts run on the host (moe/host/cuda); absent: every core but the one driving the GPU"},
      {"gpu_experts", AxisKind::text,
       "where the routed experts live: with moe/host/cuda none | layers:N (the first N MoE layers' experts on the GPU, "
       "run by moe/grouped/cuda) | fit (as many leading MoE layers as gpu_budget holds) | hot:N (each MoE layer's N "
       "most "
       "routed experts on the GPU, the rest on the CPU, both at once); with a GPU moe, none (on the GPU) "
       "| streamed (in pinned host memory, copied to the GPU before each layer's use, two layers' in flight)"},
      {"gpu_budget", AxisKind::text,
       "GPU memory the step may use: all (the device's) | <N>GB (e.g. 24GB, a consumer card)"},
      {"routing", AxisKind::text, "expert routing: model | uniform | zipf:S"},
      {"router",
       AxisKind::text,
       "the GPU MoE router's kernels (routing model): auto (measured per GPU and shape) | one_kernel (gate, top-k and "
       "permutation in one launch: up to 32 tokens) | separate (a gate kernel or GEMM, then routing and permutation)",
       {"auto", "one_kernel", "separate"}},
      {"moe_tile",
       AxisKind::text,
       "the grouped GPU MoE's tile: auto (measured per GPU and shape) | 16x32 | 16x64 | 16x128 (16 rows, 32-128 weight "
       "rows a CTA: decode) | gemv (4 rows, a warp streaming each weight row: decode) | 64 | 128 (rows a tile)",
       {"auto", "16x32", "16x64", "16x128", "gemv", "64", "128"}},
      {"topk", AxisKind::positive_int, "experts per token"},
      {"executor",
       AxisKind::text,
       "GPU step launched kernel by kernel (eager) or replayed as one CUDA graph (graph)",
       {"eager", "graph"}},
      {"layers", AxisKind::text,
       "decoder layers in the step: N consecutive layers with distinct weights, or all (the whole model: "
       "embedding, every layer, final norm, LM head)"},
      {"attn", AxisKind::text, "a layer's attention op: any mla/<form>/cuda variant's name"},
      {"moe", AxisKind::text, "a layer's MoE op: any moe/<algo>/cuda variant's name"},
      {"steps", AxisKind::positive_int, "consecutive decode steps per timed run, lengths growing by q_len each"},
      {"proj",
       AxisKind::text,
       "the projections' backend: own (default: dslab's weight-streaming GEMV at 1-2 rows, measured faster there; from "
       "3 the fastest measured per shape of cuBLASLt's algorithms and dslab's weight-streaming MMA GEMM) | cublas "
       "(cuBLAS's default heuristic)",
       {"own", "cublas"}},
      {"pdl",
       AxisKind::text,
       "programmatic dependent launch between the step's own kernels (Hopper): on | off",
       {"on", "off"}},
      {"fused_norms",
       AxisKind::text,
       "the residual add and next RMSNorm after each MoE layer inside the MoE's combine kernel (one kernel less a "
       "layer): on | off",
       {"on", "off"}},
      {"budget", AxisKind::positive_int, "sparse attention: keys attended per request (sinks and window included)"},
      {"block", AxisKind::positive_int, "sparse attention: keys per block for block selectors (Quest, InfLLM)"},
      {"local", AxisKind::positive_int,
       "sparse attention: the most recent keys every step attends (the local window, within the budget)"},
      {"cache_kind",
       AxisKind::text,
       "sparse attention's synthetic cache: random | clustered | needle",
       {"random", "clustered", "needle"}},
      {"needle_depth", AxisKind::nonneg_int,
       "sparse attention: where the needle sits, percent of the cache from its oldest key"},
      {"needle_norm", AxisKind::positive_int,
       "sparse attention: the needle's length in typical key lengths (1: a haystack key's)"},
      {"weight", AxisKind::text,
       "the linear op's weight: q_proj | q_a_proj | q_b_proj | kv_a_proj_with_mqa | o_proj | shared_gate_up | "
       "shared_down_proj | dense_gate_up | dense_down_proj | gate | lm_head"},
      {"kv_splits", AxisKind::text,
       "the fused MLA kernel's split-KV CTAs per row tile: auto (mla/fused/cuda: the count measured per GPU and shape; "
       "elsewhere about 4 key blocks each, 32 to one per SM) | N"},
      {"split_plan",
       AxisKind::text,
       "how the fused MLA kernel cuts the keys among its CTAs: auto (per_request where every request can have CTAs of "
       "its own, else packed) | packed (one run of key blocks cut equally; a CTA may end one request and begin the "
       "next) | per_request (each request's blocks on CTAs of its own)",
       {"auto", "packed", "per_request"}},
      {"fused_absorbs",
       AxisKind::text,
       "the fused MLA decode's absorbs inside the kernels beside them: on (W_UK in the latent norm's launch at 1-2 "
       "tokens without q_lora_rank, W_UV in the split merge up to 32 tokens a CTA) | off (each absorb its own GEMV "
       "or GEMM)",
       {"on", "off"}},
      {"l2_evict",
       AxisKind::text,
       "the fused MLA kernel's L2 hint for its cache blocks: auto (evict_first in the 64-key kernel where segments are "
       "short) | first (evict_first in every bf16 kernel) | normal (no hint)",
       {"auto", "first", "normal"}},
      {"block_keys", AxisKind::text,
       "the fused MLA kernel's keys a block: auto (the tuned choice, else 32 at up to 32 rows of a bf16 cache, else "
       "64) | 32 | 64 (bf16 at up to 32 rows: the two-warpgroup kernel of 128 heads)"},
  };
  return axes;
}

const AxisInfo* find_axis(const std::string& name) {
  for (const auto& a : known_axes())
    if (a.name == name) return &a;
  return nullptr;
}

namespace {

int64_t parse_int(const std::string& s, const std::string& axis, const std::string& where, bool allow_zero) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty() || v < 0 || (v == 0 && !allow_zero))
    throw bad_field(where, axis, "'" + s + "'", allow_zero ? "a non-negative integer" : "a positive integer");
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return parts;
}

}  // namespace

std::vector<AxisValue> parse_axis_values(const std::string& axis, const std::string& spec, const std::string& where) {
  const AxisInfo* info = find_axis(axis);
  if (!info) {
    std::string names;
    for (const auto& a : known_axes()) names += (names.empty() ? "" : ", ") + a.name;
    throw BadInput(where + ": axis '" + axis + "': unknown axis (expected one of " + names + ")");
  }
  std::vector<AxisValue> values;
  if (info->kind != AxisKind::text && spec.rfind("pow2:", 0) == 0) {
    const auto parts = split(spec.substr(5), ':');
    if (parts.size() != 2) throw bad_field(where, axis, "'" + spec + "'", "pow2:LO:HI (exponents, e.g. pow2:9:14)");
    const int64_t lo = parse_int(parts[0], axis, where, true), hi = parse_int(parts[1], axis, where, true);
    if (lo > hi || hi > 40) throw bad_field(where, axis, "'" + spec + "'", "pow2:LO:HI with LO <= HI <= 40");
    for (int64_t e = lo; e <= hi; ++e) values.push_back({std::to_string(int64_t(1) << e), int64_t(1) << e, true});
    return values;
  }
  for (const auto& item : split(spec, ',')) {
    if (item.empty()) throw bad_field(where, axis, "'" + spec + "'", "a comma-separated list with no empty items");
    if (info->kind == AxisKind::text) {
      if (!info->choices.empty() &&
          std::find(info->choices.begin(), info->choices.end(), item) == info->choices.end()) {
        std::string expected;
        for (const auto& c : info->choices) expected += (expected.empty() ? "one of " : ", ") + c;
        throw bad_field(where, axis, "'" + item + "'", expected);
      }
      values.push_back({item, 0, false});
    } else {
      const int64_t v = parse_int(item, axis, where, info->kind == AxisKind::nonneg_int);
      values.push_back({std::to_string(v), v, true});
    }
  }
  return values;
}

void Point::set(const std::string& axis, AxisValue v) {
  for (auto& e : entries_)
    if (e.first == axis) {
      e.second = std::move(v);
      return;
    }
  entries_.emplace_back(axis, std::move(v));
}

bool Point::has(const std::string& axis) const {
  for (const auto& e : entries_)
    if (e.first == axis) return true;
  return false;
}

const AxisValue& Point::get(const std::string& axis) const {
  for (const auto& e : entries_)
    if (e.first == axis) return e.second;
  throw std::logic_error("point has no axis '" + axis + "'");
}

int64_t Point::integer(const std::string& axis) const { return get(axis).integer; }
const std::string& Point::text(const std::string& axis) const { return get(axis).text; }

std::string Point::label() const {
  std::string s;
  for (const auto& [k, v] : entries_) s += (s.empty() ? "" : "/") + k + ":" + v.text;
  return s;
}

}  // namespace dslab
