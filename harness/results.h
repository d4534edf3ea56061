// results.json: Google Benchmark's JSON schema (context + benchmarks[], readable by its tools/compare.py)
// with dslab's fields added to each entry and to the context. Consumers ignore fields they don't know.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/measure.h"
#include "harness/point.h"
#include "harness/variant.h"

namespace dslab {

struct PointResult {
  std::string variant, suite, model;
  Device device = Device::cpu;
  Point point;
  std::string skip_reason;  // non-empty: not run
  std::string error;        // non-empty: run() or prepare() failed at run time
  SampleSet samples;
  Cost cost;
  std::optional<Verification> verification;  // absent with --no-verify or an unverified suite
  std::string unverified_reason;             // the suite's reason for not verifying (Suite::unverified_reason)
  std::optional<double> compute_ceiling, bandwidth_ceiling;  // from the machine file
  std::optional<double> kernel_fixed_s;  // the machine file's small kernel (gpu.small_kernel_s): an op floor's launches
  std::map<std::string, double> counters;  // Variant::counters()
  int repetition = 0, repetitions = 1;     // dslab run --repetitions: which whole-run pass this is

  bool ran() const { return skip_reason.empty() && error.empty(); }
  // variant/model/axes: two models' entries differ by name, as tools that match by name (compare.py) need.
  std::string name() const { return variant + "/" + model + "/" + point.label(); }
};

// Context common to every results file: build, host, GPU, command line.
nlohmann::json run_context(const std::string& command_line);

// One "iteration" entry per result (per repetition), then, for runs of several repetitions, Google Benchmark's
// aggregate entries per name over the repetitions' medians: <name>_mean, _median, _stddev, _cv (run_type
// "aggregate", aggregate_name), as --benchmark_repetitions writes them.
nlohmann::json results_to_json(const nlohmann::json& context, const std::vector<PointResult>& results);

// Temp file + rename: a reader never sees half a file, and a failed run leaves none.
void write_json_atomically(const std::string& path, const nlohmann::json& j);

// The console table printed at the end of a run.
std::string results_table(const std::vector<PointResult>& results);
// One line per result that ran faster than its roofline floor (roofline_fraction > 1: a ceiling in the machine file
// is stale or wrong, since no kernel beats the hardware), "" when none did.
std::string above_roofline_warnings(const std::vector<PointResult>& results);

}  // namespace dslab
