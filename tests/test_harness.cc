// Harness: axis syntax, sweep expansion and overrides, results round trip, and bad input through the CLI.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <set>
#include <sstream>

#include "harness/errors.h"
#include "harness/gpu_clocks.h"
#include "harness/host.h"
#include "harness/machine.h"
#include "harness/measure.h"
#ifdef DSLAB_HAVE_CUDA
#include "harness/gpu.h"
#endif
#include "harness/results.h"
#include "harness/sweep.h"
#include "harness/tuning.h"
#include "harness/collectives.h"
#include "harness/nccl.h"
#include "tests/test_util.h"

namespace dslab {
namespace {
namespace fs = std::filesystem;
using test::CliRun;
using test::dslab_binary;
using test::expect_bad_input;
using test::run_cli;
using test::test_name;

TEST(HostActivity, ProcStatLineAndOthersShare) {
  double busy = 0, steal = 0;
  // user nice system idle iowait irq softirq steal guest guest_nice, in ticks of 1/100 s
  ASSERT_TRUE(parse_proc_stat_cpu_line("cpu  1000 50 250 9000 30 10 40 20 0 0", 100, &busy, &steal));
  EXPECT_DOUBLE_EQ(busy, (1000 + 50 + 250 + 10 + 40) / 100.0);  // idle and iowait are not busy
  EXPECT_DOUBLE_EQ(steal, 0.2);
  EXPECT_FALSE(parse_proc_stat_cpu_line("cpu0 1 2 3 4", 100, &busy, &steal));  // one CPU's line, not the total
  EXPECT_FALSE(parse_proc_stat_cpu_line("intr 12 13", 100, &busy, &steal));
  // 10 s on 4 CPUs (40 CPU-seconds): the host busy 30 of them, this process 20, the hypervisor 2 -> others 25%, steal
  // 5%.
  CpuCounters before, after;
  before.wall_s = 100, after.wall_s = 110;
  before.busy_s = 500, after.busy_s = 530;
  before.own_s = 1, after.own_s = 21;
  before.steal_s = 3, after.steal_s = 5;
  const HostActivity h = host_activity(before, after, 4);
  EXPECT_DOUBLE_EQ(h.others_fraction, 0.25);
  EXPECT_DOUBLE_EQ(h.steal_fraction, 0.05);
  // This machine, now: fractions in [0, 1].
  const HostActivity here = host_activity(cpu_counters(), cpu_counters(), cpu_info().logical_cpus);
  EXPECT_GE(here.others_fraction, 0.0);
  EXPECT_LE(here.others_fraction, 1.0);
}

TEST(Axes, ListsRangesAndText) {
  auto v = parse_axis_values("kv_len", "pow2:9:12", "t");
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].integer, 512);
  EXPECT_EQ(v[3].integer, 4096);
  v = parse_axis_values("batch", "1,8,64", "t");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[2].integer, 64);
  v = parse_axis_values("len_dist", "uniform,mixed", "t");
  EXPECT_EQ(v[1].text, "mixed");
  EXPECT_FALSE(v[1].is_integer);
  EXPECT_EQ(parse_axis_values("kv_len", "0", "t")[0].integer, 0);
}

TEST(Axes, BadValuesAreBadInput) {
  EXPECT_THROW(parse_axis_values("batch", "0", "t"), BadInput);
  EXPECT_THROW(parse_axis_values("batch", "-1", "t"), BadInput);
  EXPECT_THROW(parse_axis_values("batch", "1,,2", "t"), BadInput);
  EXPECT_THROW(parse_axis_values("batch", "two", "t"), BadInput);
  EXPECT_THROW(parse_axis_values("kv_len", "pow2:12:9", "t"), BadInput);
  EXPECT_THROW(parse_axis_values("kvlen", "1", "t"), BadInput);
}

Sweep two_suite_sweep() {
  return parse_sweep(nlohmann::json::parse(R"({
    "name": "s", "model": "tiny",
    "suites": [
      {"name": "decode", "variants": ["mla/cd/cpu", "mla/a_cc_me/cpu"], "axes": {"batch": [1, 2], "kv_len": "pow2:4:6"}},
      {"name": "extend", "model": "deepseek-v2-lite", "variants": ["mla/cc/cpu"], "axes": {"q_len": 4}}
    ]})"),
                     "s.json", "s");
}

TEST(Sweep, ExpandsCartesianPointMajorWithDefaults) {
  const Plan plan = expand(two_suite_sweep());
  ASSERT_EQ(plan.points.size(), 2u * 3u * 2u + 1u);
  // Point-major: both variants at one point, then the next point.
  EXPECT_EQ(plan.points[0].entry->name, "mla/cd/cpu");
  EXPECT_EQ(plan.points[1].entry->name, "mla/a_cc_me/cpu");
  EXPECT_EQ(plan.points[0].point.label(), plan.points[1].point.label());
  EXPECT_EQ(plan.points[0].point.label(), "batch:1/q_len:1/kv_len:16");
  EXPECT_EQ(plan.points[11].point.label(), "batch:2/q_len:1/kv_len:64");
  const auto& extend = plan.points.back();
  EXPECT_EQ(extend.model->name, "deepseek-v2-lite");
  EXPECT_EQ(extend.point.label(), "batch:1/q_len:4/kv_len:4096");  // defaults fill what the suite leaves out
}

TEST(Sweep, OverridesReplaceOrAddAxesEverywhere) {
  Sweep s = two_suite_sweep();
  apply_axis_override(s, "kv_len=100");
  apply_axis_override(s, "heads=2");
  const Plan plan = expand(s);
  ASSERT_EQ(plan.points.size(), 2u * 2u + 1u);
  EXPECT_EQ(plan.points[0].point.label(), "batch:1/q_len:1/kv_len:100/heads:2");
  EXPECT_EQ(plan.points.back().point.label(), "batch:1/q_len:4/kv_len:100/heads:2");
  restrict_variants(s, {"mla/cc/cpu"});
  ASSERT_EQ(s.suites.size(), 1u);
  EXPECT_THROW(apply_axis_override(s, "kv_len"), BadInput);
  EXPECT_THROW(apply_axis_override(s, "bogus=1"), BadInput);
}

TEST(Sweep, ASuiteRaisesTheStopRulesFloorsForItsPoints) {
  const Plan plan = expand(parse_sweep(nlohmann::json::parse(R"({
    "name": "s", "model": "tiny",
    "suites": [
      {"name": "engine", "variants": ["mla/cd/cpu"], "axes": {"batch": [1, 2]}, "min_samples": 15, "timeout": 4, "max_spread": 0.25},
      {"name": "plain", "variants": ["mla/cd/cpu"]}
    ]})"),
                                       "s.json", "s"));
  ASSERT_EQ(plan.points.size(), 3u);
  EXPECT_EQ(plan.points[0].min_samples, 15);
  EXPECT_EQ(plan.points[1].timeout_s, 4.0);
  EXPECT_EQ(plan.points[2].min_samples, 0);  // the run's own
  EXPECT_EQ(plan.points[2].timeout_s, 0.0);
  EXPECT_EQ(plan.points[0].max_spread, 0.25);
  EXPECT_EQ(plan.points[2].max_spread, 0.0);
  for (const char* bad : {R"("min_samples": 0)", R"("min_samples": 2.5)", R"("timeout": -1)", R"("timeout": "4")",
                          R"("max_spread": 0)", R"("max_spread": "0.25")"}) {
    const std::string text =
        std::string(R"({"model": "tiny", "suites": [{"name": "x", "variants": ["mla/cd/cpu"], )") + bad + "}]}";
    try {
      parse_sweep(nlohmann::json::parse(text), "s.json", "s");
      ADD_FAILURE() << bad << " must be refused";
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("s.json: suites[0]: field '"), std::string::npos) << e.what();
    }
  }
}

