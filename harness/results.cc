#include "harness/results.h"

#include "harness/tuning.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "harness/build_info.h"
#include "harness/errors.h"
#include "harness/host.h"

namespace dslab {

namespace {

std::string six_digits(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

constexpr double kUsPerS = 1e6;

std::string iso_date() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
  return buf;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string human_time(double s) {
  if (s >= 1) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.3f ms", s * 1e3);
  return fmt("%.2f us", s * 1e6);
}

}  // namespace

nlohmann::json run_context(const std::string& command_line) {
  const CpuInfo& cpu = cpu_info();
  const GpuInfo& gpu = gpu_info();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  nlohmann::json c;
  // Google Benchmark's own context fields.
  c["date"] = iso_date();
  c["host_name"] = host;
  c["executable"] = "dslab";
  c["num_cpus"] = cpu.logical_cpus;
  c["mhz_per_cpu"] = 0;
  c["cpu_scaling_enabled"] = false;
  c["caches"] = nlohmann::json::array();
  c["library_build_type"] = std::string(DSLAB_BUILD_TYPE) == "Debug" ? "debug" : "release";
  // dslab's.
  c["dslab_version"] = DSLAB_VERSION;
  c["git_sha"] = DSLAB_GIT_SHA;
  if (*DSLAB_GIT_DIFF_SHA256) c["git_diff_sha256"] = DSLAB_GIT_DIFF_SHA256;  // a dirty build: which change
  c["build_type"] = DSLAB_BUILD_TYPE;
  c["compiler"] = std::string("g++ ") + __VERSION__;
  c["cpu_model"] = cpu.model;
  c["cpu_isa"] = cpu.isa;
  c["llc_bytes"] = cpu.llc_bytes;
  c["cpu_governor"] = cpu.governor;
  if (gpu.present) {
    c["tuning"] = TuningCache::instance().report();  // the measured launch choices this run used, and where from
    c["gpu_name"] = gpu.name;
    c["gpu_uuid"] = gpu.uuid;
    c["gpu_memory_clock_mhz"] = gpu.memory_clock_mhz;
    c["gpu_sms"] = gpu.sms;
    c["gpu_clock_mhz"] = gpu.clock_mhz;
    c["gpu_memory_bytes"] = gpu.memory_bytes;
    c["cuda_runtime"] = gpu.runtime_version;
    c["cuda_driver"] = gpu.driver_version;
  } else {
    c["gpu_name"] = nullptr;
    c["gpu_absent_reason"] = gpu.why_absent;
  }
  c["command_line"] = command_line;
  return c;
}

namespace {

// Google Benchmark's aggregates over the repetitions of each name (their real_time: each repetition's median).
void add_repetition_aggregates(nlohmann::json& benchmarks) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const nlohmann::json*>> by_name;
  for (const auto& b : benchmarks) {
    if (b.value("repetitions", 1) < 2) continue;
    const std::string name = b["name"].get<std::string>();
    if (!by_name.count(name)) order.push_back(name);
    by_name[name].push_back(&b);
  }
  std::vector<nlohmann::json> aggregates;
  for (const std::string& name : order) {
    const auto& reps = by_name[name];
    std::vector<double> medians;
    for (const auto* b : reps) medians.push_back((*b)["real_time"].get<double>());
    const Stats st = summarize(medians);
    const double cv = st.mean > 0 ? st.stdev / st.mean : 0.0;
    for (const auto& [aggregate, value] : std::vector<std::pair<std::string, double>>{
             {"mean", st.mean}, {"median", st.median}, {"stddev", st.stdev}, {"cv", cv}}) {
      nlohmann::json a;
      const nlohmann::json& first = *reps.front();
      a["name"] = name + "_" + aggregate;
      a["family_index"] = first["family_index"];
      a["per_family_instance_index"] = 0;
      a["run_name"] = name;
      a["run_type"] = "aggregate";
      a["repetitions"] = int(reps.size());
      a["threads"] = 1;
      a["aggregate_name"] = aggregate;
      a["aggregate_unit"] = aggregate == "cv" ? "percentage" : "time";
      a["iterations"] = int(reps.size());
      a["real_time"] = value;
      a["cpu_time"] = value;
      a["time_unit"] = "us";
      a["variant"] = first["variant"];
      a["model"] = first["model"];
      a["axes"] = first["axes"];
      aggregates.push_back(a);
    }
  }
  for (auto& a : aggregates) benchmarks.push_back(std::move(a));
}

}  // namespace

nlohmann::json results_to_json(const nlohmann::json& context, const std::vector<PointResult>& results) {
  nlohmann::json out;
  out["context"] = context;
  out["benchmarks"] = nlohmann::json::array();
  out["skipped"] = nlohmann::json::array();
  std::map<std::string, int> family_of;  // a name's repetitions share one family index, as in Google Benchmark
  for (const auto& r : results) {
    nlohmann::json axes = nlohmann::json::object();
    for (const auto& [k, v] : r.point.entries())
      axes[k] = v.is_integer ? nlohmann::json(v.integer) : nlohmann::json(v.text);
    if (!r.ran()) {
      out["skipped"].push_back({{"name", r.name()},
                                {"variant", r.variant},
                                {"suite", r.suite},
                                {"model", r.model},
                                {"axes", axes},
                                {"reason", r.skip_reason.empty() ? "error: " + r.error : r.skip_reason}});
      continue;
    }
    const Stats st = summarize(r.samples.seconds);
    nlohmann::json b;
    b["name"] = r.name();
    b["family_index"] = family_of.emplace(r.name(), int(family_of.size())).first->second;
    b["per_family_instance_index"] = 0;
    b["run_name"] = r.name();
    b["run_type"] = "iteration";
    b["repetitions"] = r.repetitions;
    b["repetition_index"] = r.repetition;
    b["threads"] = 1;
    b["iterations"] = r.samples.seconds.size();
    b["real_time"] = st.median * kUsPerS;
    b["cpu_time"] = st.median * kUsPerS;
    b["time_unit"] = "us";
    b["variant"] = r.variant;
    b["suite"] = r.suite;
    b["model"] = r.model;
    b["device"] = device_name(r.device);
    b["axes"] = axes;
    b["median_time"] = st.median * kUsPerS;
    b["p10_time"] = st.p10 * kUsPerS;
    b["p90_time"] = st.p90 * kUsPerS;
    b["mean_time"] = st.mean * kUsPerS;
    b["stdev_time"] = st.stdev * kUsPerS;
    b["samples"] = r.samples.seconds.size();
    nlohmann::json sample_times = nlohmann::json::array();
    // (six significant digits: below any timer's resolution, and a committed file of 10,000-sample entries half
    // the size of one printed to double precision)
    for (double s : r.samples.seconds) sample_times.push_back(std::stod(six_digits(s * kUsPerS)));
    b["sample_times"] = sample_times;
    b["stop_reason"] = r.samples.stop_reason;
    b["cache_state"] = r.samples.cache_state;
    if (r.samples.discarded_spread >= 0) {  // sampled twice (a disturbed window): the steadier window is the one above
      b["resampled"] = true;
      b["discarded_spread"] = r.samples.discarded_spread;
    }
    b["flops"] = r.cost.flops;
    b["bytes"] = r.cost.bytes;
    b["arithmetic_intensity"] = r.cost.bytes > 0 ? r.cost.flops / r.cost.bytes : 0.0;
    b["achieved_flops_per_s"] = r.cost.flops / st.median;
    b["achieved_bytes_per_s"] = r.cost.bytes / st.median;
    if (r.compute_ceiling && r.bandwidth_ceiling) {
      const double floor_s = std::max(r.cost.flops / *r.compute_ceiling, r.cost.bytes / *r.bandwidth_ceiling);
      b["roofline_floor_time"] = floor_s * kUsPerS;
      b["roofline_fraction"] = floor_s / st.median;
      b["roofline_bound"] =
          r.cost.flops / *r.compute_ceiling >= r.cost.bytes / *r.bandwidth_ceiling ? "compute" : "memory";
    }
    if (!r.counters.empty()) b["counters"] = r.counters;
    // A variant that reports its kernel's own time, FLOPs and bytes (kernel_s, kernel_flops, kernel_bytes) gets that
    // kernel's roofline fraction against the same ceilings as the step's.
    if (r.compute_ceiling && r.bandwidth_ceiling && r.counters.count("kernel_s") && r.counters.count("kernel_flops") &&
        r.counters.count("kernel_bytes") && r.counters.at("kernel_s") > 0)
      b["kernel_roofline_fraction"] = std::max(r.counters.at("kernel_flops") / *r.compute_ceiling,
                                               r.counters.at("kernel_bytes") / *r.bandwidth_ceiling) /
                                      r.counters.at("kernel_s");
    // A variant that reports op rows (op_time_us.X with op_floor_bytes.X, op_floor_flops.X, op_floor_kernels.X: an
    // op's measured time and its own work) gets each op against its floor: its bytes or FLOPs at the ceilings, plus
    // its kernels at a small kernel's measured fixed time (GPU).
    if (r.compute_ceiling && r.bandwidth_ceiling) {
      nlohmann::json floors = nlohmann::json::object();
      for (const auto& [key, time_us] : r.counters) {
        if (key.rfind("op_time_us.", 0) != 0) continue;
        const std::string op = key.substr(11);
        auto get = [&](const char* what) {
          const auto it = r.counters.find(std::string(what) + op);
          return it == r.counters.end() ? 0.0 : it->second;
        };
        const double bytes = get("op_floor_bytes."), flops = get("op_floor_flops."), kernels = get("op_floor_kernels.");
        const double floor_us = (std::max(flops / *r.compute_ceiling, bytes / *r.bandwidth_ceiling) +
                                 kernels * r.kernel_fixed_s.value_or(0)) *
                                kUsPerS;
        floors[op] = {{"time_us", time_us},
                      {"floor_us", floor_us},
                      {"fraction", time_us > 0 ? floor_us / time_us : 0.0},
                      {"bytes", bytes},
                      {"kernels", kernels}};
      }
      if (!floors.empty()) b["op_floors"] = floors;
    }
    if (r.verification) {
      b["verify_rel_err"] = r.verification->rel_err;
      b["verify_threshold"] = r.verification->threshold;
      b["verify_pass"] = r.verification->pass();
    } else {
      b["verify_rel_err"] = nullptr;
      b["verify_pass"] = nullptr;
      if (!r.unverified_reason.empty()) b["unverified"] = r.unverified_reason;
    }
    out["benchmarks"].push_back(b);
  }
  add_repetition_aggregates(out["benchmarks"]);
  return out;
}

void write_json_atomically(const std::string& path, const nlohmann::json& j) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const fs::path tmp = target.string() + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp);
    if (!f) throw BadInput(tmp.string() + ": cannot write (expected a writable output folder)");
    f << j.dump(2) << "\n";
    if (!f) throw std::runtime_error(tmp.string() + ": write failed");
  }
  fs::rename(tmp, target);
}

