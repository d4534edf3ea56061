// Facts about the machine at hand: CPU model and ISA, cache sizes, AMX permission, GPU presence.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace dslab {

struct CpuInfo {
  std::string model;
  int logical_cpus = 1;
  size_t llc_bytes = 0;          // last-level cache, for the cold-cache flush
  std::vector<std::string> isa;  // the flags dslab cares about, as /proc/cpuinfo spells them
  bool avx512f = false, avx512_bf16 = false, avx512_vnni = false, amx_bf16 = false, amx_int8 = false;
  std::string governor;  // cpufreq scaling governor of cpu0 ("" where the kernel exposes none, e.g. many VMs)
};
const CpuInfo& cpu_info();

// Linux hands out AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, once per process).
// Returns "" when granted, else why not.
std::string request_amx_permission();

// An empty OpenMP parallel region on `threads` threads: what waking the CPU's worker team costs (the calibration
// of a hybrid step's host round trip runs it from a CUDA host function, as the CPU experts are run).
void parallel_noop(int threads);

// What else the host's CPUs did over an interval (from /proc/stat and this process's own CPU time): a calibration
// run beside other work, or on a VM whose hypervisor takes cycles (steal), reads low ceilings. Zeros where
// /proc/stat is unreadable.
struct CpuCounters {
  double busy_s = 0, steal_s = 0, own_s = 0, wall_s = 0;  // all CPUs' busy and stolen time, this process's, wall clock
};
CpuCounters cpu_counters();
struct HostActivity {
  double others_fraction = 0;  // other processes' share of the host's CPU capacity over the interval
  double steal_fraction = 0;   // the hypervisor's share (steal time)
  double load_average = 0;     // 1-minute load average at the interval's end
};
HostActivity host_activity(const CpuCounters& before, const CpuCounters& after, int logical_cpus);
// /proc/stat's aggregate "cpu" line as (busy, steal) seconds, given the kernel's clock ticks per second; false where
// it is not such a line.
bool parse_proc_stat_cpu_line(const std::string& line, double ticks_per_s, double* busy_s, double* steal_s);

struct GpuInfo {
  bool present = false;
  std::string why_absent;  // "built without CUDA", "no CUDA device: ..."
  std::string name;
  std::string uuid;  // "GPU-xxxxxxxx-...", as nvidia-smi -L prints it: which lent GPU a result came from
  int sms = 0, clock_mhz = 0, memory_clock_mhz = 0, cc_major = 0, cc_minor = 0;
  size_t memory_bytes = 0, l2_bytes = 0;
  int runtime_version = 0, driver_version = 0;
  int devices = 0;  // CUDA devices visible to the process (the fields above are device 0's)
};
const GpuInfo& gpu_info();

}  // namespace dslab
