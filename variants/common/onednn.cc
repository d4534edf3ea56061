#include "variants/common/onednn.h"

#include "variants/common/bf16.h"

namespace dslab::onednn {

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& cpu_stream() {
  static dnnl::stream s(cpu_engine());
  return s;
}

View dense(int64_t rows, int64_t cols, dt type, int64_t batch) {
  return View{batch, rows, cols, rows * cols, cols, 1, type};
}

bool bf16_matmul_native() {
  static const bool native = [] {
    try {
      const dnnl::memory::desc one({1, 1}, dt::bf16, dnnl::memory::format_tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(one, one, one), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

namespace {
dnnl::memory::desc md(const View& v) {
  return dnnl::memory::desc({v.batch, v.rows, v.cols}, v.type, {v.batch_stride, v.row_stride, v.col_stride});
}
// The fp32 fallback's operand: a bf16 view as a dense fp32 one (an fp32 view stays as it is, strides and all).
View widened(const View& v) { return v.type == dt::bf16 ? dense(v.rows, v.cols, dt::f32, v.batch) : v; }
// Gathers (into dense fp32) or scatters (from it, rounded to bf16) a bf16 view's elements.
void gather(const View& v, const bf16* in, std::vector<float>* out) {
  out->resize(size_t(v.batch * v.rows * v.cols));
  float* o = out->data();
  for (int64_t b = 0; b < v.batch; ++b)
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t c = 0; c < v.cols; ++c)
        *o++ = to_float(in[b * v.batch_stride + r * v.row_stride + c * v.col_stride]);
}
void scatter(const View& v, const std::vector<float>& in, bf16* out) {
  const float* i = in.data();
  for (int64_t b = 0; b < v.batch; ++b)
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t c = 0; c < v.cols; ++c)
        out[b * v.batch_stride + r * v.row_stride + c * v.col_stride] = to_bf16(*i++);
}
}  // namespace

Linear::Linear(int64_t M, int64_t K, int64_t N, const void* weight, dt out_type) {
  widened_ = !bf16_matmul_native();
  out_type_ = out_type, m_ = M, k_ = K, n_ = N;
  const dt in = widened_ ? dt::f32 : dt::bf16;
  x_md_ = dnnl::memory::desc({M, K}, in, dnnl::memory::format_tag::ab);
  y_md_ = dnnl::memory::desc({M, N}, widened_ ? dt::f32 : out_type, dnnl::memory::format_tag::ab);
  const dnnl::memory::desc w_any({K, N}, in, dnnl::memory::format_tag::any);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_md_, w_any, y_md_), cpu_engine());
  prim_ = dnnl::matmul(pd);
  // W [N][K] row-major is W^T [K][N] with format "ba".
  std::vector<float> w32;
  if (widened_) gather(dense(N, K, dt::bf16), static_cast<const bf16*>(weight), &w32);
  dnnl::memory plain({{K, N}, in, dnnl::memory::format_tag::ba}, cpu_engine(),
                     widened_ ? static_cast<void*>(w32.data()) : const_cast<void*>(weight));
  packed_ = dnnl::memory(pd.weights_desc(), cpu_engine());
  dnnl::reorder(plain, packed_).execute(cpu_stream(), plain, packed_);
  cpu_stream().wait();
}

void Linear::run(const void* x, void* y) const {
  if (widened_) {
    gather(dense(m_, k_, dt::bf16), static_cast<const bf16*>(x), &x32_);
    x = x32_.data();
    if (out_type_ == dt::bf16) y32_.resize(size_t(m_ * n_));
  }
  void* out = widened_ && out_type_ == dt::bf16 ? static_cast<void*>(y32_.data()) : y;
  dnnl::memory xm(x_md_, cpu_engine(), const_cast<void*>(x)), ym(y_md_, cpu_engine(), out);
  prim_.execute(cpu_stream(), {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, packed_}, {DNNL_ARG_DST, ym}});
  cpu_stream().wait();
  if (out != y) scatter(dense(m_, n_, dt::bf16), y32_, static_cast<bf16*>(y));
}

Matmul::Matmul(const View& a, const View& b, const View& c, bool accumulate) {
  widened_ = !bf16_matmul_native() && (a.type == dt::bf16 || b.type == dt::bf16 || c.type == dt::bf16);
  a_ = a, b_ = b, c_ = c, accumulate_ = accumulate;
  a_md_ = md(widened_ ? widened(a) : a);
  b_md_ = md(widened_ ? widened(b) : b);
  c_md_ = md(widened_ ? widened(c) : c);
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  prim_ = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md_, b_md_, c_md_), attr, cpu_engine()));
}

void Matmul::run(const void* a, const void* b, void* c) const {
  void* c_run = c;
  if (widened_) {
    if (a_.type == dt::bf16) gather(a_, static_cast<const bf16*>(a), &a32_), a = a32_.data();
    if (b_.type == dt::bf16) gather(b_, static_cast<const bf16*>(b), &b32_), b = b32_.data();
    if (c_.type == dt::bf16) {
      if (accumulate_)
        gather(c_, static_cast<const bf16*>(c), &c32_);
      else
        c32_.resize(size_t(c_.batch * c_.rows * c_.cols));
      c_run = c32_.data();
    }
  }
  dnnl::memory am(a_md_, cpu_engine(), const_cast<void*>(a)), bm(b_md_, cpu_engine(), const_cast<void*>(b)),
      cm(c_md_, cpu_engine(), c_run);
  prim_.execute(cpu_stream(), {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  cpu_stream().wait();
  if (c_run != c) scatter(c_, c32_, static_cast<bf16*>(c));
}

}  // namespace dslab::onednn
