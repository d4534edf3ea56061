// dslab: the command line. `dslab --help` and `dslab COMMAND --help` say what each command does.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "harness/build_info.h"
#include "harness/command.h"
#include "harness/errors.h"
#include "harness/gpu_clocks.h"
#include "harness/host.h"
#include "harness/machine.h"
#include "harness/measure.h"
#include "harness/results.h"
#include "harness/safetensors.h"
#include "harness/sweep.h"
#include "harness/tuning.h"

namespace dslab {
namespace {

const char* kMainHelp = R"(dslab: benchmark and verify DeepSeek inference layers (MLA forms, MoE experts, ...)

usage: dslab COMMAND [options]

commands:
%s  help CMD    help for one command (same as `dslab CMD --help`)

examples:
  dslab list
  dslab run --model deepseek-v2 --variant mla/cd/cpu --variant mla/a_cc_me/cpu --axis kv_len=pow2:9:12 --out results/mla
  dslab run workloads/sweeps/default.json --axis kv_len=4096 --out results/default
  dslab calibrate --repeat 3
)";

const char* kRunHelp = R"(usage: dslab run [SWEEP.json] [options]

Runs every (variant, point) of a sweep file, or of the ad-hoc suite given by --model/--variant/--axis.
Each point is prepared (untimed), sampled until the stop rule holds, and verified against the reference.

options:
  --model NAME|PATH     model config (workloads/models/NAME.json or a path to a HF config.json);
                        with a sweep file, replaces every suite's model
  --weights DIR         a Hugging Face checkpoint folder (config.json, index, safetensors shards; DeepSeek-V3's
                        fp8 weights dequantised): its config is the model, and the variants that read weights
                        (the CPU MLA forms and MoE engines so far; docs/checkpoints.md) take them from it, the
                        others are skipped
  --variant NAME        a variant to run (repeatable); with a sweep file, keeps only these
  --suite NAME          with a sweep file, run only this suite (repeatable)
  --axis NAME=VALUES    set or override an axis in every suite (repeatable);
                        VALUES: 1,8,64 | pow2:9:14 (2^9..2^14) | uniform,mixed
  --out DIR             where results.json goes (default: results/<sweep name>); while the run goes on,
                        results.partial.json holds the points done so far (left behind if it is cut short)
  --hot                 do not flush caches before each sample (default: cold)
  --no-verify           skip verification against the reference (default: verify every point)
  --sequential          measure one variant at a time (default: the variants at one point are prepared
                        together and sampled round-robin, so machine drift moves them alike)
  --dump DIR            write each point's weights, inputs and outputs as DIR/<point>.safetensors
  --seed N              seed of the generated weights and inputs (default 1)
  --machine FILE        ceilings from `dslab calibrate` (default: $DSLAB_MACHINE or ~/.cache/dslab/machine.json)
  --min-samples N       stop rule: at least N samples (default 5)
  --min-time S          stop rule: at least S seconds of samples (default 0.3)
  --max-noise F         stop rule: stop once stdev/sqrt(n)/mean <= F (default 0.01)
  --max-spread F        a point whose samples' p10-p90 span more than F of their median (a disturbed host) is
                        sampled again and the steadier window kept; results say so (resampled, discarded_spread)
                        (default 0: off; a suite may set "max_spread")
  --timeout S           stop rule: give up converging after S seconds per point (default 5)
  --repetitions N       run the whole sweep N times, one pass after another (default 1); results.json gets each
                        pass's entry (repetition_index) and Google Benchmark's aggregates over the passes'
                        medians (_mean, _median, _stddev, _cv). dslab compare then tests on the passes' medians,
                        which see run-to-run drift that samples within one pass cannot; use 5 or more (fewer
                        than 4 per side cannot reach p < 0.05)

exit status: 0 all verified; 1 a verification failed or a point errored; 2 bad input (nothing written).
axes: )";

const char* kCalibrateHelp = R"(usage: dslab calibrate [--out FILE] [--threads N] [--repeat N]

