// CacheDecompressed: the cache holds every head's K (q_head_dim) and V (v_head_dim); attention is plain MHA.
#include "variants/mla/mla.h"

namespace dslab::mla {
namespace {

class MlaCdCpu : public CpuVariant {
 public:
  MlaCdCpu() : CpuVariant(Algo::cd) {}

 private:
  void prepare_form() override {
    const int64_t B = s_.batch, L = s_.kv_len, S = s_.q_len, N = s_.keys();
    k_cache_.resize(size_t(B * N * nh_ * qhd_));
    v_cache_.resize(size_t(B * N * nh_ * vd_));
    if (L > 0) {  // what earlier steps would have written: the cached tokens, decompressed
      const onednn::Linear past = decompressor(L);
      std::vector<bf16> kv(static_cast<size_t>(L * nh_ * (nope_ + vd_)));
      for (int64_t b = 0; b < B; ++b) {
        past.run(&ckv_cache_[size_t(b * N * r_)], kv.data());
        store(b, 0, L, kv.data());
      }
    }
    new_tokens_ = decompressor(S);
    new_kv_.resize(size_t(S * nh_ * (nope_ + vd_)));
    prepare_mha(vd_, nh_ * vd_);
  }

  // Writes decompressed rows [count][heads][nope + v] of request b at positions first.. into K/V.
  void store(int64_t b, int64_t first, int64_t count, const bf16* kv) {
    const int64_t N = s_.keys();
#pragma omp parallel for schedule(static)
    for (int64_t j = first; j < first + count; ++j)
      for (int64_t h = 0; h < nh_; ++h) {
        const bf16* src = kv + ((j - first) * nh_ + h) * (nope_ + vd_);
        bf16* k = &k_cache_[size_t(((b * N + j) * nh_ + h) * qhd_)];
        std::copy_n(src, nope_, k);
        std::copy_n(&kpe_cache_[size_t((b * N + j) * rope_)], rope_, k + nope_);
        std::copy_n(src + nope_, vd_, &v_cache_[size_t(((b * N + j) * nh_ + h) * vd_)]);
      }
  }

  void attend() override {
    const int64_t N = s_.keys(), L = s_.kv_len;
    for (int64_t b = 0; b < s_.batch; ++b) {
      new_tokens_.run(&ckv_cache_[size_t((b * N + L) * r_)], new_kv_.data());
      store(b, L, s_.q_len, new_kv_.data());
      attend_mha(b, &k_cache_[size_t(b * N * nh_ * qhd_)], &v_cache_[size_t(b * N * nh_ * vd_)]);
    }
  }

  std::vector<bf16> k_cache_, v_cache_, new_kv_;
  onednn::Linear new_tokens_;
};

}  // namespace
}  // namespace dslab::mla

using dslab::mla::MlaCdCpu;
DSLAB_REGISTER_VARIANT(MlaCdCpu, "mla/cd/cpu", dslab::Device::cpu,
                       "CacheDecompressed: cache per-head K/V, plain MHA (oneDNN)");