// A variant whose run() takes `slow_ms` and `fast_ms` in turn for its first `noisy_calls` calls (a disturbed host),
// then `fast_ms` every time.
class PacedVariant : public Variant {
 public:
  PacedVariant(int noisy_calls, double fast_ms, double slow_ms) : noisy_(noisy_calls), fast_(fast_ms), slow_(slow_ms) {}
  std::vector<std::pair<std::string, std::string>> axes() const override { return {}; }
  Support supports(const ModelFile&, const Point&) const override { return {}; }
  Cost cost(const ModelFile&, const Point&) const override { return {}; }
  std::string compute_ceiling() const override { return ""; }
  void prepare(const ModelFile&, const Point&, uint64_t) override {}
  void run() override {
    const double ms = calls_ < noisy_ && calls_ % 2 ? slow_ : fast_;
    ++calls_;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(int64_t(ms * 1e3));
    while (std::chrono::steady_clock::now() < until) {}
  }
  Verification verify() override { return {}; }

 private:
  int noisy_, calls_ = 0;
  double fast_, slow_;
};

TEST(Measure, ADisturbedWindowIsSampledAgainAndTheSteadierOneKept) {
  StopRule rule;
  rule.min_samples = 10;
  rule.min_time_s = 0;
  rule.max_noise = 0;  // (never converges: each window runs to its timeout)
  rule.timeout_s = 0.06;
  rule.max_spread = 0.25;
  // Warm-up (50 ms) and the first window (60 ms) fall in the disturbance (1 ms and 3 ms in turn: ~55 calls, a
  // p10-p90 of ~100% of the median); the second window finds the host steady. (Asserted: what holds however busy
  // the machine running the test is: not which window wins, which a loaded machine's preemptions can decide.)
  PacedVariant disturbed(55, 1.0, 3.0);
  const auto out = measure_interleaved({{&disturbed, Device::cpu, 1e9}}, rule, /*hot=*/true);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_GE(out[0].discarded_spread, 0);  // sampled twice (which window is the steadier depends on the machine's load)
  EXPECT_LE(out[0].spread(), out[0].discarded_spread);
  // Off (0, the default): the disturbed window stays, unmarked; a spread under the bound: sampled once.
  for (double max_spread : {0.0, 100.0}) {
    rule.max_spread = max_spread;
    PacedVariant again(55, 1.0, 3.0);
    const auto kept = measure_interleaved({{&again, Device::cpu, 1e9}}, rule, /*hot=*/true);
    EXPECT_EQ(kept[0].discarded_spread, -1);
    EXPECT_GT(kept[0].spread(), 0.5);
  }
}

// Every sweep file the project ships (and reproduce.sh runs on the device) expands: its variants exist and read
// every axis its suites set, so a mistyped suite fails here rather than as a device run's bad input.
TEST(Sweep, EveryShippedSweepExpands) {
  const fs::path dir = fs::path(DSLAB_SOURCE_DIR) / "workloads" / "sweeps";
  int sweeps = 0;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".json") continue;
    ++sweeps;
    SCOPED_TRACE(f.path().string());
    EXPECT_NO_THROW({
      const Plan plan = expand(load_sweep(f.path().string()));
      EXPECT_FALSE(plan.points.empty());
    });
  }
  EXPECT_GE(sweeps, 10);
}

TEST(Sweep, AxisAVariantDoesNotReadIsBadInput) {
  Sweep s = two_suite_sweep();
  apply_axis_override(s, "tokens=8");
  EXPECT_THROW(expand(s), BadInput);
}

TEST(Results, RoundTripKeepsTheContract) {
  PointResult r;
  r.variant = "mla/a_cc_me/cpu";
  r.suite = "decode";
  r.model = "tiny";
  r.point.set("batch", {"1", 1, true});
  r.point.set("kv_len", {"4096", 4096, true});
  r.samples.seconds = {1e-3, 2e-3, 3e-3};
  r.samples.stop_reason = "converged";
  r.samples.cache_state = "flushed";
  r.cost = {2e9, 1e8};
  r.verification = Verification{1e-3, 1e-2};
  r.compute_ceiling = 1e12;
  r.bandwidth_ceiling = 1e10;
  PointResult skipped = r;
  skipped.skip_reason = "needs AMX";
  const auto dir = fs::temp_directory_path() / "dslab_results_roundtrip";
  fs::remove_all(dir);
  write_json_atomically((dir / "results.json").string(), results_to_json(run_context("dslab run x"), {r, skipped}));
  std::ifstream f(dir / "results.json");
  const auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["benchmarks"].size(), 1u);
  const auto& b = j["benchmarks"][0];
  EXPECT_EQ(b["name"], "mla/a_cc_me/cpu/" + r.model +
                           "/batch:1/kv_len:4096");  // the model in the name: compare.py tells models apart
  EXPECT_EQ(b["run_type"], "iteration");
  EXPECT_TRUE(j["context"].contains("cpu_governor"));  // what the CPU ran at ("" where the kernel exposes none)
  EXPECT_EQ(b["time_unit"], "us");
  EXPECT_DOUBLE_EQ(b["real_time"].get<double>(), 2000.0);
  EXPECT_DOUBLE_EQ(b["cpu_time"].get<double>(), 2000.0);
  EXPECT_EQ(b["variant"], "mla/a_cc_me/cpu");
  EXPECT_EQ(b["axes"]["kv_len"], 4096);
  EXPECT_DOUBLE_EQ(b["flops"].get<double>(), 2e9);
  EXPECT_DOUBLE_EQ(b["bytes"].get<double>(), 1e8);
  EXPECT_DOUBLE_EQ(b["arithmetic_intensity"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(b["verify_rel_err"].get<double>(), 1e-3);
  EXPECT_EQ(b["verify_pass"], true);
  EXPECT_EQ(b["stop_reason"], "converged");
  // floor = max(2e9/1e12, 1e8/1e10) = 0.01 s against a 2 ms median.
  EXPECT_DOUBLE_EQ(b["roofline_fraction"].get<double>(), 0.01 / 2e-3);
  EXPECT_EQ(j["skipped"][0]["reason"], "needs AMX");
  for (const char* k : {"git_sha", "build_type", "compiler", "cpu_model", "cpu_isa", "dslab_version", "command_line"})
    EXPECT_TRUE(j["context"].contains(k)) << k;
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "results.json");  // no temp left
  EXPECT_FALSE(b.contains("resampled"));
  // A point sampled twice (StopRule::max_spread) says so, with the spread of the window it did not keep.
  r.samples.discarded_spread = 0.9;
  const auto again = results_to_json(run_context("dslab run x"), {r});
  EXPECT_EQ(again["benchmarks"][0]["resampled"], true);
  EXPECT_DOUBLE_EQ(again["benchmarks"][0]["discarded_spread"].get<double>(), 0.9);
}