Measures the ceilings that roofline_fraction is computed against and writes them, each with how it was
measured, to FILE (default: $DSLAB_MACHINE or ~/.cache/dslab/machine.json):
  cpu: AMX bf16 FLOP/s (TDPBF16PS from registers), AVX-512 bf16 FLOP/s (VDPBF16PS), DRAM read bytes/s
       and the same rates at 1, 2, 4, ... threads (cpu.by_threads)
  gpu: HBM bytes/s (the faster of a copy and a read-only stream), cuBLAS bf16 GEMM FLOP/s, a one-row GEMM's
       weight bytes/s, kernel launch overhead, CUDA graph launch and per-node cost, a small kernel's cost in a
       graph, pinned host<->device bytes/s, a small copy's cost, a host function's round trip (when a GPU is
       present)
  collectives: with two or more GPUs, NCCL's all-reduce, all-gather, reduce-scatter and all-to-all over all
       of them, 8 KiB to 128 MiB, each checked; the latency and bus bandwidth that `dslab plan --gpus`
       prices a step's collectives at (NCCL is opened at run time: $DSLAB_NCCL_LIBRARY, libnccl.so.2, or
       python3's nvidia-nccl wheel)
options:
  --threads N   CPU threads (default: all, as OpenMP sees them)
  --repeat N    calibrate N times: each ceiling is the best seen (a rate's largest, a cost's smallest), and
                "spread" says how far the runs disagree (min, median, max). On a shared VM one run's DRAM rate
                moved 72% with nothing else on the VM; use 3 or more where the ceilings matter
The file also records host_activity: other processes' share of the CPUs and the hypervisor's steal while it
measured (from /proc/stat), with a warning above 5% / 2%: ceilings read on a busy host are low.
)";

const char* kListHelp = R"(usage: dslab list

Prints every registered variant: name (family/algorithm/backend), device, whether it can run on this
machine (or why not), and what it is.
)";

std::string file_safe(std::string s) {
  for (auto& c : s)
    if (c == '/' || c == ':') c = '_';
  return s;
}

int cmd_list(int argc, char** argv) {
  if (argc > 2)
    throw BadInput(std::string("command line: unexpected argument '") + argv[2] + "' (see dslab list --help)");
  int width = 7;  // the longest name's
  for (const auto& e : registered_variants()) width = std::max(width, int(e.name.size()));
  std::printf("%-*s %-6s %-11s %s\n", width, "variant", "device", "here", "what");
  for (const auto& e : registered_variants()) {
    std::string here = "yes";
    if (Support s = e.make()->available(); !s.ok)  // (first: a build without a peer library says so on any machine)
      here = "no: " + s.reason;
    else if (e.device == Device::cuda && !gpu_info().present)
      here = "no: " + gpu_info().why_absent;
    std::printf("%-*s %-6s %-11s %s\n", width, e.name.c_str(), device_name(e.device), here.c_str(), e.summary.c_str());
  }
  return 0;
}

int cmd_calibrate(int argc, char** argv) {
  const Args a = parse_args(argc, argv, 2, {}, {"--out", "--threads", "--repeat"});
  if (!a.positional.empty())
    throw BadInput("command line: unexpected argument '" + a.positional[0] + "' (see dslab calibrate --help)");
  const int threads = int(a.number("--threads", omp_get_max_threads(), 1));
  const int repeat = int(a.number("--repeat", 1, 1));
  const std::string out = a.one("--out", default_machine_path());
  std::vector<nlohmann::json> runs;
  const CpuCounters before = cpu_counters();
  for (int i = 0; i < repeat; ++i) {
    std::fprintf(stderr, "calibrating with %d CPU threads%s (%d of %d) ...\n", threads,
                 gpu_info().present ? (" and " + gpu_info().name).c_str() : "", i + 1, repeat);
    runs.push_back(calibrate_machine(threads));
  }
  nlohmann::json m = combine_calibrations(runs);
  // What else ran on the host meanwhile: a busy host (a fresh device machine still settling, a neighbour's job) or a
  // hypervisor taking cycles reads low CPU ceilings, and every roofline fraction against them comes out high.
  const HostActivity activity = host_activity(before, cpu_counters(), cpu_info().logical_cpus);
  m["host_activity"] = {
      {"others_cpu_fraction", activity.others_fraction},
      {"steal_fraction", activity.steal_fraction},
      {"load_average_1m", activity.load_average},
      {"how", "/proc/stat busy and steal time of all CPUs less this process's CPU time, over the calibration"}};
  if (activity.others_fraction > 0.05 || activity.steal_fraction > 0.02)
    std::fprintf(stderr,
                 "warning: other work used %.0f%% of the CPUs and the hypervisor took %.0f%% while calibrating: the "
                 "CPU ceilings "
                 "may read low; calibrate again on an idle host\n",
                 100 * activity.others_fraction, 100 * activity.steal_fraction);
  write_json_atomically(out, m);
  std::printf("%s\n", m.dump(2).c_str());
  if (m.contains("spread"))  // how far the runs agree, ceiling by ceiling
    for (const auto& [key, s] : m["spread"].items())
      std::fprintf(stderr, "%-34s spread %5.1f%% (min %.4g, max %.4g)\n", key.c_str(), 100 * s["spread"].get<double>(),
                   s["min"].get<double>(), s["max"].get<double>());
  std::printf("machine file: %s\n", out.c_str());
  return 0;
}

