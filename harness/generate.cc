// `dslab generate`: whole requests through a generation engine under continuous batching, measured as serving
// benchmarks measure them (SGLang's bench_serving and bench_one_batch, vLLM's benchmark_serving and
// benchmark_latency): TTFT, TPOT, ITL, end-to-end latency, tokens/s, GPU busy fraction, batch occupancy; and verified:
// every request's greedy tokens equal those of the same request run alone.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/command.h"
#include "harness/engine.h"
#include "harness/errors.h"
#include "harness/host.h"
#include "harness/results.h"
#include "harness/safetensors.h"
#include "harness/serving.h"
#include "harness/sweep.h"

namespace dslab {
namespace {

using serving::RequestSpec;

// A near-tie (see the verification in cmd_generate): where two runs pick different tokens, the one-at-a-time run's pick
// ahead of its runner-up and the batched run's ahead of its own, together, by at most this fraction of the logits
// row's RMS. bf16 logits of one request differ between batch shapes (GEMMs, split-KV attention and expert groups of
// other shapes accumulate in another order); measured on the H200 over V2-Lite's 27 layers (random weights, 16K-21K
// positions a run), the partings' leads summed to 0.03 of the RMS at the median and 0.24 at most. A wrong token, page
// or cache entry makes a row another row altogether: nearly every position then parts, which the second bar catches.
constexpr float kTieFraction = 0.25f;
// And the share of positions where the two runs pick the same token, at least (measured 95.4-95.6% on random weights,
// whose logits are flat; a trained model's are peaked).
constexpr double kMinIdentical = 0.9;

const char* kGenerateHelp = R"(usage: dslab generate [options]

Runs a request set through a generation engine (the whole model: prefill in chunks, then greedy decode steps) under
continuous batching: requests arrive (all at once, or as a Poisson process), are admitted while a batch slot and the
cache pages of their whole footprint are free, and leave as they finish, their pages reused. Each step runs every
running request's next token plus prompt chunks up to the chunk budget (decodes first). Reports per run TTFT, TPOT
(the first token excluded) and ITL percentiles, end-to-end latency, output and total tokens/s, the GPU's busy fraction
and the batch occupancy; bench_one_batch's numbers (prefill latency, median decode step, throughput) come from a run
of --requests = --concurrency with fixed lengths. Verified (unless --no-verify): every request is first run alone
(concurrency 1); a batched run is fed those tokens, and at every position its greedy token must equal the one-at-a-time
run's, or the two part at a near-tie (bf16 rounding of another batch shape; docs/generation.md).

options:
  --model NAME|PATH     model config (workloads/models/NAME.json or a HF config.json); random weights from --seed
  --weights DIR         a Hugging Face checkpoint folder: its config is the model, its weights are run
  --engine NAME         the engine (default layer/deepseek/cuda)
  --requests N          requests in the set (default 64)
  --input DIST          prompt lengths: fixed:N | uniform:A,B | lognormal:MU,SIGMA (default fixed:1024)
  --output DIST         output lengths, the same forms (default fixed:256)
  --rate R              arrivals a second, a Poisson process (default 0: all at time 0)
  --trace FILE          a JSONL request set instead ({"input_len", "output_len", "arrival_s"} a line; or "prompt":
                        [ids] for input_len, and "continuation": [ids] fed after the prompt in place of the
                        engine's own tokens, to compare logits with another engine)
  --concurrency LIST    requests in the batch at once, a run each (default 16; e.g. 1,16,64)
  --chunk N             a step's token budget: decode tokens plus prompt chunk tokens (default 512)
  --page-size N         tokens per cache page (default 64)
  --gpu-budget GB       the GPU memory the engine may hold, weights, buffers and cache together (e.g. 24; default
                        0.9 of the GPU's); fewer cache pages than every request's worst case make admission wait
  --axis NAME=VALUES    an engine axis, values comma-separated (a run each): attn, prefill_attn, moe, executor
                        (graph | eager), kv_dtype, proj, pdl, block_keys, gpu_experts (with moe=moe/host/cuda:
                        none | layers:N | fit, the leading MoE layers whose experts stay on the GPU);
                        `dslab generate --list-axes` lists them with defaults
  --logits FILE         write the first run's logits of every generated token (safetensors: logits.r<N>
                        [output_len][vocab] f32, tokens.r<N>) for a comparison with another engine
  --no-verify           skip the one-at-a-time run that checks the batched tokens
  --seed N              seed of the random weights, prompts and request set (default 1)
  --out DIR             where results.json and report.md go (default results/generate)

examples:
  dslab generate --model deepseek-v2-lite --requests 64 --input uniform:1024,4096 --output fixed:256 \
      --concurrency 1,16,64 --out results/generate
  dslab generate --weights /data/DeepSeek-V2-Lite --trace requests.jsonl --concurrency 8
)";

serving::LengthDist parse_dist(const std::string& flag, const std::string& text) {
  serving::LengthDist d;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon), rest = colon == std::string::npos ? "" : text.substr(colon + 1);
  auto number = [&](const std::string& s) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != s.size() || s.empty() || !std::isfinite(v))
      throw BadInput("command line: " + flag + " '" + text + "': expected fixed:N, uniform:A,B or lognormal:MU,SIGMA");
    return v;
  };
  const size_t comma = rest.find(',');
  d.kind = kind;
  if (kind == "fixed" && comma == std::string::npos) {
    d.a = number(rest);
  } else if ((kind == "uniform" || kind == "lognormal") && comma != std::string::npos) {
    d.a = number(rest.substr(0, comma));
    d.b = number(rest.substr(comma + 1));
  } else {
    throw BadInput("command line: " + flag + " '" + text + "': expected fixed:N, uniform:A,B or lognormal:MU,SIGMA");
  }
  return d;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

