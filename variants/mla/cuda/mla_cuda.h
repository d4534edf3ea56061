// The MLA family on the GPU: the problem as a serving engine holds it (a page pool with a page table per
// request, per-request lengths, a bf16 / int8 / fp8 latent cache) and the base class every GPU form shares
// (projections, the new token's cache write, o_proj, verification). Compiled by nvcc only.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/gpu.h"
#include "harness/variant.h"
#include "variants/common/cuda/blas.h"
#include "variants/common/cuda/device_array.h"
#include "variants/mla/mla.h"

namespace dslab::mla::cuda {

// The shared GPU library (variants/common/cuda), as the MLA family spells it.
using gpu::batched_gemv;
using gpu::BatchedGemv;
using gpu::BlasHandle;
using gpu::DeviceArray;
using gpu::gemm;
using gpu::gemm_shape;
using gpu::GemmShape;
using gpu::GemmTuner;
using gpu::gemv_split;
using gpu::kGemvRows;
using gpu::kMaxUnsummedSlices;
using gpu::KSlices;
using gpu::linear;
using gpu::linear_gemm_shape;
using gpu::linear_pair;
using gpu::linear_unsummed;
using gpu::own_gemv_split;
using gpu::parse_projections;
using gpu::Projections;
using gpu::ScratchArena;
using gpu::StreamGemmMaps;
using gpu::TunedChoice;

// (rope)] in the kv_dtype, plus (int8/fp8) one fp32 scale per kQuantGroup values.
struct PagedLatentCache {
  KvDtype dtype = KvDtype::bf16;
  int64_t page_size = 0, width = 0, groups = 0, pages_per_request = 0;
  DeviceArray<uint8_t> values;                 // [pages][page_size][width] elements of dtype
  DeviceArray<float> scales;                   // [pages][page_size][groups] (quantised dtypes only)
  DeviceArray<int32_t> page_table;             // [batch][pages_per_request]
  const int32_t* shared_page_table = nullptr;  // set: read this one instead (a model's layers share one page table)
  std::vector<int32_t> host_page_table;
  size_t element_bytes() const { return dtype == KvDtype::bf16 ? 2 : 1; }
};
// kv_a_proj_with_mqa for the others.
struct MlaWeights {
  DeviceArray<__nv_bfloat16> qkv_a, q_a_norm, q_b, kv_a_norm, kv_b, o_proj;
};
void upload_mla_weights(const ModelConfig& m, const ref::MlaParams& p, MlaWeights* w);
// ref::make_mla_params(m, heads, seed)'s tensors, generated on the device.
void generate_mla_weights(const ModelConfig& m, int64_t heads, uint64_t seed, MlaWeights* w);

// The buffers an MLA op runs on, given by its caller. Their addresses are fixed from prepare() on (a captured
// graph replays them); their contents may change between steps: lengths, page table and the RoPE tables at the
// new tokens' positions are the step's metadata.
struct MlaBuffers {
  const __nv_bfloat16* x = nullptr;  // [tokens][hidden]: the attention module's input (after input_layernorm)
  float* out = nullptr;              // [tokens][hidden]: o_proj's output
  PagedLatentCache* cache = nullptr;
  const int32_t* lengths = nullptr;  // [batch]: cached tokens per request before this step
  const float* rope_cos = nullptr;   // [tokens][rope/2] at each new token's position, YaRN-scaled
  const float* rope_sin = nullptr;
  int32_t* schedule = nullptr;  // a schedule buffer shared by ops of one shape (a model's layers), else the op's own
};

// Host-computed metadata of one step for an op that needs it (the fused kernel's split-KV schedule): copied
// into schedule_buffer() before the step (cudaMemcpyAsync, in place, as serving engines update a graph's
// static buffers before replay).
struct MlaSchedule {
  std::vector<int32_t> blob;  // schedule_ints() of them
  int segments = 0;
  bool merges = false;
};

// One implementation of the attention module: projections, the new tokens' cache write, attention over the
// paged latent cache, o_proj. run on buffers it is given, with no allocation and no host synchronisation in
// forward(). The family variants (mla/<form>/cuda) and the layers (layer/deepseek/cuda) both run these.
class MlaOp {
 public:
  // fused: the FlashMLA-style kernel (decode only).
  MlaOp(Algo algo, bool fused) : algo_(algo), fused_(fused) {}
  virtual ~MlaOp() = default;
  Algo algo() const { return algo_; }
  bool fused() const { return fused_; }
  virtual bool supports_kv_dtype(KvDtype d) const { return d == KvDtype::bf16; }
  // Why this op cannot run at all in this build or on this machine (e.g. a peer library that was not fetched), or "".
  virtual std::string unavailable() const { return ""; }
  // Why this op cannot run these shapes, or "" (no GPU needed to ask).
  std::string unsupported(const ModelConfig& m, const Shape& s) const;
  // s: batch, q_len, heads, kv_dtype of every step; max_keys: the longest request (cached + new) any step will
  // have. lengths_vary: steps replayed from one capture have different lengths (the fused kernel then always
  // launches its merge, which skips requests whole in that step's schedule).
  // arena: where the forward scratch comes from (mla::gpu_forward_scratch_bytes of it; the caller rewinds it
  // first), or null for buffers of the op's own.
  void prepare(const ModelConfig& m, const Shape& s, int64_t max_keys, const MlaWeights& w, const MlaBuffers& b,
               BlasHandle& blas, bool lengths_vary, ScratchArena* arena = nullptr);
  virtual MlaSchedule schedule(const std::vector<int64_t>& lengths) const;
  int32_t* schedule_buffer() const { return b_.schedule ? b_.schedule : schedule_dev_.get(); }
  size_t schedule_ints() const { return schedule_ints_for(m_, s_); }
  // Ints of the schedule buffer an op of these shapes needs (0: none), before any prepare.
  virtual size_t schedule_ints_for(const ModelConfig&, const Shape&) const { return 0; }
  // Queues one step on `stream`; marks, when given, time each op inside it.
  void forward(cudaStream_t stream, gpu::OpMarks* marks = nullptr);
  // Sparse attention (an op built on a PageSelector): whether it attends a selection, the keys it attends of a
  // request with `keys` keys (cached + new), what the selection itself costs a step, and after a step the key
  // indices (0 .. keys - 1) each request attended (host copies; synchronises). A dense op attends them all.
  virtual bool sparse() const { return false; }
  virtual int64_t attended_keys(int64_t keys, int64_t /*page_size*/, const Shape&) const { return keys; }
  virtual Cost selection_cost(const ModelConfig&, const Shape&, int64_t /*page_size*/) const { return {}; }
  virtual std::vector<std::vector<int64_t>> attended_key_indices() const { return {}; }
  // How the selection runs at the prepared shapes (its selector's launch facts, e.g. the top-k's clusters), as
  // counters.
  virtual std::map<std::string, double> selection_counters() const { return {}; }
  // Where one step's attention kernel spends its time inside its CTAs (a fused op: one more step, eager, with the
  // kernel's phase clocks on), as counters; {} for an op without them.
  virtual std::map<std::string, double> phase_counters() { return {}; }
  // On for the steps that time the attention kernel alone (kernel_s, against FlashInfer's kernel): a fused op then
  // ends its attention at o_lat, as FlashInfer's kernel does, instead of absorbing the output in its merge kernel.
  virtual void attention_core_only(bool) {}
  // The launch choices this prepared op made by the tuning cache (harness/tuning.h) or its default table, where it
  // could take others: the cache's family and key, the Shape field a candidate is timed through, the candidates, and
  // whether it came from the cache ({} where none). A tuner settles them in order (a later one's key and timing may
  // depend on an earlier one's value).
  struct TunedChoice {
    std::string family, key;
    int64_t Shape::*field = nullptr;  // Shape::block_keys, Shape::measured_splits
    std::vector<int64_t> candidates;
    bool from_cache = false;
  };
  virtual std::vector<TunedChoice> tuned_choices() const { return {}; }
  // Whether auto launch choices follow the tuning cache and its default table (on: the MLA variants, which measure
  // them); off (the layer and the engine, until each choice is measured inside them): the choices this code made
  // before it had a tuner.
  void use_tuned_launches(bool on) { tuned_launches_ = on; }
  // Device bytes beyond the caller's buffers (weights, cache), for supports(): the form's (mla::gpu_scratch_bytes),
  // or an op's own where it allocates otherwise.
  virtual double scratch_bytes(const ModelConfig& m, const Shape& s, int64_t max_keys) const;

