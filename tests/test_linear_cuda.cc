// linear/{own,cublas}/cuda against the fp64 product of the same bf16 values, for every DeepSeek weight shape of
// three models and row counts on both sides of the own GEMV's limit (ctest label `gpu`; skipped without a GPU).
// Also here (no GPU needed): how many warps the GEMV gives one output feature.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/variant.h"
#include "tests/test_util.h"
#ifdef DSLAB_HAVE_CUDA
#include "variants/common/bf16.h"
#include "variants/common/cuda/stream_gemm.h"
#include "variants/common/cuda/blas.h"
#include "variants/reference/reference.h"
#endif

namespace dslab {
namespace {

Point linear_point(const std::string& weight, int64_t tokens) {
  Point p;
  p.set("weight", {weight, 0, false});
  p.set("tokens", {std::to_string(tokens), tokens, true});
  return p;
}

class GpuLinear : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuLinear, MatchesFp64ProductForEveryWeightAndRowCount) {
  const VariantEntry* entry = find_variant(GetParam());
  if (!entry) GTEST_SKIP() << GetParam() << " is not built (no CUDA toolkit at configure time)";
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  const uint64_t seed = test::fresh_seed();
  const std::vector<std::string> weights = {
      "q_proj",          "q_a_proj",       "q_b_proj",         "kv_a_proj_with_mqa",
      "o_proj",          "shared_gate_up", "shared_down_proj", "dense_gate_up",
      "dense_down_proj", "gate",           "lm_head"};
  int checked = 0;
  for (const char* model_name : {"tiny", "deepseek-v2-lite", "deepseek-v3"}) {
    const ModelFile model = load_model_file(model_name);
    for (const std::string& weight : weights) {
      // Every row count the GEMV has a kernel for and two past it (cuBLAS), on the smaller models; V3's weights
      // (and the LM heads) at fewer counts: the fp64 check on the host is the slow part.
      const std::string name = model_name;
      std::vector<int64_t> counts = {1, 2, 3, 33};
      if (name == "deepseek-v3") counts = {1, 2, 3};
      if (weight == "lm_head" && name != "tiny") counts = {3};
      for (int64_t tokens : counts) {
        SCOPED_TRACE(std::string(model_name) + " " + weight + " tokens " + std::to_string(tokens));
        const Point p = linear_point(weight, tokens);
        auto v = entry->make();
        const Support s = v->supports(model, p);
        if (!s.ok) continue;  // q_proj of a q_lora model and the like
        v->prepare(model, p, seed);
        v->run();
        v->run();
        const Verification r = v->verify();
        EXPECT_LE(r.rel_err, r.threshold);
        EXPECT_GT(r.rel_err, 0.0) << "fp32 sums cannot match fp64 exactly: is the output really computed?";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 70);
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuLinear, ::testing::Values("linear/own/cuda", "linear/cublas/cuda"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '/') ch = '_';
                           return n;
                         });

TEST(Linear, UnknownWeightIsBadInput) {
  const VariantEntry* entry = find_variant("linear/own/cuda");
  if (!entry) GTEST_SKIP() << "linear/own/cuda is not built (no CUDA toolkit at configure time)";
  auto v = entry->make();
  EXPECT_THROW(v->supports(load_model_file("tiny"), linear_point("wq", 1)), BadInput);
  EXPECT_FALSE(v->supports(load_model_file("deepseek-v2-lite"), linear_point("q_b_proj", 1)).ok);  // no q_lora_rank
}

#ifdef DSLAB_HAVE_CUDA
TEST(Linear, GemvSplitFillsOneWave) {
  // An H100 holding 32 GEMV warps per SM (4224): V2-Lite's kv_a (576 features, K 2048) gets 4 warps per feature,
  // o_proj (2048) two, q_proj (3072) and the LM head one; a split never leaves a lane without a 16-byte chunk
  // (K 512: at most two warps).
  // Small matrices:
  EXPECT_EQ(gpu::gemv_split(576, 2048, 4224), 4);
  EXPECT_EQ(gpu::gemv_split(2048, 2048, 4224), 2);
  EXPECT_EQ(gpu::gemv_split(3072, 2048, 4224), 1);
  EXPECT_EQ(gpu::gemv_split(102400, 2048, 4224), 1);
  EXPECT_EQ(gpu::gemv_split(64, 512, 4224), 2);
  EXPECT_EQ(gpu::gemv_split(64, 256, 4224), 1);
  EXPECT_EQ(gpu::gemv_split(16, 16384, 4224), 8);  // never more than one CTA per feature
  // Long rows: about one batch of 8 loads per lane, many waves (V3's o_proj: 7168 x 16384; V2-Lite's dense down).
  EXPECT_EQ(gpu::gemv_split(7168, 16384, 4224), 8);
  EXPECT_EQ(gpu::gemv_split(2048, 10944, 4224), 4);
}

// Which shapes dslab's streaming GEMM takes (no GPU needed): a transposed weight against up to 128 rows, K in whole
// 64-wide chunks, 16-byte aligned A and B; K split at most 8 ways (a cluster), two chunks a split at least.
TEST(Linear, StreamGemmTakesDecodeShapesOnly) {
  using namespace gpu;
  auto* w = reinterpret_cast<const void*>(uintptr_t(1) << 20);
  const GemmShape qkv_a =
      gemm_shape(CUBLAS_OP_T, CUBLAS_OP_N, 2112, 64, 7168, w, 7168, 0, w, 7168, 0, w, CUDA_R_32F, 2112, 0, 1, 0.0f);
  EXPECT_TRUE(stream_gemm_fits(qkv_a));
  GemmShape s = qkv_a;
  s.n = 129;  // past two 64-row MMA tiles
  EXPECT_FALSE(stream_gemm_fits(s));
  s = qkv_a;
  s.k = 7168 + 32;  // not whole 64-wide chunks
  s.lda = s.ldb = s.k;
  EXPECT_FALSE(stream_gemm_fits(s));
  s = qkv_a;
  s.op_a = CUBLAS_OP_N;  // absorb_query's layout (the weight MN-major): cuBLASLt's alone
  EXPECT_FALSE(stream_gemm_fits(s));
  s = qkv_a;
  s.alignment = 8;
  EXPECT_FALSE(stream_gemm_fits(s));
  // absorb_output's per-head product (V3, 16 heads): batches along A's rows and B's columns
  const GemmShape absorb_o = gemm_shape(CUBLAS_OP_T, CUBLAS_OP_N, 128, 64, 512, w, 512, 256 * 512, w, 16 * 512, 512, w,
                                        CUDA_R_16BF, 16 * 128, 128, 16, 0.0f);
  EXPECT_TRUE(stream_gemm_fits(absorb_o));
  EXPECT_TRUE(stream_gemm_splits_ok(qkv_a, 8));     // 112 chunks
  EXPECT_FALSE(stream_gemm_splits_ok(qkv_a, 16));   // past a portable cluster
  EXPECT_TRUE(stream_gemm_splits_ok(absorb_o, 4));  // 8 chunks, two a split
  EXPECT_FALSE(stream_gemm_splits_ok(absorb_o, 8));
}

// linear_pair over V2-Lite's stacked q_proj (bf16 out) and kv_a_proj_with_mqa (fp32 out): each output against the
// fp64 product, with the own GEMV (1 and 2 rows: one launch for both) and past it (3 rows: cuBLAS, two GEMMs).
TEST(GpuLinearPair, StackedProjectionsMatchFp64) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  using namespace gpu;
  const int64_t in = 2048, out1 = 16 * 192, out2 = 576;
  const uint64_t seed = test::fresh_seed();
  const std::vector<bf16> w = ref::random_bf16(seed, "w", size_t((out1 + out2) * in), 0.02f);
  for (int64_t rows : {1, 2, 3}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const std::vector<bf16> x = ref::random_bf16(seed + uint64_t(rows), "x", size_t(rows * in), 1.0f);
    DeviceArray<__nv_bfloat16> dx, dw, y1(size_t(rows * out1));
    DeviceArray<float> y2(size_t(rows * out2));
    dx.upload(x);
    dw.upload(w);
    y1.fill_bytes(0xFF), y2.fill_bytes(0xFF);  // NaN until written
    BlasHandle h;
    h.set_projections(Projections::own);
    linear_pair(h, dx.get(), rows, in, dw.get(), out1, y1.get(), CUDA_R_16BF, out2, y2.get());
    DSLAB_CUDA(cudaDeviceSynchronize());
    std::vector<bf16> got1(size_t(rows * out1));
    std::vector<float> got2(size_t(rows * out2));
    DSLAB_CUDA(cudaMemcpy(got1.data(), y1.get(), got1.size() * 2, cudaMemcpyDeviceToHost));
    DSLAB_CUDA(cudaMemcpy(got2.data(), y2.get(), got2.size() * 4, cudaMemcpyDeviceToHost));
    double err1 = 0, norm1 = 0, err2 = 0, norm2 = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = 0; n < out1 + out2; ++n) {
        double want = 0;
        for (int64_t k = 0; k < in; ++k)
          want += double(to_float(x[size_t(r * in + k)])) * double(to_float(w[size_t(n * in + k)]));
        const double got =
            n < out1 ? double(to_float(got1[size_t(r * out1 + n)])) : double(got2[size_t(r * out2 + n - out1)]);
        (n < out1 ? err1 : err2) += (got - want) * (got - want);
        (n < out1 ? norm1 : norm2) += want * want;
      }
    EXPECT_LE(std::sqrt(err1 / norm1), 1e-2);  // bf16 output
    EXPECT_LE(std::sqrt(err2 / norm2), 1e-5);  // fp32 output
    EXPECT_GT(std::sqrt(err2 / norm2), 0.0) << "fp32 sums cannot match fp64 exactly: is the output really computed?";
  }
}

