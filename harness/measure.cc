#include "harness/measure.h"

#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "harness/gpu.h"
#include "harness/host.h"
#include "harness/team_thread.h"

namespace dslab {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Reads a buffer twice the last-level cache so the next run() starts with its data in DRAM (nvbench's
// cold-L2 flush, done on the CPU side). Reading, not writing: a written buffer leaves the cache full of
// dirty lines whose write-back the timed run would then pay for.
void flush_cpu_caches() {
  static const std::vector<uint64_t> buffer(cpu_info().llc_bytes * 2 / sizeof(uint64_t), 1);
  static volatile uint64_t sink = 0;
  uint64_t sum = 0;
  const int64_t n = int64_t(buffer.size());
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < n; i += 8) sum += buffer[size_t(i)];  // one word per 64-byte line
  sink = sink + sum;
}

// Evicts every line of the buffers from all cache levels (CLFLUSH: baseline x86-64, so no CPU check), the
// buffers split over all threads.
void evict(const std::vector<std::pair<const void*, size_t>>& buffers) {
  for (const auto& [p, bytes] : buffers) {
    const auto* first = static_cast<const char*>(p);
    const int64_t lines = int64_t((bytes + 63) / 64);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < lines; ++i) _mm_clflush(first + i * 64);
  }
  _mm_mfence();
}

// The stop rule on one subject's samples so far (n of them, their sum and sum of squares), timeout aside: "converged",
// "max_samples", or "" to go on.
std::string rule_says_stop(const StopRule& rule, size_t n, double sum, double sum_sq) {
  const double k = double(n);
  if (n >= size_t(rule.min_samples) && sum >= rule.min_time_s) {
    const double mean = sum / k, var = std::max(0.0, (sum_sq - k * mean * mean) / (k - 1));
    if (std::sqrt(var / k) <= rule.max_noise * mean) return "converged";
  }
  return n >= size_t(rule.max_samples) ? "max_samples" : "";
}

double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}

}  // namespace

Stats summarize(std::vector<double> s) {
  Stats st;
  if (s.empty()) return st;
  std::sort(s.begin(), s.end());
  st.median = quantile(s, 0.5);
  st.p10 = quantile(s, 0.1);
  st.p90 = quantile(s, 0.9);
  st.mean = std::accumulate(s.begin(), s.end(), 0.0) / double(s.size());
  double ss = 0;
  for (double x : s) ss += (x - st.mean) * (x - st.mean);
  st.stdev = s.size() > 1 ? std::sqrt(ss / double(s.size() - 1)) : 0;
  return st;
}

double SampleSet::spread() const {
  const Stats st = summarize(seconds);
  return st.median > 0 ? (st.p90 - st.p10) / st.median : 0;
}

std::vector<SampleSet> measure_interleaved(const std::vector<Subject>& subjects, const StopRule& rule, bool hot) {
  const size_t n = subjects.size();
  std::vector<SampleSet> out(n);
  std::vector<bool> flush(n);
  for (size_t i = 0; i < n; ++i) {
    const bool gpu = subjects[i].device == Device::cuda;
    flush[i] = !hot && (gpu || subjects[i].working_set_bytes < 4.0 * double(cpu_info().llc_bytes));
    out[i].cache_state = hot ? "hot" : (flush[i] ? "flushed" : "streaming");
  }
  // A variant's cold buffers are evicted before every sample unless hot, streaming ones too: a working set of a few
  // LLCs read every sample still kept a fifth of it resident (the engine then read 146 GB/s over a 130 GB/s DRAM).
  std::vector<std::vector<std::pair<const void*, size_t>>> cold(n);
  for (size_t i = 0; i < n; ++i)
    if (!hot)
      cold[i] = subjects[i].variant->cold_buffers();  // (a GPU variant's: host memory it reads, e.g. CPU experts)
  auto one_sample = [&](size_t i) {
    Variant& v = *subjects[i].variant;
    if (subjects[i].device == Device::cuda) {
      if (!cold[i].empty()) run_on_team_thread([&] { evict(cold[i]); });
      const double seconds = gpu::time_seconds([&] { v.run(); }, flush[i]);
      return v.own_time_s().value_or(seconds);
    }
    double seconds = 0;
    run_on_team_thread([&] {  // (one OpenMP team for the flush and the variant's regions: harness/team_thread.h)
      if (flush[i]) flush_cpu_caches();
      evict(cold[i]);
      const double start = now_s();
      v.run();
      seconds = now_s() - start;
    });
    return v.own_time_s().value_or(seconds);
  };
  // Warm-up: first-touch, lazy initialisation, frequency ramp. At least one call and 50 ms each.
  for (size_t i = 0; i < n; ++i) {
    const double warm_start = now_s();
    do one_sample(i);
    while (now_s() - warm_start < 0.05);
  }
  std::vector<double> sum(n, 0), sum_sq(n, 0);
  size_t running = n;
  const double start = now_s();
  // Each round visits the subjects in a fresh order: a subject that leaves the machine in a state (clock
  // license after AMX or AVX-512, cache contents) must not always precede the same neighbour.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::mt19937 shuffle_rng(12345);
  while (running > 0) {
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (size_t i : order) {
      if (!out[i].stop_reason.empty()) continue;
      const double s = one_sample(i);
      out[i].seconds.push_back(s);
      sum[i] += s;
      sum_sq[i] += s * s;
      out[i].stop_reason = rule_says_stop(rule, out[i].seconds.size(), sum[i], sum_sq[i]);
      running -= !out[i].stop_reason.empty();
    }
    if (now_s() - start >= rule.timeout_s * double(n))
      for (size_t i = 0; i < n; ++i)
        if (out[i].stop_reason.empty() && out[i].seconds.size() >= 2) {
          out[i].stop_reason = "timeout";
          --running;
        }
  }
  // A disturbed window: sample that subject again, alone, and keep the steadier window.
  if (rule.max_spread > 0)
    for (size_t i = 0; i < n; ++i) {
      if (out[i].seconds.size() < 5 || out[i].spread() <= rule.max_spread) continue;
      SampleSet again;
      again.cache_state = out[i].cache_state;
      double total = 0, total_sq = 0;
      const double again_start = now_s();
      while (again.stop_reason.empty()) {
        const double s = one_sample(i);
        again.seconds.push_back(s);
        total += s, total_sq += s * s;
        again.stop_reason = rule_says_stop(rule, again.seconds.size(), total, total_sq);
        if (again.stop_reason.empty() && now_s() - again_start >= rule.timeout_s && again.seconds.size() >= 2)
          again.stop_reason = "timeout";
      }
      const double first = out[i].spread(), second = again.spread();
      if (second < first) {
        again.discarded_spread = first;
        out[i] = std::move(again);
      } else {
        out[i].discarded_spread = second;
      }
    }
  return out;
}

}  // namespace dslab