 protected:
  bool tuned_launches_ = false;
  virtual void prepare_form() {}
  // An op's own limits on the shapes, beyond the ones unsupported() checks for every op of its kind.
  virtual std::string form_unsupported(const ModelConfig&, const Shape&) const { return ""; }
  // Reads q_ (rope applied) and the cache (new tokens written); writes attn_ [tokens][heads][v_head_dim].
  virtual void attend() = 0;

  // Pieces the forms share.
  void gather_latent(__nv_bfloat16* out) const;  // paged cache -> [batch][keys_][width] bf16 (padding untouched)
  // Row-wise causal softmax of scale*scores over each request's visible keys, zeros beyond:
  // row r belongs to request r / rows_per_request and to new token (r / div) % q_len.
  void softmax(const float* scores, __nv_bfloat16* probs, int64_t rows, int64_t rows_per_request, int64_t div) const;
  void absorb_query(__nv_bfloat16* q_abs, int64_t ld) const;         // q_nope·W_UK per head into q_abs[t][h][0..r)
  BatchedGemv query_absorb(__nv_bfloat16* q_abs, int64_t ld) const;  // that product's operands
  // q_cat_ = [q_nope·W_UK ‖ q_pe] per (token, head), a fused op's pieces marked absorb_q and rope_q; forms that use
  // it allocate q_cat_
  void concat_query() const;
  void absorb_output(const __nv_bfloat16* o_lat) const;  // attn = o_lat·W_UV^T per head
  // Latent rows [rows][width] decompressed through kv_b_proj: out [rows][heads*(nope+vd)] (cd's K/V, cc every step).
  void decompress(const __nv_bfloat16* latent, int64_t rows, __nv_bfloat16* out) const;
  // Device pointer array for cublasGemmBatchedEx, built once in prepare.
  const void** pointer_array(const std::vector<const void*>& host);
  // Op boundary for per-op timing: the work queued since the last boundary is `op`'s.
  void mark(const char* op) const {
    if (marks_) marks_->mark(op, stream_);
  }

