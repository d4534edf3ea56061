// A generation engine: a whole model that runs the steps a serving scheduler plans (harness/serving.h) over a paged
// cache, for `dslab generate`. The scheduler decides which requests run and which pages they hold; the engine runs
// each step's prompt chunks and decode tokens and returns the greedy next token of each piece that ends in one.
// Engines register by name in OpRegistry<Engine> (harness/op_registry.h), next to their definition.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/op_registry.h"
#include "harness/point.h"
#include "harness/variant.h"

namespace dslab {

// The engine's limits for a run, fixed at prepare(): graphs, buffers and the cache are sized by them.
struct EngineLimits {
  int64_t max_running = 1;     // requests decoding at once (the concurrency)
  int64_t chunk_tokens = 512;  // the longest prompt chunk of a step
  int64_t max_context = 0;     // the longest request (input + output tokens)
  int64_t page_size = 64;
  int64_t pages = 0;  // cache pages the scheduler hands out (each layer's pool has these, plus the engine's own)
  double device_budget_bytes = 0;  // the GPU memory the engine may hold: weights, buffers and pages (0: the engine's)
};

// One request's share of a step: a prompt chunk or one decode token, at positions [position, position + tokens).
struct EnginePiece {
  int64_t request = 0;
  int64_t position = 0;
  std::vector<int32_t> tokens;
  const std::vector<int32_t>* pages = nullptr;  // the request's pages, in order (the scheduler's)
  bool decode = false;
  bool wants_token = false;  // the piece ends the prompt or is a decode: its last token's greedy successor is wanted
};

// A piece's greedy next token, with what a check of it needs: the gap between its logit and the runner-up's, and the
// logits row's RMS (the scale numeric noise is measured against).
struct TokenChoice {
  int32_t token = -1;
  float top2_gap = 0, logits_rms = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Axes the engine reads with their defaults (the layer step's spelling: attn, moe, executor, ...).
  virtual std::vector<std::pair<std::string, std::string>> axes() const = 0;
  virtual bool reads_weights() const { return false; }
  // Whether it can run the model at these axes and limits (memory included), and why not.
  virtual Support supports(const ModelFile& model, const Point& axes, const EngineLimits& limits) const = 0;
  // The most cache pages the device holds beside everything else at these limits (limits.pages ignored).
  virtual int64_t max_pages(const ModelFile& model, const Point& axes, const EngineLimits& limits) const = 0;
  // Weights (ModelFile::weights, or random from the seed), cache, step programs (graphs captured here).
  virtual void prepare(const ModelFile& model, const Point& axes, const EngineLimits& limits, uint64_t seed) = 0;
  // Runs one scheduler step: every decode piece in one batch, each prompt chunk on its own; returns for each piece
  // that wants one its greedy next token (token -1 for the others). logits, when given, receives each such piece's
  // logits [vocab] (else left alone). Synchronous: the tokens are needed to plan the next step.
  virtual std::vector<TokenChoice> step(const std::vector<EnginePiece>& pieces,
                                        std::vector<std::vector<float>>* logits = nullptr) = 0;
  // Device-busy seconds of the steps so far (events around each launch), and facts of the prepared engine.
  virtual double busy_s() const = 0;
  virtual std::map<std::string, double> counters() const { return {}; }
};

using EngineRegistry = OpRegistry<Engine>;

}  // namespace dslab

#define DSLAB_REGISTER_ENGINE(Class, name)                                                                          \
  static const bool dslab_engine_##Class =                                                                          \
      (::dslab::EngineRegistry::instance().add(name, [] { return std::unique_ptr<::dslab::Engine>(new Class()); }), \
       true)
