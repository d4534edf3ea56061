#include "harness/machine.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "harness/build_info.h"
#include "harness/calibrate_cpu.h"
#include "harness/collectives.h"
#include "harness/gpu.h"
#include "harness/host.h"

namespace dslab {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Pins the calling thread to the index-th CPU this process may use for the scope of a probe, then gives back its
// old mask: each probe thread stays on one core, so the pages it first touched stay near it and no two threads
// share a core. (OpenMP's thread 0 is the caller, so the mask must be restored.)
class ScopedPin {
 public:
  explicit ScopedPin(int index) {
    pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_);
    static const std::vector<int> cpus = [] {
      cpu_set_t set;
      std::vector<int> v;
      if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
          if (CPU_ISSET(c, &set)) v.push_back(c);
      return v;
    }();
    if (cpus.empty()) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[size_t(index) % cpus.size()], &one);
    pinned_ = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
  }
  ~ScopedPin() {
    if (pinned_) pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_);
  }
  ScopedPin(const ScopedPin&) = delete;
  ScopedPin& operator=(const ScopedPin&) = delete;

 private:
  cpu_set_t saved_;
  bool pinned_ = false;
};

// How long the package idles before each try of a compute probe. A core's clock follows its recent power draw:
// on the lent Xeons a burst of VDPBF16PS after a quiet phase ran 1.6x the rate of the same code sustained (1.1 vs
// 0.7 TFLOP/s), and the MoE kernels run in such bursts (between flushes, memory-bound phases); tries from a rested
// package measure the rate a kernel can reach, and agree from one calibration to the next.
constexpr auto kRestBeforeTry = std::chrono::milliseconds(200);

// Runs per_thread(iterations) on every thread at once, pinned, each try after a rest; aggregate FLOP/s, best of
// `tries`.
template <class F>
double parallel_rate(int threads, int64_t iterations, int tries, F per_thread) {
  double best = 0;
  for (int t = 0; t < tries; ++t) {
    std::this_thread::sleep_for(kRestBeforeTry);
    double flops = 0;
    const double start = now_s();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      ScopedPin pin(omp_get_thread_num());
      flops += per_thread(iterations);
    }
    best = std::max(best, flops / (now_s() - start));
  }
  return best;
}

// How a thread reads its part of the buffer: side-by-side streams and a software prefetch distance.
struct ReadLayout {
  int streams;
  int prefetch_lines;
};

