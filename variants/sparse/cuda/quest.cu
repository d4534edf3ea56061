// sparse/quest/cuda: Quest's block-sparse decode over the paged latent cache. A block is a cache page: each
// page keeps the element-wise min and max of its [latent ‖ rope] keys (made for every page at prepare; in each step
// only the pages this step's keys went to are remade, inside run()); a page's score is the best over heads and new
// tokens of sum_d max(q_d min_d, q_d max_d) with the absorbed query, an upper bound of any of its keys' scores, one
// GEMM per request (paged_select.h). One selection per request, shared by all heads as they share the latent: a page
// any head needs is kept. The sinks' and window's pages are always kept, the best-scored others fill the budget;
// mla/fused/cuda's kernel then walks the chosen pages through a compact page table, as it walks the whole cache.
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/paged_select.h"

namespace dslab::sparse::cuda {
namespace {

const bool registered = mla::cuda::register_mla_op(
    "sparse/quest/cuda",
    "Quest block-sparse decode: per-page min/max bounds of the latent keys (remade for the step's pages in run()), "
    "pages "
    "scored by the best head's upper bound (one GEMM), sinks + window + best pages within the budget, walked by "
    "mla/fused/cuda's kernel",
    [] { return mla::cuda::make_fused_op(make_block_selector(Summary::quest_bounds, "sparse/quest/cuda")); });

}  // namespace
}  // namespace dslab::sparse::cuda
