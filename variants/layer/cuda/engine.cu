// layer/deepseek/cuda as a generation engine (`dslab generate`): the whole model on the GPU running the steps a serving
// scheduler plans, over one paged latent cache whose pages the scheduler hands out, as SGLang's and vLLM's model
// runners do. The same ops the layer step times (attention by the `attn` axis for decode and `prefill_attn` for prompt
// chunks, MoE by `moe`), the same norms, the same weights (a checkpoint's, or the seed's).
//
// A scheduler step runs as one decode batch (every decode piece, padded up to a power-of-two bucket and replayed from
// that bucket's CUDA graph, or launched eagerly) and one forward per prompt chunk (padded up to a power-of-two chunk
// bucket, eager), as SGLang runs prefill and decode batches apart. Each shape is a "program": its own ops prepared for
// it (they share the weights, the caches, the metadata buffer and one scratch arena), and for decode its graph. The
// step's metadata (lengths, page table, RoPE tables, the fused kernel's schedule, token ids) is built on the host and
// copied in before the launch; a device argmax returns only the greedy tokens.
//
// Padding: a padded decode slot has length 0 and a page-table row of the engine's own spare page; a chunk's padding
// tokens sit after its real ones (causal attention keeps them out of the real tokens' outputs) and write their keys
// where the request's page table row points there: its own pages beyond its prompt (rewritten by its later tokens
// before any read) or, past its pages, the spare page.
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/engine.h"
#include "harness/errors.h"
#include "harness/host.h"
#include "variants/common/checkpoint.h"
#include "variants/common/cuda/device_random.h"
#include "variants/common/cuda/nvtx.h"
#include "variants/common/cuda/pdl.cuh"
#include "variants/common/rng.h"
#include "variants/layer/cuda/deepseek.h"
#include "variants/layer/cuda/norms.h"
#include "variants/layer/ops.h"
#include "variants/reference/model.h"

namespace dslab::layer::cuda {
namespace {

using gpu::ScratchArena;
using mla::cuda::MlaBuffers;
using mla::cuda::MlaOp;
using mla::cuda::PagedLatentCache;
using moe::cuda::MoeBuffers;
using moe::cuda::MoeOp;

constexpr int kArgmaxThreads = 256;
constexpr int64_t kMinChunkBucket = 16;

int64_t align4(int64_t n) { return (n + 3) / 4 * 4; }

// Row rows[i] of the logits: its first largest value's index into out[i], and the runner-up's gap and the row's RMS
// into gap[i], rms[i] (a NaN row gives INT32_MAX: an error upstream).
__global__ void argmax_rows_kernel(const float* logits, int64_t vocab, const int32_t* rows, int32_t* out, float* gap,
                                   float* rms) {
  const float* row = logits + int64_t(rows[blockIdx.x]) * vocab;
  float best = -INFINITY, second = -INFINITY, squares = 0;
  int32_t arg = INT32_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {  // (strided ascending: this thread's first maximum)
    const float v = row[i];
    squares += v * v;
    if (v > best) {
      second = best, best = v, arg = int32_t(i);
    } else if (v > second) {
      second = v;
    }
  }
  __shared__ float firsts[kArgmaxThreads], seconds[kArgmaxThreads], sums[kArgmaxThreads];
  __shared__ int32_t args[kArgmaxThreads];
  firsts[threadIdx.x] = best, seconds[threadIdx.x] = second, sums[threadIdx.x] = squares, args[threadIdx.x] = arg;
  __syncthreads();
  for (int s = kArgmaxThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const int o = threadIdx.x + s;
      const float f = firsts[threadIdx.x], g = firsts[o];
      const bool other = g > f || (g == f && args[o] < args[threadIdx.x]);
      seconds[threadIdx.x] = fmaxf(fmaxf(seconds[threadIdx.x], seconds[o]), other ? f : g);
      if (other) firsts[threadIdx.x] = g, args[threadIdx.x] = args[o];
      sums[threadIdx.x] += sums[o];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x] = args[0];
    gap[blockIdx.x] = firsts[0] - seconds[0];
    rms[blockIdx.x] = sqrtf(sums[0] / float(vocab));
  }
}

// The engine's axes, parsed.
struct EngineAxes {
  std::string attn, prefill_attn, moe;
  bool graph = true, pdl = true;
  bool experts_on_host = false;  // the moe op runs the routed experts on the CPU (KTransformers' placement)
  mla::KvDtype kv_dtype = mla::KvDtype::bf16;
  int64_t block_keys = 0;  // the fused decode's key block (0: auto, tuned or the GPU's table: mla/cuda/fused/host.cu)
  gpu::Projections proj{};
  // With a CPU op's experts: the leading MoE layers whose experts stay on the GPU (run by kGpuExpertsOp), as the
  // layer step's gpu_experts places them: none, layers:N, or fit (as many as the GPU budget holds beside the rest).
  layer::GpuExperts gpu_experts;
  explicit EngineAxes(const Point& p) {
    attn = p.text("attn");
    prefill_attn = p.text("prefill_attn");
    moe = p.text("moe");
    const std::string& e = p.text("executor");
    if (e != "graph" && e != "eager") throw BadInput("axis 'executor': value '" + e + "': expected graph or eager");
    graph = e == "graph";
    pdl = p.text("pdl") == "on";
    kv_dtype = mla::parse_kv_dtype(p.text("kv_dtype"));
    if (p.has("block_keys")) block_keys = mla::parse_block_keys(p.text("block_keys"));
    proj = gpu::parse_projections(p.text("proj"));
    check_op_axis("attn", attn, mla::cuda::mla_op_names());
    check_op_axis("prefill_attn", prefill_attn, mla::cuda::mla_op_names());
    check_op_axis("moe", moe, moe::cuda::moe_op_names());
    experts_on_host = moe::cuda::make_moe_op(moe)->experts_on_host();
    gpu_experts = layer::parse_gpu_experts(p.has("gpu_experts") ? p.text("gpu_experts") : "none");
    using Kind = layer::GpuExperts::Kind;
    if (gpu_experts.kind == Kind::streamed || gpu_experts.kind == Kind::hot)
      throw BadInput("axis 'gpu_experts': value '" + p.text("gpu_experts") +
                     "': the engine places whole layers: expected none, layers:N or fit");
    if (gpu_experts.kind != Kind::none && !experts_on_host)
      throw BadInput("axis 'gpu_experts': value '" + p.text("gpu_experts") + "': " + moe +
                     " keeps every layer's experts on the GPU already (the axis splits a CPU op's layers: "
                     "moe=moe/host/cuda)");
  }
};

// The op that runs the MoE layers whose experts a CPU op leaves on the GPU (gpu_experts), as the layer step's does.
constexpr const char* kGpuExpertsOp = "moe/grouped_wgmma/cuda";

// The shapes an engine runs: decode buckets 1, 2, 4 .. bucket(max_running) of one token each, and prompt chunk buckets
// 16, 32 .. bucket(chunk_tokens) of one request each (a chunk of n tokens runs in chunk_bucket(n)).
struct Shapes {
  std::vector<int64_t> decode_batches, chunk_lengths;
  int64_t max_batch = 1, max_tokens = 1, max_chunk = 1;
  explicit Shapes(const EngineLimits& l) {
    for (int64_t b = 1; b < 2 * l.max_running; b *= 2) decode_batches.push_back(b);
    max_chunk = batch_bucket(l.chunk_tokens);
    for (int64_t q = std::min(kMinChunkBucket, max_chunk); q <= max_chunk; q *= 2) chunk_lengths.push_back(q);
    max_batch = decode_batches.back();
    max_tokens = std::max(max_batch, max_chunk);
  }
  int64_t chunk_bucket(int64_t n) const { return std::min(max_chunk, std::max(kMinChunkBucket, batch_bucket(n))); }
};

class DeepseekEngineCuda final : public Engine {
 public:
  ~DeepseekEngineCuda() override { release(); }

