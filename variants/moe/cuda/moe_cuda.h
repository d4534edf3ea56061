// The MoE family on the GPU: one DeepSeek MoE layer whole (router, routed experts, shared experts) as an op
// that runs on buffers it is given, so the family variants (moe/<algo>/cuda) and the layers run the same code.
// The router and the permutation by expert run on the GPU and leave everything on the device: an op that
// needs no host look at the routing (grouped) can be captured in a CUDA graph. Compiled by nvcc only.
#pragma once
#include <cuda_bf16.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/gpu.h"
#include "harness/variant.h"
#include "variants/common/model_config.h"
#include "variants/common/cuda/blas.h"
#include "variants/common/cuda/device_array.h"
#include "variants/moe/moe.h"
#include "variants/common/checkpoint.h"

namespace dslab::moe::cuda {

using gpu::BlasHandle;
using gpu::DeviceArray;

// A SwiGLU MLP on the device (a dense layer's MLP, or the shared experts): gate and up stacked in one
// [2 * intermediate][hidden] matrix, so both come from one GEMM.
struct MlpWeights {
  int64_t intermediate = 0;
  DeviceArray<__nv_bfloat16> gate_up, down;  // [2I][H], [H][I]
};
// The reference's tensors (ref::make_mlp_params(m, intermediate, seed, prefix)), generated on the device.
void generate_mlp_weights(const ModelConfig& m, int64_t intermediate, uint64_t seed, const std::string& prefix,
                          MlpWeights* w);

// Runs a SwiGLU MLP: out = down(silu(gate x) * up x), with its scratch; out fp32, written (beta 0) or added (beta 1).
class MlpRunner {
 public:
  // arena: where gate|up and the product come from (the caller rewinds it), or null for buffers of its own.
  void prepare(const ModelConfig& m, const MlpWeights& w, int64_t tokens, gpu::ScratchArena* arena = nullptr);
  void forward(BlasHandle& blas, const __nv_bfloat16* x, float* out, float beta, cudaStream_t stream) const;
  static double scratch_bytes(int64_t tokens, int64_t intermediate) {
    return moe::gpu_mlp_scratch_bytes(tokens, intermediate);
  }

