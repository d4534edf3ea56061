// One decoder layer's step as the GPUs of a Parallelism (planner/parallel.h) compute it, in the reference's fp64
// arithmetic: each rank holds only its shard of the weights (its heads' rows of q_b / kv_b and columns of o_proj under
// tensor-parallel attention, its requests under DP attention, a slice of every expert's intermediate under TP experts,
// whole experts under EP), and the collectives run in host memory, each logged with what it moves. The sum over ranks
// regroups the single-GPU layer's sums, so the output equals ref::decoder_layer's up to fp64 rounding: the check that
// shard_plan's splits compute the model (and the arithmetic a multi-GPU step must reproduce rank by rank), and that
// the collectives it prices are the ones the step needs.
#pragma once
#include <cstdint>
#include <vector>

#include "planner/parallel.h"
#include "variants/reference/reference.h"

namespace dslab::planner {

struct ShardedLayerStep {
  std::vector<double> out;              // [tokens][hidden]: the residual stream out, as ref::decoder_layer returns it
  std::vector<Collective> collectives;  // in the order the step runs them; bytes: the whole tensor, as ShardPlan's
};

// BadInput where the placement does not divide the model (shard_plan's checks, and each FFN's intermediate size by the
// GPUs where it is split); in.rows must be empty (every new token computed).
ShardedLayerStep sharded_decoder_layer(const ModelConfig& m, int64_t layer_index, const ref::LayerParams& p,
                                       const ref::MlaInputs& in, ref::MlaForm form, const Parallelism& parallel);

// Rank `rank` of `ranks`' share of a layer's attention under tensor parallelism: heads [rank, rank + 1) x heads/ranks
// of q_b_proj (or q_proj) and kv_b_proj, their columns of o_proj; the latent projections and norms whole.
ref::MlaParams shard_heads(const ModelConfig& m, const ref::MlaParams& p, int64_t rank, int64_t ranks);
// Rank `rank` of `ranks`' slice of a SwiGLU MLP: its intermediate units' rows of gate_proj and up_proj and columns of
// down_proj (the partial outputs of all ranks sum to the MLP's).
ref::MlpParams shard_intermediate(const ref::MlpParams& p, int64_t rank, int64_t ranks);

}  // namespace dslab::planner
