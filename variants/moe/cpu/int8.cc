// moe/amx_int8/cpu: the engine of moe.h with INT8 weights (one scale per output row) and activations
// quantized per token on the fly (one scale per row, before gate/up and again before down). AMX INT8
// tiles for experts with many tokens, AVX-512-VNNI for few, switched at the measured bf16 crossover.
// Accuracy against the bf16-weight reference is what its verification reports (threshold 5e-2).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "harness/host.h"
#include "variants/moe/cpu/kernels.h"
#include "variants/moe/moe.h"

namespace dslab::moe {
namespace {

struct PackedI8 {
  int64_t n_blocks = 0, k_blocks = 0;  // 16 columns, 64 K
  std::vector<int8_t> data;            // [n_blocks][k_blocks][16 K-quads][16 columns x 4]
  std::vector<float> scale;            // per output row (column of the product)
  std::vector<int32_t> colsum;         // per output row: sum of its int8 weights (VNNI's unsigned offset)
  const int8_t* block(int64_t nb) const { return data.data() + nb * k_blocks * 1024; }
};

PackedI8 pack_i8(const bf16* w, int64_t n, int64_t k) {
  PackedI8 p;
  p.n_blocks = (n + 31) / 32 * 2;
  p.k_blocks = (k + 63) / 64;
  p.data.assign(size_t(p.n_blocks * p.k_blocks * 1024), 0);
  p.scale.assign(size_t(p.n_blocks * 16), 1.0f);
  p.colsum.assign(size_t(p.n_blocks * 16), 0);
  std::vector<int8_t> q(static_cast<size_t>(k));
  for (int64_t row = 0; row < n; ++row) {
    float mx = 0;
    for (int64_t j = 0; j < k; ++j) mx = std::max(mx, std::fabs(to_float(w[row * k + j])));
    const float s = mx > 0 ? mx / 127.0f : 1.0f;
    p.scale[size_t(row)] = s;
    int32_t sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += q[size_t(j)] = int8_t(std::lrint(to_float(w[row * k + j]) / s));
    p.colsum[size_t(row)] = sum;
    const int64_t nb = row / 16, c = row % 16;
    for (int64_t j = 0; j < k; ++j)
      p.data[size_t(((nb * p.k_blocks + j / 64) * 16 + (j % 64) / 4) * 64 + c * 4 + j % 4)] = q[size_t(j)];
  }
  return p;
}

// Symmetric per-row quantization into the packed activation layout; returns the row's scale.
float quantize_row(const float* x, int64_t n, int8_t* row_base) {
  float mx = 0;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, std::fabs(x[j]));
  const float s = mx > 0 ? mx / 127.0f : 1.0f, inv = 1.0f / s;
  for (int64_t j = 0; j < n; ++j) row_base[(j / 64) * 1024 + j % 64] = int8_t(std::lrint(x[j] * inv));
  return s;
}

class MoeAmxInt8Cpu : public Base {
 public:
  Support available() const override {
    const CpuInfo& c = cpu_info();
    if (!c.amx_int8) return Support::no("needs AMX-INT8");
    if (!c.avx512_vnni) return Support::no("needs AVX512_VNNI");
    if (std::string why = request_amx_permission(); !why.empty()) return Support::no(why);
    return {};
  }

  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override {
    Base::prepare(model, point, seed);
    const int64_t H = m_.hidden_size, I = m_.moe_intermediate_size, E = p_->shape.experts;
    gate_.assign(size_t(E), {});
    up_.assign(size_t(E), {});
    down_.assign(size_t(E), {});
#pragma omp parallel for schedule(dynamic)
    for (int64_t e = 0; e < E; ++e) {
      if (p_->rows[size_t(e)].empty()) continue;  // only experts that run need int8 copies
      const auto& x = (*p_->experts)[size_t(e)];
      gate_[size_t(e)] = pack_i8(x.gate_proj.data(), I, H);
      up_[size_t(e)] = pack_i8(x.up_proj.data(), I, H);
      down_[size_t(e)] = pack_i8(x.down_proj.data(), H, I);
    }
    crossover_ = amx_crossover(H, I, threads_);
    hk_ = (H + 63) / 64;
    ik_ = (I + 63) / 64;
    h_stride_ = (I + 31) / 32 * 32 + 16;
    y_stride_ = (H + 31) / 32 * 32 + 16;
    use_amx_.assign(size_t(E), 0);
    a_.assign(size_t(E), {});
    h_.assign(size_t(E), {});
    a_scale_.assign(size_t(E), {});
    h_scale_.assign(size_t(E), {});
    hf_.assign(size_t(E), {});
    y_.assign(size_t(E), {});
    gate_up_tasks_.clear();
    down_tasks_.clear();
    max_rows_ = 16;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = int64_t(p_->rows[size_t(e)].size());
      if (m == 0) continue;
      const int64_t rows = padded_rows(m);
      max_rows_ = std::max(max_rows_, rows);
      use_amx_[size_t(e)] = m >= crossover_;
      a_[size_t(e)].assign(size_t(rows * hk_ * 64), 0);
      h_[size_t(e)].assign(size_t(rows * ik_ * 64), 0);
      a_scale_[size_t(e)].assign(size_t(rows), 1.0f);
      h_scale_[size_t(e)].assign(size_t(rows), 1.0f);
      hf_[size_t(e)].assign(size_t(m * h_stride_), 0.0f);
      y_[size_t(e)].assign(size_t(rows * y_stride_), 0.0f);
      for (int64_t nb = 0; nb < gate_[size_t(e)].n_blocks; ++nb) gate_up_tasks_.push_back({int32_t(e), int32_t(nb)});
      for (int64_t nb = 0; nb < down_[size_t(e)].n_blocks; nb += 2) down_tasks_.push_back({int32_t(e), int32_t(nb)});
    }
    any_amx_ = std::find(use_amx_.begin(), use_amx_.end(), 1) != use_amx_.end();
    scratch_.assign(size_t(threads_), std::vector<int32_t>(size_t(max_rows_ * 32)));
    x_float_.assign(size_t(threads_), std::vector<float>(size_t(H)));
  }

