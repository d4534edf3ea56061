#include "variants/common/onednn.h"

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

namespace {
dnnl::memory::desc md(const View& v) {
  return dnnl::memory::desc({v.batch, v.rows, v.cols}, v.type, {v.batch_stride, v.row_stride, v.col_stride});
}
}  // namespace

Linear::Linear(int64_t M, int64_t K, int64_t N, const void* weight, dt out_type) {
  x_md_ = dnnl::memory::desc({M, K}, dt::bf16, dnnl::memory::format_tag::ab);
  y_md_ = dnnl::memory::desc({M, N}, out_type, dnnl::memory::format_tag::ab);
  const dnnl::memory::desc w_any({K, N}, dt::bf16, dnnl::memory::format_tag::any);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_md_, w_any, y_md_), cpu_engine());
  prim_ = dnnl::matmul(pd);
  // W [N][K] row-major is W^T [K][N] with format "ba".
  dnnl::memory plain({{K, N}, dt::bf16, dnnl::memory::format_tag::ba}, cpu_engine(), const_cast<void*>(weight));
  packed_ = dnnl::memory(pd.weights_desc(), cpu_engine());
  dnnl::reorder(plain, packed_).execute(cpu_stream(), plain, packed_);
  cpu_stream().wait();
}

void Linear::run(const void* x, void* y) const {
  dnnl::memory xm(x_md_, cpu_engine(), const_cast<void*>(x)), ym(y_md_, cpu_engine(), y);
  prim_.execute(cpu_stream(), {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, packed_}, {DNNL_ARG_DST, ym}});
  cpu_stream().wait();
}

Matmul::Matmul(const View& a, const View& b, const View& c, bool accumulate) {
  a_md_ = md(a);
  b_md_ = md(b);
  c_md_ = md(c);
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  prim_ = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md_, b_md_, c_md_), attr, cpu_engine()));
}

void Matmul::run(const void* a, const void* b, void* c) const {
  dnnl::memory am(a_md_, cpu_engine(), const_cast<void*>(a)), bm(b_md_, cpu_engine(), const_cast<void*>(b)),
      cm(c_md_, cpu_engine(), c);
  prim_.execute(cpu_stream(), {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  cpu_stream().wait();
}

}  // namespace dslab::onednn
