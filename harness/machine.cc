#include "harness/machine.h"

#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "harness/build_info.h"
#include "harness/calibrate_cpu.h"
#include "harness/gpu.h"
#include "harness/host.h"

namespace dslab {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs per_thread(iterations) on every thread at once; returns aggregate FLOP/s, best of `tries`.
template <class F>
double parallel_rate(int threads, int64_t iterations, int tries, F per_thread) {
  double best = 0;
  for (int t = 0; t < tries; ++t) {
    double flops = 0;
    const double start = now_s();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += per_thread(iterations);
    best = std::max(best, flops / (now_s() - start));
  }
  return best;
}

// Read bandwidth over a buffer far larger than the LLC, first touched by the threads of the widest reading (so its
// pages sit where they read them); a reading on fewer threads reads the same total in their chunks.
class DramProbe {
 public:
  explicit DramProbe(int threads)
      : n_(int64_t(std::max<size_t>(size_t(1) << 30, cpu_info().llc_bytes * 8) / sizeof(float))),
        buf_(static_cast<float*>(std::aligned_alloc(64, size_t(n_) * 4)), &std::free) {
    const int64_t chunk = (n_ / threads) & ~int64_t(63);
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num();
      for (int64_t i = t * chunk; i < (t + 1) * chunk; ++i) buf_.get()[i] = float(i % 7) + 0.5f;
    }
  }
  size_t bytes() const { return size_t(n_) * 4; }
  double read_bytes_per_s(int threads) {  // best of 10 passes
    const int64_t chunk = (n_ / threads) & ~int64_t(63);
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 10; ++rep) {
      float total = 0;
      const double start = now_s();
#pragma omp parallel num_threads(threads) reduction(+ : total)
      total += calibrate::read_sum(buf_.get() + omp_get_thread_num() * chunk, chunk);
      best = std::max(best, double(chunk * threads * 4) / (now_s() - start));
      sink = sink + total;
    }
    return best;
  }

 private:
  int64_t n_;
  std::unique_ptr<float, decltype(&std::free)> buf_;
};

}  // namespace