int cmd_run(int argc, char** argv) {
  const Args a =
      parse_args(argc, argv, 2, {"--hot", "--no-verify", "--sequential"},
                 {"--model", "--weights", "--variant", "--suite", "--axis", "--out", "--dump", "--seed", "--machine",
                  "--min-samples", "--min-time", "--max-noise", "--timeout", "--max-spread", "--repetitions"});
  if (a.positional.size() > 1)
    throw BadInput("command line: expected at most one sweep file, got '" + a.positional[1] + "'");
  Sweep sweep;
  if (a.positional.empty()) {  // (with --weights the checkpoint's config is the model: expand() puts it in place)
    const std::string weights_config = a.one("--weights").empty() ? "" : a.one("--weights") + "/config.json";
    sweep = adhoc_sweep(a.one("--model").empty() ? weights_config : a.one("--model"), a.all("--variant"));
  } else {
    sweep = load_sweep(a.positional[0]);
    override_model(sweep, a.one("--model"));
    restrict_variants(sweep, a.all("--variant"));
    restrict_suites(sweep, a.all("--suite"));
  }
  for (const auto& ov : a.all("--axis")) apply_axis_override(sweep, ov);
  StopRule rule;
  rule.min_samples = int(a.number("--min-samples", rule.min_samples, 1));
  rule.min_time_s = a.number("--min-time", rule.min_time_s, 0);
  rule.max_noise = a.number("--max-noise", rule.max_noise, 0);
  rule.timeout_s = a.number("--timeout", rule.timeout_s, 0);
  rule.max_spread = a.number("--max-spread", rule.max_spread, 0);
  const uint64_t seed = uint64_t(a.number("--seed", 1, 0));
  const int repetitions = int(a.number("--repetitions", 1, 1));
  const bool hot = a.has("--hot"), verify = !a.has("--no-verify"), sequential = a.has("--sequential");
  const std::string out_dir = a.one("--out", "results/" + sweep.name);
  const std::string dump_dir = a.one("--dump");

  const std::string weights = a.one("--weights");
  if (!weights.empty() && !a.one("--model").empty())
    throw BadInput("command line: --model and --weights: the checkpoint's config.json is the model (give one)");
  const Plan plan = expand(sweep, weights);  // every input error surfaces here, before anything runs or is written

  std::string machine_note;
  const auto machine = load_machine(a.one("--machine", default_machine_path()), &machine_note);
  if (!dump_dir.empty()) std::filesystem::create_directories(dump_dir);

  std::vector<PointResult> results;
  int failures = 0, errors = 0;
  const size_t total = plan.points.size();
  // The variants at one point are prepared together and sampled round-robin (see measure_interleaved),
  // as many at a time as fit in 60% of the host's memory and 80% of the GPU's.
  const double memory_budget = 0.6 * double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  const double device_budget = gpu_info().present ? 0.8 * double(gpu_info().memory_bytes) : 0.0;
  auto host_memory = [](const PlannedPoint& pp) {
    return pp.support.ok ? pp.entry->make()->host_memory_bytes(*pp.model, pp.point) : 0.0;
  };
  auto device_memory = [](const PlannedPoint& pp) {
    return pp.support.ok ? pp.entry->make()->device_memory_bytes(*pp.model, pp.point) : 0.0;
  };
  // The GPU's clocks and throttle reasons as the run starts, and (below) as each results file is written.
  const nlohmann::json gpu_clocks_before =
      gpu_info().present ? gpu_clock_state(gpu_info().uuid) : nlohmann::json(nullptr);
  auto run_context_json = [&] {
    nlohmann::json context = run_context(joined_command_line(argc, argv));
    if (gpu_info().present) {
      context["gpu_clocks_before"] = gpu_clocks_before;
      context["gpu_clocks_after"] = gpu_clock_state(gpu_info().uuid);
    }
    context["sweep"] = sweep.name;
    context["sweep_source"] = sweep.source;
    if (!weights.empty()) context["weights"] = weights;  // (the checkpoint; without it, weights from the seed)
    context["seed"] = seed;
    context["hot"] = hot;
    context["interleaved"] = !sequential;
    context["repetitions"] = repetitions;
    context["verify"] = verify;
    context["stop_rule"] = {{"min_samples", rule.min_samples},
                            {"min_time_s", rule.min_time_s},
                            {"max_noise", rule.max_noise},
                            {"timeout_s", rule.timeout_s},
                            {"max_spread", rule.max_spread}};
    context["machine_file"] =
        machine ? nlohmann::json(a.one("--machine", default_machine_path())) : nlohmann::json(nullptr);
    if (machine) context["machine"] = *machine;
    std::string models;
    for (const auto& m : plan.models) models += (models.empty() ? "" : ",") + m->name;
    context["model"] = models;
    return context;
  };
  const std::string path = out_dir + "/results.json", partial_path = out_dir + "/results.partial.json";
  // Whole-run repetitions: every point once, then every point again, so drift over the run's time moves all of
  // them alike and each point's repetition medians sample it (what dslab compare tests on).
  for (int rep = 0; rep < repetitions; ++rep) {
    for (size_t first = 0; first < total;) {
      size_t last = first + 1;
      double memory = host_memory(plan.points[first]), device = device_memory(plan.points[first]);
      while (!sequential && last < total && plan.points[last].suite == plan.points[first].suite &&
             plan.points[last].model == plan.points[first].model &&
             plan.points[last].point.label() == plan.points[first].point.label() &&
             (memory += host_memory(plan.points[last])) <= memory_budget &&
             (device += device_memory(plan.points[last])) <= std::max(device_budget, device_memory(plan.points[first])))
        ++last;
      std::vector<PointResult> group;
      std::vector<std::unique_ptr<Variant>> variants;
      for (size_t i = first; i < last; ++i) {
        const PlannedPoint& pp = plan.points[i];
        PointResult r;
        r.variant = pp.entry->name;
        r.suite = pp.suite;
        r.unverified_reason = pp.unverified_reason;
        r.model = pp.model->name;
        r.device = pp.entry->device;
        r.point = pp.point;
        r.repetition = rep;
        r.repetitions = repetitions;
        std::unique_ptr<Variant> v;
        if (!pp.support.ok) {
          r.skip_reason = pp.support.reason;
        } else {
          try {
            v = pp.entry->make();
            v->prepare(*pp.model, pp.point, seed);
            r.cost = v->cost(*pp.model, pp.point);  // after prepare: a routing-dependent cost sees this seed's routing
            if (machine) {
              r.compute_ceiling = machine_ceiling(*machine, v->compute_ceiling());
              const std::string bandwidth = v->bandwidth_ceiling();
              r.bandwidth_ceiling = machine_ceiling(*machine, !bandwidth.empty()        ? bandwidth
                                                              : r.device == Device::cpu ? "cpu.dram_read_bytes_per_s"
                                                                                        : "gpu.hbm_bytes_per_s");
              if (r.device != Device::cpu) r.kernel_fixed_s = machine_ceiling(*machine, "gpu.small_kernel_s");
            }
          } catch (const BadInput&) {
            throw;
          } catch (const std::exception& e) {
            r.error = std::string("prepare: ") + e.what();
            v.reset();
          }
        }
        group.push_back(std::move(r));
        variants.push_back(std::move(v));
      }
      std::vector<Subject> subjects;
      std::vector<size_t> measured;
      for (size_t k = 0; k < group.size(); ++k)
        if (variants[k]) {
          subjects.push_back({variants[k].get(), group[k].device, group[k].cost.bytes});
          measured.push_back(k);
        }
      std::vector<SampleSet> samples;
      try {
        StopRule point_rule = rule;  // the suite may raise the floors (never lower the command line's)
        point_rule.min_samples = std::max(rule.min_samples, plan.points[first].min_samples);
        point_rule.timeout_s = std::max(rule.timeout_s, plan.points[first].timeout_s);
        if (plan.points[first].max_spread > 0)
          point_rule.max_spread = rule.max_spread > 0 ? std::min(rule.max_spread, plan.points[first].max_spread)
                                                      : plan.points[first].max_spread;
        samples = measure_interleaved(subjects, point_rule, hot);
      } catch (const std::exception& e) {
        for (size_t k : measured) group[k].error = std::string("run: ") + e.what();
        measured.clear();
      }
      for (size_t m = 0; m < measured.size(); ++m) group[measured[m]].samples = std::move(samples[m]);
      for (size_t k = 0; k < group.size(); ++k) {
        PointResult& r = group[k];
        const std::string progress = repetitions > 1
                                         ? "rep " + std::to_string(rep + 1) + "/" + std::to_string(repetitions) + ", "
                                         : std::string();
        std::fprintf(stderr, "[%s%zu/%zu] %-16s %s/%s ", progress.c_str(), first + k + 1, total, r.variant.c_str(),
                     r.model.c_str(), r.point.label().c_str());
        if (!r.skip_reason.empty()) {
          std::fprintf(stderr, "skipped: %s\n", r.skip_reason.c_str());
        } else if (!r.error.empty()) {
          ++errors;
          std::fprintf(stderr, "error: %s\n", r.error.c_str());
        } else {
          try {
            r.counters = variants[k]->counters();
            // A count per run ("tokens_per_run") becomes a rate at the median ("tokens_per_s"), so results carry it.
            const double median_s = summarize(r.samples.seconds).median;
            for (const auto& [name, value] : std::map<std::string, double>(r.counters))
              if (name.size() > 8 && name.compare(name.size() - 8, 8, "_per_run") == 0 && median_s > 0)
                r.counters[name.substr(0, name.size() - 8) + "_per_s"] = value / median_s;
            // A step's GPU busy time against its wall time: what is lost between kernels (launches, gaps).
            if (r.counters.count("kernel_time_s") && r.counters.at("kernel_time_s") > 0 && median_s > 0)
              r.counters["step_over_kernel_time"] =
                  median_s / std::max(1.0, r.counters.count("steps") ? r.counters.at("steps") : 1.0) /
                  r.counters.at("kernel_time_s");
            // (and the share of the step the GPU sits idle: a hybrid step's wait for the CPU experts)
            if (r.counters.count("step_over_kernel_time"))
              r.counters["gpu_idle_fraction"] = std::max(0.0, 1.0 - 1.0 / r.counters.at("step_over_kernel_time"));
            if (verify && r.unverified_reason.empty()) {
              r.verification = variants[k]->verify();
              for (const auto& [name, value] : variants[k]->verification_counters()) r.counters[name] = value;
            }
            if (!dump_dir.empty())
              write_safetensors(dump_dir + "/" + file_safe(r.name()) + ".safetensors", variants[k]->tensors(),
                                {{"variant", r.variant},
                                 {"model", r.model},
                                 {"point", r.point.label()},
                                 {"seed", std::to_string(seed)}});
          } catch (const std::exception& e) {
            r.error = std::string("verify: ") + e.what();
            ++errors;
            std::fprintf(stderr, "error: %s\n", r.error.c_str());
            continue;
          }
          const Stats st = summarize(r.samples.seconds);
          std::fprintf(stderr, "%.4g ms (%zu samples, %s)", st.median * 1e3, r.samples.seconds.size(),
                       r.samples.stop_reason.c_str());
          if (r.samples.discarded_spread >= 0)
            std::fprintf(stderr,
                         " (sampled twice: a window's p10-p90 spanned %.0f%% of its median; kept the one at %.0f%%)",
                         100 * std::max(r.samples.discarded_spread, r.samples.spread()),
                         100 * std::min(r.samples.discarded_spread, r.samples.spread()));
          if (r.verification) {
            std::fprintf(stderr, " verify %s %.2e", r.verification->pass() ? "PASS" : "FAIL", r.verification->rel_err);
            failures += !r.verification->pass();
          } else if (!r.unverified_reason.empty()) {
            std::fprintf(stderr, " not verified (the suite says: %s)", r.unverified_reason.c_str());
          }
          std::fprintf(stderr, "\n");
        }
        results.push_back(std::move(r));
      }
      first = last;
      // What is done so far, so a run cut short (a time limit, a lost machine) still leaves its points behind.
      if (last < total || rep + 1 < repetitions)
        write_json_atomically(partial_path, results_to_json(run_context_json(), results));
    }
  }
  write_json_atomically(path, results_to_json(run_context_json(), results));
  std::filesystem::remove(partial_path);

  std::printf("%s\n", results_table(results).c_str());
  std::printf("%s", above_roofline_warnings(results).c_str());
  std::printf("results: %s\n", path.c_str());
  // (A missing machine file's note comes with the results, so that a bad input's one line comes alone.)
  if (!machine) std::fprintf(stderr, "note: %s\n", machine_note.c_str());
  if (failures || errors) std::printf("%d point(s) failed verification, %d errored\n", failures, errors);
  return failures || errors ? 1 : 0;
}

