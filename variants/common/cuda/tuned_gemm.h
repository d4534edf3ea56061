// cuBLASLt GEMMs whose algorithm is chosen by timing, per shape, on the GPU they run on (as PyTorch's TunableOp
// and serving engines' tuned GEMM configs do): at decode sizes (16-128 rows of a 7168-wide input) cuBLAS's default
// heuristic picks a tile with too few CTAs for the weight to stream at HBM speed (on the H100: q_a_proj
// at 64 rows 14.8 us, 1.5 TB/s: 12 column tiles, split in 2-3 along K, 24-36 of 132 SMs). The candidates are
// cuBLASLt's own heuristic list, split-K variants of the algorithms that allow it, and - for an unbatched GEMM -
// K cut into 2-16 slices run as one strided-batched GEMM into fp32 partials that a kernel of ours sums into C (so
// the weight streams through slices x tiles CTAs), and our own weight-streaming GEMM (stream_gemm.h: up to 128 rows,
// K split 1-8 ways, launched with programmatic dependent launch); each is timed from a flushed L2 (with its sum, but
// for gemm_unsummed's shapes, whose caller adds the slices up), the fastest kept for the process.
#pragma once

#include <cublasLt.h>
#include <cuda.h>  // CUtensorMap
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <memory>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

namespace dslab::gpu {

// stream_gemm's (stream_gemm.h) tensor maps of one (A, B) pair, encoded on first use and again when the pointers
// change.
struct StreamGemmMaps {
  const void* a = nullptr;
  const void* b = nullptr;
  CUtensorMap a_map{}, b_map{};
};

// One column-major strided-batched GEMM's description (cuBLAS's argument order), bf16 A and B, fp32 accumulation.
struct GemmShape {
  cublasOperation_t op_a, op_b;
  int64_t m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch;
  cudaDataType c_type;
  bool accumulate;           // beta != 0
  int alignment;             // the least of the three pointers' alignments, bytes (16 at most)
  bool caller_sums = false;  // GemmTuner::gemm_unsummed: K slices are left for the caller's next kernel to add up
  auto tie() const {
    return std::tie(op_a, op_b, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch, c_type, accumulate,
                    alignment, caller_sums);
  }
  bool operator<(const GemmShape& o) const { return tie() < o.tie(); }
};

// The most K slices gemm_unsummed leaves to its caller (a consumer kernel holds one value of each in flight).
constexpr int kMaxUnsummedSlices = 8;

// An fp32 product as `count` partial sums to add up: element (row j, feature i) is the sum over s < count of
// data[s * stride + j * m + i] (count 1: the product itself, stride 0).
struct KSlices {
  const float* data = nullptr;
  int count = 1;
  int64_t stride = 0;
};

// What tuning chose for a shape (for counters and reports).
struct TunedChoice {
  int algo_id = -1, tile = -1, split_k = 1, candidates = 0;
  int k_slices = 1;         // > 1: K cut into this many slices, one batch entry each, summed into C by a kernel of ours
  bool own_kernel = false;  // stream_gemm (k_slices: its K splits) rather than cuBLASLt (algo_id, tile, split_k unset)
  double tuned_us = 0, heuristic_us = 0;  // the chosen one's and cuBLASLt's first heuristic pick's best cold time
  double own_us = 0;                      // stream_gemm's best (over its splits), where it was a candidate
};

class GemmTuner {
 public:
  GemmTuner(void* workspace, size_t workspace_bytes);
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // c = a·b (+ beta c) on `stream`. A shape seen for the first time is tuned first (synchronising the device),
  // unless `stream` is capturing a graph: then cuBLASLt's first heuristic pick runs, untuned and not remembered.
  void gemm(cudaStream_t stream, const GemmShape& s, const void* a, const void* b, void* c, float beta);
  // c = a·b for an fp32 C with ldc == m, unbatched, no accumulation - but where the tuned way cuts K into slices
  // (at most kMaxUnsummedSlices), their partials are returned unsummed instead, for the kernel after it to add up
  // as it reads them (one kernel and one round trip of C fewer: the MLA step's qkv_a, whose norm kernel sums them).
  // The shape is tuned apart from gemm()'s, its sliced ways timed without a sum.
  KSlices gemm_unsummed(cudaStream_t stream, GemmShape s, const void* a, const void* b, float* c);
  // The choice for a tuned shape, or nullptr.
  const TunedChoice* choice(const GemmShape& s) const;
  // Tests: tune shapes seen from here on over the candidates with this many K slices only (0: all), on this handle
  // alone (the process-wide choices are neither read nor written).
  void only_slices(int slices) { only_slices_ = slices; }
  // Tests: the same with our own kernel (stream_gemm) in this many K splits only, where it fits (0: off).
  void only_own(int splits) { only_own_ = splits; }
  // Tests: every handle's shapes that K can be cut into `slices` slices are tuned over those candidates alone, on
  // each handle apart (0: off) - a whole MLA step with its projections sliced (its norm kernel adding qkv_a's up).
  static void slice_everywhere_for_tests(int slices) { slices_for_tests = slices; }

