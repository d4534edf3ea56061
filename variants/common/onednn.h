// oneDNN matmuls as the CPU variants use them: a Linear with weights packed once in prepare(), and a
// strided batched matmul for views into caches (transposes and head strides without copies).
#pragma once
#include <cstdint>

#include <oneapi/dnnl/dnnl.hpp>

namespace dslab::onednn {

using dt = dnnl::memory::data_type;

dnnl::engine& cpu_engine();
dnnl::stream& cpu_stream();

// A [batch][rows][cols] view of a buffer; strides in elements. batch == 1 with a batched partner broadcasts.
struct View {
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t batch_stride = 0, row_stride = 0, col_stride = 1;
  dt type = dt::bf16;
};
// Row-major [rows][cols], optionally `batch` of them back to back.
View dense(int64_t rows, int64_t cols, dt type, int64_t batch = 1);

// y[M][N] = x[M][K] · W^T with W an nn.Linear weight [N][K] (bf16), reordered once into oneDNN's
// preferred blocked layout (AMX/VNNI) so run() never repacks it.
class Linear {
 public:
  Linear() = default;
  Linear(int64_t M, int64_t K, int64_t N, const void* weight, dt out_type);
  void run(const void* x, void* y) const;

 private:
  dnnl::matmul prim_;
  dnnl::memory::desc x_md_, y_md_;
  dnnl::memory packed_;
};

// C = A · B (+ C if accumulate), batched over the views' batch dimension.
class Matmul {
 public:
  Matmul() = default;
  Matmul(const View& a, const View& b, const View& c, bool accumulate = false);
  void run(const void* a, const void* b, void* c) const;

 private:
  dnnl::matmul prim_;
  dnnl::memory::desc a_md_, b_md_, c_md_;
};

}  // namespace dslab::onednn