TEST(Results, RepetitionsCarryTheirIndexAndGoogleBenchmarksAggregates) {
  std::vector<PointResult> runs;
  const std::vector<double> medians_ms = {2, 1, 4};  // repetitions 0, 1, 2
  for (int rep = 0; rep < 3; ++rep) {
    PointResult r;
    r.variant = "mla/a_cc_me/cpu";
    r.model = "tiny";
    r.point.set("batch", {"1", 1, true});
    r.samples.seconds = {medians_ms[rep] * 1e-3};
    r.repetition = rep;
    r.repetitions = 3;
    runs.push_back(r);
  }
  const auto j = results_to_json(run_context("dslab run x --repetitions 3"), runs);
  ASSERT_EQ(j["benchmarks"].size(), 3u + 4u);  // three passes, then mean, median, stddev, cv
  for (int rep = 0; rep < 3; ++rep) {
    EXPECT_EQ(j["benchmarks"][rep]["repetition_index"], rep);
    EXPECT_EQ(j["benchmarks"][rep]["repetitions"], 3);
    EXPECT_EQ(j["benchmarks"][rep]["family_index"], 0);  // one benchmark, three repetitions
  }
  std::map<std::string, double> aggregate;
  for (size_t i = 3; i < j["benchmarks"].size(); ++i) {
    const auto& a = j["benchmarks"][i];
    EXPECT_EQ(a["run_type"], "aggregate");
    EXPECT_EQ(a["run_name"], "mla/a_cc_me/cpu/tiny/batch:1");
    EXPECT_EQ(a["name"], "mla/a_cc_me/cpu/tiny/batch:1_" + a["aggregate_name"].get<std::string>());
    aggregate[a["aggregate_name"]] = a["real_time"].get<double>();
  }
  EXPECT_DOUBLE_EQ(aggregate["median"], 2000.0);
  EXPECT_NEAR(aggregate["mean"], 7000.0 / 3, 1e-9);
  EXPECT_NEAR(
      aggregate["stddev"],
      std::sqrt((std::pow(2000 - 7000.0 / 3, 2) + std::pow(1000 - 7000.0 / 3, 2) + std::pow(4000 - 7000.0 / 3, 2)) / 2),
      1e-6);
  EXPECT_NEAR(aggregate["cv"], aggregate["stddev"] / aggregate["mean"], 1e-12);
}

// ---- bad input through the command line: exit 2, one line on stderr, no results.json ----

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p;
}

TEST(CliBadInput, UnknownModel) { expect_bad_input("run --model deepseek-v9 --variant mla/cd/cpu", "deepseek-v9"); }
TEST(CliBadInput, UnknownVariant) { expect_bad_input("run --model tiny --variant mla/xx/cpu", "mla/xx/cpu"); }
TEST(CliBadInput, UnknownAxis) { expect_bad_input("run --model tiny --variant mla/cd/cpu --axis kvlen=4", "kvlen"); }
TEST(CliBadInput, NonPositiveAxisValue) {
  expect_bad_input("run --model tiny --variant mla/cd/cpu --axis batch=0", "batch");
}
TEST(CliBadInput, TextAxisValueOutsideItsChoices) {
  // Checked when the axis is read, so a machine that cannot run the variant still rejects the typo.
  expect_bad_input("run --model tiny --variant mla/cd/cpu --axis kv_dtype=fp16", "fp16");
}
TEST(CliBadInput, UnknownOption) { expect_bad_input("run --model tiny --variant mla/cd/cpu --fast", "--fast"); }
TEST(CliBadInput, MalformedSweepJson) {
  const auto p = write_temp("dslab_bad_sweep.json", "{\"suites\": [ {\"variants\": [\"mla/cd/cpu\"] ");
  expect_bad_input("run " + p.string(), "malformed JSON");
}
TEST(CliBadInput, SweepWithUnknownField) {
  const auto p =
      write_temp("dslab_bad_sweep2.json", R"({"model": "tiny", "suites": [{"variants": ["mla/cd/cpu"], "axis": {}}]})");
  expect_bad_input("run " + p.string(), "'axis'");
}
TEST(CliBadInput, ModelWithNonPositiveField) {
  std::ifstream f("workloads/models/tiny.json");
  auto j = nlohmann::json::parse(f);
  j["kv_lora_rank"] = -1;
  const auto p = write_temp("dslab_bad_model.json", j.dump());
  expect_bad_input("run --model " + p.string() + " --variant mla/cd/cpu", "kv_lora_rank");
}
TEST(CliBadInput, ModelWithMissingField) {
  std::ifstream f("workloads/models/tiny.json");
  auto j = nlohmann::json::parse(f);
  j.erase("hidden_size");
  const auto p = write_temp("dslab_bad_model2.json", j.dump());
  expect_bad_input("run --model " + p.string() + " --variant mla/cd/cpu", "hidden_size");
}

TEST(Cli, SmallRunWritesVerifiedResults) {
  const fs::path out = fs::temp_directory_path() / "dslab_cli_ok";
  fs::remove_all(out);
  const CliRun r = run_cli(
      "run --model tiny --variant mla/cd/cpu --variant mla/a_cc_me/cpu --axis kv_len=32,64 "
      "--min-samples 2 --min-time 0 --timeout 1 --dump " +
          (out / "dump").string(),
      out);
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream f(out / "results.json");
  const auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["benchmarks"].size(), 4u);
  // The points-so-far file a cut-short run leaves behind is gone once the run completes.
  EXPECT_FALSE(fs::exists(out / "results.partial.json"));
  for (const auto& b : j["benchmarks"]) {
    EXPECT_EQ(b["verify_pass"], true) << b["name"];
    EXPECT_GT(b["real_time"].get<double>(), 0);
  }
  EXPECT_NE(r.err.find("[4/4]"), std::string::npos) << "progress line: " << r.err;
  EXPECT_TRUE(fs::exists(out / "dump" / "mla_cd_cpu_tiny_batch_1_q_len_1_kv_len_32.safetensors"));
}

// A suite that says why its points are not verified is timed, not verified, and says so in the results, the
// console and the report; other suites of the same run still verify.
TEST(Cli, AnUnverifiedSuiteSaysSoEverywhere) {
  const fs::path out = fs::temp_directory_path() / ("dslab_" + test_name());
  fs::remove_all(out);
  const fs::path sweep = write_temp("dslab_" + test_name() + ".json", R"({"model": "tiny", "suites": [
      {"name": "big", "variants": ["mla/cd/cpu"], "axes": {"kv_len": [32]}, "unverified": "its reference takes an hour"},
      {"name": "small", "variants": ["mla/cd/cpu"], "axes": {"kv_len": [64]}}]})");
  const CliRun r = run_cli("run " + sweep.string() + " --min-samples 2 --min-time 0 --timeout 1", out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("not verified (the suite says: its reference takes an hour)"), std::string::npos) << r.err;
  std::ifstream f(out / "results.json");
  const auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["benchmarks"].size(), 2u);
  for (const auto& b : j["benchmarks"]) {
    const bool big = b["suite"] == "big";
    EXPECT_EQ(b.contains("unverified"), big) << b.dump();
    EXPECT_EQ(b["verify_pass"].is_null(), big) << b.dump();
  }
  const CliRun report = run_cli("report " + (out / "results.json").string(), out / "report");
  ASSERT_EQ(report.status, 0) << report.err;
  std::ifstream md_file(out / "report" / "report.md");
  std::stringstream md;
  md << md_file.rdbuf();
  EXPECT_NE(md.str().find("not verified"), std::string::npos) << md.str();
}

}  // namespace
}  // namespace dslab

