#include "harness/host.h"

#include <sys/syscall.h>
#include <unistd.h>

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
      return std::string("the kernel refused AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM failed; Linux >= 5.16 needed)");
    return std::string();
  }();
  return result;
}

void parallel_noop(int threads) {
  volatile int sink = 0;
#pragma omp parallel num_threads(threads)
  { sink = sink + 1; }
}

}  // namespace dslab
