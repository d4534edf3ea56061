#include "harness/host.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

namespace dslab {

const CpuInfo& cpu_info() {
  static const CpuInfo info = [] {
    CpuInfo c;
    c.logical_cpus = int(std::thread::hardware_concurrency());
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    std::set<std::string> flags;
    while (std::getline(f, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
      const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
      if (key == "model name" && c.model.empty()) c.model = value;
      if (key == "flags" && flags.empty()) {
        std::istringstream words(value);
        for (std::string w; words >> w;) flags.insert(w);
      }
    }
    for (const char* want : {"avx2", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile",
                             "amx_bf16", "amx_int8"})
      if (flags.count(want)) c.isa.push_back(want);
    c.avx512f = flags.count("avx512f");
    c.avx512_bf16 = flags.count("avx512_bf16");
    c.avx512_vnni = flags.count("avx512_vnni");
    c.amx_bf16 = flags.count("amx_bf16") && flags.count("amx_tile");
    c.amx_int8 = flags.count("amx_int8") && flags.count("amx_tile");
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    c.llc_bytes = size_t(l3 > 0 ? l3 : (l2 > 0 ? l2 : 32l << 20));
    if (std::ifstream g("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"); g) std::getline(g, c.governor);
    return c;
  }();
  return info;
}

std::string request_amx_permission() {
  static const std::string result = [] {
    if (!cpu_info().amx_bf16) return std::string("this CPU has no AMX");
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
      return std::string(
          "the kernel refused AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM failed; Linux >= 5.16 needed)");
    return std::string();
  }();
  return result;
}

void parallel_noop(int threads) {
  volatile int sink = 0;
#pragma omp parallel num_threads(threads)
  { sink = sink + 1; }
}

bool parse_proc_stat_cpu_line(const std::string& line, double ticks_per_s, double* busy_s, double* steal_s) {
  std::istringstream in(line);
  std::string label;
  in >> label;
  if (label != "cpu" || ticks_per_s <= 0) return false;
  // user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
  double v[8] = {};
  int n = 0;
  while (n < 8 && in >> v[n]) ++n;
  if (n < 4) return false;
  *busy_s = (v[0] + v[1] + v[2] + v[5] + v[6]) / ticks_per_s;
  *steal_s = v[7] / ticks_per_s;
  return true;
}

CpuCounters cpu_counters() {
  CpuCounters c;
  c.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0)
    c.own_s = double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
              1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  std::ifstream stat("/proc/stat");
  std::string line;
  if (stat && std::getline(stat, line) &&
      !parse_proc_stat_cpu_line(line, double(sysconf(_SC_CLK_TCK)), &c.busy_s, &c.steal_s))
    c.busy_s = c.steal_s = 0;
  return c;
}

HostActivity host_activity(const CpuCounters& before, const CpuCounters& after, int logical_cpus) {
  HostActivity h;
  const double capacity = (after.wall_s - before.wall_s) * std::max(1, logical_cpus);
  if (capacity > 0 && after.busy_s > 0) {
    h.others_fraction =
        std::clamp(((after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / capacity, 0.0, 1.0);
    h.steal_fraction = std::clamp((after.steal_s - before.steal_s) / capacity, 0.0, 1.0);
  }
  if (std::ifstream load("/proc/loadavg"); load) load >> h.load_average;
  return h;
}

}  // namespace dslab
