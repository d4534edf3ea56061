// The generic-library baseline: one oneDNN bf16 matmul per active expert for gate+up and one for down,
// on the same weights (packed once in oneDNN's own preferred layout), oneDNN's threading inside each.
#include <omp.h>

#include <cmath>

#include "variants/common/onednn.h"
#include "variants/moe/moe.h"

namespace dslab::moe {
namespace {

class MoeOnednnCpu : public Base {
 public:
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override {
    Base::prepare(model, point, seed);
    const int64_t H = m_.hidden_size, I = m_.moe_intermediate_size, E = p_->shape.experts;
    experts_.clear();
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = int64_t(p_->rows[size_t(e)].size());
      if (m == 0) continue;
      const auto& w = (*p_->experts)[size_t(e)];
      std::vector<bf16> gate_up(w.gate_proj);  // [2I][H]: gate rows then up rows, one matmul for both
      gate_up.insert(gate_up.end(), w.up_proj.begin(), w.up_proj.end());
      Expert x;
      x.id = e;
      x.gate_up = onednn::Linear(m, H, 2 * I, gate_up.data(), onednn::dt::f32);
      x.down = onednn::Linear(m, I, H, w.down_proj.data(), onednn::dt::f32);
      x.a.resize(size_t(m * H));
      x.gu.resize(size_t(m * 2 * I));
      x.h.resize(size_t(m * I));
      x.y.resize(size_t(m * H));
      experts_.push_back(std::move(x));
    }
    index_.assign(size_t(E), -1);
    for (size_t i = 0; i < experts_.size(); ++i) index_[size_t(experts_[i].id)] = int(i);
  }

  void run() override {
    const int64_t H = m_.hidden_size, I = m_.moe_intermediate_size;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads_);  // oneDNN's OpenMP runtime takes its team size from here
    for (auto& x : experts_) {
      const auto& rows = p_->rows[size_t(x.id)];
      const int64_t m = int64_t(rows.size());
      for (int64_t r = 0; r < m; ++r) std::copy_n(&p_->x[size_t(rows[size_t(r)]) * size_t(H)], H, &x.a[size_t(r * H)]);
      x.gate_up.run(x.a.data(), x.gu.data());
#pragma omp parallel for num_threads(threads_) schedule(static)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < I; ++j) {
          const float g = x.gu[size_t(r * 2 * I + j)], u = x.gu[size_t(r * 2 * I + I + j)];
          x.h[size_t(r * I + j)] = to_bf16(g / (1.0f + std::exp(-g)) * u);
        }
      x.down.run(x.h.data(), x.y.data());
    }
#pragma omp parallel num_threads(threads_)
    combine(
        [&](int expert, int slot) { return &experts_[size_t(index_[size_t(expert)])].y[size_t(slot) * size_t(H)]; });
    omp_set_num_threads(saved);
  }

 private:
  struct Expert {
    int64_t id = 0;
    onednn::Linear gate_up, down;
    std::vector<bf16> a, h;
    std::vector<float> gu, y;
  };
  std::vector<Expert> experts_;
  std::vector<int> index_;  // expert id -> experts_ slot
};

}  // namespace
}  // namespace dslab::moe

using dslab::moe::MoeOnednnCpu;
DSLAB_REGISTER_VARIANT(MoeOnednnCpu, "moe/onednn/cpu", dslab::Device::cpu,
                       "routed experts: one oneDNN bf16 matmul per active expert (generic-library baseline)");