 private:
  const MlpWeights* w_ = nullptr;
  int64_t hidden_ = 0, tokens_ = 0;
  DeviceArray<float> gate_up_;    // [tokens][2I]
  DeviceArray<__nv_bfloat16> h_;  // [tokens][I]
};

// One MoE layer's weights on the device: the router, `experts` routed experts (the first of the model's,
// each [I][H] gate, [I][H] up, [H][I] down, experts stacked), the shared experts.
struct MoeWeights {
  int64_t experts = 0;
  uint64_t seed = 0;                // the reference's seed of these tensors (an op may make its own copies elsewhere)
  bool routed_on_device = true;     // false: w_gate, w_up, w_down are empty (an op that keeps the experts on the host)
  DeviceArray<__nv_bfloat16> gate;  // router [n_routed_experts][hidden]
  DeviceArray<float> bias;          // e_score_correction_bias (noaux_tc)
  DeviceArray<__nv_bfloat16> w_gate, w_up, w_down;
  MlpWeights shared;  // intermediate 0 when the model has none
  // Streamed experts (layer/deepseek/cuda's gpu_experts=streamed): w_gate/w_up/w_down stay empty and the routed
  // experts are read from a staging buffer the layer copies this layer's experts into before each step's use
  // (the same stacking). The ops read the experts through these.
  const __nv_bfloat16 *staged_gate = nullptr, *staged_up = nullptr, *staged_down = nullptr;
  // Routed experts left on the host (!routed_on_device) by a checkpoint's load: where an op that runs them there reads
  // them (the checkpoint outlives the op); null: the seed's.
  const Checkpoint* checkpoint = nullptr;
  int64_t checkpoint_layer = -1;
  const __nv_bfloat16* gate_experts() const { return staged_gate ? staged_gate : w_gate.get(); }
  const __nv_bfloat16* up_experts() const { return staged_up ? staged_up : w_up.get(); }
  const __nv_bfloat16* down_experts() const { return staged_down ? staged_down : w_down.get(); }
};
// Routed expert e of ref::make_moe_params (its gate [I][H], up [I][H], down [H][I]), generated on the device.
void generate_expert_weights(const ModelConfig& m, uint64_t seed, int64_t e, __nv_bfloat16* gate, __nv_bfloat16* up,
                             __nv_bfloat16* down);
// ref::make_moe_params's tensors, generated on the device (experts beyond `experts` are not made; none of the
// routed experts when !routed_on_device).
void generate_moe_weights(const ModelConfig& m, int64_t experts, uint64_t seed, MoeWeights* w,
                          bool routed_on_device = true);
// Decoder layer `layer`'s MoE weights from a checkpoint (router, its bias under noaux_tc, every routed expert - or,
// !routed_on_device, a reference to them for an op that reads them into host memory itself -, the shared experts), and
// a dense MLP's (prefix: "model.layers.0.mlp."). BadInput naming file and tensor.
void load_moe_weights(const Checkpoint& c, int64_t layer, MoeWeights* w, bool routed_on_device = true);
void load_mlp_weights(const Checkpoint& c, const std::string& prefix, int64_t intermediate, MlpWeights* w);
// Device bytes of those weights.
double moe_weight_bytes(const ModelConfig& m, int64_t experts);

struct MoeBuffers {
  const __nv_bfloat16* x = nullptr;  // [tokens][hidden]: the MoE's input (after post_attention_layernorm)
  float* out = nullptr;              // [tokens][hidden]
  // Given routing ([tokens][topk] expert ids and weights) instead of the router: synthetic routings
  // (uniform, zipf) of the family variants. Null: the router decides from the gate.
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;
  // The residual stream's next step, fused into the combine (a layer's fused_norms axis; one kernel less a layer):
  // resid += the MoE's output, then, with norm_weight, norm_out = bf16(RMSNorm(resid) * norm_weight). out still
  // holds the shared experts' output (the combine reads it) but not the sum. Null resid: out is written as above.
  float* resid = nullptr;                      // [tokens][hidden]
  const __nv_bfloat16* norm_weight = nullptr;  // [hidden]
  float norm_eps = 0;
  __nv_bfloat16* norm_out = nullptr;  // [tokens][hidden]
};

// Rows of the permuted tokens (one per (token, k)) are grouped by expert; GEMMs take them in tiles of
// tile_rows() rows, each tile within one expert (FlashInfer's / SGLang's fused-MoE layout).
class MoeOp {
 public:
  virtual ~MoeOp() = default;
  // Whether forward() runs without a host look at the routing (so it can be captured in a CUDA graph).
  virtual bool graph_safe() const = 0;
  // Whether the routed experts run from host memory (their weights need not be on the device: see MoeWeights).
  virtual bool experts_on_host() const { return false; }
  // Why this op cannot run on this machine ("" if it can).
  virtual std::string unavailable() const { return ""; }
  int tile_rows() const { return tile_rows_; }
  int tile_width() const { return tile_width_; }  // B rows a CTA of the 16-row tiles (choose_tile_rows)
  // Whether the router reads the gate, routes and permutes in one kernel (choose_router).
  bool one_kernel_router() const { return one_kernel_router_; }
  // The router's kernels (the MoE family's router axis), set before prepare(): measured (auto), or one of the two.
  enum class RouterKernels { automatic, one_kernel, separate };
  void set_router_kernels(RouterKernels k) { router_kernels_ = k; }
  // The grouped GEMMs' tile (the MoE family's moe_tile axis), set before prepare(): rows 0 is auto (measured); width
  // counts at 16 rows only. Only ops whose tile is measured take one (has_tiles).
  void set_tile(int rows, int width) { forced_tile_rows_ = rows, forced_tile_width_ = width; }
  bool has_tiles() const { return tile_kernels() != nullptr; }
  // Threads of an op whose routed experts run on the CPU (0: every core but one, which drives the GPU); set before
  // prepare(). Other ops ignore it (the variants reject a value for them).
  void set_cpu_threads(int threads) { cpu_threads_ = threads; }
  // An op whose routed experts run on the CPU may keep this many of each layer's experts on the GPU (the most routed
  // ones: see profiled_counts), run there beside the CPU's share; set before prepare(). Others ignore it (the layer
  // rejects it for them).
  void set_hot_experts(int64_t n) { hot_experts_ = n; }
  // What the op measured of its own work in the steps it ran since prepare() (e.g. the CPU experts' own wall time
  // per call, beside the stream's view of them), as counters; empty for an op that measures nothing itself.
  virtual std::map<std::string, double> own_counters() const { return {}; }
  // Host memory of the op's routed experts (those on the CPU), which a cold sample must find in DRAM; empty for an op
  // whose experts are all on the GPU.
  virtual std::vector<std::pair<const void*, size_t>> host_weights() const { return {}; }
  // side_blas (a handle of its own: cuBLAS workspaces must not be shared by concurrent GEMMs): the shared experts
  // run on a second stream beside the router and routed experts, joined before the combine. Several ops that run
  // one after another may share one side handle.
  // arena: where the forward scratch comes from (moe::gpu_moe_forward_scratch_bytes of it; the caller rewinds it
  // first), or null for buffers of the op's own.
  void prepare(const ModelConfig& m, int64_t tokens, const MoeWeights& w, const MoeBuffers& b, BlasHandle& blas,
               BlasHandle* side_blas = nullptr, gpu::ScratchArena* arena = nullptr);
  // Queues one step; marks, when given, time the router, experts and combine.
  void forward(cudaStream_t stream, gpu::OpMarks* marks = nullptr);
  static double scratch_bytes(const ModelConfig& m, int64_t tokens, int64_t experts);
  // After a step: the routing it made, for verification and for counters (host copies; synchronises).
  void routing(std::vector<int32_t>* ids, std::vector<float>* weights) const;

