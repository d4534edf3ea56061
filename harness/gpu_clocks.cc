#include "harness/gpu_clocks.h"

#include <dlfcn.h>

namespace dslab {
namespace {

// The few NVML entry points used, declared from NVML's C API (stable since NVML 5): the library is opened at run
// time, not linked, so dslab still starts where no driver is installed.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1, kNvmlClockMem = 2, kNvmlTemperatureGpu = 0;

struct Nvml {
  NvmlReturn (*init)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*handle_by_uuid)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*max_clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*event_reasons)(NvmlDevice, unsigned long long*) = nullptr;
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*power_usage)(NvmlDevice, unsigned*) = nullptr;
  std::string why_unavailable;
};

template <class F>
bool bind(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

const Nvml& nvml() {
  static const Nvml n = [] {
    Nvml n;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      n.why_unavailable = "NVML not loadable (no NVIDIA driver?): libnvidia-ml.so.1";
      return n;
    }
    // clocks-event reasons were called throttle reasons before NVML 12.2; either name serves.
    const bool ok =
        bind(lib, n.init, "nvmlInit_v2") && bind(lib, n.error_string, "nvmlErrorString") &&
        bind(lib, n.handle_by_uuid, "nvmlDeviceGetHandleByUUID") && bind(lib, n.clock_info, "nvmlDeviceGetClockInfo") &&
        bind(lib, n.max_clock_info, "nvmlDeviceGetMaxClockInfo") &&
        bind(lib, n.temperature, "nvmlDeviceGetTemperature") && bind(lib, n.power_usage, "nvmlDeviceGetPowerUsage") &&
        (bind(lib, n.event_reasons, "nvmlDeviceGetCurrentClocksEventReasons") ||
         bind(lib, n.event_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    if (!ok) {
      n.why_unavailable = "libnvidia-ml.so.1 lacks an entry point dslab reads";
      return n;
    }
    if (const NvmlReturn r = n.init(); r != kNvmlSuccess)
      n.why_unavailable = std::string("nvmlInit: ") + n.error_string(r);
    return n;
  }();
  return n;
}

}  // namespace

nlohmann::json clock_event_reason_names(unsigned long long mask) {
  static const std::pair<unsigned long long, const char*> kReasons[] = {{0x1, "gpu_idle"},
                                                                        {0x2, "applications_clocks_setting"},
                                                                        {0x4, "sw_power_cap"},
                                                                        {0x8, "hw_slowdown"},
                                                                        {0x10, "sync_boost"},
                                                                        {0x20, "sw_thermal_slowdown"},
                                                                        {0x40, "hw_thermal_slowdown"},
                                                                        {0x80, "hw_power_brake_slowdown"},
                                                                        {0x100, "display_clock_setting"}};
  nlohmann::json names = nlohmann::json::array();
  unsigned long long known = 0;
  for (const auto& [bit, name] : kReasons) {
    known |= bit;
    if (mask & bit) names.push_back(name);
  }
  if (mask & ~known) names.push_back("other");
  return names;
}

nlohmann::json gpu_clock_state(const std::string& uuid) {
  const Nvml& n = nvml();
  if (!n.why_unavailable.empty()) return {{"unavailable", n.why_unavailable}};
  NvmlDevice dev = nullptr;
  if (const NvmlReturn r = n.handle_by_uuid(uuid.c_str(), &dev); r != kNvmlSuccess)
    return {{"unavailable", "nvmlDeviceGetHandleByUUID(" + uuid + "): " + n.error_string(r)}};
  nlohmann::json s;
  // Each query's value is read after its call returns (as arguments of one call, the order would be unspecified).
  auto field = [&](const char* key, auto&& query, double scale = 1.0) {
    unsigned v = 0;
    const NvmlReturn r = query(&v);
    s[key] = r == kNvmlSuccess ? nlohmann::json(double(v) * scale) : nlohmann::json(nullptr);
  };
  field("sm_clock_mhz", [&](unsigned* v) { return n.clock_info(dev, kNvmlClockSm, v); });
  field("memory_clock_mhz", [&](unsigned* v) { return n.clock_info(dev, kNvmlClockMem, v); });
  field("max_sm_clock_mhz", [&](unsigned* v) { return n.max_clock_info(dev, kNvmlClockSm, v); });
  field("temperature_c", [&](unsigned* v) { return n.temperature(dev, kNvmlTemperatureGpu, v); });
  field(
      "power_w", [&](unsigned* v) { return n.power_usage(dev, v); }, 1e-3);
  unsigned long long mask = 0;
  if (n.event_reasons(dev, &mask) == kNvmlSuccess) {
    s["clock_event_mask"] = mask;
    s["clock_event_reasons"] = clock_event_reason_names(mask);
  } else {
    s["clock_event_reasons"] = nullptr;
  }
  return s;
}

}  // namespace dslab
