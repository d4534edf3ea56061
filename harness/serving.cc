#include "harness/serving.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "harness/errors.h"

namespace dslab::serving {

Scheduler::Scheduler(const SchedulerConfig& config, std::vector<RequestSpec> requests)
    : config_(config), requests_(std::move(requests)), state_(requests_.size()), timelines_(requests_.size()) {
  if (config_.max_running < 1 || config_.chunk_tokens < 1 || config_.page_size < 1 || config_.total_pages < 1)
    throw BadInput("scheduler: max_running, chunk_tokens, page_size and total_pages must be positive");
  for (size_t r = 0; r < requests_.size(); ++r) {
    const RequestSpec& q = requests_[r];
    const std::string which = "request " + std::to_string(r);
    if (q.input_len < 1 || q.output_len < 1)
      throw BadInput(which + ": input_len " + std::to_string(q.input_len) + ", output_len " +
                     std::to_string(q.output_len) + ": expected at least one token each");
    if (pages_needed(int64_t(r)) > config_.total_pages)
      throw BadInput(which + ": needs " + std::to_string(pages_needed(int64_t(r))) + " pages of " +
                     std::to_string(config_.page_size) + " tokens, the cache has " +
                     std::to_string(config_.total_pages));
    timelines_[r].arrival_s = q.arrival_s;
  }
  std::vector<int64_t> order(requests_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return requests_[size_t(a)].arrival_s < requests_[size_t(b)].arrival_s;
  });
  waiting_.assign(order.begin(), order.end());
  for (int64_t p = config_.total_pages - 1; p >= 0; --p) free_pages_.push_back(int32_t(p));  // page 0 taken first
}

int64_t Scheduler::pages_needed(int64_t request) const {
  const RequestSpec& q = requests_[size_t(request)];
  return (q.input_len + q.output_len + config_.page_size - 1) / config_.page_size;
}

double Scheduler::next_arrival() const {
  return waiting_.empty() ? std::numeric_limits<double>::infinity() : requests_[size_t(waiting_.front())].arrival_s;
}

