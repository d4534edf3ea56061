// Continuous batching for whole requests, as serving engines schedule them (vLLM's chunked prefill, SGLang's
// scheduler): requests arrive over time, are admitted while a batch slot and the pages of their whole footprint are
// free, and every engine step runs one token of each running request's decode plus chunks of waiting prompts up to a
// token budget. The GPU engine loop runs the steps this plans; the plan itself is host logic, tested on its own.
//
// Policy (stated, since engines differ): decodes first, then prompt chunks in arrival order (vLLM's chunked prefill);
// admission reserves a request's whole KV footprint (input + output tokens, in pages), so no request is ever preempted
// and pages freed by a finished request are reused by the next; a prompt's last chunk yields its first output token.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace dslab::serving {

struct RequestSpec {
  int64_t input_len = 0, output_len = 0;
  double arrival_s = 0;
  std::vector<int32_t> prompt;  // a trace's own prompt token ids (input_len of them), or empty: the caller makes them
  // Tokens fed after the prompt instead of the engine's own greedy picks (teacher forcing: another engine's tokens,
  // so that a comparison of logits never diverges), output_len - 1 of them; empty: the engine's picks.
  std::vector<int32_t> continuation;
};

// A request set: lengths from a distribution (fixed: `a`; uniform: integers in [a, b]; lognormal: exp(N(mu = a,
// sigma = b)) rounded, at least 1) for input and output alike, arriving all at once (rate 0) or as a Poisson process of
// `rate` requests a second. The same seed gives the same set.
struct LengthDist {
  std::string kind = "fixed";  // fixed | uniform | lognormal
  double a = 1, b = 0;
};
struct RequestSetSpec {
  int64_t requests = 1;
  LengthDist input, output;
  double rate = 0;  // requests a second; 0: all at time 0
};
// BadInput naming the field for a distribution that makes no sense (a non-positive length, b < a, sigma < 0).
std::vector<RequestSpec> request_set(const RequestSetSpec& spec, uint64_t seed);
// A JSONL trace, a request a line: {"input_len": N, "output_len": N, "arrival_s": T} (arrival optional: 0), or with
// "prompt": [token ids] in place of input_len (a fixed prompt, e.g. to compare logits with another engine) and
// "continuation": [token ids] (RequestSpec::continuation). BadInput
// naming the file, line and field for anything else.
std::vector<RequestSpec> load_trace(const std::string& path);

// Request `request`'s prompt: the trace's own ids, or input_len ids drawn uniformly over the vocabulary from the seed.
std::vector<int32_t> prompt_tokens(const RequestSpec& q, int64_t request, uint64_t seed, int64_t vocab);

struct SchedulerConfig {
  int64_t max_running = 1;     // concurrency: requests in the batch at once
  int64_t chunk_tokens = 512;  // the step's token budget: decode tokens plus prompt chunk tokens
  int64_t page_size = 64;
  int64_t total_pages = 0;  // the paged cache's pages
};

// One request's share of a step: a prompt chunk (tokens of its prompt from first_token) or one decode token.
struct StepWork {
  int64_t request = 0;
  int64_t first_token = 0;  // position in the request's sequence of the chunk's first token
  int64_t tokens = 0;
  bool decode = false;
};

// When each request's tokens came out (seconds on the caller's clock).
struct RequestTimeline {
  double arrival_s = 0;
  double first_token_s = -1, finish_s = -1;
  std::vector<double> token_s;  // every output token's time, the first included
};

class Scheduler {
 public:
  // BadInput for a request that could never run (no tokens, or a footprint over the whole cache or the budget).
  Scheduler(const SchedulerConfig& config, std::vector<RequestSpec> requests);
  // The next step's work at time `now`: admits arrived requests (in arrival order) while a slot and their pages are
  // free, then plans decodes and prompt chunks. Empty when nothing can run before next_arrival().
  std::vector<StepWork> next_step(double now);
  // The step planned last has ended at `now`: prompts advance by their chunks (a finished prompt yields its first
  // token), decodes by a token; finished requests leave the batch and free their pages.
  void complete(double now);
  bool done() const { return finished_ == int64_t(requests_.size()); }
  double next_arrival() const;  // the next waiting request's arrival, or infinity
  int64_t free_pages() const { return int64_t(free_pages_.size()); }
  int64_t running() const { return int64_t(running_.size()); }
  const std::vector<int32_t>& pages_of(int64_t request) const { return state_[size_t(request)].pages; }
  const std::vector<RequestTimeline>& timelines() const { return timelines_; }
  int64_t pages_needed(int64_t request) const;

 private:
  struct State {
    int64_t prefilled = 0, generated = 0;
    std::vector<int32_t> pages;
  };
  SchedulerConfig config_;
  std::vector<RequestSpec> requests_;
  std::vector<State> state_;
  std::vector<RequestTimeline> timelines_;
  std::deque<int64_t> waiting_;  // arrival order
  std::vector<int64_t> running_;
  std::vector<int32_t> free_pages_;  // a stack: the most recently freed page is reused first
  std::vector<StepWork> planned_;
  int64_t finished_ = 0;
};

// What serving benchmarks report of a run (SGLang's bench_serving, vLLM's benchmark_serving, same definitions):
// TTFT = first token - arrival; TPOT = (finish - first token) / (output_len - 1), over requests of 2+ output tokens
// (the first token excluded); ITL = every gap between consecutive output tokens of a request, pooled; E2E = finish -
// arrival; throughputs over the run's span, first arrival to last finish. Percentiles as numpy's default (linear).
struct Distribution {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
  int64_t count = 0;
};
Distribution distribution(std::vector<double> values);
struct ServingMetrics {
  int64_t requests = 0, input_tokens = 0, output_tokens = 0;
  double duration_s = 0;
  Distribution ttft_s, tpot_s, itl_s, e2e_s;
  double output_tokens_per_s = 0, total_tokens_per_s = 0;
};
// BadInput if a request has not finished or its timeline does not hold its output_len tokens.
ServingMetrics serving_metrics(const std::vector<RequestSpec>& requests, const std::vector<RequestTimeline>& timelines);

}  // namespace dslab::serving
