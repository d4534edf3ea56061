// oneDNN matmuls as the CPU variants use them: a Linear with weights packed once in prepare(), and a
// strided batched matmul for views into caches (transposes and head strides without copies).
//
// oneDNN 2.x (Debian's) has bf16 matmuls only from AVX-512 up. On a CPU without (AVX2 hosts), both classes run the
// same products in fp32 on the bf16 operands widened as they run, and round a bf16 output once: the same results
// within bf16 rounding, slower (the widened copies), so the CPU forms still run and verify everywhere.
#pragma once
#include <cstdint>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

namespace dslab::onednn {

using dt = dnnl::memory::data_type;

dnnl::engine& cpu_engine();
dnnl::stream& cpu_stream();

// Whether this CPU's oneDNN has bf16 matmuls (probed once); without, the fp32 fallback above.
bool bf16_matmul_native();

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
  // (fp32 fallback) x widened, and the fp32 output of a bf16 y
  bool widened_ = false;
  dt out_type_ = dt::f32;
  int64_t m_ = 0, k_ = 0, n_ = 0;
  mutable std::vector<float> x32_, y32_;
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
  // (fp32 fallback) each bf16 view gathered into a dense fp32 copy; C's copy written back rounded
  View a_, b_, c_;
  bool accumulate_ = false, widened_ = false;
  mutable std::vector<float> a32_, b32_, c32_;
};

}  // namespace dslab::onednn