std::vector<StepWork> Scheduler::next_step(double now) {
  // Admission: arrived requests in arrival order while a slot and their whole footprint's pages are free (the head
  // of the queue waits for room rather than being overtaken).
  while (!waiting_.empty() && int64_t(running_.size()) < config_.max_running) {
    const int64_t r = waiting_.front();
    if (requests_[size_t(r)].arrival_s > now || pages_needed(r) > int64_t(free_pages_.size())) break;
    waiting_.pop_front();
    for (int64_t i = 0; i < pages_needed(r); ++i) {
      state_[size_t(r)].pages.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
    running_.push_back(r);
  }
  planned_.clear();
  // Every running request past its prompt decodes one token; the prompts share what is left of the token budget.
  int64_t budget = config_.chunk_tokens;
  for (int64_t r : running_) {
    const State& s = state_[size_t(r)];
    if (s.prefilled == requests_[size_t(r)].input_len) {
      planned_.push_back({r, requests_[size_t(r)].input_len + s.generated - 1, 1, true});
      --budget;
    }
  }
  for (int64_t r : running_) {
    const State& s = state_[size_t(r)];
    const int64_t left = requests_[size_t(r)].input_len - s.prefilled;
    if (left == 0 || budget <= 0) continue;
    const int64_t chunk = std::min(left, budget);
    planned_.push_back({r, s.prefilled, chunk, false});
    budget -= chunk;
  }
  return planned_;
}

void Scheduler::complete(double now) {
  std::vector<int64_t> finished;
  for (const StepWork& w : planned_) {
    State& s = state_[size_t(w.request)];
    RequestTimeline& t = timelines_[size_t(w.request)];
    const RequestSpec& q = requests_[size_t(w.request)];
    if (w.decode) {
      ++s.generated;
      t.token_s.push_back(now);
    } else {
      s.prefilled += w.tokens;
      if (s.prefilled < q.input_len) continue;
      s.generated = 1;  // the prompt's last position yields the first output token
      t.first_token_s = now;
      t.token_s.push_back(now);
    }
    if (s.generated == q.output_len) finished.push_back(w.request);
  }
  planned_.clear();
  for (int64_t r : finished) {
    timelines_[size_t(r)].finish_s = now;
    running_.erase(std::find(running_.begin(), running_.end(), r));
    State& s = state_[size_t(r)];
    for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) free_pages_.push_back(*it);  // reused first
    s.pages.clear();
    ++finished_;
  }
}

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: counter-based draws, the same on every machine
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double uniform_open(uint64_t stream, uint64_t i) {  // in (0, 1)
  return (double(mix(stream + i * 0x9e3779b97f4a7c15ull) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

int64_t draw_length(const LengthDist& d, uint64_t stream, uint64_t i, const std::string& field) {
  if (d.kind == "fixed") {
    if (d.a < 1) throw bad_field("request set", field, std::to_string(d.a), "a length of at least 1");
    return int64_t(d.a);
  }
  if (d.kind == "uniform") {
    if (d.a < 1 || d.b < d.a)
      throw bad_field("request set", field, "uniform " + std::to_string(d.a) + ".." + std::to_string(d.b),
                      "1 <= low <= high");
    return int64_t(d.a) + int64_t(uniform_open(stream, i) * (std::floor(d.b) - std::floor(d.a) + 1));
  }
  if (d.kind == "lognormal") {
    if (d.b < 0) throw bad_field("request set", field, "sigma " + std::to_string(d.b), "sigma >= 0");
    // Box-Muller from two independent uniforms.
    const double u1 = uniform_open(stream, 2 * i), u2 = uniform_open(stream, 2 * i + 1);
    const double z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    return std::max<int64_t>(1, std::llround(std::exp(d.a + d.b * z)));
  }
  throw bad_field("request set", field, d.kind, "fixed | uniform | lognormal");
}

}  // namespace

std::vector<RequestSpec> request_set(const RequestSetSpec& spec, uint64_t seed) {
  if (spec.requests < 1) throw bad_field("request set", "requests", std::to_string(spec.requests), "at least 1");
  if (spec.rate < 0) throw bad_field("request set", "rate", std::to_string(spec.rate), "requests a second, or 0");
  const uint64_t in = mix(seed ^ 0x1e9b7ull), out = mix(seed ^ 0x0b7ull), gaps = mix(seed ^ 0xa441ull);
  std::vector<RequestSpec> set;
  double t = 0;
  for (int64_t r = 0; r < spec.requests; ++r) {
    RequestSpec q;
    q.input_len = draw_length(spec.input, in, uint64_t(r), "input_len");
    q.output_len = draw_length(spec.output, out, uint64_t(r), "output_len");
    if (spec.rate > 0 && r > 0) t += -std::log(uniform_open(gaps, uint64_t(r))) / spec.rate;  // exponential gaps
    q.arrival_s = t;
    set.push_back(q);
  }
  return set;
}

std::vector<int32_t> prompt_tokens(const RequestSpec& q, int64_t request, uint64_t seed, int64_t vocab) {
  if (!q.prompt.empty()) return q.prompt;
  std::vector<int32_t> ids(size_t(q.input_len));
  const uint64_t stream = seed * 0x9e3779b97f4a7c15ull + uint64_t(request) * 0xbf58476d1ce4e5b9ull + 0x5eed;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(mix(stream + i * 0x9e3779b97f4a7c15ull) % uint64_t(vocab));
  return ids;
}

std::vector<RequestSpec> load_trace(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw BadInput(path + ": cannot open (expected a JSONL trace: a request a line)");
  std::vector<RequestSpec> set;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw BadInput(where + ": malformed JSON (expected {\"input_len\": N, \"output_len\": N, \"arrival_s\": T})");
    }
    if (!j.is_object()) throw BadInput(where + ": expected an object");
    for (const auto& [k, v] : j.items())
      if (k != "input_len" && k != "output_len" && k != "arrival_s" && k != "prompt" && k != "continuation")
        throw BadInput(where + ": field '" + k +
                       "': unknown (expected input_len, output_len, arrival_s, prompt, continuation)");
    RequestSpec q;
    if (j.contains("prompt")) {  // the prompt's token ids themselves (input_len, if given too, must agree)
      const auto& p = j.at("prompt");
      bool ok = p.is_array() && !p.empty();
      for (const auto& id : p)
        ok = ok && id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1ll << 31);
      if (!ok) throw bad_field(where, "prompt", p.dump().substr(0, 40), "a non-empty list of token ids");
      q.prompt = p.get<std::vector<int32_t>>();
      if (!j.contains("input_len")) j["input_len"] = int64_t(q.prompt.size());
      if (j.at("input_len") != int64_t(q.prompt.size()))
        throw bad_field(where, "input_len", j.at("input_len").dump(),
                        "the prompt's length, " + std::to_string(q.prompt.size()));
    }
    for (const char* k : {"input_len", "output_len"}) {
      if (!j.contains(k) || !j.at(k).is_number_integer() || j.at(k).get<int64_t>() < 1)
        throw bad_field(where, k, j.contains(k) ? j.at(k).dump() : "missing", "a positive integer");
    }
    q.input_len = j.at("input_len").get<int64_t>();
    q.output_len = j.at("output_len").get<int64_t>();
    if (j.contains("continuation")) {
      const auto& c = j.at("continuation");
      bool ok = c.is_array() && int64_t(c.size()) == q.output_len - 1;
      for (const auto& id : c)
        ok = ok && id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1ll << 31);
      if (!ok)
        throw bad_field(where, "continuation", c.dump().substr(0, 40),
                        "output_len - 1 = " + std::to_string(q.output_len - 1) + " token ids");
      q.continuation = c.get<std::vector<int32_t>>();
    }
    if (j.contains("arrival_s")) {
      if (!j.at("arrival_s").is_number() || j.at("arrival_s").get<double>() < 0)
        throw bad_field(where, "arrival_s", j.at("arrival_s").dump(), "seconds >= 0");
      q.arrival_s = j.at("arrival_s").get<double>();
    }
    set.push_back(q);
  }
  if (set.empty()) throw BadInput(path + ": no requests (expected a JSONL trace: a request a line)");
  return set;
}

