// Sweep files (workloads/sweeps/*.json), ad-hoc runs and --axis overrides, expanded into planned points.
//
//   {"name": "default", "model": "deepseek-v2-lite",
//    "suites": [{"name": "mla-decode", "variants": ["mla/cd/cpu", "mla/a_cc_me/cpu"],
//                "axes": {"batch": [1, 4], "kv_len": "pow2:10:12"}}]}
//
// An axis is a JSON array of values or a string in --axis syntax ("1,8", "pow2:9:14", "uniform,mixed").
// A suite may name its own "model". Axes a variant declares but the suite omits take the variant's default.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "harness/point.h"
#include "harness/variant.h"

namespace dslab {

struct Axis {
  std::string name;
  std::vector<AxisValue> values;
};

struct Suite {
  std::string name;
  std::string model;  // name or path
  std::vector<std::string> variants;
  std::vector<Axis> axes;
  // Floors on the run's stop rule for this suite's points (0: the run's own): at least this many samples, and at
  // least this long per point before the timeout, for points whose medians feed something else (the planner's
  // engine efficiencies) and must survive a noisy host.
  int min_samples = 0;
  double timeout_s = 0;
  double max_spread = 0;  // (StopRule::max_spread; 0: the run's own)
  // Non-empty: the suite's points are timed but not verified, for this reason (points whose fp64 reference takes
  // longer than a device call, e.g. a whole-stack 8K prefill; the same code verifies at smaller points and in tests).
  std::string unverified_reason;
};

struct Sweep {
  std::string name;
  std::string source;  // file, or "command line"
  std::vector<Suite> suites;
};

Sweep load_sweep(const std::string& path);
Sweep parse_sweep(const nlohmann::json& j, const std::string& source, const std::string& default_name);
// An ad-hoc sweep: one suite from --model, --variant and --axis.
Sweep adhoc_sweep(const std::string& model, const std::vector<std::string>& variants);
// "kv_len=4096" sets (replacing) that axis in every suite.
void apply_axis_override(Sweep& sweep, const std::string& assignment);
// With a sweep file, --variant keeps only the named variants; --model replaces every suite's model.
void restrict_variants(Sweep& sweep, const std::vector<std::string>& variants);
void override_model(Sweep& sweep, const std::string& model);
// --suite keeps only the named suites.
void restrict_suites(Sweep& sweep, const std::vector<std::string>& suites);

// name: stem in ./workloads/models, $DSLAB_MODELS or the source tree's workloads/models; or a path.
ModelFile load_model_file(const std::string& name_or_path);

struct PlannedPoint {
  const VariantEntry* entry;
  std::string suite;
  const ModelFile* model;
  Point point;
  Support support;      // device absent, ISA missing, or the variant's own reason
  int min_samples = 0;  // the suite's floors on the stop rule (Suite)
  double timeout_s = 0;
  double max_spread = 0;
  std::string unverified_reason;  // (Suite)
};

// Validates everything (variants exist, axes known to each variant, models parse) before anything runs.
// Points are ordered point-major so variants at one point run back to back (they share generated inputs).
struct Plan {
  std::vector<std::unique_ptr<ModelFile>> models;
  std::vector<PlannedPoint> points;
};
// weights: a Hugging Face checkpoint folder (dslab run --weights): its config.json is every suite's model, and the
// variants that do not read weights are planned as skipped, saying so.
Plan expand(const Sweep& sweep, const std::string& weights = "");

}  // namespace dslab