struct RunOutcome {
  serving::ServingMetrics metrics;
  std::vector<serving::RequestTimeline> timelines;
  std::vector<std::vector<int32_t>> tokens;             // per request, its generated tokens
  std::vector<std::vector<TokenChoice>> choices;        // and each one's runner-up gap and logits scale
  std::vector<std::vector<std::vector<float>>> logits;  // per request, per generated token (when asked)
  double busy_s = 0, prefill_latency_s = 0, decode_step_p50_s = 0, mean_decodes = 0;
  std::vector<double> step_t, step_decodes, step_prefill_tokens;  // the occupancy over time, a sample per step
};

RunOutcome run_requests(Engine& engine, const std::vector<RequestSpec>& requests,
                        const std::vector<std::vector<int32_t>>& prompts, int64_t concurrency,
                        const EngineLimits& limits, bool keep_logits, const std::string& label,
                        const std::vector<std::vector<int32_t>>* forced = nullptr) {
  serving::SchedulerConfig sc;
  sc.max_running = concurrency;
  sc.chunk_tokens = limits.chunk_tokens;
  sc.page_size = limits.page_size;
  sc.total_pages = limits.pages;
  serving::Scheduler scheduler(sc, requests);
  RunOutcome out;
  out.tokens.resize(requests.size());
  out.choices.resize(requests.size());
  if (keep_logits) out.logits.resize(requests.size());
  const double busy0 = engine.busy_s();
  std::vector<double> decode_steps;
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_progress = 0;
  int64_t done_tokens = 0;
  while (!scheduler.done()) {
    const double t = now();
    const std::vector<serving::StepWork> work = scheduler.next_step(t);
    if (work.empty()) {
      const double next = scheduler.next_arrival();
      if (!std::isfinite(next)) throw std::logic_error("generate: nothing to run and nothing to come");
      std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, next - t)));
      continue;
    }
    std::vector<EnginePiece> pieces(work.size());
    int64_t decodes = 0, prefill_tokens = 0;
    for (size_t i = 0; i < work.size(); ++i) {
      const serving::StepWork& w = work[i];
      EnginePiece& p = pieces[i];
      const RequestSpec& q = requests[size_t(w.request)];
      p.request = w.request;
      p.position = w.first_token;
      p.pages = &scheduler.pages_of(w.request);
      p.decode = w.decode;
      if (w.decode) {
        const auto& mine = out.tokens[size_t(w.request)];
        const size_t k = mine.size() - 1;  // (the k-th decode feeds the k-th token after the prompt)
        p.tokens = {!q.continuation.empty() ? q.continuation[k]
                    : forced                ? (*forced)[size_t(w.request)][k]
                                            : mine.back()};
        p.wants_token = true;
        ++decodes;
      } else {
        const auto& prompt = prompts[size_t(w.request)];
        p.tokens.assign(prompt.begin() + w.first_token, prompt.begin() + w.first_token + w.tokens);
        p.wants_token = w.first_token + w.tokens == q.input_len;
        prefill_tokens += w.tokens;
      }
    }
    std::vector<std::vector<float>> logits;
    const double began = now();
    const std::vector<TokenChoice> next = engine.step(pieces, keep_logits ? &logits : nullptr);
    size_t k = 0;
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i].wants_token) {
        out.tokens[size_t(pieces[i].request)].push_back(next[i].token);
        out.choices[size_t(pieces[i].request)].push_back(next[i]);
        if (keep_logits) out.logits[size_t(pieces[i].request)].push_back(std::move(logits[k++]));
        ++done_tokens;
      }
    scheduler.complete(now());
    if (prefill_tokens == 0) decode_steps.push_back(now() - began);
    out.step_t.push_back(began);
    out.step_decodes.push_back(double(decodes));
    out.step_prefill_tokens.push_back(double(prefill_tokens));
    if (isatty(STDERR_FILENO) && now() - last_progress > 1.0) {
      last_progress = now();
      std::fprintf(stderr, "\r  %s: %lld tokens out, %lld running, %.1f s  ", label.c_str(),
                   static_cast<long long>(done_tokens), static_cast<long long>(scheduler.running()), last_progress);
    }
  }
  if (isatty(STDERR_FILENO)) std::fprintf(stderr, "\r%80s\r", "");
  out.timelines = scheduler.timelines();
  out.metrics = serving::serving_metrics(requests, out.timelines);
  out.busy_s = engine.busy_s() - busy0;
  for (const auto& tl : out.timelines) out.prefill_latency_s = std::max(out.prefill_latency_s, tl.first_token_s);
  out.decode_step_p50_s = serving::distribution(decode_steps).p50;
  double sum = 0;
  for (double d : out.step_decodes) sum += d;
  out.mean_decodes = out.step_decodes.empty() ? 0 : sum / double(out.step_decodes.size());
  return out;
}