  Algo algo_;
  bool fused_, lengths_vary_ = false;
  cudaStream_t stream_ = 0;  // the stream forward() queues on
  ModelConfig m_;
  Shape s_;
  const MlaWeights* w_ = nullptr;
  MlaBuffers b_;
  ScratchArena* arena_ = nullptr;      // the forward scratch's source (DeviceArray::scratch), or null
  BlasHandle* blas_handle_ = nullptr;  // linear() reads its projections choice
  cublasHandle_t blas_ = nullptr;      // blas_handle_->get(), for the GEMMs
  int64_t max_keys_ = 0;
  int64_t nh_ = 0, nope_ = 0, rope_ = 0, qhd_ = 0, vd_ = 0, r_ = 0, hid_ = 0, width_ = 0;
  int64_t keys_ = 0;  // keys per request in the unfused forms' buffers: max_keys rounded up to kKeyAlign
  float scale_ = 0;
  DeviceArray<__nv_bfloat16> q_;       // [tokens][heads][q_head_dim], rope applied
  DeviceArray<__nv_bfloat16> attn_;    // [tokens][heads][v_head_dim]
  DeviceArray<__nv_bfloat16> kv_new_;  // [tokens][width]: this step's latent rows, bf16, if a form allocates it
  DeviceArray<int32_t> schedule_dev_;
  __nv_bfloat16* q_cat_ = nullptr;  // [tokens][heads][width]: q_pe behind the absorbed part is written by
                                    // concat_query() (q_lora_rank models) or norm_and_cache_kernel (the others)
  // Whether this step's cache write is the launch right before attend()'s first kernel (the W_UK absorb rode in the
  // norm's launch, so nothing runs between them): a kernel programmatically launched there must not read the cache
  // before its wait.
  bool cache_written_just_before() const { return query_absorbed_; }

