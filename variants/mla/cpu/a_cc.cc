// Absorbed_CacheCompressed: W_UK folded into q and W_UV into the output; attention in the latent space,
// but over a materialised [c_kv ‖ k_pe] key copied once per head (the data movement a_cc_me elides).
#include "variants/mla/mla.h"

namespace dslab::mla {
namespace {

class MlaACcCpu : public CpuVariant {
 public:
  MlaACcCpu() : CpuVariant(Algo::a_cc) {}

 private:
  void prepare_form() override {
    using onednn::dt;
    const int64_t S = s_.q_len, N = s_.keys(), w = r_ + rope_;
    prepare_absorbed();
    key_.resize(size_t(nh_ * N * w));
    scores_.resize(size_t(nh_ * S * N));
    probs_.resize(scores_.size());
    const onednn::View q{nh_, S, w, w, nh_ * w, 1, dt::bf16};
    const onednn::View key_t{nh_, w, N, N * w, 1, w, dt::bf16};
    qk_ = onednn::Matmul(q, key_t, onednn::dense(S, N, dt::f32, nh_));
    const onednn::View value{nh_, N, r_, N * w, w, 1, dt::bf16};  // the latent half of the key
    const onednn::View o_lat{nh_, S, r_, r_, nh_ * r_, 1, dt::bf16};
    pv_ = onednn::Matmul(onednn::dense(S, N, dt::bf16, nh_), value, o_lat);
  }

  void attend() override {
    const int64_t S = s_.q_len, N = s_.keys(), w = r_ + rope_;
    absorb_query();
    for (int64_t b = 0; b < s_.batch; ++b) {
#pragma omp parallel for schedule(static)
      for (int64_t h = 0; h < nh_; ++h)
        for (int64_t j = 0; j < N; ++j) {
          bf16* k = &key_[size_t((h * N + j) * w)];
          std::copy_n(&ckv_cache_[size_t((b * N + j) * r_)], r_, k);
          std::copy_n(&kpe_cache_[size_t((b * N + j) * rope_)], rope_, k + r_);
        }
      qk_.run(&q_abs_[size_t(b * S * nh_ * w)], key_.data(), scores_.data());
      softmax(scores_.data(), probs_.data(), nh_ * S, 1);
      pv_.run(probs_.data(), key_.data(), &o_lat_[size_t(b * S * nh_ * r_)]);
    }
    absorb_output();
  }

  std::vector<bf16> key_;  // [heads][keys][kv_lora_rank + rope]
  onednn::Matmul qk_, pv_;
};

}  // namespace
}  // namespace dslab::mla

using dslab::mla::MlaACcCpu;
DSLAB_REGISTER_VARIANT(MlaACcCpu, "mla/a_cc/cpu", dslab::Device::cpu,
                       "Absorbed: attend in latent space over a per-head concatenated key (oneDNN)");