  std::vector<std::pair<std::string, std::string>> axes() const override {
    return {{"attn", "mla/fused/cuda"},
            {"prefill_attn", "mla/cc/cuda"},
            {"moe", "moe/grouped_wgmma/cuda"},
            {"executor", "graph"},
            {"kv_dtype", "bf16"},
            {"proj", "own"},
            {"pdl", "on"},
            {"block_keys", "auto"},
            {"gpu_experts", "none"}};
  }
  bool reads_weights() const override { return true; }

  Support supports(const ModelFile& model, const Point& p, const EngineLimits& l) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const EngineAxes a(p);
    const Shapes shapes(l);
    if (m.vocab_size <= 0) return Support::no("needs vocab_size in " + m.source);
    if (m.hidden_size > 8192) return Support::no("norm kernels: hidden_size up to 8192");
    const auto decode_op = mla::cuda::make_mla_op(a.attn), prefill_op = mla::cuda::make_mla_op(a.prefill_attn);
    if (decode_op->sparse() || prefill_op->sparse())
      return Support::no("attn: the engine runs dense attention (a sparse op's selection is a layer-step axis)");
    for (int64_t b : shapes.decode_batches)
      if (const std::string why = decode_op->unsupported(m, shape(m, a, b, 1, l)); !why.empty())
        return Support::no("attn " + a.attn + " at batch " + std::to_string(b) + ": " + why);
    for (int64_t q : shapes.chunk_lengths)
      if (const std::string why = prefill_op->unsupported(m, shape(m, a, 1, q, l)); !why.empty())
        return Support::no("prefill_attn " + a.prefill_attn + " at a " + std::to_string(q) + "-token chunk: " + why);
    const auto moe_op = moe::cuda::make_moe_op(a.moe);
    if (const std::string why = moe_op->unavailable(); !why.empty()) return Support::no(why);
    if (a.graph && !moe_op->graph_safe())
      return Support::no("executor graph: " + a.moe + " reads the routing on the host; use executor eager");
    const int64_t moe_layers = count_moe_layers(m);
    if (a.gpu_experts.kind == layer::GpuExperts::Kind::layers && a.gpu_experts.layers > moe_layers)
      return Support::no("gpu_experts: layers:" + std::to_string(a.gpu_experts.layers) + ": " + m.source + " has " +
                         std::to_string(moe_layers) + " MoE layers");
    if (a.gpu_experts.kind != layer::GpuExperts::Kind::none)
      if (const std::string why = moe::cuda::make_moe_op(kGpuExpertsOp)->unavailable(); !why.empty())
        return Support::no("gpu_experts: " + why);
    const GpuInfo& g = gpu_info();
    if (!g.present) return Support::no(g.why_absent);
    if (l.device_budget_bytes > double(g.memory_bytes))
      return Support::no("a GPU budget of " + gigabytes(l.device_budget_bytes) + " is more than the " + g.name + "'s " +
                         gigabytes(double(g.memory_bytes)));
    const double fixed = fixed_bytes(m, a, l), need = fixed + double(l.pages + 1) * page_bytes(m, a, l);
    if (fixed > budget_bytes(l))
      return Support::no("weights and buffers need " + gigabytes(fixed) + ", over the GPU budget of " +
                         gigabytes(budget_bytes(l)) +
                         (a.experts_on_host ? "" : " (routed experts on the CPU: moe=moe/host/cuda)"));
    if (need > budget_bytes(l))
      return Support::no("needs " + gigabytes(need) + " of GPU memory, over the budget of " +
                         gigabytes(budget_bytes(l)) + " (" + g.name + ": " + gigabytes(double(g.memory_bytes)) + ")");
    return {};
  }