 private:
  void project();
  void rope_query() const;  // RoPE on q's rope parts, in place (and into q_cat_'s where a form has it)
  gpu::OpMarks* marks_ = nullptr;
  bool query_absorbed_ = false;  // this step's W_UK absorb ran in the norm's launch (fused_absorbs, project())
  DeviceArray<float> qa_f32_;    // [tokens][q_lora_rank + width]: q_a and kv_a outputs side by side
  DeviceArray<float> kv_f32_;
  DeviceArray<__nv_bfloat16> qa_;
  std::vector<DeviceArray<const void*>> pointer_arrays_;
};

// Block-sparse decode (variants/sparse/cuda): a selector the fused kernel asks, after the absorbed query is made and
// this step's keys are in the cache, for a compact page table and per-request lengths to walk instead of the
// cache's own (whole pages, ascending, the cache's last page last, so causality among the new tokens holds).
class PageSelector {
 public:
  virtual ~PageSelector() = default;
  virtual std::string name() const = 0;
  // Why it cannot run these shapes, or "".
  virtual std::string unsupported(const ModelConfig& m, const Shape& s) const = 0;
  // The keys it keeps of a request with `keys` keys: fixed by the budget, whatever the scores (the host's split-KV
  // schedule is made from it before the GPU has chosen).
  virtual int64_t kept_keys(int64_t keys, int64_t page_size, const Shape& s) const = 0;
  virtual Cost cost(const ModelConfig& m, const Shape& s, int64_t page_size) const = 0;
  // lengths: [batch] cached keys before the step (the op's buffers); the cache as it is after prepare's writes.
  virtual void prepare(const ModelConfig& m, const Shape& s, const PagedLatentCache& cache, const int32_t* lengths,
                       ScratchArena* arena) = 0;
  // Queued on `stream` before the decode kernel. q_cat: [tokens][heads][kv_lora_rank + rope] the absorbed query;
  // blas: the op's cuBLAS handle, already on `stream`; mark(op): the work queued since the last mark is op's (the
  // per-op breakdown; its names start with "select").
  using Mark = std::function<void(const char*)>;
  virtual void select(const __nv_bfloat16* q_cat, cudaStream_t stream, cublasHandle_t blas, const Mark& mark) = 0;
  virtual const int32_t* page_table() const = 0;  // [batch][pages_per_request()] physical pages
  // Keys per entry of that table: the cache's pages (block selectors), or 1 (token selectors: entries are slots).
  virtual int64_t keys_per_entry(int64_t page_size) const { return page_size; }
  virtual int64_t pages_per_request() const = 0;
  virtual const int32_t* lengths() const = 0;  // [batch]: the selection's keys before this step's (as the op's lengths)
  virtual std::vector<std::vector<int64_t>> key_indices() const = 0;  // after a step (synchronises)
  // How its kernels launch at the prepared shapes, as counters (after prepare; none by default).
  virtual std::map<std::string, double> launch_counters() const { return {}; }
};
// mla/fused/cuda's op over a selector's pages.
std::unique_ptr<MlaOp> make_fused_op(std::unique_ptr<PageSelector> selector);

// The MLA ops by name ("mla/fused/cuda"): each registration also registers the family variant of that name,
// and every layer can pick it by its `attn` axis.
using MlaOpFactory = std::unique_ptr<MlaOp> (*)();
bool register_mla_op(const char* name, const char* summary, MlaOpFactory make);
std::unique_ptr<MlaOp> make_mla_op(const std::string& name);  // nullptr if unknown
std::vector<std::string> mla_op_names();
#define DSLAB_REGISTER_MLA_OP(Class, name, summary)                             \
  static const bool dslab_mla_op_##Class = ::dslab::mla::cuda::register_mla_op( \
      name, summary, [] { return std::unique_ptr<::dslab::mla::cuda::MlaOp>(new Class()); })

// One point's weights, inputs and cache, generated once and shared by every GPU variant at that point
// (each variant's run() writes the same new-token values into the same cache slots).
struct GpuProblem {
  ModelConfig model;
  Shape shape;
  uint64_t seed = 0;
  int64_t page_size = 0;
  std::string len_dist;
  std::string weights_dir;       // the checkpoint the weights came from (dslab run --weights), or "": the seed's
  std::vector<int64_t> lengths;  // cached tokens per request before this step
  int64_t max_keys = 0;          // max over requests of lengths + q_len
  ref::MlaParams params;         // host copies: the reference and --dump read them
  std::vector<bf16> hidden;      // [tokens][hidden]
  MlaWeights weights;
  DeviceArray<__nv_bfloat16> x;
  PagedLatentCache cache;
  DeviceArray<int32_t> lengths_dev;            // int32 [batch]
  DeviceArray<float> rope_cos, rope_sin;       // [tokens][rope/2], YaRN-scaled, at each new token's position
  uint64_t ckv_stream(int64_t request) const;  // counter-based streams of request b's cached latent / rope key
  uint64_t kpe_stream(int64_t request) const;
  // Which requests verify() compares (all, unless the fp64 reference of all would take too long) and their
  // reference output rows [q_len][hidden] each.
  std::vector<int64_t> verified_requests;
  const std::vector<double>& reference(int64_t request) const;
  // The reference of one request over only these key indices (0 .. its keys - 1, new tokens last), or all (null).
  // mass_recall (with keys): dense attention's softmax mass inside them, the mean over new tokens and heads.
  std::vector<double> reference_over(int64_t request, const std::vector<int64_t>* keys,
                                     double* mass_recall = nullptr) const;

 private:
  mutable std::vector<std::vector<double>> reference_;
};
// weights: a checkpoint folder, whose first layer's attention weights replace the seed's.
std::shared_ptr<GpuProblem> gpu_problem(const ModelConfig& m, const Shape& s, int64_t page_size,
                                        const std::string& len_dist, uint64_t seed, const std::string& weights = "");