 protected:
  virtual void prepare_experts() {}
  // The name of the expert kernels in the tile tuner's cache key, for an op whose row tile is measured on the GPU
  // (choose_tile_rows); null: tile_rows_for's rule, unmeasured (experts on the CPU, the loop over cuBLAS).
  virtual const char* tile_kernels() const { return nullptr; }
  // The routed experts over the permuted rows (perm_token_, grouped by expert at offsets_, in tiles_): writes
  // y_ [rows][hidden] fp32, or y16_ in bf16 where bf16_rows(), each row its expert's output (the routing weight is
  // applied by the combine).
  virtual void experts() = 0;
  // Whether experts() writes its rows in bf16 (y16_): half the bytes the down GEMM writes and the combine reads
  // again (at V3 prefill, 8192 tokens, fp32 rows were 1.9 GB each way, as serving engines' MoE GEMMs write bf16).
  virtual bool bf16_rows() const { return false; }
  // The combine: out[t] (+)= sum over k of weight[t][k] * y_[slot[t][k]] + experts_sum_[t], with slot_ or
  // combine_slot_ (a row < 0 is left out), and experts_sum_ ([tokens][hidden]) when set: what an op's experts()
  // summed per token itself (the CPU's share). combined_by_experts_: every choice is in experts_sum_ (no rows).
  bool combined_by_experts_ = false;
  const int32_t* combine_slot_ = nullptr;
  const float* experts_sum_ = nullptr;
  // Routes `tokens` random hidden states of unit RMS (seeded) through this layer's router; each expert's count. (The
  // offline profile a serving engine takes on real traffic to pick its hot experts; random weights route about
  // uniformly, so here it mostly fixes which experts, not how many of the choices they get.)
  std::vector<int64_t> profiled_counts(int64_t tokens, uint64_t seed);
  // tile_rows_ (with max_tiles_ and the tile list) and, for 16-row tiles, tile_width_: the tuning cache's measured
  // choice for this GPU and shape, else measured now (every tile on a uniform synthetic routing of the op's own
  // tokens), else the rule (64 B rows a decode tile).
  void choose_tile_rows();
  void set_tile_rows(int rows);
  // one_kernel_router_: whether route() reads the gate in gate_route_scan_kernel (gate, routing and permutation in one
  // launch) rather than a gate kernel or GEMM then the routing kernel: the tuning cache's measured choice for this GPU
  // and shape, else measured now (both on random tokens), else the rule (up to moe::kGateKernelTokens tokens).
  void choose_router();
  bool one_kernel_router_fits() const;
  size_t router_smem_per_token() const;  // route_token's scratch: a warp's 2 E floats
  size_t gate_route_smem() const;        // gate_route_scan_kernel's: the logits and that scratch, every token
  void mark(const char* op) const {
    if (marks_) marks_->mark(op, stream_);
  }

