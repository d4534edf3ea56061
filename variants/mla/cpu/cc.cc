// CacheCompressed: the cache holds the latent; every step re-decompresses all of it with kv_b_proj.
#include "variants/mla/mla.h"

namespace dslab::mla {
namespace {

class MlaCcCpu : public CpuVariant {
 public:
  MlaCcCpu() : CpuVariant(Algo::cc) {}

 private:
  void prepare_form() override {
    const int64_t N = s_.keys();
    decompress_ = decompressor(N);
    kv_.resize(size_t(N * nh_ * (nope_ + vd_)));
    k_.resize(size_t(N * nh_ * qhd_));
    prepare_mha(nope_ + vd_, nh_ * (nope_ + vd_));  // V read in place from the decompressed rows
  }

  void attend() override {
    const int64_t N = s_.keys();
    for (int64_t b = 0; b < s_.batch; ++b) {
      decompress_.run(&ckv_cache_[size_t(b * N * r_)], kv_.data());
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < N; ++j)  // K = [k_nope ‖ k_pe], the rope key shared by all heads
        for (int64_t h = 0; h < nh_; ++h) {
          bf16* k = &k_[size_t((j * nh_ + h) * qhd_)];
          std::copy_n(&kv_[size_t((j * nh_ + h) * (nope_ + vd_))], nope_, k);
          std::copy_n(&kpe_cache_[size_t((b * N + j) * rope_)], rope_, k + nope_);
        }
      attend_mha(b, k_.data(), kv_.data() + nope_);
    }
  }

  onednn::Linear decompress_;
  std::vector<bf16> kv_, k_;
};

}  // namespace
}  // namespace dslab::mla

using dslab::mla::MlaCcCpu;
DSLAB_REGISTER_VARIANT(MlaCcCpu, "mla/cc/cpu", dslab::Device::cpu,
                       "CacheCompressed: cache the latent, re-decompress it all each step (oneDNN)");