// The cached values of request b as the CPU generates them (the GPU fill must match bit for bit).
std::vector<bf16> host_latent(const GpuProblem& p,
                              int64_t request);  // [lengths[b]][width], bf16 before any quantisation
// The same for any streams: `length` tokens of [latent (ckv_stream) ‖ rope key (kpe_stream)].
std::vector<bf16> host_latent(const ModelConfig& m, uint64_t ckv_stream, uint64_t kpe_stream, int64_t length);
// The counter-based streams of request b's cached latent and rope key under `seed`.
uint64_t ckv_stream(uint64_t seed, int64_t request);
uint64_t kpe_stream(uint64_t seed, int64_t request);

// Paged cache set-up shared by the family variants and the layers: pages for each request's cached and new
// tokens (room for `room` new tokens each), drawn in shuffled order from one pool, unwritten slots 0xFF (NaN).
void allocate_paged_cache(const ModelConfig& m, KvDtype dtype, int64_t page_size, const std::vector<int64_t>& lengths,
                          int64_t room, uint64_t seed, PagedLatentCache* c);
// Fills request b's cached tokens [0, lengths[b]) with the counter-based values of streams[2b] (latent) and
// streams[2b + 1] (rope key), as host_latent() generates them.
void fill_paged_cache(PagedLatentCache& c, const int32_t* lengths_dev, int64_t batch, int64_t max_len,
                      const std::vector<uint64_t>& streams, int64_t kv_lora_rank);
// RoPE tables [tokens][rope/2] for q_len new tokens per request at positions lengths[b] + s.
void rope_tables(const ModelConfig& m, const std::vector<int64_t>& lengths, int64_t q_len,
                 std::vector<float>* cos_table, std::vector<float>* sin_table);

// Device bytes a point needs beyond the shared problem, for an op (its own scratch), for supports().
double device_bytes(const MlaOp& op, const ModelConfig& m, const Shape& s, int64_t page_size,
                    const std::string& len_dist);

// The unfused forms pad every request to the longest (max_keys) in their gathered buffers, and further to a
// multiple of kKeyAlign keys (keys_): a key count in a GEMM's dimensions and leading dimensions that is not a
// multiple of 8 (max_keys = kv_len + 1 at q_len 1) sends cuBLAS to its unaligned kernels. On the H200 (
// 6): a_cc_me's batched score GEMM at 16 rows, 64 requests, 4097 keys 579 us, at 4104 keys 79 us; P V 269 vs 77 us.
// The padding keys are zeros that the softmax masks like any key past a request's end.
constexpr int64_t kKeyAlign = mla::kGpuKeyAlign;

// The family variant mla/<form>/cuda: makes one point's problem, runs the op on it, verifies. The executor axis
// (default: graph for the fused kernel, eager for the others) makes run() replay one CUDA graph of the whole
// step, captured in prepare(), as serving engines do per batch size, instead of launching kernel by kernel.
class GpuVariant : public Variant {
 public:
  explicit GpuVariant(const std::string& op_name);
  ~GpuVariant() override;
  std::vector<std::pair<std::string, std::string>> axes() const override;
  Support available() const override;
  Support supports(const ModelFile& model, const Point& point) const override;
  Cost cost(const ModelFile& model, const Point& point) const override;
  double host_memory_bytes(const ModelFile& model, const Point& point) const override;
  double device_memory_bytes(const ModelFile& model, const Point& point) const override;
  std::string compute_ceiling() const override { return "gpu.tensor_bf16_flops"; }
  bool reads_weights() const override { return true; }
  void prepare(const ModelFile& model, const Point& point, uint64_t seed) override;
  void run() override;
  Verification verify() override;
  std::vector<DumpTensor> tensors() const override;
  std::map<std::string, double> counters() override;
  std::map<std::string, double> verification_counters()
      const override;  // a sparse op's: rel_err_vs_dense, attended_keys, mass_recall

 private:
  void capture_graph();
  std::unique_ptr<MlaOp> op_;
  ModelConfig m_;
  Shape s_;
  std::shared_ptr<GpuProblem> p_;
  std::unique_ptr<BlasHandle> blas_;
  DeviceArray<float> out_;  // [tokens][hidden]
  std::vector<float> host_out_;
  MlaSchedule schedule_;
  cudaGraphExec_t graph_exec_ = nullptr;
  double rel_err_vs_dense_ = 0, attended_keys_mean_ = 0, mass_recall_ = 0;  // a sparse op's, from its last verification
};

}  // namespace dslab::mla::cuda