  ModelConfig m_;
  int64_t tokens_ = 0, experts_ = 0, topk_ = 0, hidden_ = 0, inter_ = 0, rows_ = 0;  // rows_ = tokens * topk
  const MoeWeights* w_ = nullptr;
  MoeBuffers b_;
  BlasHandle* blas_ = nullptr;
  gpu::ScratchArena* arena_ = nullptr;  // the forward scratch's source (DeviceArray::scratch), or null
  cudaStream_t stream_ = 0;
  gpu::OpMarks* marks_ = nullptr;
  // Routing and permutation, all on the device.
  DeviceArray<float> logits_;               // [tokens][n_routed_experts]
  DeviceArray<int32_t> topk_ids_;           // [tokens][topk]
  DeviceArray<float> topk_weights_;         // [tokens][topk]
  DeviceArray<int32_t> counts_;             // [experts]: rows routed to each expert
  DeviceArray<unsigned> gate_blocks_done_;  // decode's gate_route_scan_kernel: its blocks finished so far
  DeviceArray<int32_t> offsets_;            // [experts + 1]: first permuted row of each expert
  DeviceArray<int32_t> perm_token_;         // [rows]: the token of each permuted row
  DeviceArray<float> perm_weight_;          // [rows]
  DeviceArray<int32_t> slot_;               // [tokens][topk]: the permuted row of each (token, k)
  DeviceArray<int2> tiles_;                 // (expert, first row) of each row tile
  DeviceArray<int32_t> num_tiles_;
  int tile_rows_ = 16, max_tiles_ = 0;
  int tile_width_ = 64;                                // decode (16-row) tiles: B rows a CTA, measured with tile_rows_
  int forced_tile_rows_ = 0, forced_tile_width_ = 64;  // set_tile()
  bool one_kernel_router_ = false;
  RouterKernels router_kernels_ = RouterKernels::automatic;
  int cpu_threads_ = 0;
  int64_t hot_experts_ = 0;
  DeviceArray<float> y_;            // [rows][hidden] (unless bf16_rows())
  DeviceArray<__nv_bfloat16> y16_;  // [rows][hidden] where bf16_rows()
  MlpRunner shared_;
  struct SideStream {
    explicit SideStream(BlasHandle* side_blas);
    ~SideStream();
    BlasHandle* blas;
    cudaStream_t stream{};
    cudaEvent_t forked{}, joined{};
  };
  std::unique_ptr<SideStream> side_;

 private:
  void route();
};

using MoeOpFactory = std::unique_ptr<MoeOp> (*)();
bool register_moe_op(const char* name, const char* summary, MoeOpFactory make);
std::unique_ptr<MoeOp> make_moe_op(const std::string& name);  // nullptr if unknown
std::vector<std::string> moe_op_names();
#define DSLAB_REGISTER_MOE_OP(Class, name, summary)                             \
  static const bool dslab_moe_op_##Class = ::dslab::moe::cuda::register_moe_op( \
      name, summary, [] { return std::unique_ptr<::dslab::moe::cuda::MoeOp>(new Class()); })