// STREAM-style DRAM probe over a buffer far larger than the LLC, first touched by the pinned threads of the widest
// reading (so its pages sit where they are read); a reading on fewer threads reads the same total in their chunks.
class DramProbe {
 public:
  explicit DramProbe(int threads)
      : threads_(threads),
        n_(int64_t(std::max<size_t>(size_t(1) << 30, cpu_info().llc_bytes * 8) / sizeof(float)) & ~int64_t(1023)),
        buf_(static_cast<float*>(std::aligned_alloc(64, size_t(n_) * 4)), &std::free) {
    if (!buf_) throw std::runtime_error("calibrate: cannot allocate the DRAM probe's buffer");
    const int64_t chunk = chunk_of(threads);
#pragma omp parallel num_threads(threads)
    {
      ScopedPin pin(omp_get_thread_num());
      const int64_t t = omp_get_thread_num();
      for (int64_t i = t * chunk; i < (t + 1) * chunk; ++i) buf_.get()[i] = float(i % 7) + 0.5f;
    }
  }
  size_t bytes() const { return size_t(n_) * 4; }
  double read_bytes_per_s(int threads, ReadLayout layout, int passes) {  // best of `passes`
    const int64_t chunk = chunk_of(threads);
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < passes; ++rep) {
      float total = 0;
      const double start = now_s();
#pragma omp parallel num_threads(threads) reduction(+ : total)
      {
        ScopedPin pin(omp_get_thread_num());
        total += calibrate::read_sum(buf_.get() + omp_get_thread_num() * chunk, chunk, layout.streams,
                                     layout.prefetch_lines);
      }
      best = std::max(best, double(chunk * threads * 4) / (now_s() - start));
      sink = sink + total;
    }
    return best;
  }
  // STREAM's copy on all threads: each copies the first half of its chunk over the second; bytes read + written.
  double copy_bytes_per_s(int passes) {
    const int64_t chunk = chunk_of(threads_), half = calibrate::odd_lines(chunk / 2);
    double best = 0;
    for (int rep = 0; rep < passes; ++rep) {
      const double start = now_s();
#pragma omp parallel num_threads(threads_)
      {
        ScopedPin pin(omp_get_thread_num());
        float* mine = buf_.get() + omp_get_thread_num() * chunk;
        calibrate::copy_lines(mine, mine + half, half);
      }
      best = std::max(best, double(2 * half * threads_ * 4) / (now_s() - start));
    }
    return best;
  }

 private:
  // A thread's part: an odd number of lines (calibrate::odd_lines), so the threads' parts start out of step.
  int64_t chunk_of(int threads) const { return calibrate::odd_lines(n_ / threads); }
  int threads_;
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
    c["amx_bf16_flops"] = parallel_rate(threads, 2'000'000, 5, calibrate::amx_bf16_flops_per_thread);
    c["amx_bf16_how"] =
        "TDPBF16PS on 4 independent 16x16 fp32 tiles from registers, all threads pinned, each try after 200 ms idle, "
        "best of 5";
    c["amx_int8_ops"] = parallel_rate(threads, 2'000'000, 5, calibrate::amx_int8_ops_per_thread);
    c["amx_int8_how"] =
        "TDPBSSD on 4 independent 16x16 int32 tiles from registers, all threads pinned, each try after 200 ms idle, "
        "best of 5";
  } else {
    c["amx_bf16_flops"] = nullptr;
    c["amx_bf16_how"] = cpu.amx_bf16 ? request_amx_permission() : "no AMX on this CPU";
  }
  // The AVX-512 rate: the best over instruction mixes (register-only chains, 12 or 24; the MoE kernel's shape) and
  // run lengths (short bursts best of 5, sustained best of 2), measured again after the DRAM probe (the rate moves
  // with the host's clock and neighbours; a kernel can reach the best of it, so the ceiling is the best seen).
  int avx_chains = 24;
  int64_t avx_iterations = 24'000'000 / 24;
  auto per_instruction = [](int chains) { return chains == 0 ? 1024 : chains; };
  auto avx_rate = [&](int n, int tries) {
    return parallel_rate(n, avx_iterations, tries,
                         [&](int64_t k) { return calibrate::avx512_bf16_flops_per_thread(k, avx_chains); });
  };
  nlohmann::json avx_runs = nlohmann::json::array();
  double avx_best = 0;
  if (cpu.avx512_bf16) {
    for (int chains : {12, 24, 0})
      for (int64_t instructions : {int64_t(24'000'000), int64_t(240'000'000)}) {
        const int64_t iterations = instructions / per_instruction(chains);
        const double rate = parallel_rate(threads, iterations, instructions < 100'000'000 ? 5 : 2, [&](int64_t n) {
          return calibrate::avx512_bf16_flops_per_thread(n, chains);
        });
        avx_runs.push_back({{"shape", chains == 0 ? std::string("moe_kernel") : std::to_string(chains) + "_chains"},
                            {"instructions_per_thread", instructions},
                            {"flops", rate}});
        if (rate > avx_best) avx_best = rate, avx_chains = chains, avx_iterations = iterations;
      }
  } else {
    c["avx512_bf16_flops"] = nullptr;
    c["avx512_bf16_how"] = "no AVX512_BF16 on this CPU";
  }
  if (cpu.avx512f) {
    DramProbe probe(threads);
    // STREAM quality: try each read layout (streams per thread x software prefetch distance) briefly, then read
    // with the best one ten times; the kernels' own layouts (the MoE engine reads two prefetched weight streams
    // per thread) are among them, so no kernel streams faster than the ceiling.
    ReadLayout best_layout{1, 0};
    double best = 0;
    nlohmann::json layouts = nlohmann::json::array();
    for (int streams : {1, 2, 4, 8})
      for (int prefetch : {0, 8, 32}) {
        const double rate = probe.read_bytes_per_s(threads, {streams, prefetch}, 3);
        layouts.push_back({{"streams", streams}, {"prefetch_lines", prefetch}, {"bytes_per_s", rate}});
        if (rate > best) best = rate, best_layout = {streams, prefetch};
      }
    c["dram_read_bytes_per_s"] = std::max(best, probe.read_bytes_per_s(threads, best_layout, 10));
    c["dram_read_how"] = "sum of a " + std::to_string(probe.bytes() >> 20) +
                         " MiB buffer first touched by its readers, threads pinned, " +
                         std::to_string(best_layout.streams) + " streams per thread prefetched " +
                         std::to_string(best_layout.prefetch_lines) + " lines ahead (best of 12 layouts), best of 10";
    c["dram_read_layouts"] = layouts;
    c["dram_copy_bytes_per_s"] = probe.copy_bytes_per_s(10);
    c["dram_copy_how"] =
        "STREAM copy, each thread half its chunk over the other half, 64-byte loads and stores, bytes read + written, "
        "best of 10";
    // The rates at fewer threads (a hybrid step may give the CPU experts only some cores): powers of two, then all.
    nlohmann::json by = nlohmann::json::array();
    for (int n = 1;; n = std::min(2 * n, threads)) {
      nlohmann::json e = {{"threads", n}, {"dram_read_bytes_per_s", probe.read_bytes_per_s(n, best_layout, 5)}};
      if (cpu.avx512_bf16) e["avx512_bf16_flops"] = avx_rate(n, 3);
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
  if (cpu.avx512_bf16) {
    const double again = avx_rate(threads, 5);
    avx_runs.push_back({{"shape", "best shape again, after the DRAM probe"}, {"flops", again}});
    c["avx512_bf16_flops"] = std::max(avx_best, again);
    c["avx512_bf16_how"] =
        "VDPBF16PS zmm, " +
        std::string(avx_chains == 0 ? "in the MoE kernel's shape (L1 weights x broadcast pairs, 8 accumulators)"
                                    : std::to_string(avx_chains) + " independent register chains") +
        ", " + std::to_string(avx_iterations * per_instruction(avx_chains)) +
        " instructions per thread, all threads pinned, each try after 200 ms idle; best of 6 shapes (short x 5, "
        "sustained x 2) and of 5 more at the end";
    c["avx512_bf16_shapes"] = avx_runs;
  }
  m["cpu"] = c;
  m["gpu"] = gpu::calibrate();
  if (gpu_info().present)
    m["gpu"]["name"] = gpu_info().name, m["gpu"]["memory_bytes"] = double(gpu_info().memory_bytes);
  m["collectives"] = collectives::calibrate();
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
        if (r.contains(section) && r[section].contains(key) && r[section][key].is_number())
          v.push_back(r[section][key].get<double>());
      std::sort(v.begin(), v.end());
      const double median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
      // The best seen: a rate's largest, a cost's (seconds) smallest. A ceiling is what a kernel can reach, and on a
      // shared host the rate moves with the neighbours (DRAM 100-146 GB/s within minutes on the lent Xeons): the
      // best of several runs bounds every kernel and moves less between calibrations than their median.
      auto ends_with = [&](const std::string& tail) {
        return key.size() >= tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
      };
      const bool cost = ends_with("_s") && !ends_with("_per_s");  // launch_overhead_s, not hbm_bytes_per_s
      value = cost ? v.front() : v.back();
      spread[std::string(section) + "." + key] = {{"min", v.front()},
                                                  {"median", median},
                                                  {"max", v.back()},
                                                  {"spread", median != 0 ? (v.back() - v.front()) / median : 0.0},
                                                  {"runs", v.size()}};
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
