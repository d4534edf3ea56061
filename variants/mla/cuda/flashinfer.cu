// mla/flashinfer/cuda: the peer baseline. The same step as mla/fused/cuda (projections, cache write, absorbed query,
// o_proj, same verification) with FlashInfer's Hopper MLA paged decode as the attention core, reading our cache in
// place: the query and cache rows are [512 latent ‖ 64 rope], so FlashInfer's separate ckv / kpe tensors are the two
// parts of one row (stride 576), and our page table is its page index list (request i's pages from i * pages per
// request). FlashInfer's scheduler (MLAPlan) is the op's schedule: made on the host for each step's lengths and
// copied into the schedule buffer before the step, as the fused kernel's split-KV plan is, so one captured graph
// replays steps of any lengths.
#include <cstdint>
#include <string>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/errors.h"
#include "harness/gpu.h"
#include "harness/host.h"
#include "variants/mla/cuda/mla_cuda.h"
#ifdef DSLAB_HAVE_FLASHINFER
#include "variants/mla/cuda/flashinfer_mla.h"
#endif

namespace dslab::mla::cuda {
namespace {

class FlashInferCuda final : public MlaOp {
 public:
  FlashInferCuda() : MlaOp(Algo::a_cc_me, /*fused=*/true) {}
  std::string unavailable() const override {
#ifdef DSLAB_HAVE_FLASHINFER
    return "";
#else
    return "not built: FlashInfer's headers were not found at configure time (scripts/setup.sh fetches "
           "flashinfer-python==" DSLAB_FLASHINFER_PIN " from PyPI; DSLAB_FLASHINFER=off skips it)";
#endif
  }

 protected:
  std::string form_unsupported(const ModelConfig&, const Shape& s) const override {
    if (s.kv_splits > 0) return "kv_splits: FlashInfer's scheduler chooses its own splits (kv_splits auto)";
    if (s.heads * s.q_len > 16384) return "FlashInfer's MLA plan: up to 16384 query rows";
    return "";
  }
#ifdef DSLAB_HAVE_FLASHINFER
  void prepare_form() override {
    const int64_t T = s_.tokens();
    sms_ = dslab::gpu_info().sms;
    q_cat_buffer_.scratch(arena_, size_t(T * nh_ * width_));
    q_cat_ = q_cat_buffer_.get();
    o_lat_.scratch(arena_, size_t(T * nh_ * r_));
    workspace_.scratch(arena_, flashinfer_mla::float_workspace_bytes(sms_));
    // The plan's grid and offsets depend on the shapes and the SM count, not on the lengths (and its offsets on the
    // buffers' alignment, 16 bytes and more here): planned once for any lengths, checked again by every schedule().
    plan_info_ = make_plan(std::vector<int64_t>(size_t(s_.batch), max_keys_ - s_.q_len), nullptr);
  }
  size_t schedule_ints_for(const ModelConfig&, const Shape&) const override {
    return (flashinfer_mla::int_workspace_bytes(dslab::gpu_info().sms) + 3) / 4;
  }
  MlaSchedule schedule(const std::vector<int64_t>& lengths) const override {
    if (int64_t(lengths.size()) != s_.batch) throw std::logic_error("mla/flashinfer/cuda: schedule for another batch");
    MlaSchedule out;
    out.blob.assign(schedule_ints(), 0);
    if (make_plan(lengths, out.blob.data()) != plan_info_)
      throw std::logic_error("mla/flashinfer/cuda: the plan's layout changed with the lengths");
    return out;
  }
  void attend() override {
    concat_query();
    const int32_t* page_table = b_.cache->shared_page_table ? b_.cache->shared_page_table : b_.cache->page_table.get();
    void* schedule = schedule_buffer();
    if (reinterpret_cast<uintptr_t>(schedule) % 16 || reinterpret_cast<uintptr_t>(workspace_.get()) % 16)
      throw std::logic_error(
          "mla/flashinfer/cuda: its schedule and workspace must be 16-byte aligned (the plan's offsets assume it)");
    const flashinfer_mla::Step step{q_cat_, b_.cache->values.get(), page_table, o_lat_.get(), s_.tokens(),
                                    nh_,    b_.cache->page_size,    scale_,     s_.q_len > 1};
    DSLAB_CUDA(flashinfer_mla::run(step, plan_info_, schedule, workspace_.get(), stream_));
    DSLAB_CHECK_LAUNCH();
    mark("decode");
    absorb_output(o_lat_.get());
    mark("absorb_o");
  }

 private:
  // FlashInfer's plan for these lengths (cached keys before the step; each request attends to them and its q_len new
  // tokens), its schedule written to `host` when given. Offsets are laid out from a 256-aligned base: the same for any
  // 16-byte-aligned buffer (attend() checks the real ones).
  std::vector<int64_t> make_plan(const std::vector<int64_t>& lengths, int32_t* host) const {
    std::vector<int64_t> kv(lengths);
    for (auto& k : kv) k += s_.q_len;
    std::vector<int32_t> scratch;
    if (!host) scratch.assign(schedule_ints(), 0), host = scratch.data();
    void* const base = reinterpret_cast<void*>(uintptr_t(256));
    size_t staged = 0;
    return flashinfer_mla::plan(base, host, schedule_ints() * 4, base, flashinfer_mla::float_workspace_bytes(sms_), kv,
                                s_.q_len, b_.cache->pages_per_request, nh_, s_.q_len > 1, &staged);
  }
  int sms_ = 0;
  std::vector<int64_t> plan_info_;
  DeviceArray<__nv_bfloat16> q_cat_buffer_, o_lat_;
  DeviceArray<uint8_t> workspace_;
#else
  void attend() override { throw std::logic_error("mla/flashinfer/cuda: " + unavailable()); }
#endif
};

}  // namespace

DSLAB_REGISTER_MLA_OP(FlashInferCuda, "mla/flashinfer/cuda",
                      "peer baseline: FlashInfer's Hopper MLA paged decode (pinned release, fetched by the set-up) as "
                      "the attention core of "
                      "the same step, its scheduler as the step's schedule");

}  // namespace dslab::mla::cuda
