// DeepSeek over several GPUs: what each GPU holds and what the collectives move, for attention tensor-parallel (the
// heads split `gpus` ways, every GPU holding every request's latent cache, since all heads share it) or data-parallel
// (SGLang's DP attention: whole requests a GPU, the MLA weights replicated), and routed experts tensor-parallel (each
// expert's intermediate split) or expert-parallel (whole experts a GPU). The plan of one decoder layer's decode step;
// bytes are bf16, the cache bf16 [kv_lora_rank + qk_rope_head_dim] a token a layer.
//
// Collectives per layer (SGLang's placement): TP attention all-reduces o_proj's partial sums [tokens][hidden]; DP
// attention all-gathers every GPU's tokens before the MoE and reduce-scatters them after; TP MoE (and the shared
// experts and dense MLPs, split alike) all-reduces its down_proj's partial sums, unless DP attention's reduce-scatter
// already does; EP MoE after DP attention dispatches each token's hidden state to the GPUs of its top-k experts and
// combines the outputs back (two all-to-alls), after TP attention all-reduces like TP.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "variants/common/model_config.h"

namespace dslab::planner {

struct Parallelism {
  int64_t gpus = 1;
  bool dp_attention = false;  // attention data-parallel (else tensor-parallel over the heads)
  bool ep = false;            // routed experts expert-parallel (else tensor-parallel)
};

struct Collective {
  std::string kind;  // all_reduce | all_gather | reduce_scatter | all_to_all
  std::string where;
  double bytes = 0;  // the whole tensor's bytes (an all-to-all: what all GPUs send in total)
};

struct ShardPlan {
  int64_t heads_per_gpu = 0;            // attention heads a GPU computes
  int64_t requests_per_gpu = 0;         // requests whose attention a GPU runs (DP: ceil(batch / gpus))
  int64_t experts_per_gpu = 0;          // routed experts a GPU holds (whole under EP; every one, a slice, under TP)
  double expert_fraction = 1;           // of each held expert's weights (1 / gpus under TP)
  double weight_bytes_per_gpu = 0;      // every layer's weights a GPU holds, embedding and LM head included
  double kv_bytes_per_token_layer = 0;  // the latent cache of one token in one layer
  double kv_bytes_per_gpu = 0;          // the batch's cache a GPU holds at kv_len
  std::vector<Collective> per_moe_layer, per_dense_layer;  // one decode step's collectives
};

// BadInput unless gpus >= 1 divides num_attention_heads (TP attention) and n_routed_experts (EP).
ShardPlan shard_plan(const ModelConfig& m, const Parallelism& p, int64_t batch, int64_t q_len, int64_t kv_len);
// Requests of kv_len cached tokens (every layer) that fit in `gpu_bytes` of each GPU beside its weights, in the whole
// machine: TP attention's copies of one request on every GPU count once, DP attention's GPUs add up.
int64_t kv_capacity_requests(const ModelConfig& m, const Parallelism& p, double gpu_bytes, int64_t kv_len);

// What a GPU and its links can do, for a step's time estimate. The collectives by NCCL's bus-bandwidth model
// (collectives::bus_factor): time = latency + bytes x factor / bus bandwidth, the factor 2(n-1)/n for an all-reduce,
// (n-1)/n for an all-gather or a reduce-scatter, (n-1)/n^2 for an all-to-all of `bytes` in all. Each kind's latency
// and bandwidth as `dslab calibrate` measured them on a machine of several GPUs (link_from_calibration), else the
// defaults: NVLink 4 in an HGX H100 / H200 board, 450 GB/s a direction a GPU by the datasheet, of which NCCL's large
// all-reduces reach ~360 GB/s of bus bandwidth; 10 us of latency a collective.
struct GpuCeilings {
  double hbm_bytes_per_s = 4.48e12;  // the H200's measured HBM read (reports/nvidia-h200/calibration)
  double tensor_flops = 868e12;      // its measured bf16 tensor GEMM rate
  double kernel_s = 4e-6;            // a small kernel's fixed cost in a graph-replayed step
};
struct Link {
  double bus_bytes_per_s = 360e9;
  double latency_s = 10e-6;
  struct Measured {
    double bus_bytes_per_s = 0, latency_s = 0;
  };
  std::map<std::string, Measured> measured;  // by collective kind; a kind not here takes the defaults above
  int64_t measured_gpus = 0;                 // the GPUs the calibration ran over (0: none)
  std::string measured_on;                   // "8 x NVIDIA H200, NCCL 2.27.3"
};
// The machine file's "collectives" section (collectives.h's JSON); the defaults where it has no fit (absent, one GPU).
// BadInput naming `source` for a fit without its fields.
Link link_from_calibration(const nlohmann::json& collectives, const std::string& gpu_name, const std::string& source);
double collective_seconds(const Collective& c, int64_t gpus, const Link& link);

// One decode step (a token a request) of the whole model over `p`, estimated from the ops' work (layer::step_ops):
// each op's share a GPU runs under the placement, priced at max(flops / peak, bytes / HBM) plus its kernels' fixed
// cost; then the layers' collectives, not overlapped (the layer's compute waits for them).
struct ParallelEstimate {
  Parallelism p;
  double compute_s = 0, comm_s = 0, step_s = 0;
  double tokens_per_s = 0;  // the batch's tokens over the step
  double weight_bytes_per_gpu = 0, kv_bytes_per_gpu = 0;
  std::string label() const;  // "DP attention + EP experts on 8 GPUs"
};
ParallelEstimate estimate_parallel_step(const ModelConfig& m, const Parallelism& p, int64_t batch, int64_t kv_len,
                                        const GpuCeilings& gpu = {}, const Link& link = {});
// Every placement on `gpus` GPUs that the model's heads and experts allow (TP or DP attention x TP or EP experts),
// fastest first.
std::vector<ParallelEstimate> rank_placements(const ModelConfig& m, int64_t gpus, int64_t batch, int64_t kv_len,
                                              const GpuCeilings& gpu = {}, const Link& link = {});

}  // namespace dslab::planner
