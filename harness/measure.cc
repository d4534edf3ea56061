#include "harness/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "harness/gpu.h"
#include "harness/host.h"

namespace dslab {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Overwrites a buffer twice the last-level cache so the next run() starts with its data in DRAM
// (nvbench's cold-L2 memset, done on the CPU side).
void flush_cpu_caches() {
  static std::vector<unsigned char> buffer(cpu_info().llc_bytes * 2);
  static unsigned char round = 1;
  std::memset(buffer.data(), ++round, buffer.size());
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

SampleSet measure(Variant& v, Device device, const StopRule& rule, bool hot, double working_set_bytes) {
  SampleSet out;
  const bool gpu = device == Device::cuda;
  const bool flush = !hot && (gpu || working_set_bytes < 4.0 * double(cpu_info().llc_bytes));
  out.cache_state = hot ? "hot" : (flush ? "flushed" : "streaming");
  auto one_sample = [&] {
    if (gpu) return gpu::time_seconds([&] { v.run(); }, flush);
    if (flush) flush_cpu_caches();
    const double start = now_s();
    v.run();
    return now_s() - start;
  };
  // Warm-up: first-touch, lazy initialisation, frequency ramp. At least one call and 50 ms.
  const double warm_start = now_s();
  do one_sample();
  while (now_s() - warm_start < 0.05);

  const double start = now_s();
  double sum = 0, sum_sq = 0;
  for (;;) {
    const double s = one_sample();
    out.seconds.push_back(s);
    sum += s;
    sum_sq += s * s;
    const double n = double(out.seconds.size());
    if (out.seconds.size() >= size_t(rule.min_samples) && sum >= rule.min_time_s) {
      const double mean = sum / n, var = std::max(0.0, (sum_sq - n * mean * mean) / (n - 1));
      if (std::sqrt(var / n) <= rule.max_noise * mean) {
        out.stop_reason = "converged";
        break;
      }
    }
    if (out.seconds.size() >= size_t(rule.max_samples)) {
      out.stop_reason = "max_samples";
      break;
    }
    if (now_s() - start >= rule.timeout_s && out.seconds.size() >= 2) {
      out.stop_reason = "timeout";
      break;
    }
  }
  return out;
}

}  // namespace dslab