namespace dslab {
namespace {
using test::dslab_binary;

// `dslab report` of these results, written as a run would write them: its report.md (empty if the report failed).
std::string report_of(const std::vector<PointResult>& results) {
  const fs::path dir = fs::temp_directory_path() / ("dslab_" + test_name());
  fs::remove_all(dir);
  write_json_atomically((dir / "results.json").string(), results_to_json(run_context("dslab run x"), results));
  const CliRun run = run_cli("report " + (dir / "results.json").string(), dir / "report");
  EXPECT_EQ(run.status, 0) << run.err;
  std::ifstream f(dir / "report" / "report.md");
  std::stringstream md;
  md << f.rdbuf();
  return md.str();
}

// A whole V2-Lite step at batch 1 as layer/deepseek/cuda reports it, `seconds` a sample.
PointResult layer_step(const std::string& suite, double seconds) {
  PointResult r;
  r.variant = "layer/deepseek/cuda";
  r.suite = suite;
  r.model = "deepseek-v2-lite";
  r.point.set("batch", {"1", 1, true});
  r.samples.seconds = {seconds, seconds, seconds};
  r.samples.stop_reason = "converged";
  r.samples.cache_state = "flushed";
  r.cost = {1e9, 1e9};
  return r;
}

TEST(Cli, ReportShowsWholeStepsWhereTheirTimeGoes) {
  PointResult r = layer_step("split", 13.2e-3);
  r.point.set("gpu_experts", {"fit", 0, false});
  r.counters = {{"tokens_per_s", 75.78},           {"kernel_time_s", 2.98e-3}, {"gpu_idle_fraction", 0.774},
                {"cpu_experts_engine_s", 9.08e-3}, {"gpu_moe_layers", 18},     {"moe_layers", 26}};
  PointResult streamed = r;  // the experts streamed over the link instead: 28.8 GB in a 540 ms step
  streamed.point.set("gpu_experts", {"streamed", 0, false});
  streamed.samples.seconds = {0.54, 0.54, 0.54};
  streamed.counters = {{"tokens_per_s", 7585}, {"kernel_time_s", 0.5}, {"gpu_idle_fraction", 0.0},
                       {"gpu_moe_layers", 26}, {"moe_layers", 26},     {"streamed_expert_bytes", 28.8e9}};
  const std::string md = report_of({r, streamed});
  EXPECT_NE(md.find("| 13.2 ms | 75.78 | 2.98 ms | 77% | 9.08 ms | 18 of 26 | — |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 26 of 26 | 28.8 GB at 53.3 GB/s |"), std::string::npos) << md;
  EXPECT_EQ(md.find("Per-op GPU time"), std::string::npos) << "no op_us counters, no per-op table";
}

// A peer that takes only the shape (batch) beside a variant with launch options (executor) meets it at the axes they
// share, with its speedup, while the per-run table keeps each run's own axes; once the variant has two runs at one
// shared point (eager and graph), the points stay apart.
TEST(Cli, ReportLinesUpPeersThatTakeFewerAxes) {
  PointResult ours = layer_step("peers", 2.6e-3);
  ours.point.set("executor", {"graph", 0, false});
  PointResult peer = layer_step("peers", 42.4e-3);
  peer.variant = "peer/transformers/cuda";
  std::string md = report_of({ours, peer});
  EXPECT_NE(md.find("| batch=1 | 2.6 ms (2.6 ms..2.6 ms) | 42.4 ms (42.4 ms..42.4 ms) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| batch=1 | 1.00x | 0.06x |"), std::string::npos) << md;
  EXPECT_NE(md.find("| layer/deepseek/cuda | batch=1 executor=graph |"), std::string::npos) << md;
  PointResult eager = ours;
  eager.point.set("executor", {"eager", 0, false});
  md = report_of({ours, eager, peer});
  EXPECT_EQ(md.find("| batch=1 | 1.00x"), std::string::npos) << md;
  EXPECT_NE(md.find("| batch=1 executor=graph | 1.00x | — |"), std::string::npos) << md;
}

// A step's per-op times (op_us.*) as one row per point, largest first with its share of their sum.
TEST(Cli, ReportListsAStepsOpsLargestFirst) {
  PointResult r = layer_step("acceptance", 3.3e-3);
  r.counters = {{"tokens_per_s", 303}, {"kernel_time_s", 3.2e-3}, {"gpu_idle_fraction", 0.03},
                {"op_us.decode", 500}, {"op_us.gate_up", 1000},   {"op_us.norm", 500}};
  const std::string md = report_of({r});
  EXPECT_NE(md.find("| gate_up 1000 (50%), decode 500 (25%), norm 500 (25%) |"), std::string::npos) << md;
}

// Each op against its own floor, from the op rows a step reports and the machine's ceilings: one row per point, the
// ops by their time above the floor; no machine file, no floors.
TEST(Cli, ReportShowsEachOpAgainstItsFloor) {
  PointResult r = layer_step("acceptance", 3.3e-3);
  r.device = Device::cuda;
  r.compute_ceiling = 1e15, r.bandwidth_ceiling = 1e12, r.kernel_fixed_s = 2e-6;
  r.counters = {{"tokens_per_s", 303},           {"kernel_time_s", 3.2e-3},
                {"op_time_us.experts", 92},      {"op_floor_bytes.experts", 40e6},
                {"op_floor_kernels.experts", 3}, {"op_time_us.router", 8},
                {"op_floor_kernels.router", 1}};
  const std::string md = report_of({r});
  EXPECT_NE(md.find("| 100 / 48 (0.48) | experts 92 / 46 (0.50), router 8 / 2 (0.25) |"), std::string::npos) << md;
  r.compute_ceiling.reset();
  EXPECT_EQ(report_of({r}).find("Each op against its own floor"), std::string::npos);
}

// The fused decode kernel's phase counters as one row per run, in the kernel's order; none, no table.
TEST(Cli, ReportShowsWhereADecodeCtasTimeGoes) {
  PointResult r = layer_step("kv-splits", 75e-6);
  r.variant = "mla/fused/cuda";
  r.counters = {{"decode_phase.working_ctas", 22},
                {"decode_phase.blocks", 3},
                {"decode_phase_us.wait", 4.08},
                {"decode_phase_us.first_block_landed", -0.83},
                {"decode_phase_us.first_block_scored", 0.02},
                {"decode_phase_us.first_block_maxed", 0.19},
                {"decode_phase_us.first_block_handed_over", 3.12},
                {"decode_phase_us.first_block_accumulated", 4.09},
                {"decode_phase_us.last_block_accumulated", 8.17},
                {"decode_phase_us.done", 9.62},
                {"decode_phase_us.last_done", 10.31},
                {"decode_phase_us.per_block", 1.99},
                {"decode_phase_us.span", 14.08}};
  const std::string md = report_of({r});
  EXPECT_NE(md.find("| 22 | 3 | 4.08 | -0.83 | 0.02 | 0.19 | 3.12 | 4.09 | 8.17 | 9.62 | 10.31 | 1.99 | 14.08 |"),
            std::string::npos)
      << md;
  // The 128-head kernel records a subset: the others are dashes.
  for (const char* absent : {"decode_phase_us.first_block_landed", "decode_phase_us.first_block_maxed",
                             "decode_phase_us.first_block_handed_over"})
    r.counters.erase(absent);
  EXPECT_NE(report_of({r}).find("| 22 | 3 | 4.08 | - | 0.02 | - | - | 4.09 | 8.17 | 9.62 | 10.31 | 1.99 | 14.08 |"),
            std::string::npos)
      << report_of({r});
  PointResult plain = layer_step("kv-splits", 75e-6);
  EXPECT_EQ(report_of({plain}).find("decode_phase_us"), std::string::npos) << "no phase counters, no phase table";
  EXPECT_EQ(report_of({r}).find("what the switch costs"), std::string::npos) << "one segment a CTA, no switch table";
  // Two segments a CTA (the 128-head kernel): the switch's phases, its cost and two steady blocks.
  r.counters.insert({{"decode_phase_us.first_segment_accumulated", 146.7},
                     {"decode_phase_us.first_segment_written", 159.1},
                     {"decode_phase_us.second_segment_q_landed", 163.7},
                     {"decode_phase_us.second_segment_first_accumulated", 172.8}});
  EXPECT_NE(report_of({r}).find("| - | - | 146.70 | - | 159.10 | 163.70 | - | 172.80 | - | 26.10 | 3.98 |"),
            std::string::npos)
      << report_of({r});
  // The phases inside the switch: the tail entered and its last pair, the stores, the next blocks scored.
  r.counters.insert({{"decode_phase_us.first_segment_last_pairs", 130.0},
                     {"decode_phase_us.first_segment_last_pair", 143.5},
                     {"decode_phase_us.first_segment_stored", 151.0},
                     {"decode_phase_us.second_segment_scored", 166.2}});
  EXPECT_NE(report_of({r}).find(
                "| 130.00 | 143.50 | 146.70 | 151.00 | 159.10 | 163.70 | 166.20 | 172.80 | 16.70 | 26.10 | 3.98 |"),
            std::string::npos)
      << report_of({r});
}

// A sparse result beside the dense fused kernel at its point (the same model, batch, kv_len, page size; its own
// budget and window axes aside): the attention alone, the selection's share, both ratios; no dense match, dashes.
TEST(Cli, ReportPutsSparseAttentionBesideDense) {
  PointResult dense;
  dense.variant = "mla/fused/cuda";
  dense.suite = "gpu-dense-v3";
  dense.model = "deepseek-v3";
  for (const auto& [k, v] :
       std::vector<std::pair<const char*, int64_t>>{{"batch", 16}, {"q_len", 1}, {"kv_len", 131072}, {"page_size", 64}})
    dense.point.set(k, {std::to_string(v), v, true});
  dense.point.set("kv_dtype", {"bf16", 0, false});
  dense.samples.seconds = {1.317e-3, 1.317e-3, 1.317e-3};
  dense.samples.stop_reason = "converged";
  dense.samples.cache_state = "flushed";
  dense.cost = {1e9, 1e9};
  dense.counters = {{"kernel_s", 1.2e-3}};
  PointResult quest = dense;
  quest.variant = "sparse/quest/cuda";
  quest.suite = "gpu-sparse-v3";
  quest.point.set("budget", {"6144", 6144, true});
  quest.point.set("local", {"4096", 4096, true});
  quest.samples.seconds = {0.2e-3, 0.2e-3, 0.2e-3};
  quest.counters = {{"kernel_s", 1e-4},        {"selection_share", 0.4},    {"attended_keys", 6144},
                    {"rel_err_vs_dense", 0.5}, {"op_us.select_scores", 30}, {"op_us.select_pages", 10},
                    {"op_us.decode", 52.5},    {"op_us.combine", 7.25}};
  PointResult alone = quest;  // (no dense run at 32K in the file)
  alone.point.set("kv_len", {"32768", 32768, true});
  const std::string md = report_of({dense, quest, alone});
  const std::string stages = " | pages 10, scores 30, decode 52.5, combine 7.25 | ";
  EXPECT_NE(md.find("| 200 us | 100 us | 40%" + stages + "1.32 ms | 1.2 ms | 12.00x | 6.58x | 6144 | 5.00e-01 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| 200 us | 100 us | 40%" + stages + "— | — | — | — | 6144 | 5.00e-01 |"), std::string::npos) << md;
}

// dslab compare end to end: an unchanged pair exits 0; a copy with one variant's times doubled exits 1
// and names that variant SLOWER. Forty hot samples each: under a parallel ctest on two cores, a dozen
// cold ones can spread so wide that a doubling is honestly NOISY.
TEST(CliCompare, DoubledVariantIsSlowerAndFailsTheGate) {
  const fs::path dir = fs::temp_directory_path() / "dslab_cli_compare";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string run = dslab_binary() +
                          " run --model tiny --variant mla/cd/cpu --variant mla/a_cc_me/cpu --axis kv_len=64 "
                          "--hot --min-samples 40 --min-time 0 --timeout 5 --out " +
                          (dir / "a").string() + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(run.c_str()), 0);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "a" / "results.json"));
  std::ofstream(dir / "same.json") << j.dump();
  for (auto& b : j["benchmarks"])
    if (b["variant"] == "mla/cd/cpu") {
      for (const char* k : {"real_time", "cpu_time", "median_time", "p10_time", "p90_time", "mean_time"})
        b[k] = b[k].get<double>() * 2;
      for (auto& s : b["sample_times"]) s = s.get<double>() * 2;
    }
  std::ofstream(dir / "doubled.json") << j.dump();
  const std::string base = (dir / "a" / "results.json").string();
  auto compare = [&](const std::string& other, const std::string& extra) {
    const std::string cmd = dslab_binary() + " compare " + base + " " + (dir / other).string() + extra + " > " +
                            (dir / "out.txt").string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::stringstream ss;
    ss << std::ifstream(dir / "out.txt").rdbuf();
    return std::make_pair(WEXITSTATUS(rc), ss.str());
  };
  auto [rc_same, out_same] = compare("same.json", "");
  EXPECT_EQ(rc_same, 0) << out_same;
  auto [rc_doubled, out_doubled] = compare("doubled.json", "");
  EXPECT_EQ(rc_doubled, 1) << out_doubled;
  const auto line = out_doubled.find("mla/cd/cpu/tiny/batch:1/q_len:1/kv_len:64");
  ASSERT_NE(line, std::string::npos) << out_doubled;
  EXPECT_NE(out_doubled.substr(line, out_doubled.find('\n', line) - line).find("SLOWER"), std::string::npos)
      << out_doubled;
  // Normalized by the unchanged variant, the doubled one still stands out.
  auto [rc_norm, out_norm] = compare("doubled.json", " --normalize mla/a_cc_me/cpu");
  EXPECT_EQ(rc_norm, 1) << out_norm;
  auto [rc_bad, out_bad] = compare("missing.json", "");
  EXPECT_EQ(rc_bad, 2) << out_bad;
}