Distribution distribution(std::vector<double> v) {
  Distribution d;
  d.count = int64_t(v.size());
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {  // numpy.percentile, method 'linear'
    const double pos = q * double(v.size() - 1);
    const size_t lo = size_t(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
  };
  d.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  d.p50 = at(0.50), d.p90 = at(0.90), d.p99 = at(0.99);
  return d;
}

ServingMetrics serving_metrics(const std::vector<RequestSpec>& requests,
                               const std::vector<RequestTimeline>& timelines) {
  if (requests.size() != timelines.size()) throw BadInput("serving metrics: a timeline per request expected");
  ServingMetrics m;
  std::vector<double> ttft, tpot, itl, e2e;
  double first_arrival = std::numeric_limits<double>::infinity(), last_finish = -first_arrival;
  for (size_t r = 0; r < requests.size(); ++r) {
    const RequestSpec& q = requests[r];
    const RequestTimeline& t = timelines[r];
    if (t.finish_s < 0 || int64_t(t.token_s.size()) != q.output_len)
      throw BadInput("serving metrics: request " + std::to_string(r) + ": " + std::to_string(t.token_s.size()) +
                     " of its " + std::to_string(q.output_len) + " output tokens timed (expected a finished request)");
    m.input_tokens += q.input_len, m.output_tokens += q.output_len;
    first_arrival = std::min(first_arrival, t.arrival_s);
    last_finish = std::max(last_finish, t.finish_s);
    ttft.push_back(t.first_token_s - t.arrival_s);
    e2e.push_back(t.finish_s - t.arrival_s);
    if (q.output_len > 1) tpot.push_back((t.finish_s - t.first_token_s) / double(q.output_len - 1));
    for (size_t i = 1; i < t.token_s.size(); ++i) itl.push_back(t.token_s[i] - t.token_s[i - 1]);
  }
  m.requests = int64_t(requests.size());
  m.duration_s = requests.empty() ? 0 : last_finish - first_arrival;
  m.ttft_s = distribution(ttft), m.tpot_s = distribution(tpot), m.itl_s = distribution(itl),
  m.e2e_s = distribution(e2e);
  if (m.duration_s > 0) {
    m.output_tokens_per_s = double(m.output_tokens) / m.duration_s;
    m.total_tokens_per_s = double(m.input_tokens + m.output_tokens) / m.duration_s;
  }
  return m;
}

}  // namespace dslab::serving