std::string above_roofline_warnings(const std::vector<PointResult>& results) {
  std::string out;
  for (const auto& r : results) {
    if (r.samples.seconds.empty() || !r.compute_ceiling || !r.bandwidth_ceiling) continue;
    const double floor_s = std::max(r.cost.flops / *r.compute_ceiling, r.cost.bytes / *r.bandwidth_ceiling);
    const double fraction = floor_s / summarize(r.samples.seconds).median;
    if (fraction > 1.0)
      out += "warning: above its roofline (" + fmt("%.2f", fraction) + "): " + r.variant + " " + r.model + "/" +
             r.point.label() + ": a ceiling in the machine file is stale or wrong (recalibrate: dslab calibrate)\n";
  }
  return out;
}

std::string results_table(const std::vector<PointResult>& results) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%-16s %-40s %12s %21s %9s %9s %7s %9s %-7s %s\n", "variant", "point", "median",
                "p10 .. p90", "GFLOP/s", "GB/s", "roofl.", "rel.err", "verify", "stop");
  os << line;
  std::string last_point;
  for (const auto& r : results) {
    const std::string pt = r.model + "/" + r.point.label();
    if (!last_point.empty() && pt != last_point) os << "\n";
    last_point = pt;
    if (!r.ran()) {
      std::snprintf(line, sizeof line, "%-16s %-40s skipped: %s\n", r.variant.c_str(), pt.c_str(),
                    (r.skip_reason.empty() ? r.error : r.skip_reason).c_str());
      os << line;
      continue;
    }
    const Stats st = summarize(r.samples.seconds);
    std::string roof = "-", err = "-", verdict = r.unverified_reason.empty() ? "off" : "skipped";
    if (r.compute_ceiling && r.bandwidth_ceiling)
      roof = fmt("%.2f", std::max(r.cost.flops / *r.compute_ceiling, r.cost.bytes / *r.bandwidth_ceiling) / st.median);
    if (r.verification) {
      err = fmt("%.2e", r.verification->rel_err);
      verdict = r.verification->pass() ? "PASS" : "FAIL";
    }
    std::snprintf(line, sizeof line, "%-16s %-40s %12s %10s..%-10s %9.1f %9.2f %7s %9s %-7s %s\n", r.variant.c_str(),
                  pt.c_str(), human_time(st.median).c_str(), human_time(st.p10).c_str(), human_time(st.p90).c_str(),
                  r.cost.flops / st.median * 1e-9, r.cost.bytes / st.median * 1e-9, roof.c_str(), err.c_str(),
                  verdict.c_str(),
                  (r.samples.stop_reason + (r.samples.discarded_spread >= 0 ? ", resampled" : "")).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace dslab