nlohmann::json distribution_json(const serving::Distribution& d) {
  return {{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"count", d.count}};
}

int cmd_generate(int argc, char** argv) {
  const Args a =
      parse_args(argc, argv, 2, {"--no-verify", "--list-axes"},
                 {"--model", "--weights", "--engine", "--requests", "--input", "--output", "--rate", "--trace",
                  "--concurrency", "--chunk", "--page-size", "--gpu-budget", "--axis", "--logits", "--seed", "--out"});
  if (!a.positional.empty()) throw BadInput("command line: unexpected argument '" + a.positional[0] + "'");
  const std::string engine_name = a.one("--engine", "layer/deepseek/cuda");
  std::unique_ptr<Engine> engine = EngineRegistry::instance().make(engine_name);
  if (!engine) {
    std::string list;
    for (const auto& n : EngineRegistry::instance().names()) list += (list.empty() ? "" : " | ") + n;
    throw BadInput("command line: --engine '" + engine_name + "': expected one of " +
                   (list.empty() ? std::string("(none built: no CUDA toolkit at configure time)") : list));
  }
  if (a.has("--list-axes")) {
    for (const auto& [name, value] : engine->axes()) std::printf("%-14s default %s\n", name.c_str(), value.c_str());
    return 0;
  }
  // The model.
  const std::string weights = a.one("--weights");
  if (!weights.empty() && !a.one("--model").empty())
    throw BadInput("command line: --model and --weights: the checkpoint's config.json is the model (give one)");
  if (weights.empty() && a.one("--model").empty())
    throw BadInput("command line: expected --model NAME|PATH or --weights DIR");
  ModelFile model = load_model_file(weights.empty() ? a.one("--model") : weights + "/config.json");
  model.weights = weights;
  const int64_t vocab = model.config.value("vocab_size", int64_t(0));
  if (vocab <= 0) throw BadInput(model.path + ": field 'vocab_size': missing: expected the vocabulary's size");
  // The request set.
  const uint64_t seed = uint64_t(a.number("--seed", 1, 0));
  std::vector<RequestSpec> requests;
  nlohmann::json set_json;
  if (!a.one("--trace").empty()) {
    for (const char* f : {"--requests", "--input", "--output", "--rate"})
      if (a.has(f)) throw BadInput(std::string("command line: --trace and ") + f + ": the trace is the request set");
    requests = serving::load_trace(a.one("--trace"));
    set_json = {{"trace", a.one("--trace")}, {"requests", requests.size()}};
  } else {
    serving::RequestSetSpec spec;
    spec.requests = int64_t(a.number("--requests", 64, 1));
    spec.input = parse_dist("--input", a.one("--input", "fixed:1024"));
    spec.output = parse_dist("--output", a.one("--output", "fixed:256"));
    spec.rate = a.number("--rate", 0, 0);
    requests = serving::request_set(spec, seed);
    set_json = {{"requests", spec.requests},
                {"input", a.one("--input", "fixed:1024")},
                {"output", a.one("--output", "fixed:256")},
                {"rate", spec.rate}};
  }
  std::vector<std::vector<int32_t>> prompts;
  for (size_t r = 0; r < requests.size(); ++r) {
    prompts.push_back(serving::prompt_tokens(requests[r], int64_t(r), seed, vocab));
    std::vector<int32_t> ids = prompts.back();
    ids.insert(ids.end(), requests[r].continuation.begin(), requests[r].continuation.end());
    for (int32_t id : ids)
      if (id >= vocab)
        throw BadInput(a.one("--trace") + ": request " + std::to_string(r) +
                       ": field 'prompt' or 'continuation': token id " + std::to_string(id) +
                       ": expected below vocab_size " + std::to_string(vocab));
  }
  std::vector<int64_t> concurrencies;
  for (const auto& c : split_commas(a.one("--concurrency", "16"))) {
    char* end = nullptr;
    const long long v = std::strtoll(c.c_str(), &end, 10);
    if (c.empty() || *end || v < 1)
      throw BadInput("command line: --concurrency '" + a.one("--concurrency") +
                     "': expected positive integers, e.g. 1,16,64");
    concurrencies.push_back(v);
  }
  EngineLimits limits;
  limits.chunk_tokens = int64_t(a.number("--chunk", 512, 1));
  limits.page_size = int64_t(a.number("--page-size", 64, 1));
  limits.device_budget_bytes = a.has("--gpu-budget") ? a.number("--gpu-budget", 0, 1e-6) * 1e9 : 0;
  limits.max_running = *std::max_element(concurrencies.begin(), concurrencies.end());
  for (const auto& q : requests) limits.max_context = std::max(limits.max_context, q.input_len + q.output_len);
  // The engine's axes: defaults, then --axis overrides (lists: a run each, the cross product).
  std::vector<std::pair<std::string, std::vector<std::string>>> axis_values;
  for (const auto& [name, value] : engine->axes()) axis_values.push_back({name, {value}});
  for (const auto& ov : a.all("--axis")) {
    const size_t eq = ov.find('=');
    const std::string name = ov.substr(0, eq);
    auto it = std::find_if(axis_values.begin(), axis_values.end(), [&](const auto& e) { return e.first == name; });
    if (eq == std::string::npos || it == axis_values.end()) {
      std::string list;
      for (const auto& e : axis_values) list += (list.empty() ? "" : ", ") + e.first;
      throw BadInput("command line: --axis '" + ov + "': expected NAME=VALUES with NAME one of " + list);
    }
    it->second = split_commas(ov.substr(eq + 1));
  }
  std::vector<Point> points(1);
  for (const auto& [name, values] : axis_values) {
    std::vector<Point> next;
    for (const Point& p : points)
      for (const auto& v : values) {
        Point q = p;
        q.set(name, {v, 0, false});
        next.push_back(q);
      }
    points = next;
  }
  // Every point checked before anything runs: bad axis values are bad input, an engine that cannot run says why.
  const bool verify = !a.has("--no-verify");
  const std::string out_dir = a.one("--out", "results/generate"), logits_path = a.one("--logits");
  std::vector<EngineLimits> point_limits;
  for (const Point& p : points) {
    EngineLimits l = limits;
    const int64_t per_request = (l.max_context + l.page_size - 1) / l.page_size;
    l.pages = per_request * l.max_running;
    const Support s = engine->supports(model, p, l);
    if (!s.ok) {
      const int64_t fit = gpu_info().present ? engine->max_pages(model, p, l) : 0;
      if (fit >= per_request && s.reason.find("GPU memory") != std::string::npos) {
        l.pages = fit;  // fewer pages than every slot's worst case: admission waits for room, as engines do
      } else {
        std::fprintf(stderr, "dslab generate: %s at %s: %s\n", engine_name.c_str(), p.label().c_str(),
                     s.reason.c_str());
        return 1;
      }
    }
    point_limits.push_back(l);
  }

  nlohmann::json context = run_context(joined_command_line(argc, argv));
  context["engine"] = engine_name;
  context["model"] = model.name;
  if (!weights.empty()) context["weights"] = weights;
  context["seed"] = seed;
  context["request_set"] = set_json;
  context["chunk_tokens"] = limits.chunk_tokens;
  context["page_size"] = limits.page_size;
  if (limits.device_budget_bytes > 0) context["gpu_budget_bytes"] = limits.device_budget_bytes;
  context["verify"] = verify;
  nlohmann::json benchmarks = nlohmann::json::array();
  std::string table =
      "| run | TTFT p50 / p90 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms | E2E p50 s | out tok/s | total tok/s | "
      "GPU busy | mean decodes a step | greedy tokens as alone |\n|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<DumpTensor> dumps;
  std::vector<std::vector<float>> dump_store;
  std::vector<std::vector<int32_t>> token_store;
  int failures = 0;
  for (size_t pi = 0; pi < points.size(); ++pi) {
    const Point& p = points[pi];
    std::fprintf(stderr, "preparing %s on %s (%s)\n", engine_name.c_str(), model.name.c_str(), p.label().c_str());
    engine->prepare(model, p, point_limits[pi], seed);
    RunOutcome alone;
    // The one-at-a-time tokens first: a run of concurrency 1 if asked for, else a check run (0) that reports nothing.
    std::vector<int64_t> order = concurrencies;
    std::stable_partition(order.begin(), order.end(), [](int64_t c) { return c == 1; });
    if (verify && order.front() != 1) order.insert(order.begin(), 0);
    for (int64_t c : order) {
      const bool check_only = c == 0;
      const int64_t running = check_only ? 1 : c;
      std::vector<RequestSpec> set = requests;
      if (check_only)
        for (auto& q : set) q.arrival_s = 0;
      const std::string label = "concurrency " + std::to_string(running) + (check_only ? " (one at a time)" : "");
      const bool keep_logits = !logits_path.empty() && !check_only && dumps.empty() && pi == 0;
      // With verification, a batched run is fed the one-at-a-time run's tokens (teacher forcing: the same work, and
      // a rounding-level parting at one position does not change every later one), and its own greedy picks are
      // compared with those tokens at every position.
      const bool forcing = verify && !alone.tokens.empty();
      const RunOutcome o = run_requests(*engine, set, prompts, running, point_limits[pi], keep_logits, label,
                                        forcing ? &alone.tokens : nullptr);
      if (running == 1 && alone.tokens.empty()) alone = o;
      if (check_only) continue;
      const auto& m = o.metrics;
      nlohmann::json e;
      e["name"] = "generate/" + engine_name + "/" + model.name + "/" + p.label() + "/concurrency:" + std::to_string(c);
      e["run_name"] = e["name"];
      e["run_type"] = "iteration";
      e["repetitions"] = 1;
      e["repetition_index"] = 0;
      e["threads"] = 1;
      e["iterations"] = 1;
      e["real_time"] = m.duration_s * 1e3;
      e["cpu_time"] = m.duration_s * 1e3;
      e["time_unit"] = "ms";
      e["variant"] = engine_name;  // (the engine: a results reader's variant)
      e["engine"] = engine_name;
      e["model"] = model.name;
      nlohmann::json axes;
      for (const auto& [name, v] : p.entries()) axes[name] = v.text;
      e["axes"] = axes;
      e["concurrency"] = c;
      nlohmann::json g;
      g["requests"] = m.requests;
      g["input_tokens"] = m.input_tokens;
      g["output_tokens"] = m.output_tokens;
      g["duration_s"] = m.duration_s;
      g["ttft_s"] = distribution_json(m.ttft_s);
      g["tpot_s"] = distribution_json(m.tpot_s);
      g["itl_s"] = distribution_json(m.itl_s);
      g["e2e_s"] = distribution_json(m.e2e_s);
      g["output_tokens_per_s"] = m.output_tokens_per_s;
      g["total_tokens_per_s"] = m.total_tokens_per_s;
      g["gpu_busy_fraction"] = m.duration_s > 0 ? o.busy_s / m.duration_s : 0;
      g["mean_decodes_per_step"] = o.mean_decodes;
      g["prefill_latency_s"] = o.prefill_latency_s;  // bench_one_batch's: the last first token
      g["decode_step_p50_s"] = o.decode_step_p50_s;  // bench_one_batch's median decode latency
      // The raw series the plots draw: each request's TTFT and E2E, every ITL gap, the occupancy per step.
      std::vector<double> ttft, e2e, itl;
      for (const auto& tl : o.timelines) {
        ttft.push_back(tl.first_token_s - tl.arrival_s);
        e2e.push_back(tl.finish_s - tl.arrival_s);
        for (size_t i = 1; i < tl.token_s.size(); ++i) itl.push_back(tl.token_s[i] - tl.token_s[i - 1]);
      }
      g["series"] = {{"ttft_s", ttft},
                     {"e2e_s", e2e},
                     {"itl_s", itl},
                     {"step_t_s", o.step_t},
                     {"step_decodes", o.step_decodes},
                     {"step_prefill_tokens", o.step_prefill_tokens}};
      e["generation"] = g;
      e["counters"] = engine->counters();
      std::string verdict = "not checked";
      if (verify) {
        // Every position of every request: the batched run's greedy token (fed the one-at-a-time run's tokens) against
        // the one-at-a-time run's. A position passes if they are equal, or if they part at a near-tie (the two picks'
        // leads over their runners-up together within kTieFraction of the logits' RMS); any other position fails.
        int64_t positions = 0, same = 0, ties = 0, requests_same = 0;
        nlohmann::json differing = nlohmann::json::array();
        for (size_t r = 0; r < requests.size(); ++r) {
          bool all = true;
          for (size_t k = 0; k < alone.tokens[r].size(); ++k, ++positions) {
            if (o.tokens[r][k] == alone.tokens[r][k]) {
              ++same;
              continue;
            }
            all = false;
            const TokenChoice& a = alone.choices[r][k];
            const TokenChoice& b = o.choices[r][k];
            const bool tie = a.top2_gap + b.top2_gap <= kTieFraction * std::max(a.logits_rms, b.logits_rms);
            ties += tie ? 1 : 0;
            differing.push_back({{"request", r},
                                 {"token", k},
                                 {"alone_top2_gap", a.top2_gap},
                                 {"batched_top2_gap", b.top2_gap},
                                 {"logits_rms", a.logits_rms},
                                 {"near_tie", tie}});
          }
          requests_same += all ? 1 : 0;
        }
        const bool pass = same + ties == positions && double(same) >= kMinIdentical * double(positions);
        e["verification"] = {
            {"check",
             "at every position, fed the one-at-a-time run's tokens, the batched run's greedy token equals "
             "the one-at-a-time run's, or the two part at a near-tie (their leads over their runners-up "
             "together <= " +
                 std::to_string(kTieFraction) + " x the logits' RMS)"},
            {"requests", requests.size()},
            {"requests_identical", requests_same},
            {"positions", positions},
            {"identical", same},
            {"near_ties", ties},
            {"differing", differing},
            {"pass", pass}};
        char text[128];
        std::snprintf(text, sizeof text, "%.2f%% (%lld near-tie%s, %lld not)", 100.0 * double(same) / double(positions),
                      static_cast<long long>(ties), ties == 1 ? "" : "s",
                      static_cast<long long>(positions - same - ties));
        verdict = text;
        if (!pass) ++failures;
      }
      benchmarks.push_back(e);
      char row[512];
      std::snprintf(row, sizeof row,
                    "| %s concurrency %lld | %.1f / %.1f / %.1f | %.2f / %.2f | %.2f / %.2f | %.2f | %.0f | %.0f | "
                    "%.2f | %.1f | %s |\n",
                    p.label().c_str(), static_cast<long long>(c), 1e3 * m.ttft_s.p50, 1e3 * m.ttft_s.p90,
                    1e3 * m.ttft_s.p99, 1e3 * m.tpot_s.p50, 1e3 * m.tpot_s.p99, 1e3 * m.itl_s.p50, 1e3 * m.itl_s.p99,
                    m.e2e_s.p50, m.output_tokens_per_s, m.total_tokens_per_s, g["gpu_busy_fraction"].get<double>(),
                    o.mean_decodes, verdict.c_str());
      table += row;
      std::fprintf(stderr, "%s", row);
      if (keep_logits)
        for (size_t r = 0; r < requests.size(); ++r) {
          std::vector<float> flat;
          for (const auto& l : o.logits[r]) flat.insert(flat.end(), l.begin(), l.end());
          dump_store.push_back(std::move(flat));
          token_store.push_back(o.tokens[r]);
          const int64_t n = int64_t(o.logits[r].size());
          dumps.push_back({"logits.r" + std::to_string(r), "F32", {n, vocab}, nullptr, size_t(n * vocab) * 4});
          dumps.push_back({"tokens.r" + std::to_string(r), "I32", {n}, nullptr, size_t(n) * 4});
        }
    }
  }
  // Everything ran: the results, the report and (asked) the logits, each written whole.
  std::filesystem::create_directories(out_dir);
  write_json_atomically(out_dir + "/results.json", {{"context", context}, {"benchmarks", benchmarks}});
  std::ofstream report(out_dir + "/report.md.tmp");
  report << "# dslab generate: " << engine_name << " on " << model.name
         << (weights.empty() ? " (random weights, seed " + std::to_string(seed) + ")" : " (" + weights + ")") << "\n\n"
         << "Request set: " << set_json.dump() << "; chunk " << limits.chunk_tokens << " tokens, pages of "
         << limits.page_size << ".";
  if (gpu_info().present) report << " GPU: " << gpu_info().name << ".";
  report
      << "\n\nTTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1); ITL = gaps between a "
         "request's tokens; throughputs over first arrival to last finish (SGLang's and vLLM's definitions). "
         "bench_one_batch's prefill latency and median decode step are in results.json (prefill_latency_s, "
         "decode_step_p50_s).\n\n"
      << table;
  report.close();
  std::filesystem::rename(out_dir + "/report.md.tmp", out_dir + "/report.md");
  if (!logits_path.empty()) {
    for (size_t i = 0; i < dump_store.size(); ++i) {
      dumps[2 * i].data = dump_store[i].data();
      dumps[2 * i + 1].data = token_store[i].data();
    }
    write_safetensors(logits_path, dumps, {{"engine", engine_name}, {"model", model.name}});
  }
  std::printf("results: %s/results.json, report: %s/report.md\n", out_dir.c_str(), out_dir.c_str());
  if (failures) {
    std::fprintf(stderr, "dslab generate: %d run(s) produced tokens that differ from the one-at-a-time run\n",
                 failures);
    return 1;
  }
  return 0;
}

}  // namespace

DSLAB_REGISTER_COMMAND(generate, "generate",
                       "whole requests under continuous batching: TTFT, TPOT, ITL, tokens/s; tokens verified",
                       kGenerateHelp, cmd_generate);

}  // namespace dslab
