// The GPU's clocks and why they are where they are, read from NVML (the driver's management library) at a
// moment: results record it before and after a run, since lent GPUs of one kind differ and a throttled run is
// slower for reasons no kernel change explains.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace dslab {

// {"sm_clock_mhz", "memory_clock_mhz", "max_sm_clock_mhz", "temperature_c", "power_w", "clock_event_reasons":
// [names], "clock_event_mask"} for the GPU with this UUID ("GPU-..."), or {"unavailable": why} where NVML cannot be
// loaded (no driver, as on a CPU-only machine) or does not know the GPU. Never throws.
nlohmann::json gpu_clock_state(const std::string& uuid);

// The names of the bits of NVML's clocks-event (throttle) reason mask, e.g. 0x4 -> ["sw_power_cap"].
nlohmann::json clock_event_reason_names(unsigned long long mask);

}  // namespace dslab