#ifdef DSLAB_HAVE_CUDA
// The per-kernel counters' names (kernel_us.<name>): nvcc's anonymous namespaces ("(anonymous namespace)", whose
// parenthesis once cut the name to nothing), templates and parameters dropped; cuBLAS's unmangled names kept.
TEST(KernelNames, ShortNamesSurviveAnonymousNamespacesAndTemplates) {
  EXPECT_EQ(gpu::short_kernel_name("_ZN5dslab3mla4cuda46_GLOBAL__N__671bf253_8_fused_cu_c472558e_1912619merge_splits_"
                                   "kernelEPKfS4_iPK4int2iP13__nv_bfloat16"),
            "merge_splits_kernel");
  EXPECT_EQ(gpu::short_kernel_name("_ZN5dslab3mla4cuda46_GLOBAL__N__671bf253_8_fused_cu_c472558e_191265roles13decode_"
                                   "kernelILNS0_7KvDtypeE0EEEvNS2_6ParamsE"),
            "decode_kernel");
  EXPECT_EQ(gpu::short_kernel_name("nvjet_sm90_tss_64x8_64x16_4x1_v_bz_TNT"), "nvjet_sm90_tss_64x8_64x16_4x1_v_bz_TNT");
}
#endif

TEST(Calibrate, RepeatedRunsCombineToTheBestSeenWithTheirSpread) {
  auto run = [](double dram, double hbm, double launch_s) {
    return nlohmann::json{{"cpu_model", "x"},
                          {"cpu", {{"threads", 16}, {"dram_read_bytes_per_s", dram}, {"dram_read_how", "probe"}}},
                          {"gpu", {{"hbm_bytes_per_s", hbm}, {"launch_overhead_s", launch_s}}}};
  };
  const auto m = combine_calibrations({run(100, 3.0, 4e-6), run(150, 3.1, 3e-6), run(110, 2.9, 5e-6)});
  EXPECT_DOUBLE_EQ(m["cpu"]["dram_read_bytes_per_s"].get<double>(), 150);  // a rate: the largest
  EXPECT_DOUBLE_EQ(m["gpu"]["hbm_bytes_per_s"].get<double>(), 3.1);
  EXPECT_DOUBLE_EQ(m["gpu"]["launch_overhead_s"].get<double>(), 3e-6);  // a cost: the smallest
  EXPECT_DOUBLE_EQ(m["spread"]["cpu.dram_read_bytes_per_s"]["median"].get<double>(), 110);
  EXPECT_NEAR(m["spread"]["cpu.dram_read_bytes_per_s"]["spread"].get<double>(), 50.0 / 110, 1e-12);
  EXPECT_EQ(m["cpu"]["dram_read_how"], "probe");
  EXPECT_FALSE(m["spread"].contains("cpu.threads"));
  EXPECT_FALSE(combine_calibrations({run(100, 3.0, 4e-6)}).contains("spread"));  // one run: nothing to compare
}

