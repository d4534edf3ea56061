// sparse/infllm/cuda: InfLLM's block retrieval over the paged latent cache. A block is a cache page and its
// representative key the plain mean of its [latent ‖ rope] keys (InfLLM proper keeps the keys that received the most
// attention from the local window's queries, which needs the window's past queries that a decode step here does not
// keep). Made for every page at prepare, the step's pages remade in run(); a page's score is its best head's (and new
// token's) q · mean, one GEMM per request (paged_select.h); the sinks' and window's pages always kept, the
// best-scored fill the budget, and mla/fused/cuda's kernel walks the chosen pages.
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/paged_select.h"

namespace dslab::sparse::cuda {
namespace {

const bool registered = mla::cuda::register_mla_op(
    "sparse/infllm/cuda",
    "InfLLM block-sparse decode: a representative key per page (the mean of its latent keys, remade for the step's "
    "pages in "
    "run()), pages scored by the best head's q·rep (one GEMM), sinks + window + best pages within the budget, walked "
    "by mla/fused/cuda's kernel",
    [] { return mla::cuda::make_fused_op(make_block_selector(Summary::infllm_mean, "sparse/infllm/cuda")); });

}  // namespace
}  // namespace dslab::sparse::cuda