  int64_t max_pages(const ModelFile& model, const Point& p, const EngineLimits& l) const override {
    const ModelConfig m = parse_model_config(model.config, model.name, model.path);
    const EngineAxes a(p);
    const double room = budget_bytes(l) - fixed_bytes(m, a, l);
    return std::max<int64_t>(0, int64_t(room / page_bytes(m, a, l)) - 1);
  }

  // What the engine may hold: the run's budget, else 0.9 of the GPU's memory (the rest: the runtime's and cuBLAS's).
  static double budget_bytes(const EngineLimits& l) {
    const double own = 0.9 * double(gpu_info().memory_bytes);
    return l.device_budget_bytes > 0 ? std::min(l.device_budget_bytes, own) : own;
  }
  static std::string gigabytes(double bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GB", bytes / 1e9);
    return text;
  }

  void prepare(const ModelFile& model, const Point& p, const EngineLimits& l, uint64_t seed) override {
    gpu::NvtxRange range("engine.prepare");
    release();
    m_ = parse_model_config(model.config, model.name, model.path);
    limits_ = l;
    const EngineAxes a(p);
    axes_ = std::make_unique<EngineAxes>(a);
    shapes_ = std::make_unique<Shapes>(l);
    const Shapes& shapes = *shapes_;
    const int64_t H = m_.hidden_size, V = m_.vocab_size, L = m_.num_hidden_layers;
    if (!blas_) blas_ = std::make_unique<BlasHandle>(), side_blas_ = std::make_unique<BlasHandle>();
    blas_->set_projections(a.proj);
    side_blas_->set_projections(a.proj);
    DSLAB_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DSLAB_CUDA(cudaEventCreate(&begin_));
    DSLAB_CUDA(cudaEventCreate(&end_));

    // Weights: the checkpoint's, or the seed's (the layer step's streams, so a layer-step point and an engine run of
    // one seed hold the same model).
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Checkpoint> checkpoint;
    if (!model.weights.empty()) checkpoint = std::make_unique<Checkpoint>(model.weights);
    weights_.resize(size_t(L));
    gpu_expert_layers_ = gpu_expert_layers(m_, a, l);
    for (int64_t layer = 0, moe_ordinal = 0; layer < L; ++layer) {
      LayerWeights& w = weights_[size_t(layer)];
      const bool on_gpu = experts_on_gpu(a, moe_ordinal, gpu_expert_layers_);
      moe_ordinal += m_.is_moe_layer(layer) ? 1 : 0;
      if (checkpoint) {
        load_layer_weights(*checkpoint, layer, &w, on_gpu);
        std::fprintf(stderr, "\rweights: layer %lld of %lld read (%.1f GB)", static_cast<long long>(layer + 1),
                     static_cast<long long>(L), checkpoint->bytes_read() / 1e9);
      } else {
        make_layer_weights(m_, layer, seed, &w, on_gpu);
      }
    }
    if (checkpoint) {
      std::fprintf(stderr, "\n");
      load_model_ends(*checkpoint, &embed_, &final_norm_, &lm_head_);
      checkpoint->report_load("the whole model", std::chrono::steady_clock::now() - t0);
      load_bytes_ = checkpoint->bytes_read();
      load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      make_model_ends(m_, seed, &embed_, &final_norm_, &lm_head_);
    }

    // Metadata: lengths [max_batch], page table [max_batch][pages_per_row], RoPE cos and sin [max_tokens][rope/2],
    // the fused kernel's schedule, token ids [max_tokens], the step; each part 16-byte aligned.
    const int64_t half = m_.qk_rope_head_dim / 2, B = shapes.max_batch, T = shapes.max_tokens;
    pages_per_row_ = (max_keys(l) + l.page_size - 1) / l.page_size;
    int64_t sched_ints = 0;
    {
      const auto probe = mla::cuda::make_mla_op(a.attn);
      for (int64_t b : shapes.decode_batches)
        sched_ints = std::max<int64_t>(sched_ints, int64_t(probe->schedule_ints_for(m_, shape(m_, a, b, 1, l))));
    }
    off_pt_ = align4(B), off_cos_ = off_pt_ + align4(B * pages_per_row_), off_sin_ = off_cos_ + align4(T * half);
    off_sched_ = off_sin_ + align4(T * half), off_ids_ = off_sched_ + align4(sched_ints);
    off_step_ = off_ids_ + align4(T), meta_ints_ = off_step_ + 4;
    meta_.resize(size_t(meta_ints_));
    meta_.zero();
    DSLAB_CUDA(cudaMallocHost(&meta_host_, size_t(meta_ints_) * 4));
    std::fill(meta_host_, meta_host_ + meta_ints_, 0);
    rows_.resize(size_t(T));
    tokens_.resize(size_t(3 * T));
    DSLAB_CUDA(cudaMallocHost(&tokens_host_, size_t(3 * T) * 4));

    // Caches: each layer a pool of the scheduler's pages plus one spare (the last), read through the one page table.
    spare_page_ = int32_t(l.pages);
    caches_.resize(size_t(L));
    for (auto& c : caches_) {
      c.dtype = a.kv_dtype;
      c.page_size = l.page_size;
      c.width = m_.kv_lora_rank + m_.qk_rope_head_dim;
      c.groups = (c.width + mla::kQuantGroup - 1) / mla::kQuantGroup;
      c.pages_per_request = pages_per_row_;
      c.values.resize(size_t((l.pages + 1) * l.page_size * c.width) * c.element_bytes());
      c.values.fill_bytes(0xFF);  // (NaN: a slot read before it is written fails loudly)
      if (c.dtype != mla::KvDtype::bf16) {
        c.scales.resize(size_t((l.pages + 1) * l.page_size * c.groups));
        c.scales.fill_bytes(0xFF);
      }
      c.shared_page_table = meta_.get() + off_pt_;
    }

    // Step buffers, sized for the largest program.
    resid_.resize(size_t(T * H));
    attn_out_.resize(size_t(T * H));
    ffn_out_.resize(size_t(T * H));
    xb_.resize(size_t(T * H));
    logits_.resize(size_t(T * V));

    // Programs: one arena for every op's forward scratch (they run one after another), sized for the largest.
    double arena = 0;
    for (int64_t b : shapes.decode_batches) arena = std::max(arena, arena_bytes(m_, a, b, 1, l));
    for (int64_t q : shapes.chunk_lengths) arena = std::max(arena, arena_bytes(m_, a, 1, q, l));
    arena_.reserve(size_t(arena));
    for (int64_t b : shapes.decode_batches) programs_.push_back(make_program(a, b, 1, true));
    for (int64_t q : shapes.chunk_lengths) programs_.push_back(make_program(a, 1, q, false));
    DSLAB_CUDA(cudaDeviceSynchronize());
    // Each program once, eagerly, on the spare page (first-call initialisation outside any capture), then the
    // decode programs' graphs. Each waits for the last: the next program's metadata is written into the same pinned
    // buffer that the last one's queued copy reads (a slow program, such as one with CPU experts, would otherwise be
    // fed the next program's schedule).
    for (auto& prog : programs_) {
      write_metadata(prog, {});
      launch(prog);
      DSLAB_CUDA(cudaStreamSynchronize(stream_));
    }
    if (a.graph)
      for (auto& prog : programs_)
        if (prog.decode) capture(prog);
    busy_s_ = 0;
    device_bytes_ = fixed_bytes(m_, a, l) + double(l.pages + 1) * page_bytes(m_, a, l);
    // Where the run's memory went, before its long part: the GPU's share against its budget, the experts' placement.
    std::fprintf(stderr, "engine: %s held on the GPU of a %s budget (%lld cache pages)",
                 gigabytes(device_bytes_).c_str(), gigabytes(budget_bytes(l)).c_str(), static_cast<long long>(l.pages));
    if (a.experts_on_host)
      std::fprintf(stderr, "; routed experts of %lld of %lld MoE layers on the GPU, the rest on the CPU",
                   static_cast<long long>(gpu_expert_layers_), static_cast<long long>(count_moe_layers(m_)));
    std::fprintf(stderr, "\n");
  }