// A GPU result of 2 ms against a 1 ms floor (1 GB at 1 TB/s; 1 GFLOP at 1 PFLOP/s).
PointResult gpu_result(const std::string& variant) {
  PointResult r;
  r.variant = variant;
  r.model = "m";
  r.device = Device::cuda;
  r.samples.seconds = {2e-3, 2e-3, 2e-3};
  r.cost.flops = 1e9, r.cost.bytes = 1e9;
  r.compute_ceiling = 1e15, r.bandwidth_ceiling = 1e12;
  return r;
}

TEST(Results, AKernelsOwnRooflineFractionFromItsCounters) {
  PointResult r = gpu_result("mla/fused/cuda");
  r.counters = {{"kernel_s", 1e-3}, {"kernel_flops", 1e9}, {"kernel_bytes", 0.5e9}};  // floor 0.5 ms of 1 ms
  const auto j = results_to_json(run_context("dslab run x"), {r});
  EXPECT_DOUBLE_EQ(j["benchmarks"][0]["kernel_roofline_fraction"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["benchmarks"][0]["roofline_fraction"].get<double>(), 0.5);  // the step: 1 ms floor of 2 ms
}

TEST(Results, EachOpAgainstItsOwnFloorFromItsCounters) {
  PointResult r = gpu_result("layer/deepseek/cuda");
  r.kernel_fixed_s = 2e-6;
  // experts: 40 MB at 1 TB/s = 40 us, plus 3 kernels of 2 us = 46 us of 92 us; router: one kernel, 2 us of 8 us.
  r.counters = {{"op_time_us.experts", 92},      {"op_floor_bytes.experts", 40e6}, {"op_floor_flops.experts", 1e6},
                {"op_floor_kernels.experts", 3}, {"op_time_us.router", 8},         {"op_floor_kernels.router", 1}};
  const auto j = results_to_json(run_context("dslab run x"), {r});
  const auto& floors = j["benchmarks"][0]["op_floors"];
  ASSERT_EQ(floors.size(), 2u) << floors.dump();
  EXPECT_NEAR(floors["experts"]["floor_us"].get<double>(), 46, 1e-9);
  EXPECT_NEAR(floors["experts"]["fraction"].get<double>(), 0.5, 1e-12);
  EXPECT_NEAR(floors["router"]["fraction"].get<double>(), 0.25, 1e-12);
  r.compute_ceiling.reset();  // without a machine file: no floors
  EXPECT_FALSE(results_to_json(run_context("dslab run x"), {r})["benchmarks"][0].contains("op_floors"));
}

TEST(Results, AResultAboveItsRooflineIsCalledOut) {
  PointResult r;
  r.variant = "moe/avx512/cpu";
  r.model = "m";
  r.samples.seconds = {1.0, 1.0, 1.0};
  r.cost.flops = 1e9;
  r.cost.bytes = 1e9;
  r.compute_ceiling = 1e12;
  r.bandwidth_ceiling = 2e9;  // floor 0.5 s: at 1 s the run is at half its roofline
  EXPECT_EQ(above_roofline_warnings({r}), "");
  r.bandwidth_ceiling = 0.5e9;  // floor 2 s: a 1 s run beat the ceiling, which must be wrong
  const std::string w = above_roofline_warnings({r});
  EXPECT_NE(w.find("above its roofline (2.00): moe/avx512/cpu m/"), std::string::npos) << w;
  EXPECT_NE(w.find("stale or wrong"), std::string::npos);
}

TEST(Clocks, ReasonBitsAreNamed) {
  EXPECT_EQ(clock_event_reason_names(0), nlohmann::json::array());
  EXPECT_EQ(clock_event_reason_names(0x4 | 0x40), (nlohmann::json{"sw_power_cap", "hw_thermal_slowdown"}));
  EXPECT_EQ(clock_event_reason_names(0x1 | 0x10000), (nlohmann::json{"gpu_idle", "other"}));
}

TEST(Clocks, UnknownGpuIsUnavailableNotAnError) {
  const nlohmann::json s = gpu_clock_state("GPU-00000000-0000-0000-0000-000000000000");
  ASSERT_TRUE(s.contains("unavailable")) << s.dump();
  EXPECT_FALSE(s["unavailable"].get<std::string>().empty());
}

// On the device: NVML knows the GPU the CUDA runtime picked, and its SM clock is a real clock.
TEST(GpuClocks, ReadsTheRunsGpu) {
  if (!gpu_info().present) GTEST_SKIP() << "no GPU: " << gpu_info().why_absent;
  const nlohmann::json s = gpu_clock_state(gpu_info().uuid);
  ASSERT_FALSE(s.contains("unavailable")) << s.dump();
  EXPECT_GT(s["sm_clock_mhz"].get<double>(), 0);
  EXPECT_GE(s["max_sm_clock_mhz"].get<double>(), s["sm_clock_mhz"].get<double>());
  EXPECT_GT(s["memory_clock_mhz"].get<double>(), 0);
  EXPECT_GT(s["temperature_c"].get<double>(), 0);  // each field its own query's value (a shifted read gave 1980)
  EXPECT_LT(s["temperature_c"].get<double>(), 130);
  EXPECT_GT(s["power_w"].get<double>(), 1);
  EXPECT_TRUE(s["clock_event_reasons"].is_array());
}

}  // namespace
}  // namespace dslab