  void run() override {
    const int64_t H = m_.hidden_size, I = m_.moe_intermediate_size, E = p_->shape.experts;
    std::atomic<int64_t> next_gate_up{0}, next_down{0};
#pragma omp parallel num_threads(threads_)
    {
      int32_t* c0 = scratch_[size_t(omp_get_thread_num())].data();
      int32_t* c1 = c0 + max_rows_ * 16;
      if (any_amx_) kernels::amx_configure();
      float* xf = x_float_[size_t(omp_get_thread_num())].data();
#pragma omp for schedule(dynamic)
      for (int64_t e = 0; e < E; ++e) {  // gather and quantize each expert's tokens
        const auto& rows = p_->rows[size_t(e)];
        for (size_t r = 0; r < rows.size(); ++r) {
          for (int64_t j = 0; j < H; ++j) xf[j] = to_float(p_->x[size_t(rows[r]) * size_t(H) + size_t(j)]);
          a_scale_[size_t(e)][r] = quantize_row(xf, H, &a_[size_t(e)][(r / 16) * size_t(hk_ * 1024) + (r % 16) * 64]);
        }
      }
      for (int64_t i; (i = next_gate_up.fetch_add(1, std::memory_order_relaxed)) < int64_t(gate_up_tasks_.size());) {
        const auto [e, nb] = gate_up_tasks_[size_t(i)];
        const int64_t m = int64_t(p_->rows[size_t(e)].size());
        const PackedI8 &g = gate_[size_t(e)], &u = up_[size_t(e)];
        const int8_t* a = a_[size_t(e)].data();
        if (use_amx_[size_t(e)])
          kernels::amx_i8_two_blocks(a, padded_rows(m), g.block(nb), u.block(nb), g.k_blocks, c0, c1, 16);
        else
          kernels::vnni_two_blocks(a, m, g.block(nb), u.block(nb), g.k_blocks, &g.colsum[size_t(nb * 16)],
                                   &u.colsum[size_t(nb * 16)], c0, c1, 16);
        kernels::swiglu_i32_block(c0, c1, m, a_scale_[size_t(e)].data(), &g.scale[size_t(nb * 16)],
                                  &u.scale[size_t(nb * 16)], hf_[size_t(e)].data() + nb * 16, h_stride_);
      }
#pragma omp barrier
#pragma omp for schedule(dynamic)
      for (int64_t e = 0; e < E; ++e) {  // the down projection's input, quantized per token
        const int64_t m = int64_t(p_->rows[size_t(e)].size());
        for (int64_t r = 0; r < m; ++r)
          h_scale_[size_t(e)][size_t(r)] = quantize_row(&hf_[size_t(e)][size_t(r * h_stride_)], I,
                                                        &h_[size_t(e)][size_t((r / 16) * ik_ * 1024 + (r % 16) * 64)]);
      }
      for (int64_t i; (i = next_down.fetch_add(1, std::memory_order_relaxed)) < int64_t(down_tasks_.size());) {
        const auto [e, nb] = down_tasks_[size_t(i)];
        const int64_t m = int64_t(p_->rows[size_t(e)].size());
        const PackedI8& d = down_[size_t(e)];
        if (use_amx_[size_t(e)])
          kernels::amx_i8_two_blocks(h_[size_t(e)].data(), padded_rows(m), d.block(nb), d.block(nb + 1), d.k_blocks, c0,
                                     c1, 16);
        else
          kernels::vnni_two_blocks(h_[size_t(e)].data(), m, d.block(nb), d.block(nb + 1), d.k_blocks,
                                   &d.colsum[size_t(nb * 16)], &d.colsum[size_t(nb * 16 + 16)], c0, c1, 16);
        const float* ws = &d.scale[size_t(nb * 16)];
        for (int64_t r = 0; r < m; ++r) {
          const float rs = h_scale_[size_t(e)][size_t(r)];
          float* y = &y_[size_t(e)][size_t(r * y_stride_ + nb * 16)];
          for (int c = 0; c < 16; ++c) {
            y[c] = float(c0[r * 16 + c]) * rs * ws[c];
            y[16 + c] = float(c1[r * 16 + c]) * rs * ws[16 + c];
          }
        }
      }
#pragma omp barrier
      combine([&](int expert, int slot) { return &y_[size_t(expert)][size_t(slot) * size_t(y_stride_)]; });
      if (any_amx_) kernels::amx_release();
    }
  }

