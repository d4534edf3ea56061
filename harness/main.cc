// dslab: the command line. `dslab --help` and `dslab COMMAND --help` say what each command does.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <omp.h>

#include "harness/build_info.h"
#include "harness/errors.h"
#include "harness/host.h"
#include "harness/machine.h"
#include "harness/measure.h"
#include "harness/results.h"
#include "harness/safetensors.h"
#include "harness/sweep.h"

namespace dslab {
namespace {

const char* kMainHelp = R"(dslab: benchmark and verify DeepSeek inference layers (MLA forms, MoE experts, ...)

usage: dslab COMMAND [options]

commands:
  list        the registered variants, their device, and whether they can run here
  run         run a sweep file or an ad-hoc set of variants and axes; verify; write results.json
  calibrate   measure this machine's ceilings (AMX/AVX-512 bf16, DRAM, GPU HBM/GEMM/launch)
  help CMD    help for one command (same as `dslab CMD --help`)

examples:
  dslab list
  dslab run --model deepseek-v2 --variant mla/cd/cpu --variant mla/a_cc_me/cpu --axis kv_len=pow2:9:12 --out results/mla
  dslab run workloads/sweeps/default.json --axis kv_len=4096 --out results/default
  dslab calibrate
)";

const char* kRunHelp = R"(usage: dslab run [SWEEP.json] [options]

Runs every (variant, point) of a sweep file, or of the ad-hoc suite given by --model/--variant/--axis.
Each point is prepared (untimed), sampled until the stop rule holds, and verified against the reference.

options:
  --model NAME|PATH     model config (workloads/models/NAME.json or a path to a HF config.json);
                        with a sweep file, replaces every suite's model
  --variant NAME        a variant to run (repeatable); with a sweep file, keeps only these
  --axis NAME=VALUES    set or override an axis in every suite (repeatable);
                        VALUES: 1,8,64 | pow2:9:14 (2^9..2^14) | uniform,mixed
  --out DIR             where results.json goes (default: results/<sweep name>)
  --hot                 do not flush caches before each sample (default: cold)
  --no-verify           skip verification against the reference (default: verify every point)
  --dump DIR            write each point's weights, inputs and outputs as DIR/<point>.safetensors
  --seed N              seed of the generated weights and inputs (default 1)
  --machine FILE        ceilings from `dslab calibrate` (default: $DSLAB_MACHINE or ~/.cache/dslab/machine.json)
  --min-samples N       stop rule: at least N samples (default 5)
  --min-time S          stop rule: at least S seconds of samples (default 0.3)
  --max-noise F         stop rule: stop once stdev/sqrt(n)/mean <= F (default 0.01)
  --timeout S           stop rule: give up converging after S seconds per point (default 5)

exit status: 0 all verified; 1 a verification failed or a point errored; 2 bad input (nothing written).
axes: )";

const char* kCalibrateHelp = R"(usage: dslab calibrate [--out FILE] [--threads N]

Measures the ceilings that roofline_fraction is computed against and writes them, each with how it was
measured, to FILE (default: $DSLAB_MACHINE or ~/.cache/dslab/machine.json):
  cpu: AMX bf16 FLOP/s (TDPBF16PS from registers), AVX-512 bf16 FLOP/s (VDPBF16PS), DRAM read bytes/s
  gpu: HBM copy bytes/s, cuBLAS bf16 GEMM FLOP/s, kernel launch overhead (when a GPU is present)
options:
  --threads N   CPU threads (default: all, as OpenMP sees them)
)";

const char* kListHelp = R"(usage: dslab list

Prints every registered variant: name (family/algorithm/backend), device, whether it can run on this
machine (or why not), and what it is.
)";

struct Args {
  std::vector<std::string> positional;
  std::multimap<std::string, std::string> options;
  bool has(const std::string& k) const { return options.count(k) > 0; }
  std::vector<std::string> all(const std::string& k) const {
    std::vector<std::string> v;
    for (auto [it, end] = options.equal_range(k); it != end; ++it) v.push_back(it->second);
    return v;
  }
  std::string one(const std::string& k, const std::string& fallback = "") const {
    auto v = all(k);
    if (v.size() > 1) throw BadInput("command line: " + k + " given " + std::to_string(v.size()) + " times (expected once)");
    return v.empty() ? fallback : v[0];
  }
};

Args parse_args(int argc, char** argv, int first, const std::vector<std::string>& flags,
                const std::vector<std::string>& valued) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) {
      a.positional.push_back(s);
      continue;
    }
    std::string value;
    const auto eq = s.find('=');
    std::string key = s.substr(0, eq);
    const bool is_flag = std::find(flags.begin(), flags.end(), key) != flags.end();
    const bool is_valued = std::find(valued.begin(), valued.end(), key) != valued.end();
    if (!is_flag && !is_valued) throw BadInput("command line: option '" + key + "': unknown option (see --help)");
    if (is_valued) {
      if (eq != std::string::npos && key != "--axis") {
        value = s.substr(eq + 1);
      } else if (eq != std::string::npos) {
        value = s.substr(eq + 1);  // --axis=kv_len=4096
      } else {
        if (i + 1 >= argc) throw BadInput("command line: option '" + key + "': missing value (see --help)");
        value = argv[++i];
      }
    }
    a.options.emplace(key, value);
  }
  return a;
}

