// The MoE family: the routed experts of one DeepSeek MoE layer. Input: tokens x hidden with each
// token's top-k experts and weights; output: tokens x hidden, the weighted sum of the experts' SwiGLU
// outputs (shared experts and the gate are the GPU's in KTransformers' split, and not timed here).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "harness/variant.h"
#include "variants/common/model_config.h"
#include "variants/reference/reference.h"

namespace dslab::moe {

struct Shape {
  int64_t tokens = 0, experts = 0, topk = 0, threads = 0;
  std::string routing;  // model | uniform | zipf:S
};
Shape shape_of(const ModelConfig& m, const Point& p);
std::vector<std::pair<std::string, std::string>> axes();

// Routes and weights of one point, generated once and shared by the variants run there.
struct Problem {
  ModelConfig model;
  Shape shape;
  uint64_t seed = 0;
  std::string weights;  // the checkpoint they came from, or empty
  // `experts` of them, HF names experts.{e}.{gate,up,down}_proj; shared across token counts (the
  // largest tensors here: 22.5 GB for all of DeepSeek-V3's).
  std::shared_ptr<const std::vector<ref::MlpParams>> experts;
  std::vector<bf16> x;                 // [tokens][hidden]
  ref::Routing routing;                // [tokens][topk] expert ids and weights
  std::vector<std::vector<int>> rows;  // per expert: the tokens routed to it, in token order
  // fp64 reference of up to kVerifiedTokens tokens spread over the batch (the reference costs
  // tokens*topk*3*hidden*intermediate MACs in fp64): which tokens, and their outputs.
  static constexpr int64_t kVerifiedTokens = 48;
  std::vector<int64_t> verified_tokens;
  const std::vector<double>& reference() const;  // [verified_tokens][hidden]

 private:
  mutable std::vector<double> reference_;
};
// weights: a Hugging Face checkpoint folder (dslab run --weights): the experts, router and bias of its first MoE layer
// (the hidden states stay made from the seed); empty: all made from the seed.
std::shared_ptr<const Problem> problem(const ModelConfig& m, const Shape& s, uint64_t seed,
                                       const std::string& weights = "");
// The problem's experts as tensors of Hugging Face names (experts.{e}.{gate,up,down}_proj.weight, bf16), for --dump
// and a peer's inputs.
std::vector<DumpTensor> expert_tensors(const Problem& p);
// Synthetic routing (s.routing uniform or zipf:S): each token draws topk distinct experts with popularity p_e
// (uniform, or Zipf by id), weights normalised and scaled by routed_scaling_factor.
ref::Routing synthetic_routing(const ModelConfig& m, const Shape& s, uint64_t seed);
// BadInput unless model | uniform | zipf:S.
void check_routing_name(const std::string& routing);

Cost cost(const ModelConfig& m, const Problem& p);
// Expected distinct experts reached by tokens x topk choices spread uniformly over `experts`.
double expected_active_experts(int64_t experts, int64_t topk, int64_t tokens);
// Tokens up to which the GPU MoE's router reads the gate in a kernel of its own (cuda/op.cu: with the routing and
// the permutation, one launch a layer); beyond, the logits are a cuBLAS GEMM. The planner counts its launches by it.
constexpr int64_t kGateKernelTokens = 4;

// Weights packed once for the AMX and AVX-512 kernels: for each 16-column block and 32-deep K block,
// a 16 x 32 bf16 tile whose row r holds the K pair (2r, 2r+1) of each of the 16 columns (VNNI order):
// exactly an AMX B tile, and for AVX-512 one zmm per K pair across 16 columns.
struct Packed {
  int64_t n_blocks = 0, k_blocks = 0;
  std::vector<bf16> data;  // [n_blocks][k_blocks][16][32]
  const bf16* block(int64_t nb) const { return data.data() + nb * k_blocks * 512; }
};
Packed pack(const bf16* w, int64_t n, int64_t k);  // w: nn.Linear weight [n][k]

// What every CPU MoE variant shares: axes, support checks, cost, the problem, verification.
class Base : public Variant {
 public:
  std::vector<std::pair<std::string, std::string>> axes() const override { return moe::axes(); }
  bool reads_weights() const override { return true; }
  Support supports(const ModelFile& model, const Point& point) const override;
  Cost cost(const ModelFile& model, const Point& point) const override;
  double host_memory_bytes(const ModelFile& model, const Point& point) const override;
  std::string compute_ceiling() const override;
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override;
  Verification verify() override;
  std::vector<DumpTensor> tensors() const override;
  std::map<std::string, double> counters() override;

 protected:
  // out[t] = sum over k of weight[t][k] * row_of(expert[t][k], slot[t][k]): the weighted combine every
  // variant ends with. An orphaned `omp for`: run it inside the variant's parallel region.
  template <class RowOf>
  void combine(RowOf row_of) {
    const int64_t H = m_.hidden_size, T = p_->shape.tokens, K = p_->shape.topk;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      float* o = &out_[size_t(t * H)];
      for (int64_t k = 0; k < K; ++k) {
        const auto w = float(p_->routing.weight[size_t(t * K + k)]);
        const float* y = row_of(p_->routing.expert[size_t(t * K + k)], slot_[size_t(t)][size_t(k)]);
        for (int64_t j = 0; j < H; ++j) o[j] = (k == 0 ? 0.0f : o[j]) + w * y[j];
      }
    }
  }

  ModelConfig m_;
  std::shared_ptr<const Problem> p_;
  int threads_ = 1;
  std::vector<std::vector<int>> slot_;  // [token][k]: the token's row within its k-th expert's batch
  std::vector<float> out_;              // [tokens][hidden]
};