  Verification verify() override {
    Verification v = Base::verify();
    v.threshold = 5e-2;  // int8 weights and activations against the bf16-weight reference
    return v;
  }

  std::map<std::string, double> counters() override {
    auto c = Base::counters();
    double amx = 0;
    for (size_t e = 0; e < use_amx_.size(); ++e) amx += use_amx_[e] && !p_->rows[e].empty();
    c["amx_experts"] = amx;
    c["amx_crossover_tokens"] = double(crossover_);
    return c;
  }

  std::string compute_ceiling() const override { return "cpu.amx_int8_ops"; }

  std::vector<std::pair<const void*, size_t>> cold_buffers() const override {  // the reached experts' int8 weights
    std::vector<std::pair<const void*, size_t>> out;
    for (size_t e = 0; e < gate_.size(); ++e)
      if (!p_->rows[e].empty())
        for (const PackedI8* w : {&gate_[e], &up_[e], &down_[e]}) out.emplace_back(w->data.data(), w->data.size());
    return out;
  }

  Cost cost(const ModelFile& model, const Point& point) const override {
    Cost c = Base::cost(model, point);  // same FLOPs; the weights it reads are int8: half the bytes
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const double T = double(shape_of(m, point).tokens), hid = double(m.hidden_size);
    const double weights = c.bytes - T * hid * 6.0;
    c.bytes = weights / 2 + T * hid * 6.0;
    return c;
  }

 private:
  struct Task {
    int32_t expert, block;
  };
  int64_t crossover_ = 0, hk_ = 0, ik_ = 0, h_stride_ = 0, y_stride_ = 0, max_rows_ = 16;
  std::vector<PackedI8> gate_, up_, down_;
  std::vector<char> use_amx_;
  bool any_amx_ = false;
  std::vector<std::vector<float>> x_float_;  // per thread: one token in fp32 before quantization
  std::vector<std::vector<int8_t>> a_, h_;
  std::vector<std::vector<float>> a_scale_, h_scale_, hf_, y_;
  std::vector<Task> gate_up_tasks_, down_tasks_;
  std::vector<std::vector<int32_t>> scratch_;
};

}  // namespace
}  // namespace dslab::moe

using dslab::moe::MoeAmxInt8Cpu;
DSLAB_REGISTER_VARIANT(
    MoeAmxInt8Cpu, "moe/amx_int8/cpu", dslab::Device::cpu,
    "routed experts: INT8 weights (per-row scales), per-token activation scales; AMX-INT8 or AVX-512-VNNI");
