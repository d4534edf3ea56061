// Measured ceilings of the machine at hand (`dslab calibrate`), read back by runs for roofline_fraction.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dslab {

// Default location: $DSLAB_MACHINE, else ~/.cache/dslab/machine.json.
std::string default_machine_path();

// Measures CPU (AMX bf16, AVX-512 bf16, DRAM read) and, with a GPU, GPU ceilings. Each figure says how.
nlohmann::json calibrate_machine(int threads);

// N calibrations of one machine as one: each top-level number of the cpu and gpu sections becomes the median of
// the runs, and "spread" lists, for each, min, median, max and (max - min) / median.
nlohmann::json combine_calibrations(const std::vector<nlohmann::json>& runs);

// Loads a machine file; nullopt (with a note in *why) when absent or measured on another CPU.
std::optional<nlohmann::json> load_machine(const std::string& path, std::string* why);

// A ceiling by dotted key ("cpu.amx_bf16_flops"); nullopt when not measured.
std::optional<double> machine_ceiling(const nlohmann::json& machine, const std::string& key);

}  // namespace dslab