double number_option(const Args& a, const std::string& key, double fallback, double min) {
  const std::string v = a.one(key);
  if (v.empty()) return fallback;
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || !(d >= min)) throw BadInput("command line: " + key + " '" + v + "': expected a number >= " + std::to_string(min));
  return d;
}

std::string joined_command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    const bool quote = a.find_first_of(" \t'\"$") != std::string::npos;
    s += (i ? " " : "") + (quote ? "'" + a + "'" : a);
  }
  return s;
}

std::string file_safe(std::string s) {
  for (auto& c : s)
    if (c == '/' || c == ':') c = '_';
  return s;
}

int cmd_list() {
  std::printf("%-22s %-6s %-11s %s\n", "variant", "device", "here", "what");
  for (const auto& e : registered_variants()) {
    std::string here = "yes";
    if (e.device == Device::cuda && !gpu_info().present)
      here = "no: " + gpu_info().why_absent;
    else if (Support s = e.make()->available(); !s.ok)
      here = "no: " + s.reason;
    std::printf("%-22s %-6s %-11s %s\n", e.name.c_str(), device_name(e.device), here.c_str(), e.summary.c_str());
  }
  return 0;
}

int cmd_calibrate(int argc, char** argv) {
  const Args a = parse_args(argc, argv, 2, {"--help"}, {"--out", "--threads"});
  if (a.has("--help")) return std::fputs(kCalibrateHelp, stdout), 0;
  if (!a.positional.empty()) throw BadInput("command line: unexpected argument '" + a.positional[0] + "' (see dslab calibrate --help)");
  const int threads = int(number_option(a, "--threads", omp_get_max_threads(), 1));
  const std::string out = a.one("--out", default_machine_path());
  std::fprintf(stderr, "calibrating with %d CPU threads%s ...\n", threads, gpu_info().present ? (" and " + gpu_info().name).c_str() : "");
  const nlohmann::json m = calibrate_machine(threads);
  write_json_atomically(out, m);
  std::printf("%s\n", m.dump(2).c_str());
  std::printf("machine file: %s\n", out.c_str());
  return 0;
}