// bf16 values as floats, and the fp64 product x [rows][in] · w [out][in]^T of bf16 values, [rows][out]: what the
// GEMM tests below compare against.
std::vector<float> floats_of(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = to_float(v[i]);
  return f;
}
std::vector<double> fp64_linear(const std::vector<bf16>& x, const std::vector<bf16>& w, int64_t rows, int64_t in,
                                int64_t out) {
  std::vector<double> product(size_t(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < out; ++n) {
      double sum = 0;
      for (int64_t k = 0; k < in; ++k)
        sum += double(to_float(x[size_t(r * in + k)])) * double(to_float(w[size_t(n * in + k)]));
      product[size_t(r * out + n)] = sum;
    }
  return product;
}
// linear() without accumulation into the bf16 `y` (first filled with 0xFF bytes: NaN wherever nothing is written),
// read back: its relative L2 error against `want`.
double bf16_linear_rel_err(gpu::BlasHandle& h, const __nv_bfloat16* x, int64_t rows, int64_t in, const __nv_bfloat16* w,
                           int64_t out, gpu::DeviceArray<__nv_bfloat16>& y, const std::vector<double>& want) {
  y.fill_bytes(0xFF);
  gpu::linear(h, x, rows, in, w, out, y.get(), CUDA_R_16BF);
  std::vector<bf16> got(y.size());
  DSLAB_CUDA(cudaDeviceSynchronize());
  DSLAB_CUDA(cudaMemcpy(got.data(), y.get(), got.size() * 2, cudaMemcpyDeviceToHost));
  return ref::relative_l2_error(floats_of(got).data(), want.data(), want.size());
}

// The own projections' GEMM past kGemvRows (cuBLASLt, tuned per shape on first use): an accumulating call (beta 1)
// adds to what the caller's output held - tuning times its candidates into a scratch buffer, not into y - and a
// second call reuses the choice; a handle whose first call for a shape is inside a graph capture runs cuBLASLt's
// heuristic pick there (no tuning: it would synchronise) and the replayed graph is still right.
TEST(GpuTunedGemm, AccumulatesIntoTheCallersOutputAndCapturesUntuned) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  using namespace gpu;
  const int64_t rows = 16, in = 1024, out = 768;
  const uint64_t seed = test::fresh_seed();
  const std::vector<bf16> w = ref::random_bf16(seed, "w", size_t(out * in), 0.03f);
  const std::vector<bf16> x = ref::random_bf16(seed, "x", size_t(rows * in), 1.0f);
  const std::vector<float> y0 = floats_of(ref::random_bf16(seed, "y0", size_t(rows * out), 1.0f));
  const std::vector<double> product = fp64_linear(x, w, rows, in, out);
  DeviceArray<__nv_bfloat16> dx, dw;
  dx.upload(x);
  dw.upload(w);
  DeviceArray<float> y;
  const auto error_after = [&](double times) {
    std::vector<float> got(size_t(rows * out));
    DSLAB_CUDA(cudaDeviceSynchronize());
    DSLAB_CUDA(cudaMemcpy(got.data(), y.get(), got.size() * 4, cudaMemcpyDeviceToHost));
    double err = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double want = double(y0[i]) + times * product[i];
      err += (double(got[i]) - want) * (double(got[i]) - want);
      norm += want * want;
    }
    return std::sqrt(err / norm);
  };
  // Every way of running it (0: whichever tuning picks; 1: cuBLASLt's kernels alone; 2 and 4: K slices summed by ours).
  for (int slices : {0, 1, 2, 4}) {
    SCOPED_TRACE("slices " + std::to_string(slices));
    BlasHandle h;
    h.set_projections(Projections::own);
    h.tuner().only_slices(slices);
    y.upload(y0);
    linear(h, dx.get(), rows, in, dw.get(), out, y.get(), CUDA_R_32F, 1.0f);
    EXPECT_LE(error_after(1), 1e-5);
    EXPECT_GT(error_after(1), 0.0) << "fp32 sums cannot match fp64 exactly: is the output really computed?";
    const GemmShape tuned_shape = linear_gemm_shape(dx.get(), rows, in, dw.get(), out, y.get(), CUDA_R_32F, 1.0f);
    const TunedChoice* choice = h.tuner().choice(tuned_shape);
    ASSERT_NE(choice, nullptr) << "an eager first call tunes";
    EXPECT_GE(choice->candidates, 1);
    EXPECT_GT(choice->tuned_us, 0.0);
    EXPECT_LE(choice->tuned_us, choice->heuristic_us)
        << "the first candidate is a candidate: the fastest is at most its time";
    if (slices != 0) EXPECT_EQ(choice->k_slices, slices);
    linear(h, dx.get(), rows, in, dw.get(), out, y.get(), CUDA_R_32F, 1.0f);
    EXPECT_LE(error_after(2), 1e-5);
  }
  {  // bf16 output through the slices' sum (q_b's and the absorbs' type), no accumulation
    BlasHandle h;
    h.set_projections(Projections::own);
    h.tuner().only_slices(4);
    DeviceArray<__nv_bfloat16> yb(size_t(rows * out));
    EXPECT_LE(bf16_linear_rel_err(h, dx.get(), rows, in, dw.get(), out, yb, product), 1e-2);
    EXPECT_EQ(
        h.tuner().choice(linear_gemm_shape(dx.get(), rows, in, dw.get(), out, yb.get(), CUDA_R_16BF, 0.0f))->k_slices,
        4);
  }
  {
    BlasHandle h;
    h.set_projections(Projections::own);
    y.upload(y0);
    cudaStream_t stream{};
    DSLAB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    h.set_stream(stream);
    cudaGraph_t graph{};
    cudaGraphExec_t exec{};
    DSLAB_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    linear(h, dx.get(), rows, in, dw.get(), out, y.get(), CUDA_R_32F, 1.0f);
    DSLAB_CUDA(cudaStreamEndCapture(stream, &graph));
    DSLAB_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    EXPECT_EQ(h.tuner().choice(linear_gemm_shape(dx.get(), rows, in, dw.get(), out, y.get(), CUDA_R_32F, 1.0f)),
              nullptr)
        << "no tuning inside a capture";
    DSLAB_CUDA(cudaGraphLaunch(exec, stream));
    DSLAB_CUDA(cudaStreamSynchronize(stream));
    EXPECT_LE(error_after(1), 1e-5);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// linear_unsummed (the MLA step's qkv_a, whose K slices the norm kernel adds up): with K cut into 2 or 4 slices
// the partials come back unsummed (their sum the product; the caller's y left as it was); unsliced, y itself; and
// inside a capture (untuned) y itself too. Each against fp64.
TEST(GpuTunedGemm, UnsummedSlicesAddUpToTheProduct) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  using namespace gpu;
  const int64_t rows = 24, in = 2048, out = 320;
  const uint64_t seed = test::fresh_seed();
  const std::vector<bf16> w = ref::random_bf16(seed, "w", size_t(out * in), 0.03f);
  const std::vector<bf16> x = ref::random_bf16(seed, "x", size_t(rows * in), 1.0f);
  const std::vector<double> product = fp64_linear(x, w, rows, in, out);
  DeviceArray<__nv_bfloat16> dx, dw;
  dx.upload(x);
  dw.upload(w);
  DeviceArray<float> y(size_t(rows * out));
  // The sum of the returned slices, read back, against fp64.
  const auto error_of = [&](const KSlices& k) {
    std::vector<float> parts(size_t(k.count) * size_t(rows * out));
    DSLAB_CUDA(cudaDeviceSynchronize());
    for (int s = 0; s < k.count; ++s)
      DSLAB_CUDA(cudaMemcpy(parts.data() + size_t(s) * size_t(rows * out), k.data + s * k.stride,
                            size_t(rows * out) * 4, cudaMemcpyDeviceToHost));
    std::vector<float> sum(size_t(rows * out), 0.0f);
    for (int s = 0; s < k.count; ++s)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += parts[size_t(s) * sum.size() + i];
    return ref::relative_l2_error(sum.data(), product.data(), product.size());
  };
  for (int slices : {1, 2, 4}) {
    SCOPED_TRACE("slices " + std::to_string(slices));
    BlasHandle h;
    h.set_projections(Projections::own);
    h.tuner().only_slices(slices);
    y.fill_bytes(0xFF);  // (NaN: a sliced run must not need it, an unsliced one must overwrite it)
    const KSlices k = linear_unsummed(h, dx.get(), rows, in, dw.get(), out, y.get());
    EXPECT_EQ(k.count, slices);
    if (slices == 1)
      EXPECT_EQ(k.data, y.get());
    else
      EXPECT_EQ(k.stride, rows * out);
    const double err = error_of(k);
    EXPECT_LE(err, 1e-5);
    EXPECT_GT(err, 0.0) << "fp32 sums cannot match fp64 exactly: is the output really computed?";
    EXPECT_EQ(error_of(linear_unsummed(h, dx.get(), rows, in, dw.get(), out, y.get())), err)
        << "a second call runs the same way";
  }
  {
    BlasHandle h;
    h.set_projections(Projections::own);
    cudaStream_t stream{};
    DSLAB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    h.set_stream(stream);
    cudaGraph_t graph{};
    cudaGraphExec_t exec{};
    y.fill_bytes(0xFF);
    DSLAB_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const KSlices k = linear_unsummed(h, dx.get(), rows, in, dw.get(), out, y.get());
    DSLAB_CUDA(cudaStreamEndCapture(stream, &graph));
    DSLAB_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    DSLAB_CUDA(cudaGraphLaunch(exec, stream));
    DSLAB_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(k.count, 1) << "untuned inside a capture: cuBLASLt's first pick, into y";
    EXPECT_LE(error_of(k), 1e-5);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// A whole fused MLA step (V3, 16 heads, 8 requests, graph-replayed) with every projection that allows it cut into
// 2, 4 or 8 K slices (GemmTuner::slice_everywhere_for_tests; counts the tuner itself tries): qkv_a's partials are
// added up by the norm kernel (one instantiation per count), q_b's and o_proj's by the sum kernel where they slice;
// each against the fp64 reference. (Without the restriction the tuner picks by time: which path a step takes would
// be the GPU's to decide.)
TEST(GpuTunedGemm, MlaStepWithSlicedProjectionsMatchesReference) {
  const VariantEntry* entry = find_variant("mla/fused/cuda");
  if (!entry) GTEST_SKIP() << "mla/fused/cuda is not built";
  if (Support a = entry->make()->available(); !a.ok) GTEST_SKIP() << a.reason;
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  struct Restore {
    ~Restore() { gpu::GemmTuner::slice_everywhere_for_tests(0); }
  } restore;
  const ModelFile model = load_model_file("deepseek-v3");
  Point p;
  for (const auto& [axis, value] : std::vector<std::pair<std::string, int64_t>>{
           {"batch", 8}, {"q_len", 1}, {"kv_len", 300}, {"heads", 16}, {"page_size", 64}})
    p.set(axis, {std::to_string(value), value, true});
  for (const auto& [axis, value] : std::vector<std::pair<std::string, std::string>>{
           {"len_dist", "mixed"}, {"kv_dtype", "bf16"}, {"executor", "graph"}, {"kv_splits", "auto"}, {"proj", "own"}})
    p.set(axis, {value, 0, false});
  for (int slices : {2, 4, 8}) {
    SCOPED_TRACE("K slices " + std::to_string(slices));
    gpu::GemmTuner::slice_everywhere_for_tests(slices);
    auto v = entry->make();
    ASSERT_TRUE(v->supports(model, p).ok);
    v->prepare(model, p, test::fresh_seed());
    v->run();
    v->run();
    const Verification check = v->verify();
    EXPECT_LE(check.rel_err, 1e-2);
    EXPECT_GT(check.rel_err, 0.0) << "bf16 arithmetic cannot match fp64 exactly: is the output really computed?";
  }
}

// stream_gemm (our weight-streaming GEMM, a tuning candidate) forced through GemmTuner::only_own: one and two 64-row
// slabs (16, 64, 65 and 128 rows), a feature count that leaves a partial 128-feature tile, K whole and split 2-4 ways
// (partials summed), fp32 accumulating (beta 1) and bf16 outputs, and a batched per-head product laid out as
// MlaOp's absorb_output (W_UV inside kv_b_proj, o_lat rows [t][h][rank], out [t][h][vd]); each against fp64.
TEST(GpuTunedGemm, OwnStreamingKernelMatchesFp64) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  using namespace gpu;
  const uint64_t seed = test::fresh_seed();
  const int64_t in = 512, out = 200;
  const std::vector<bf16> w = ref::random_bf16(seed, "w", size_t(out * in), 0.05f);
  DeviceArray<__nv_bfloat16> dw;
  dw.upload(w);
  for (int64_t rows : {16, 64, 65, 128}) {
    const std::vector<bf16> x = ref::random_bf16(seed + uint64_t(rows), "x", size_t(rows * in), 1.0f);
    const std::vector<float> y0 = floats_of(ref::random_bf16(seed + uint64_t(rows), "y0", size_t(rows * out), 1.0f));
    const std::vector<double> product = fp64_linear(x, w, rows, in, out);
    DeviceArray<__nv_bfloat16> dx;
    dx.upload(x);
    for (int splits : {1, 2, 4}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " splits " + std::to_string(splits));
      BlasHandle h;
      h.set_projections(Projections::own);
      h.tuner().only_own(splits);
      DeviceArray<float> y;
      y.upload(y0);
      linear(h, dx.get(), rows, in, dw.get(), out, y.get(), CUDA_R_32F, 1.0f);
      std::vector<float> got(y0.size());
      DSLAB_CUDA(cudaDeviceSynchronize());
      DSLAB_CUDA(cudaMemcpy(got.data(), y.get(), got.size() * 4, cudaMemcpyDeviceToHost));
      std::vector<double> want(product.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = double(y0[i]) + product[i];
      const double err = ref::relative_l2_error(got.data(), want.data(), want.size());
      EXPECT_LE(err, 1e-5);
      EXPECT_GT(err, 0.0) << "fp32 sums cannot match fp64 exactly: is the output really computed?";
      const TunedChoice* choice =
          h.tuner().choice(linear_gemm_shape(dx.get(), rows, in, dw.get(), out, y.get(), CUDA_R_32F, 1.0f));
      ASSERT_NE(choice, nullptr);
      EXPECT_TRUE(choice->own_kernel);
      EXPECT_EQ(choice->k_slices, splits);
      if (splits == 2) {  // bf16 output, no accumulation
        DeviceArray<__nv_bfloat16> yb(size_t(rows * out));
        EXPECT_LE(bf16_linear_rel_err(h, dx.get(), rows, in, dw.get(), out, yb, product), 1e-2);
      }
    }
  }
  {  // absorb_output's per-head product: heads 4, nope 64, v_head_dim 128, rank 256, 5 tokens, bf16 out
    const int64_t heads = 4, nope = 64, vd = 128, rank = 256, tokens = 5, per_head = (nope + vd) * rank;
    const std::vector<bf16> kv_b = ref::random_bf16(seed, "kv_b", size_t(heads * per_head), 0.05f);
    const std::vector<bf16> o_lat = ref::random_bf16(seed, "o_lat", size_t(tokens * heads * rank), 1.0f);
    DeviceArray<__nv_bfloat16> dkv, dlat, dattn(size_t(tokens * heads * vd));
    dkv.upload(kv_b);
    dlat.upload(o_lat);
    dattn.fill_bytes(0xFF);
    BlasHandle h;
    h.set_projections(Projections::own);
    h.tuner().only_own(1);
    gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, vd, tokens, rank, dkv.get() + nope * rank, rank, per_head, dlat.get(),
         heads * rank, rank, dattn.get(), CUDA_R_16BF, heads * vd, vd, heads);
    std::vector<bf16> got(dattn.size());
    DSLAB_CUDA(cudaDeviceSynchronize());
    DSLAB_CUDA(cudaMemcpy(got.data(), dattn.get(), got.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<double> want(got.size());
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t hd = 0; hd < heads; ++hd)
        for (int64_t v = 0; v < vd; ++v) {
          double sum = 0;
          for (int64_t k = 0; k < rank; ++k)
            sum += double(to_float(o_lat[size_t((t * heads + hd) * rank + k)])) *
                   double(to_float(kv_b[size_t(hd * per_head + (nope + v) * rank + k)]));
          const size_t at = size_t((t * heads + hd) * vd + v);
          want[at] = sum;
        }
    EXPECT_LE(ref::relative_l2_error(floats_of(got).data(), want.data(), want.size()), 1e-2);
    const GemmShape shape =
        gemm_shape(CUBLAS_OP_T, CUBLAS_OP_N, vd, tokens, rank, dkv.get() + nope * rank, rank, per_head, dlat.get(),
                   heads * rank, rank, dattn.get(), CUDA_R_16BF, heads * vd, vd, heads, 0.0f);
    ASSERT_NE(h.tuner().choice(shape), nullptr);
    EXPECT_TRUE(h.tuner().choice(shape)->own_kernel);
  }
}

// batched_gemv, both weight layouts, at the absorbed forms' shapes (heads x nope x rank x v_head_dim of tiny, V2-Lite
// and V3), x and y strided as MlaOp lays them out ([t][h][...] rows): every output against the fp64 product; past
// kGemvRows rows, or with cuBLAS projections, it declines (false) and writes nothing.
TEST(GpuBatchedGemv, PerHeadProductsMatchFp64InBothLayouts) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  using namespace gpu;
  const uint64_t seed = test::fresh_seed();
  struct Shape {
    int64_t heads, nope, rank, vd;
  };
  for (const Shape& sh : {Shape{4, 16, 32, 16}, Shape{16, 128, 512, 128}, Shape{128, 128, 512, 128}}) {
    // kv_b_proj as MlaOp holds it: per head [nope][rank] (W_UK) then [vd][rank] (W_UV)
    const int64_t per_head = (sh.nope + sh.vd) * sh.rank;
    const std::vector<bf16> w = ref::random_bf16(seed, "kv_b", size_t(sh.heads * per_head), 0.05f);
    DeviceArray<__nv_bfloat16> dw;
    dw.upload(w);
    for (bool k_major : {true, false}) {
      // k_major (W_UK): x = q_nope inside q [t][h][nope + 8], out [t][h][rank + 8]; else (W_UV): x = o_lat
      // [t][h][rank], out [t][h][vd]
      const int64_t K = k_major ? sh.nope : sh.rank, N = k_major ? sh.rank : sh.vd;
      const int64_t x_head = k_major ? sh.nope + 8 : sh.rank, y_head = k_major ? sh.rank + 8 : sh.vd;
      const __nv_bfloat16* wp = dw.get() + (k_major ? 0 : sh.nope * sh.rank);
      for (int64_t rows : {1, 2, 3}) {
        SCOPED_TRACE("heads " + std::to_string(sh.heads) + (k_major ? " W_UK" : " W_UV") + " rows " +
                     std::to_string(rows));
        const std::vector<bf16> x =
            ref::random_bf16(seed + uint64_t(rows), "x", size_t(rows * sh.heads * x_head), 1.0f);
        DeviceArray<__nv_bfloat16> dx, dy(size_t(rows * sh.heads * y_head));
        dx.upload(x);
        dy.fill_bytes(0xFF);  // NaN until written
        BlasHandle h;
        const BatchedGemv g{dx.get(), sh.heads * x_head, x_head, K, wp, per_head, N, k_major,
                            dy.get(), sh.heads * y_head, y_head};
        EXPECT_FALSE(batched_gemv(h, g, rows, sh.heads)) << "a new handle's projections are cublas";
        h.set_projections(Projections::own);
        const bool ran = batched_gemv(h, g, rows, sh.heads);
        EXPECT_EQ(ran, rows <= kGemvRows);
        DSLAB_CUDA(cudaDeviceSynchronize());
        if (!ran) continue;
        std::vector<bf16> got(dy.size());
        DSLAB_CUDA(cudaMemcpy(got.data(), dy.get(), got.size() * 2, cudaMemcpyDeviceToHost));
        const bf16* wh = w.data() + (k_major ? 0 : sh.nope * sh.rank);
        double err = 0, norm = 0;
        int64_t untouched = 0;
        for (int64_t t = 0; t < rows; ++t)
          for (int64_t hd = 0; hd < sh.heads; ++hd) {
            for (int64_t n = 0; n < N; ++n) {
              double want = 0;
              for (int64_t k = 0; k < K; ++k) {
                const bf16 wv = wh[size_t(hd * per_head + (k_major ? k * N + n : n * K + k))];
                want += double(to_float(x[size_t((t * sh.heads + hd) * x_head + k)])) * double(to_float(wv));
              }
              const double gv = double(to_float(got[size_t((t * sh.heads + hd) * y_head + n)]));
              err += (gv - want) * (gv - want);
              norm += want * want;
            }
            for (int64_t n = N; n < y_head; ++n)
              untouched += std::isnan(to_float(got[size_t((t * sh.heads + hd) * y_head + n)])) ? 1 : 0;
          }
        EXPECT_LE(std::sqrt(err / norm), 1e-2);  // bf16 output
        EXPECT_EQ(untouched, rows * sh.heads * (y_head - N)) << "wrote outside its rows";
      }
    }
  }
}
#endif

}  // namespace
}  // namespace dslab