std::string main_help() {
  std::string list;
  for (const auto& c : registered_commands()) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-11s %s\n", c.name.c_str(), c.summary.c_str());
    list += line;
  }
  char buf[4096];
  std::snprintf(buf, sizeof buf, kMainHelp, list.c_str());
  return buf;
}

const Command* find_command(const std::string& name) {
  for (const auto& c : registered_commands())
    if (c.name == name) return &c;
  return nullptr;
}

std::string run_help() {
  std::string h = kRunHelp;
  for (const auto& ax : known_axes())
    h += "\n  " + ax.name + std::string(ax.name.size() < 10 ? 10 - ax.name.size() : 1, ' ') + ax.help;
  return h + "\n";
}

DSLAB_REGISTER_COMMAND(list, "list", "the registered variants, their device, and whether they can run here", kListHelp,
                       cmd_list);
DSLAB_REGISTER_COMMAND(run, "run", "run a sweep file or ad-hoc variants and axes; verify; write results.json",
                       run_help(), cmd_run);
DSLAB_REGISTER_COMMAND(calibrate, "calibrate",
                       "measure this machine's ceilings (AMX/AVX-512 bf16, DRAM; GPU HBM, GEMM, launch)",
                       kCalibrateHelp, cmd_calibrate);

int dispatch(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "--help";
  if (cmd == "--help" || cmd == "-h") return std::fputs(main_help().c_str(), stdout), 0;
  if (cmd == "--version") return std::printf("dslab %s (%s)\n", DSLAB_VERSION, DSLAB_GIT_SHA), 0;
  if (cmd == "help") {
    const Command* c = argc > 2 ? find_command(argv[2]) : nullptr;
    std::fputs(c ? c->help.c_str() : main_help().c_str(), stdout);
    return 0;
  }
  const Command* c = find_command(cmd);
  if (!c) {
    std::string names;
    for (const auto& k : registered_commands()) names += (names.empty() ? "" : ", ") + k.name;
    throw BadInput("command line: unknown command '" + cmd + "' (expected one of " + names + ", help)");
  }
  for (int i = 2; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0) return std::fputs(c->help.c_str(), stdout), 0;
  return c->run(argc, argv);
}

}  // namespace
}  // namespace dslab

int main(int argc, char** argv) {
  try {
    dslab::TuningCache::parse_mode(std::getenv("DSLAB_TUNE"));  // (a bad mode: one line before anything runs)
    return dslab::dispatch(argc, argv);
  } catch (const dslab::BadInput& e) {
    std::fprintf(stderr, "dslab: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dslab: error: %s\n", e.what());
    return 1;
  }
}