  // A shape's measured choice; made once per process and device (every handle then runs the shape the same way).
  struct Tuned {
    cublasLtMatmulAlgo_t algo{};
    size_t workspace_bytes = 0;
    TunedChoice choice;
  };

 private:
  // A shape's cuBLASLt descriptors and algorithm (tuned: the fastest measured; else the heuristic's first).
  // The layouts of one way to run a shape: K in `slices` batch entries (1: the shape as given, into C).
  struct Layouts {
    int slices = 1;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    Layouts() = default;
    Layouts(const GemmShape& s, int slices);
    Layouts(Layouts&& o) noexcept;
    Layouts& operator=(Layouts&& o) noexcept;
    ~Layouts();
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    StreamGemmMaps maps;  // (own_kernel: its tensor maps of the last operands)
    Layouts layouts;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace_bytes = 0;
    float* partials = nullptr;  // [slices][n][m] fp32 where layouts.slices > 1
    bool tuned = false;
    TunedChoice choice;
    ~Plan();
  };
  struct Candidate;
  Plan& plan_for(const GemmShape& s);
  std::vector<Candidate> heuristic(const Plan& p, const Layouts& l, const GemmShape& s, int count) const;
  // base with its K split in `split` by cuBLASLt (its own reduction), if the algorithm and the workspace allow it.
  bool split_variant(const Plan& p, const cublasLtMatmulAlgo_t& base, int split, Candidate* out) const;
  Tuned tune(const GemmShape& s, const Plan& p, const void* a, const void* b, int only_slices);
  // The tuning cache's (harness/tuning.h) form of a choice: its key, its value, and a value read back (nullopt where
  // it no longer holds: another cuBLASLt, an algorithm it refuses for these descriptors, a kernel that no longer fits).
  static std::string shape_key(const GemmShape& s);
  static nlohmann::json to_json(const Tuned& t);
  std::optional<Tuned> from_json(const nlohmann::json& v, const GemmShape& s, const Plan& p) const;
  void adopt(const GemmShape& s, Plan& p, const Tuned& t);
  // (s.caller_sums: a sliced way's partials are left unsummed)
  void launch(const Plan& p, const Layouts& l, const cublasLtMatmulAlgo_t& algo, size_t workspace_bytes,
              float* partials, cudaStream_t stream, const GemmShape& s, const void* a, const void* b, void* c,
              float beta) const;
  // gemm()'s body: tunes s on first use (outside a capture), then runs it.
  const Plan& run(cudaStream_t stream, const GemmShape& s, const void* a, const void* b, void* c, float beta);
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<GemmShape, std::unique_ptr<Plan>> plans_;
  int only_slices_ = 0, only_own_ = 0;
  static std::atomic<int> slices_for_tests;
};

}  // namespace dslab::gpu
