// Launch choices measured on the GPU a run uses (a GEMM's algorithm, a kernel's split), kept per GPU model and driver
// under the user's cache directory, so a second run reuses what the first measured, as PyTorch's TunableOp keeps its
// results file. DSLAB_TUNE picks the mode: unset or "on" (use the cache, measure what it lacks and add it), "off"
// (measure nothing: the code's built-in choices), "redo" (measure everything this run needs again and overwrite).
// The cache file: $DSLAB_TUNING_CACHE, else ~/.cache/dslab/tuning/<gpu>-driver<version>.json. What a run used goes
// into its results (context.tuning). The values are opaque JSON to this file: each tuner writes and reads its own.
#pragma once
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace dslab {

class TuningCache {
 public:
  enum class Mode { on, off, redo };
  static TuningCache& instance();  // the process's, for the GPU harness/host.h reports
  // A cache at `path` for a device named `device` (tests; a run uses instance()). BadInput for a malformed file.
  TuningCache(std::string path, std::string device, Mode mode);

  Mode mode() const { return mode_; }
  const std::string& path() const { return path_; }
  // The cached value of (family, key), unless the mode is off or redo (a value this process measured is returned in
  // any mode but off); the lookup is remembered as used.
  std::optional<nlohmann::json> lookup(const std::string& family, const std::string& key);
  // A value just measured (not in off mode: then nothing is kept); written to the file at once.
  void record(const std::string& family, const std::string& key, const nlohmann::json& value);
  // A built-in choice used where the cache had none (reported as such, unless this process measured or looked it up).
  void use_default(const std::string& family, const std::string& key, const nlohmann::json& value);
  // What this process used: {"mode", "cache", "device", "used": [{"family", "key", "value", "source":
  // "cache" | "measured" | "default"}]}.
  nlohmann::json report() const;

  static Mode parse_mode(const char* text);  // BadInput naming DSLAB_TUNE for anything else

 private:
  void save() const;
  std::string path_, device_;
  Mode mode_;
  mutable std::mutex mutex_;
  nlohmann::json entries_;  // {family: {key: value}}
  std::map<std::pair<std::string, std::string>, std::pair<nlohmann::json, std::string>> used_;
};

}  // namespace dslab