std::string default_machine_path() {
  if (const char* env = std::getenv("DSLAB_MACHINE")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/dslab/machine.json";
}

nlohmann::json calibrate_machine(int threads) {
  const CpuInfo& cpu = cpu_info();
  nlohmann::json m;
  m["cpu_model"] = cpu.model;
  m["dslab_version"] = DSLAB_VERSION;
  m["git_sha"] = DSLAB_GIT_SHA;
  nlohmann::json c;
  c["threads"] = threads;
  if (cpu.amx_bf16 && request_amx_permission().empty()) {
    calibrate::amx_bf16_flops_per_thread(1000);  // warm: tile state allocation, frequency ramp
    c["amx_bf16_flops"] = parallel_rate(threads, 2'000'000, 3, calibrate::amx_bf16_flops_per_thread);
    c["amx_bf16_how"] = "TDPBF16PS on 4 independent 16x16 fp32 tiles from registers, all threads, best of 3";
    c["amx_int8_ops"] = parallel_rate(threads, 2'000'000, 3, calibrate::amx_int8_ops_per_thread);
    c["amx_int8_how"] = "TDPBSSD on 4 independent 16x16 int32 tiles from registers, all threads, best of 3";
  } else {
    c["amx_bf16_flops"] = nullptr;
    c["amx_bf16_how"] = cpu.amx_bf16 ? request_amx_permission() : "no AMX on this CPU";
  }
  if (cpu.avx512_bf16) {
    c["avx512_bf16_flops"] = parallel_rate(threads, 20'000'000, 3, calibrate::avx512_bf16_flops_per_thread);
    c["avx512_bf16_how"] = "VDPBF16PS zmm on 12 independent accumulators, all threads, best of 3";
  } else {
    c["avx512_bf16_flops"] = nullptr;
    c["avx512_bf16_how"] = "no AVX512_BF16 on this CPU";
  }
  if (cpu.avx512f) {
    DramProbe probe(threads);
    c["dram_read_bytes_per_s"] = probe.read_bytes_per_s(threads);
    c["dram_read_how"] = "sum of a " + std::to_string(probe.bytes() >> 20) + " MiB buffer, 64-byte loads on 8 accumulators, all threads, best of 10";
    // The rates at fewer threads (a hybrid step may give the CPU experts only some cores): powers of two, then all.
    nlohmann::json by = nlohmann::json::array();
    for (int n = 1;; n = std::min(2 * n, threads)) {
      nlohmann::json e = {{"threads", n}, {"dram_read_bytes_per_s", probe.read_bytes_per_s(n)}};
      if (cpu.avx512_bf16) e["avx512_bf16_flops"] = parallel_rate(n, 20'000'000, 3, calibrate::avx512_bf16_flops_per_thread);
      if (cpu.amx_bf16 && request_amx_permission().empty())
        e["amx_bf16_flops"] = parallel_rate(n, 2'000'000, 3, calibrate::amx_bf16_flops_per_thread);
      by.push_back(e);
      if (n == threads) break;
    }
    c["by_threads"] = by;
  } else {
    c["dram_read_bytes_per_s"] = nullptr;
    c["dram_read_how"] = "needs AVX-512 for the read probe";
  }
  m["cpu"] = c;
  m["gpu"] = gpu::calibrate();
  if (gpu_info().present) m["gpu"]["name"] = gpu_info().name, m["gpu"]["memory_bytes"] = double(gpu_info().memory_bytes);
  return m;
}

nlohmann::json combine_calibrations(const std::vector<nlohmann::json>& runs) {
  if (runs.empty()) throw std::logic_error("combine_calibrations: no runs");
  nlohmann::json out = runs.front();
  if (runs.size() == 1) return out;
  nlohmann::json spread = nlohmann::json::object();
  for (const char* section : {"cpu", "gpu"}) {
    if (!out.contains(section) || !out[section].is_object()) continue;
    for (auto& [key, value] : out[section].items()) {
      if (!value.is_number() || key == "threads") continue;
      std::vector<double> v;
      for (const auto& r : runs)
        if (r.contains(section) && r[section].contains(key) && r[section][key].is_number()) v.push_back(r[section][key].get<double>());
      std::sort(v.begin(), v.end());
      const double median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
      value = median;
      spread[std::string(section) + "." + key] = {{"min", v.front()}, {"median", median}, {"max", v.back()},
                                                  {"spread", median != 0 ? (v.back() - v.front()) / median : 0.0}, {"runs", v.size()}};
    }
  }
  out["spread"] = spread;
  return out;
}

std::optional<nlohmann::json> load_machine(const std::string& path, std::string* why) {
  std::ifstream f(path);
  if (!f) {
    *why = "no machine file at " + path + " (run `dslab calibrate`): roofline_fraction omitted";
    return std::nullopt;
  }
  nlohmann::json m = nlohmann::json::parse(f, nullptr, false);
  if (m.is_discarded() || !m.is_object()) {
    *why = path + ": not a machine file (malformed JSON): roofline_fraction omitted";
    return std::nullopt;
  }
  if (m.value("cpu_model", "") != cpu_info().model) {
    *why = path + " was measured on '" + m.value("cpu_model", "?") + "', not this CPU: roofline_fraction omitted";
    return std::nullopt;
  }
  return m;
}

std::optional<double> machine_ceiling(const nlohmann::json& machine, const std::string& key) {
  const auto dot = key.find('.');
  const std::string section = key.substr(0, dot), field = key.substr(dot + 1);
  if (!machine.contains(section) || !machine[section].is_object()) return std::nullopt;
  const auto& s = machine[section];
  if (!s.contains(field) || !s[field].is_number()) return std::nullopt;
  return s[field].get<double>();
}

}  // namespace dslab
