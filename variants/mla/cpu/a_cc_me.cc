// Absorbed_CacheCompressed_MoveElision: score = q_pe·k_peᵀ + q_abs·c_kvᵀ with no concatenation. All heads
// share one latent cache, so the heads become the rows of one MQA matmul per request: compute-dense.
#include "variants/mla/mla.h"

namespace dslab::mla {
namespace {

class MlaACcMeCpu : public CpuVariant {
 public:
  MlaACcMeCpu() : CpuVariant(Algo::a_cc_me) {}

 private:
  void prepare_form() override {
    using onednn::dt;
    const int64_t rows = s_.q_len * nh_, N = s_.keys(), w = r_ + rope_;
    prepare_absorbed();
    scores_.resize(size_t(rows * N));
    probs_.resize(scores_.size());
    const onednn::View q_nope{1, rows, r_, rows * w, w, 1, dt::bf16};
    const onednn::View q_pe{1, rows, rope_, rows * w, w, 1, dt::bf16};
    const onednn::View ckv_t{1, r_, N, N * r_, 1, r_, dt::bf16};
    const onednn::View kpe_t{1, rope_, N, N * rope_, 1, rope_, dt::bf16};
    score_latent_ = onednn::Matmul(q_nope, ckv_t, onednn::dense(rows, N, dt::f32));
    score_rope_ = onednn::Matmul(q_pe, kpe_t, onednn::dense(rows, N, dt::f32), /*accumulate=*/true);
    pv_ = onednn::Matmul(onednn::dense(rows, N, dt::bf16), onednn::dense(N, r_, dt::bf16),
                         onednn::dense(rows, r_, dt::bf16));
  }

  void attend() override {
    const int64_t rows = s_.q_len * nh_, N = s_.keys(), w = r_ + rope_;
    absorb_query();
    for (int64_t b = 0; b < s_.batch; ++b) {
      const bf16* q = &q_abs_[size_t(b * rows * w)];
      score_latent_.run(q, &ckv_cache_[size_t(b * N * r_)], scores_.data());
      score_rope_.run(q + r_, &kpe_cache_[size_t(b * N * rope_)], scores_.data());
      softmax(scores_.data(), probs_.data(), rows, nh_);  // rows are (query, head): query = row / heads
      pv_.run(probs_.data(), &ckv_cache_[size_t(b * N * r_)], &o_lat_[size_t(b * rows * r_)]);
    }
    absorb_output();
  }

  onednn::Matmul score_latent_, score_rope_, pv_;
};

}  // namespace
}  // namespace dslab::mla

using dslab::mla::MlaACcMeCpu;
DSLAB_REGISTER_VARIANT(MlaACcMeCpu, "mla/a_cc_me/cpu", dslab::Device::cpu,
                       "Absorbed + MoveElision: MQA over the shared latent, no concatenation (oneDNN)");