namespace dslab {
namespace {

// The tuning cache (harness/tuning.h): a measured choice is kept in the file and found by the next process; off
// measures and keeps nothing; redo ignores the file and overwrites it; a malformed file is one BadInput line.
TEST(TuningCache, KeepsMeasuredChoicesAcrossRunsAndHonoursTheMode) {
  const std::string path = (std::filesystem::temp_directory_path() / ("dslab_tuning_" + test::test_name() + ".json"));
  std::filesystem::remove(path);
  {
    TuningCache first(path, "test GPU", TuningCache::Mode::on);
    EXPECT_FALSE(first.lookup("gemm", "m1 n2").has_value());
    first.record("gemm", "m1 n2", {{"split", 4}});
    const auto r = first.report();
    ASSERT_EQ(r.at("used").size(), 1u);
    EXPECT_EQ(r.at("used")[0].at("source"), "measured");
  }
  {
    TuningCache second(path, "test GPU", TuningCache::Mode::on);  // a second run: found, reported as from the cache
    const auto v = second.lookup("gemm", "m1 n2");
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(v->at("split"), 4);
    EXPECT_EQ(second.report().at("used")[0].at("source"), "cache");
    EXPECT_EQ(second.report().at("mode"), "on");
  }
  {
    TuningCache off(path, "test GPU", TuningCache::Mode::off);  // nothing read, nothing kept
    EXPECT_FALSE(off.lookup("gemm", "m1 n2").has_value());
    off.record("gemm", "m9", {{"split", 1}});
    EXPECT_TRUE(off.report().at("used").empty());
  }
  {
    TuningCache redo(path, "test GPU", TuningCache::Mode::redo);  // measured again, the file rewritten
    EXPECT_FALSE(redo.lookup("gemm", "m1 n2").has_value());
    redo.record("gemm", "m1 n2", {{"split", 2}});
  }
  TuningCache after(path, "test GPU", TuningCache::Mode::on);
  EXPECT_EQ(after.lookup("gemm", "m1 n2")->at("split"), 2);
  EXPECT_FALSE(after.lookup("gemm", "m9").has_value());
  std::ofstream(path) << "{\"entries\": [1, 2]}";
  EXPECT_THROW(TuningCache(path, "test GPU", TuningCache::Mode::on), BadInput);
  EXPECT_THROW(TuningCache::parse_mode("sometimes"), BadInput);
  setenv("DSLAB_TUNE", "sometimes", 1);  // through the command line: one line, exit 2, before anything runs
  test::expect_bad_input("list", "DSLAB_TUNE 'sometimes'");
  unsetenv("DSLAB_TUNE");
  EXPECT_EQ(TuningCache::parse_mode(nullptr), TuningCache::Mode::on);
  std::filesystem::remove(path);
}

// On a GPU, through the command line: a run with an empty tuning cache measures its GEMMs' choices, keeps them and
// reports them (context.tuning); a second run finds them in the cache; DSLAB_TUNE=redo measures them again.
// A tuning cache of the test's own (DSLAB_TUNING_CACHE) and an output folder, removed after it; mode(m) sets
// DSLAB_TUNE (nullptr: unset) for the next command-line run.
struct TuningRun {
  std::filesystem::path cache = std::filesystem::temp_directory_path() / ("dslab_tuning_" + test::test_name());
  std::filesystem::path out = std::filesystem::temp_directory_path() / ("dslab_tuning_out_" + test::test_name());
  TuningRun() {
    std::filesystem::remove(cache);
    setenv("DSLAB_TUNING_CACHE", cache.c_str(), 1);
  }
  ~TuningRun() {
    unsetenv("DSLAB_TUNE");
    unsetenv("DSLAB_TUNING_CACHE");
    std::filesystem::remove(cache);
    std::filesystem::remove_all(out);
  }
  void mode(const char* m) {
    std::filesystem::remove_all(out);
    if (m)
      setenv("DSLAB_TUNE", m, 1);
    else
      unsetenv("DSLAB_TUNE");
  }
  // `dslab ARGS` in tuning mode `m` (null: unset): the launch choices it used (context.tuning.used); the run must
  // succeed with every point verified.
  nlohmann::json used(const char* m, const std::string& args) {
    mode(m);
    const test::CliRun r = test::run_cli(args, out);
    EXPECT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(std::ifstream(out / "results.json"));
    for (const auto& b : j.at("benchmarks")) EXPECT_TRUE(b.at("verify_pass").get<bool>()) << b.dump();
    return j.at("context").at("tuning").at("used");
  }
};

TEST(GpuTuning, ASecondRunReusesTheFirstRunsMeasurements) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  TuningRun t;
  auto sources = [&](const char* mode) {
    std::set<std::string> s;
    for (const auto& u : t.used(mode,
                                "run --model deepseek-v2-lite --variant linear/own/cuda --axis tokens=32 "
                                "--axis weight=o_proj --min-samples 3"))
      s.insert(u.at("source").get<std::string>());
    return s;
  };
  EXPECT_EQ(sources(nullptr), std::set<std::string>{"measured"});
  EXPECT_TRUE(std::filesystem::exists(t.cache));
  EXPECT_EQ(sources(nullptr), std::set<std::string>{"cache"});
  EXPECT_EQ(sources("redo"), std::set<std::string>{"measured"});
}

// The fused decode's key block at 16 heads (32 or 64 keys: which is faster depends on the GPU): measured on first use
// and kept, found in the cache the second time, the built-in table's choice with DSLAB_TUNE=off; every run verified.
TEST(GpuTuning, TheFusedDecodeMeasuresItsKeyBlockOnFirstUse) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  TuningRun t;
  auto block_keys = [&](const char* mode) {
    std::pair<std::string, int> choice;
    for (const auto& u : t.used(mode,
                                "run --model deepseek-v3 --variant mla/fused/cuda --axis heads=16 --axis batch=8 "
                                "--axis kv_len=3000 --axis proj=cublas --min-samples 3"))
      if (u.at("family") == "mla_fused_block_keys") choice = {u.at("source"), u.at("value").get<int>()};
    EXPECT_TRUE(choice.second == 32 || choice.second == 64) << choice.second;
    return choice;
  };
  const auto first = block_keys(nullptr);
  EXPECT_EQ(first.first, "measured");
  const auto second = block_keys(nullptr);
  EXPECT_EQ(second.first, "cache");
  EXPECT_EQ(second.second, first.second);
  EXPECT_EQ(block_keys("off").first, "default");
}

// The choices of tuning family `family` a run of `args` used in mode `m`, by key: where each came from and its value.
using Choices = std::map<std::string, std::pair<std::string, nlohmann::json>>;
Choices choices_of(TuningRun& t, const char* m, const std::string& args, const std::string& family) {
  Choices by_key;
  for (const auto& u : t.used(m, args))
    if (u.at("family") == family) by_key[u.at("key")] = {u.at("source"), u.at("value")};
  return by_key;
}

// A family measured on first use (every key of `keys` expected choices), found in the cache with the same values the
// second time, the built-in choice with DSLAB_TUNE=off; `valid` checks each value.
void expect_tuned_on_first_use(const std::string& args, const std::string& family, size_t keys,
                               const std::function<void(const nlohmann::json&)>& valid) {
  TuningRun t;
  const Choices first = choices_of(t, nullptr, args, family);
  EXPECT_EQ(first.size(), keys) << family;
  for (const auto& [key, choice] : first) {
    EXPECT_EQ(choice.first, "measured") << key;
    valid(choice.second);
  }
  const Choices second = choices_of(t, nullptr, args, family);
  EXPECT_EQ(second.size(), keys) << family;
  for (const auto& [key, choice] : second) {
    EXPECT_EQ(choice.first, "cache") << key;
    ASSERT_TRUE(first.count(key)) << key;
    EXPECT_EQ(choice.second, first.at(key).second) << key;
  }
  const Choices off = choices_of(t, "off", args, family);
  EXPECT_EQ(off.size(), keys) << family;
  for (const auto& [key, choice] : off) {
    EXPECT_EQ(choice.first, "default") << key;
    valid(choice.second);
  }
}

// The own GEMV's split (warps a feature) at one and two rows: one shape a row count.
TEST(GpuTuning, TheOwnGemvMeasuresItsSplitOnFirstUse) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  expect_tuned_on_first_use(
      "run --model deepseek-v2-lite --variant linear/own/cuda --axis tokens=1,2 --axis weight=o_proj --min-samples 3",
      "gemv_split", 2, [](const nlohmann::json& v) {
        const int split = v.at("split").get<int>();
        EXPECT_TRUE(split == 1 || split == 2 || split == 4 || split == 8) << split;
      });
}

// The grouped MoE's row tile at decode (2 tokens; one token takes the GEMV form unmeasured) and at 64 tokens (6 rows
// an expert, where the rule changes size): 4-row GEMVs, 16-row tiles of 32-128 weight rows a CTA, 64 or 128 rows.
TEST(GpuTuning, TheGroupedMoeMeasuresItsRowTileOnFirstUse) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  expect_tuned_on_first_use(
      "run --model deepseek-v2-lite --variant moe/grouped/cuda --axis tokens=2,64 --min-samples 3", "moe_tile_rows", 2,
      [](const nlohmann::json& v) {
        const int rows = v.at("tile_rows").get<int>();  // (4: the GEMV form; 16 with its width)
        EXPECT_TRUE(rows == 4 || rows == 16 || rows == 64 || rows == 128) << rows;
        if (rows == 16) EXPECT_TRUE(v.contains("tile_width")) << v.dump();
      });
}