// The engine KTransformers runs on the CPU, as an op on buffers it is given (the MoE variants below time it; the
// hybrid layer runs it beside the GPU): one layer's experts packed once, then per call the tokens' rows gathered
// by expert; fused gate/up with SiLU(gate)*up over all (expert, column block) tasks; down over all (expert,
// column-block pair) tasks; the weighted combine per token. Tasks are taken from a shared atomic counter in small
// grains, so a hot expert's blocks spread over every thread instead of idling the rest. A per-expert kernel
// choice: AMX tiles or AVX-512 vector-matrix over the same packed weights (choose: AMX from a tokens-per-expert
// crossover measured on this machine). Its buffers grow to the largest call and are reused after that.
class HostExperts {
 public:
  enum class Kernel { amx, avx512, choose };
  HostExperts(Kernel k, int threads) : kernel_(k), threads_(threads) {}
  // An expert given with empty tensors is not packed (the hybrid layer's hot experts: the GPU runs them); a call that
  // routes a token to one throws.
  void set_weights(const ModelConfig& m, const std::vector<ref::MlpParams>& experts);
  // out[t] = sum over k < topk of weights[t][k] * expert_{ids[t][k]}(x[t]), for t < tokens (x: [tokens][hidden]).
  // ids[t][k] < 0: that choice runs elsewhere (on the GPU) and is left out of out[t] (0 if every choice is).
  void forward(const bf16* x, int64_t tokens, const int32_t* ids, const float* weights, int64_t topk, float* out);
  // The packed weights of the experts these (token, k) choices reach: what a decode step streams from DRAM.
  std::vector<std::pair<const void*, size_t>> weights_of(const int32_t* ids, int64_t count) const;
  int64_t amx_crossover() const { return crossover_; }
  int64_t amx_experts() const { return amx_experts_; }  // of the last call's active experts, those on AMX
  int threads() const { return threads_; }

 private:
  struct Task {
    int32_t expert, block;
  };
  Kernel kernel_;
  int threads_;
  int64_t hidden_ = 0, inter_ = 0, experts_ = 0;
  int64_t crossover_ = 0;
  int64_t hidden_blocks_ = 0, inter_blocks_ = 0, y_stride_ = 0;
  std::vector<Packed> gate_, up_, down_;
  // Per call: each expert's tokens, their rows' offsets in the arenas (16-row padded per expert), the tasks.
  std::vector<std::vector<int32_t>> rows_;  // per expert: (token, k) as token * topk + k
  std::vector<int64_t> first_row_;          // per expert, in padded rows
  std::vector<char> use_amx_;
  std::vector<bf16> a_, h_;    // gathered tokens, SwiGLU output (packed, kernels.h)
  std::vector<float> y_;       // down output [rows][y_stride_]
  std::vector<int32_t> slot_;  // per (token, k): its row in y_
  std::vector<Task> gate_up_tasks_, down_tasks_;
  std::vector<std::vector<float>> scratch_;  // per thread: two [max rows][16] fp32 blocks
  int64_t amx_experts_ = 0;
};

// The engine as a variant of the MoE family: the problem's tokens and routing through HostExperts.
class Engine : public Base {
 public:
  using Kernel = HostExperts::Kernel;
  explicit Engine(Kernel k) : kernel_(k) {}
  Support available() const override;
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override;
  void run() override;
  std::map<std::string, double> counters() override;
  // Measured against the unit it computes on: the AVX-512 engine against AVX-512's rate, not AMX's (which would
  // hide it); AMX (and the per-expert choice, which reaches AMX's rate at most) against AMX's.
  std::string compute_ceiling() const override;
  std::vector<std::pair<const void*, size_t>> cold_buffers() const override;

 private:
  Kernel kernel_;
  std::unique_ptr<HostExperts> op_;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
};

// Device memory of the GPU MoE ops (variants/moe/cuda) beyond their weights. A SwiGLU MLP over `tokens` rows: gate|up
// fp32 and the product bf16, all forward scratch. One MoE layer: forward scratch (the permutation, the experts'
// outputs, the grouped or per-expert GEMMs' intermediates, the shared experts' MLP), which a model's layers take
// from one arena (gpu::ScratchArena), and owned buffers that outlive a step (router logits and the routing
// the verification reads, the expert counts the scan leaves zeroed, the tiles). The ops size their buffers by
// these; the layer and the offload planner count them.
inline double gpu_mlp_scratch_bytes(int64_t tokens, int64_t intermediate) {
  return double(tokens) * double(intermediate) * 10;
}
double gpu_moe_forward_scratch_bytes(const ModelConfig& m, int64_t tokens);
double gpu_moe_owned_bytes(const ModelConfig& m, int64_t tokens, int64_t experts,
                           int64_t hot_experts = 0);  // (hot: moe/host/cuda's split, not its weights)
inline double gpu_moe_scratch_bytes(const ModelConfig& m, int64_t tokens, int64_t experts) {
  return gpu_moe_forward_scratch_bytes(m, tokens) + gpu_moe_owned_bytes(m, tokens, experts);
}

// Rows of an expert padded to the AMX tile height.
inline int64_t padded_rows(int64_t m) { return (m + 15) / 16 * 16; }

// Smallest tokens-per-expert at which AMX beats AVX-512 for this expert shape and thread count,
// measured on this machine the first time it is asked (and remembered for the process).
int64_t amx_crossover(int64_t hidden, int64_t intermediate, int threads);

}  // namespace dslab::moe