  std::vector<TokenChoice> step(const std::vector<EnginePiece>& pieces,
                                std::vector<std::vector<float>>* logits) override {
    std::vector<TokenChoice> next(pieces.size());
    std::vector<std::vector<float>> piece_logits(pieces.size());
    std::vector<size_t> decodes;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const EnginePiece& piece = pieces[i];
      if (piece.tokens.empty() || (piece.decode && piece.tokens.size() != 1) ||
          piece.position + int64_t(piece.tokens.size()) > limits_.max_context || !piece.pages)
        throw std::logic_error("engine: a piece the scheduler cannot have planned");
      if (piece.decode) decodes.push_back(i);
    }
    std::vector<TokenChoice> got;
    std::vector<std::vector<float>> got_logits;
    // The decodes, in batches of at most max_running.
    for (size_t first = 0; first < decodes.size(); first += size_t(limits_.max_running)) {
      const size_t n = std::min(decodes.size() - first, size_t(limits_.max_running));
      std::vector<const EnginePiece*> batch;
      for (size_t k = 0; k < n; ++k) batch.push_back(&pieces[decodes[first + k]]);
      run_program(program(true, batch_bucket(int64_t(n))), batch, &got, logits ? &got_logits : nullptr);
      for (size_t k = 0; k < n; ++k) {
        next[decodes[first + k]] = got[k];
        if (logits) piece_logits[decodes[first + k]] = std::move(got_logits[k]);
      }
    }
    // Each prompt piece, in chunks of at most chunk_tokens.
    for (size_t i = 0; i < pieces.size(); ++i) {
      const EnginePiece& piece = pieces[i];
      if (piece.decode) continue;
      for (size_t at = 0; at < piece.tokens.size(); at += size_t(limits_.chunk_tokens)) {
        const size_t n = std::min(piece.tokens.size() - at, size_t(limits_.chunk_tokens));
        EnginePiece chunk;
        chunk.request = piece.request;
        chunk.position = piece.position + int64_t(at);
        chunk.tokens.assign(piece.tokens.begin() + int64_t(at), piece.tokens.begin() + int64_t(at + n));
        chunk.pages = piece.pages;
        chunk.wants_token = piece.wants_token && at + n == piece.tokens.size();
        run_program(program(false, shapes_->chunk_bucket(int64_t(n))), {&chunk}, &got, logits ? &got_logits : nullptr);
        if (chunk.wants_token) {
          next[i] = got[0];
          if (logits) piece_logits[i] = std::move(got_logits[0]);
        }
      }
    }
    if (logits)
      for (size_t i = 0; i < pieces.size(); ++i)
        if (pieces[i].wants_token) logits->push_back(std::move(piece_logits[i]));
    return next;
  }

  double busy_s() const override { return busy_s_; }

  std::map<std::string, double> counters() const override {
    std::map<std::string, double> c;
    c["programs"] = double(programs_.size());
    c["graphs"] = double(std::count_if(programs_.begin(), programs_.end(), [](const Program& p) { return p.graph; }));
    c["cache_pages"] = double(limits_.pages);
    c["device_bytes"] = device_bytes_;  // weights, cache pages, buffers and scratch the engine holds on the GPU
    if (axes_ && axes_->experts_on_host) c["gpu_moe_layers"] = double(gpu_expert_layers_);  // (the rest: the CPU's)
    if (load_s_ > 0) {
      c["weights_load_s"] = load_s_;
      c["weights_load_GBps"] = load_bytes_ / load_s_ / 1e9;
    }
    return c;
  }

 private:
  struct Program {
    int64_t batch = 0, q_len = 0;
    bool decode = false;
    std::vector<std::unique_ptr<MlaOp>> attn;
    std::vector<std::unique_ptr<MoeOp>> moe;
    std::vector<moe::cuda::MlpRunner> dense;
    cudaGraphExec_t graph = nullptr;
    int64_t tokens() const { return batch * q_len; }
  };

  static mla::Shape shape(const ModelConfig& m, const EngineAxes& a, int64_t batch, int64_t q_len,
                          const EngineLimits& l) {
    mla::Shape s;
    s.heads = m.num_attention_heads;
    s.batch = batch;
    s.q_len = q_len;
    s.kv_len = l.max_context;
    s.kv_dtype = a.kv_dtype;
    s.block_keys = a.block_keys;
    return s;
  }
  static int64_t max_keys(const EngineLimits& l) { return l.max_context + batch_bucket(l.chunk_tokens); }

  static layer::StepScratch scratch(const ModelConfig& m, const EngineAxes& a, int64_t batch, int64_t q_len,
                                    const EngineLimits& l) {
    const auto op = mla::cuda::make_mla_op(q_len == 1 ? a.attn : a.prefill_attn);
    layer::StepScratch s;
    s.attn = shape(m, a, batch, q_len, l);
    s.algo = op->algo();
    s.fused = op->fused();
    s.max_keys = max_keys(l);
    s.layers = m.num_hidden_layers;
    for (int64_t i = 0; i < m.num_hidden_layers; ++i) s.moe_layers += m.is_moe_layer(i) ? 1 : 0;
    s.whole = true;
    return s;
  }
  static double arena_bytes(const ModelConfig& m, const EngineAxes& a, int64_t batch, int64_t q_len,
                            const EngineLimits& l) {
    return layer::gpu_step_arena_bytes(m, scratch(m, a, batch, q_len, l));
  }

  // Weights, step buffers, metadata and every program's own scratch: the device memory besides the cache pages.
  static double fixed_bytes(const ModelConfig& m, const EngineAxes& a, const EngineLimits& l) {
    const Shapes shapes(l);
    const double H = double(m.hidden_size), V = double(m.vocab_size);
    double bytes = 2 * V * H * 2;
    int64_t moe_layers = 0;
    const int64_t on_gpu = gpu_expert_layers(m, a, l);
    for (int64_t i = 0; i < m.num_hidden_layers; ++i) {
      bytes += mla::weight_bytes(m, m.num_attention_heads) + 4 * H;
      if (m.is_moe_layer(i))  // (a CPU op's routed experts stay in host memory: the router and shared experts here)
        bytes += moe::cuda::moe_weight_bytes(m, experts_on_gpu(a, moe_layers, on_gpu) ? m.n_routed_experts : 0),
            ++moe_layers;
      else
        bytes += 3 * H * double(m.intermediate_size) * 2;
    }
    double arena = 0;
    auto program_bytes = [&](int64_t batch, int64_t q_len) {
      const layer::StepScratch s = scratch(m, a, batch, q_len, l);
      arena = std::max(arena, layer::gpu_step_arena_bytes(m, s));
      return layer::gpu_step_scratch_bytes(m, s) - layer::gpu_step_arena_bytes(m, s);
    };
    for (int64_t b : shapes.decode_batches) bytes += program_bytes(b, 1);
    for (int64_t q : shapes.chunk_lengths) bytes += program_bytes(1, q);
    return bytes + arena;
  }
  static int64_t count_moe_layers(const ModelConfig& m) {
    int64_t n = 0;
    for (int64_t i = 0; i < m.num_hidden_layers; ++i) n += m.is_moe_layer(i) ? 1 : 0;
    return n;
  }
  // Whether the MoE layer of this ordinal keeps its routed experts on the GPU.
  static bool experts_on_gpu(const EngineAxes& a, int64_t moe_ordinal, int64_t gpu_layers) {
    return !a.experts_on_host || moe_ordinal < gpu_layers;
  }
  // The leading MoE layers a CPU op leaves on the GPU (gpu_experts): layers:N, or for fit as many as the budget holds
  // beside everything else (the pages included).
  static int64_t gpu_expert_layers(const ModelConfig& m, const EngineAxes& a, const EngineLimits& l) {
    using Kind = layer::GpuExperts::Kind;
    if (!a.experts_on_host || a.gpu_experts.kind == Kind::none) return 0;
    const int64_t moe_layers = count_moe_layers(m);
    if (a.gpu_experts.kind == Kind::layers) return std::min(a.gpu_experts.layers, moe_layers);
    EngineAxes none = a;
    none.gpu_experts = {};
    const double rest = fixed_bytes(m, none, l) + double(l.pages + 1) * page_bytes(m, a, l);
    const double host_set = moe::cuda::moe_weight_bytes(m, 0),
                 full_set = moe::cuda::moe_weight_bytes(m, m.n_routed_experts);
    // (rest holds every MoE layer's host set already: resident_moe_layers counts them once more, so add them back)
    return layer::resident_moe_layers(budget_bytes(l), rest - double(moe_layers) * host_set, moe_layers, host_set,
                                      full_set);
  }
  static double page_bytes(const ModelConfig& m, const EngineAxes& a, const EngineLimits& l) {
    return double(m.num_hidden_layers) * double(l.page_size) * double(m.kv_lora_rank + m.qk_rope_head_dim) *
           (a.kv_dtype == mla::KvDtype::bf16 ? 2.0 : 1.0 + 4.0 / double(mla::kQuantGroup));
  }

  Program make_program(const EngineAxes& a, int64_t batch, int64_t q_len, bool decode) {
    Program prog;
    prog.batch = batch, prog.q_len = q_len, prog.decode = decode;
    const mla::Shape s = shape(m_, a, batch, q_len, limits_);
    for (int64_t layer = 0; layer < m_.num_hidden_layers; ++layer) {
      LayerWeights& w = weights_[size_t(layer)];
      MlaBuffers b;
      b.x = xb_.get();
      b.out = attn_out_.get();
      b.cache = &caches_[size_t(layer)];
      b.lengths = meta_.get();
      b.rope_cos = reinterpret_cast<const float*>(meta_.get() + off_cos_);
      b.rope_sin = reinterpret_cast<const float*>(meta_.get() + off_sin_);
      prog.attn.push_back(mla::cuda::make_mla_op(decode ? a.attn : a.prefill_attn));
      prog.attn.back()->use_tuned_launches(true);  // (the key block and split count: as the layer step takes them)
      b.schedule = prog.attn.back()->schedule_ints_for(m_, s) ? meta_.get() + off_sched_ : nullptr;
      arena_.rewind();
      prog.attn.back()->prepare(m_, s, max_keys(limits_), w.attn, b, *blas_, /*lengths_vary=*/true, &arena_);
      arena_.rewind();
      if (w.moe) {
        MoeBuffers mb;
        mb.x = xb_.get();
        mb.out = ffn_out_.get();
        const bool on_gpu = a.experts_on_host && int64_t(prog.moe.size()) < gpu_expert_layers_;
        prog.moe.push_back(moe::cuda::make_moe_op(on_gpu ? kGpuExpertsOp : a.moe));
        prog.moe.back()->prepare(m_, prog.tokens(), *w.moe, mb, *blas_, side_blas_.get(), &arena_);
      } else {
        prog.dense.emplace_back();
        prog.dense.back().prepare(m_, w.dense, prog.tokens(), &arena_);
      }
    }
    return prog;
  }

  Program& program(bool decode, int64_t size) {
    for (auto& p : programs_)
      if (p.decode == decode && (decode ? p.batch : p.q_len) == size) return p;
    throw std::logic_error("engine: no program of that shape");
  }

  // The metadata of `pieces` (each of prog.q_len tokens or fewer, at most prog.batch of them) into meta_host_.
  void write_metadata(const Program& prog, const std::vector<const EnginePiece*>& pieces) {
    const int64_t B = prog.batch, S = prog.q_len, half = m_.qk_rope_head_dim / 2;
    std::fill(meta_host_, meta_host_ + meta_ints_, 0);
    std::vector<int64_t> lengths(size_t(B), 0);
    for (int64_t b = 0; b < B; ++b) {
      int32_t* row = meta_host_ + off_pt_ + b * pages_per_row_;
      std::fill(row, row + pages_per_row_, spare_page_);
      if (b < int64_t(pieces.size())) {
        const EnginePiece& piece = *pieces[size_t(b)];
        lengths[size_t(b)] = piece.position;
        const std::vector<int32_t>& pages = *piece.pages;
        std::copy_n(pages.begin(), std::min<int64_t>(int64_t(pages.size()), pages_per_row_), row);
        for (size_t t = 0; t < piece.tokens.size(); ++t) meta_host_[off_ids_ + b * S + int64_t(t)] = piece.tokens[t];
      }
      meta_host_[b] = int32_t(lengths[size_t(b)]);
    }
    std::vector<float> cs, sn;
    mla::cuda::rope_tables(m_, lengths, S, &cs, &sn);
    std::memcpy(meta_host_ + off_cos_, cs.data(), size_t(B * S * half) * 4);
    std::memcpy(meta_host_ + off_sin_, sn.data(), size_t(B * S * half) * 4);
    if (prog.attn[0]->schedule_ints_for(m_, shape(m_, *axes_, B, S, limits_))) {
      const auto sched = prog.attn[0]->schedule(lengths);
      std::copy(sched.blob.begin(), sched.blob.end(), meta_host_ + off_sched_);
    }
  }

  void forward(Program& prog, cudaStream_t stream) {
    const int64_t T = prog.tokens();
    const int H = int(m_.hidden_size);
    const float eps = float(m_.rms_norm_eps);
    gpu::NvtxRange range(prog.decode ? "engine.decode" : "engine.prefill");
    const ProgrammaticLaunchScope pdl(axes_->pdl);
    input_norm(embed_.get(), meta_.get() + off_ids_, meta_.get() + off_step_, T, H, weights_[0].input_layernorm.get(),
               eps, resid_.get(), xb_.get(), stream);
    size_t moe_i = 0, dense_i = 0;
    for (size_t i = 0; i < weights_.size(); ++i) {
      prog.attn[i]->forward(stream);
      add_norm(T, resid_.get(), attn_out_.get(), H, weights_[i].post_attention_layernorm.get(), eps, xb_.get(), stream);
      if (weights_[i].moe) {
        prog.moe[moe_i++]->forward(stream);
      } else {
        blas_->set_stream(stream);
        prog.dense[dense_i++].forward(*blas_, xb_.get(), ffn_out_.get(), 0.0f, stream);
      }
      const __nv_bfloat16* next = i + 1 < weights_.size() ? weights_[i + 1].input_layernorm.get() : final_norm_.get();
      add_norm(T, resid_.get(), ffn_out_.get(), H, next, eps, xb_.get(), stream);
    }
    blas_->set_stream(stream);
    gpu::linear(*blas_, xb_.get(), T, H, lm_head_.get(), m_.vocab_size, logits_.get(), CUDA_R_32F);
  }

  void launch(Program& prog) {
    DSLAB_CUDA(cudaMemcpyAsync(meta_.get(), meta_host_, size_t(meta_ints_) * 4, cudaMemcpyHostToDevice, stream_));
    if (prog.graph)
      DSLAB_CUDA(cudaGraphLaunch(prog.graph, stream_));
    else
      forward(prog, stream_);
  }

  void capture(Program& prog) {
    cudaGraph_t graph{};
    DSLAB_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      forward(prog, stream_);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    DSLAB_CUDA(cudaStreamEndCapture(stream_, &graph));
    DSLAB_CUDA(cudaGraphInstantiate(&prog.graph, graph, 0));
    DSLAB_CUDA(cudaGraphDestroy(graph));
  }

  // Runs `batch` on `prog`: tokens[k] is the k-th piece's greedy next token (-1 unless it wants one), logits[k] its
  // logits (when asked).
  void run_program(Program& prog, const std::vector<const EnginePiece*>& batch, std::vector<TokenChoice>* tokens,
                   std::vector<std::vector<float>>* logits) {
    write_metadata(prog, batch);
    tokens->assign(batch.size(), TokenChoice{});
    if (logits) logits->assign(batch.size(), {});
    std::vector<int32_t> rows;  // the logits row of each wanted token: its piece's last token
    std::vector<size_t> wanted;
    for (size_t k = 0; k < batch.size(); ++k)
      if (batch[k]->wants_token) {
        rows.push_back(int32_t(int64_t(k) * prog.q_len + int64_t(batch[k]->tokens.size()) - 1));
        wanted.push_back(k);
      }
    DSLAB_CUDA(cudaEventRecord(begin_, stream_));
    launch(prog);
    if (!rows.empty()) {
      DSLAB_CUDA(cudaMemcpyAsync(rows_.get(), rows.data(), rows.size() * 4, cudaMemcpyHostToDevice, stream_));
      const int64_t T = int64_t(rows_.size());  // (tokens_: ids [T], gaps [T], RMSs [T], the floats bit-cast)
      float* gaps = reinterpret_cast<float*>(tokens_.get() + T);
      argmax_rows_kernel<<<unsigned(rows.size()), kArgmaxThreads, 0, stream_>>>(
          logits_.get(), m_.vocab_size, rows_.get(), tokens_.get(), gaps, gaps + T);
      DSLAB_CUDA(cudaGetLastError());
      DSLAB_CUDA(cudaMemcpyAsync(tokens_host_, tokens_.get(), size_t(3 * T) * 4, cudaMemcpyDeviceToHost, stream_));
    }
    DSLAB_CUDA(cudaEventRecord(end_, stream_));
    DSLAB_CUDA(cudaStreamSynchronize(stream_));
    float ms = 0;
    DSLAB_CUDA(cudaEventElapsedTime(&ms, begin_, end_));
    busy_s_ += double(ms) / 1e3;
    const int64_t T = int64_t(rows_.size());
    for (size_t j = 0; j < wanted.size(); ++j) {
      const int32_t token = tokens_host_[j];
      if (token < 0 || token >= m_.vocab_size)
        throw std::runtime_error("engine: request " + std::to_string(batch[wanted[j]]->request) +
                                 ": its logits are not finite (no greedy token)");
      TokenChoice& c = (*tokens)[wanted[j]];
      c.token = token;
      std::memcpy(&c.top2_gap, tokens_host_ + T + int64_t(j), 4);
      std::memcpy(&c.logits_rms, tokens_host_ + 2 * T + int64_t(j), 4);
      if (logits) {
        std::vector<float> row(size_t(m_.vocab_size));
        DSLAB_CUDA(cudaMemcpy(row.data(), logits_.get() + int64_t(rows[j]) * m_.vocab_size, row.size() * 4,
                              cudaMemcpyDeviceToHost));
        (*logits)[wanted[j]] = std::move(row);
      }
    }
  }

  void release() {
    for (auto& p : programs_)
      if (p.graph) cudaGraphExecDestroy(p.graph);
    programs_.clear();
    caches_.clear();
    weights_.clear();
    if (meta_host_) cudaFreeHost(meta_host_);
    if (tokens_host_) cudaFreeHost(tokens_host_);
    meta_host_ = tokens_host_ = nullptr;
    if (begin_) cudaEventDestroy(begin_);
    if (end_) cudaEventDestroy(end_);
    if (stream_) cudaStreamDestroy(stream_);
    begin_ = end_ = nullptr;
    stream_ = nullptr;
    arena_.reserve(0);
  }

  ModelConfig m_;
  EngineLimits limits_;
  std::unique_ptr<EngineAxes> axes_;
  std::unique_ptr<Shapes> shapes_;
  std::unique_ptr<BlasHandle> blas_, side_blas_;
  std::vector<LayerWeights> weights_;
  DeviceArray<__nv_bfloat16> embed_, final_norm_, lm_head_, xb_;
  std::vector<PagedLatentCache> caches_;
  ScratchArena arena_;
  DeviceArray<float> resid_, attn_out_, ffn_out_, logits_;
  DeviceArray<int32_t> meta_, rows_, tokens_;
  int32_t *meta_host_ = nullptr, *tokens_host_ = nullptr;
  int64_t off_pt_ = 0, off_cos_ = 0, off_sin_ = 0, off_sched_ = 0, off_ids_ = 0, off_step_ = 0, meta_ints_ = 0;
  int64_t pages_per_row_ = 0;
  int32_t spare_page_ = 0;
  std::vector<Program> programs_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
  double busy_s_ = 0, load_s_ = 0, load_bytes_ = 0, device_bytes_ = 0;
  int64_t gpu_expert_layers_ = 0;  // with a CPU op: the leading MoE layers whose experts the GPU runs
};

DSLAB_REGISTER_ENGINE(DeepseekEngineCuda, "layer/deepseek/cuda");

}  // namespace
}  // namespace dslab::layer::cuda