int cmd_run(int argc, char** argv) {
  const Args a = parse_args(argc, argv, 2, {"--help", "--hot", "--no-verify"},
                            {"--model", "--variant", "--axis", "--out", "--dump", "--seed", "--machine", "--min-samples",
                             "--min-time", "--max-noise", "--timeout"});
  if (a.has("--help")) {
    std::fputs(kRunHelp, stdout);
    for (const auto& ax : known_axes()) std::printf("\n  %-10s %s", ax.name.c_str(), ax.help.c_str());
    std::printf("\n");
    return 0;
  }
  if (a.positional.size() > 1) throw BadInput("command line: expected at most one sweep file, got '" + a.positional[1] + "'");
  Sweep sweep;
  if (a.positional.empty()) {
    sweep = adhoc_sweep(a.one("--model"), a.all("--variant"));
  } else {
    sweep = load_sweep(a.positional[0]);
    override_model(sweep, a.one("--model"));
    restrict_variants(sweep, a.all("--variant"));
  }
  for (const auto& ov : a.all("--axis")) apply_axis_override(sweep, ov);
  StopRule rule;
  rule.min_samples = int(number_option(a, "--min-samples", rule.min_samples, 1));
  rule.min_time_s = number_option(a, "--min-time", rule.min_time_s, 0);
  rule.max_noise = number_option(a, "--max-noise", rule.max_noise, 0);
  rule.timeout_s = number_option(a, "--timeout", rule.timeout_s, 0);
  const uint64_t seed = uint64_t(number_option(a, "--seed", 1, 0));
  const bool hot = a.has("--hot"), verify = !a.has("--no-verify");
  const std::string out_dir = a.one("--out", "results/" + sweep.name);
  const std::string dump_dir = a.one("--dump");

  const Plan plan = expand(sweep);  // every input error surfaces here, before anything runs or is written

  std::string machine_note;
  const auto machine = load_machine(a.one("--machine", default_machine_path()), &machine_note);
  if (!machine) std::fprintf(stderr, "note: %s\n", machine_note.c_str());
  if (!dump_dir.empty()) std::filesystem::create_directories(dump_dir);

  std::vector<PointResult> results;
  int failures = 0, errors = 0;
  const size_t total = plan.points.size();
  for (size_t i = 0; i < total; ++i) {
    const PlannedPoint& pp = plan.points[i];
    PointResult r;
    r.variant = pp.entry->name;
    r.suite = pp.suite;
    r.model = pp.model->name;
    r.device = pp.entry->device;
    r.point = pp.point;
    std::fprintf(stderr, "[%zu/%zu] %-16s %s/%s ", i + 1, total, r.variant.c_str(), r.model.c_str(), r.point.label().c_str());
    if (!pp.support.ok) {
      r.skip_reason = pp.support.reason;
      std::fprintf(stderr, "skipped: %s\n", r.skip_reason.c_str());
      results.push_back(std::move(r));
      continue;
    }
    try {
      auto v = pp.entry->make();
      r.cost = v->cost(*pp.model, pp.point);
      if (machine) {
        r.compute_ceiling = machine_ceiling(*machine, v->compute_ceiling());
        r.bandwidth_ceiling = machine_ceiling(*machine, r.device == Device::cpu ? "cpu.dram_read_bytes_per_s" : "gpu.hbm_bytes_per_s");
      }
      v->prepare(*pp.model, pp.point, seed);
      r.samples = measure(*v, r.device, rule, hot, r.cost.bytes);
      if (verify) r.verification = v->verify();
      if (!dump_dir.empty())
        write_safetensors(dump_dir + "/" + file_safe(r.name()) + ".safetensors", v->tensors(),
                          {{"variant", r.variant}, {"model", r.model}, {"point", r.point.label()}, {"seed", std::to_string(seed)}});
      const Stats st = summarize(r.samples.seconds);
      std::fprintf(stderr, "%.4g ms (%zu samples, %s)", st.median * 1e3, r.samples.seconds.size(), r.samples.stop_reason.c_str());
      if (r.verification) {
        std::fprintf(stderr, " verify %s %.2e", r.verification->pass() ? "PASS" : "FAIL", r.verification->rel_err);
        failures += !r.verification->pass();
      }
      std::fprintf(stderr, "\n");
    } catch (const BadInput&) {
      throw;
    } catch (const std::exception& e) {
      r.error = e.what();
      ++errors;
      std::fprintf(stderr, "error: %s\n", e.what());
    }
    results.push_back(std::move(r));
  }

  nlohmann::json context = run_context(joined_command_line(argc, argv));
  context["sweep"] = sweep.name;
  context["sweep_source"] = sweep.source;
  context["seed"] = seed;
  context["hot"] = hot;
  context["verify"] = verify;
  context["stop_rule"] = {{"min_samples", rule.min_samples}, {"min_time_s", rule.min_time_s},
                          {"max_noise", rule.max_noise}, {"timeout_s", rule.timeout_s}};
  context["machine_file"] = machine ? nlohmann::json(a.one("--machine", default_machine_path())) : nlohmann::json(nullptr);
  if (machine) context["machine"] = *machine;
  std::string models;
  for (const auto& m : plan.models) models += (models.empty() ? "" : ",") + m->name;
  context["model"] = models;
  const std::string path = out_dir + "/results.json";
  write_json_atomically(path, results_to_json(context, results));

  std::printf("%s\n", results_table(results).c_str());
  std::printf("results: %s\n", path.c_str());
  if (failures || errors) std::printf("%d point(s) failed verification, %d errored\n", failures, errors);
  return failures || errors ? 1 : 0;
}

int dispatch(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "--help";
  if (cmd == "--help" || cmd == "-h") return std::fputs(kMainHelp, stdout), 0;
  if (cmd == "--version") return std::printf("dslab %s (%s)\n", DSLAB_VERSION, DSLAB_GIT_SHA), 0;
  if (cmd == "help") {
    const std::string topic = argc > 2 ? argv[2] : "";
    if (topic == "run") {
      char help[] = "--help";
      char* args[] = {argv[0], argv[1], help};
      return cmd_run(3, args);
    }
    std::fputs(topic == "calibrate" ? kCalibrateHelp : topic == "list" ? kListHelp : kMainHelp, stdout);
    return 0;
  }
  if (cmd == "list") {
    if (argc > 2 && std::strcmp(argv[2], "--help") == 0) return std::fputs(kListHelp, stdout), 0;
    if (argc > 2) throw BadInput(std::string("command line: unexpected argument '") + argv[2] + "' (see dslab list --help)");
    return cmd_list();
  }
  if (cmd == "run") return cmd_run(argc, argv);
  if (cmd == "calibrate") return cmd_calibrate(argc, argv);
  throw BadInput("command line: unknown command '" + cmd + "' (expected list, run, calibrate or help)");
}

}  // namespace
}  // namespace dslab

int main(int argc, char** argv) {
  try {
    return dslab::dispatch(argc, argv);
  } catch (const dslab::BadInput& e) {
    std::fprintf(stderr, "dslab: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dslab: error: %s\n", e.what());
    return 1;
  }
}