// The family variant moe/<algo>/cuda: one MoE layer (router, routed and shared experts) on `tokens` tokens,
// verified against the fp64 reference (ref::route, ref::mlp) on the experts the tokens reach.
class GpuMoeVariant : public Variant {
 public:
  bool reads_weights() const override { return true; }
  explicit GpuMoeVariant(const std::string& op_name);
  std::vector<std::pair<std::string, std::string>> axes() const override;
  Support supports(const ModelFile& model, const Point& point) const override;
  Cost cost(const ModelFile& model, const Point& point) const override;
  double host_memory_bytes(const ModelFile& model, const Point& point) const override;
  double device_memory_bytes(const ModelFile& model, const Point& point) const override;
  // moe/host/cuda: its routed experts (nearly all of its work and bytes) are the CPU's, measured against the CPU's.
  std::string compute_ceiling() const override;
  std::string bandwidth_ceiling() const override;
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override;
  void run() override;
  Verification verify() override;
  std::map<std::string, double> counters() override;
  // moe/host/cuda's experts in host memory: alone, one layer's reached experts (at one token, 104 MB of V2-Lite's)
  // would sit in a large LLC from sample to sample (the op read 1.7x the DRAM probe on the lent Xeon's 300 MB L3).
  std::vector<std::pair<const void*, size_t>> cold_buffers() const override {
    return op_ ? op_->host_weights() : decltype(op_->host_weights()){};
  }

 private:
  std::unique_ptr<MoeOp> op_;
  ModelConfig m_;
  Shape s_;
  uint64_t seed_ = 0;
  double active_experts_ = 0;  // reached by the prepared point's routing
  std::string prepared_;       // which point (label@model) that was
  std::shared_ptr<const MoeWeights> weights_;
  std::unique_ptr<Checkpoint> checkpoint_;  // --weights: the weights' source (the reference reads it too)
  std::unique_ptr<BlasHandle> blas_, side_blas_;
  std::vector<bf16> x_host_;
  DeviceArray<__nv_bfloat16> x_;
  DeviceArray<int32_t> given_ids_;
  DeviceArray<float> given_weights_, out_;
};

// The grouped GEMMs of moe/grouped/cuda over row tiles (each within one expert; at most max_tiles, the count on the
// device): for permuted row p of expert e, h[p] = silu(x[perm_token[p]] gate_e^T) * (x[perm_token[p]] up_e^T) (bf16),
// then y[p] = h[p] down_e^T (fp32). Experts' weights stacked [slab][N][K]; weight_slot maps an expert to its slab
// (null: the expert's own index), so a subset of the experts (moe/host/cuda's hot experts) can be stacked alone.
struct GroupedExperts {
  const int2* tiles;
  const int32_t* num_tiles;
  const int32_t* offsets;     // [experts + 1]
  const int32_t* perm_token;  // [rows]
  int max_tiles, tile_rows;
  const __nv_bfloat16* x;  // [tokens][hidden]
  const __nv_bfloat16 *gate, *up, *down;
  const int32_t* weight_slot;
  int64_t hidden, inter;
  __nv_bfloat16* h;              // [rows][inter]
  float* y;                      // [rows][hidden]
  bool wgmma = false;            // 128-row tiles on the warpgroup-MMA kernel (moe/grouped_wgmma/cuda)
  __nv_bfloat16* y16 = nullptr;  // down's rows in bf16 instead of y (MoeOp::bf16_rows)
  // grouped_down runs right after grouped_gate_up on the stream, and the tile list before that: down's first weight
  // stages are copied before it waits for gate+up (grouped_gemm_kernel)
  bool down_after_gate_up = false;
  int tile_width = 64;  // 16-row tiles: B rows a CTA (32 | 64 | 128; gate+up: half of them outputs)
};
void grouped_gate_up(const GroupedExperts& e, cudaStream_t stream);
void grouped_down(const GroupedExperts& e, cudaStream_t stream);

// Analytic cost of one MoE layer on `tokens` tokens: router, routed experts (`active` experts' weights read),
// shared experts.
Cost moe_layer_cost(const ModelConfig& m, int64_t tokens, double active_experts);
using moe::expected_active_experts;

// Rows of the grouped experts' GEMV form (moe/grouped/cuda's decode candidate): a warp streams a weight row for them.
constexpr int kGemvTileRows = 4;
// The moe_tile axis: "auto" -> {0, 64} (measured), "16x32" | "16x64" | "16x128" -> {16, width}, "gemv" ->
// {kGemvTileRows, 64}, "64" | "128" -> {rows, 64}; BadInput for anything else.
std::pair<int, int> parse_moe_tile(const std::string& text);
// Tiles of rows for the grouped GEMMs at a given mean of rows per expert (decode: a few; prefill: hundreds).
int tile_rows_for(double rows_per_expert);

}  // namespace dslab::moe::cuda