// One token: every chosen expert has one row, and the grouped ops take the GEMV form without measuring (op.cu says
// why: the standalone timing does not see the step's overlap).
TEST(GpuTuning, OneTokenTakesTheGroupedGemvUnmeasured) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  TuningRun t;
  const Choices c =
      choices_of(t, nullptr, "run --model deepseek-v2-lite --variant moe/grouped/cuda --axis tokens=1 --min-samples 3",
                 "moe_tile_rows");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c.begin()->second.first, "default");
  EXPECT_EQ(c.begin()->second.second.at("tile_rows").get<int>(), 4);
}

// The MoE router in one kernel or two, at 1 and 8 tokens (the rule takes one kernel up to 4).
TEST(GpuTuning, TheMoeRouterMeasuresItsKernelsOnFirstUse) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  expect_tuned_on_first_use("run --model deepseek-v2-lite --variant moe/grouped/cuda --axis tokens=1,8 --min-samples 3",
                            "moe_router", 2,
                            [](const nlohmann::json& v) { EXPECT_TRUE(v.at("one_kernel").is_boolean()); });
}

// The sparse top-k's CTAs a request (one block or a cluster of 4-8) at 32K keys, the lightning indexer's scores.
// The fused decode's CTAs given keys (kv_splits auto): the rule (0), 32, 64 or the whole grid, measured once per
// rows, batch and cache length, with the key block settled first.
TEST(GpuTuning, TheFusedDecodeMeasuresItsSplitCountOnFirstUse) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  expect_tuned_on_first_use(
      "run --model deepseek-v2-lite --variant mla/fused/cuda --axis batch=4 --axis kv_len=1024 --min-samples 3",
      "mla_fused_kv_splits", 1, [](const nlohmann::json& v) {
        const int64_t splits = v.get<int64_t>();
        EXPECT_TRUE(splits == 0 || splits == 32 || splits == 64 || splits == gpu_info().sms) << splits;
      });
}

TEST(GpuTuning, TheSparseTopkMeasuresItsClusterOnFirstUse) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  expect_tuned_on_first_use(
      "run --model deepseek-v2-lite --variant sparse/dsa/cuda --axis kv_len=32768 --axis batch=2 --axis budget=2048 "
      "--axis local=256 --min-samples 3",
      "topk_ctas", 1, [](const nlohmann::json& v) {
        const int ctas = v.at("ctas").get<int>();
        EXPECT_TRUE(ctas == 1 || (ctas >= 4 && ctas <= 8)) << ctas;
      });
}

// The collective fit reads the two ends of NCCL's curve: points made from a known latency and bus bandwidth give them
// back; one GPU or one size cannot be fitted.
TEST(Collectives, FitTakesTheLatencyAndBusBandwidthFromTheEnds) {
  const double latency = 12e-6, bus = 250e9;
  for (const std::string& kind : collectives::kinds()) {
    std::vector<collectives::Point> points;
    for (double bytes : collectives::default_sizes())
      points.push_back({kind, bytes, latency + bytes * collectives::bus_factor(kind, 4) / bus});
    const collectives::Fit f = collectives::fit(points, 4);
    EXPECT_NEAR(f.latency_s, latency + 8192 * collectives::bus_factor(kind, 4) / bus, 1e-12) << kind;
    EXPECT_NEAR(f.bus_bytes_per_s, bus, 1e-3 * bus) << kind;
  }
  EXPECT_DOUBLE_EQ(collectives::bus_factor("all_reduce", 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(collectives::bus_factor("all_to_all", 4), 3.0 / 16);
  EXPECT_THROW(collectives::fit({{"all_reduce", 1e6, 1e-5}, {"all_reduce", 1e7, 1e-4}}, 1), std::invalid_argument);
  EXPECT_THROW(collectives::fit({{"all_reduce", 1e6, 1e-5}}, 2), std::invalid_argument);
}

// `dslab plan --gpus` prices the collectives at the machine file's calibration, says so, and names a bad field.
TEST(Collectives, PlanOverSeveralGpusUsesTheCalibratedLinks) {
  nlohmann::json machine = nlohmann::json::parse(std::ifstream("reports/nvidia-h200/calibration/machine.json"));
  machine["collectives"] = {{"gpus", 8},
                            {"nccl", "2.27.3"},
                            {"fit",
                             {{"all_reduce", {{"latency_s", 2e-5}, {"bus_bytes_per_s", 3e11}}},
                              {"all_gather", {{"latency_s", 1.5e-5}, {"bus_bytes_per_s", 3.2e11}}},
                              {"reduce_scatter", {{"latency_s", 1.5e-5}, {"bus_bytes_per_s", 3.1e11}}},
                              {"all_to_all", {{"latency_s", 3e-5}, {"bus_bytes_per_s", 1.5e11}}}}}};
  const auto dir = std::filesystem::temp_directory_path() / ("dslab_" + test::test_name());
  std::filesystem::create_directories(dir);
  const auto file = dir / "machine.json";
  std::ofstream(file) << machine.dump();
  const test::CliRun ok = test::run_cli(
      "plan --model deepseek-v3 --batch 64 --kv-len 4096 --gpus 8 --machine " + file.string(), dir / "out");
  EXPECT_EQ(ok.status, 0) << ok.err;
  std::stringstream md;
  md << std::ifstream(dir / "out" / "plan.md").rdbuf();
  EXPECT_NE(md.str().find("calibrated on 8 x NVIDIA H200, NCCL 2.27.3 (all_gather 320 GB/s + 15.0 us"),
            std::string::npos)
      << md.str();
  const auto plan = nlohmann::json::parse(std::ifstream(dir / "out" / "plan.json"));
  EXPECT_EQ(plan.at("gpus").at("links"), "calibrated on 8 x NVIDIA H200, NCCL 2.27.3");
  EXPECT_EQ(plan.at("gpus").at("placements").size(), 4u);  // TP or DP attention x TP or EP experts
  for (const auto& p : plan.at("gpus").at("placements")) {
    for (const auto& c : p.at("collectives_per_moe_layer")) EXPECT_GT(c.at("seconds").get<double>(), 0) << p.dump();
    ASSERT_TRUE(p.contains("collectives_per_dense_layer")) << p.dump();
    // the requests that fit: none where the weights alone overflow a GPU (V3 in bf16 over 8 H200s), else some
    ASSERT_TRUE(p.at("kv_capacity_requests").is_number_integer()) << p.dump();
    EXPECT_EQ(p.at("kv_capacity_requests").get<int64_t>() > 0, p.at("fits").get<bool>()) << p.dump();
  }
  machine["collectives"]["fit"]["all_to_all"].erase("latency_s");
  std::ofstream(file) << machine.dump();
  const test::CliRun bad = test::run_cli("plan --model deepseek-v3 --gpus 8 --machine " + file.string(), dir / "bad");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find(file.string() + ": collectives.fit.all_to_all.latency_s: missing"), std::string::npos)
      << bad.err;
  std::filesystem::remove_all(dir);
}

// NCCL opened at run time drives every collective on this machine's first GPU (a communicator of one: each result is
// still checked against the host's), where a GPU and NCCL are present.
TEST(GpuCollectives, OneGpuRunsAndChecksEveryCollective) {
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  std::string why;
  if (!nccl::api(&why)) GTEST_SKIP() << why;
  const nlohmann::json c = collectives::measure(1, {8192, 1 << 20});
  EXPECT_EQ(c.at("gpus"), 1);
  EXPECT_FALSE(c.contains("fit"));  // (one GPU: nothing crosses a link)
  ASSERT_EQ(c.at("points").size(), 8u);
  for (const auto& p : c.at("points")) EXPECT_GT(p.at("seconds").get<double>(), 0) << p.dump();
}

}  // namespace
}  // namespace dslab
