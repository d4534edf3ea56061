// Reports: the U test against scipy's values, verdicts, normalization, matching by variant and axes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness/errors.h"
#include "harness/variant.h"

#include "analysis/compare.h"
#include "analysis/results_file.h"
#include "analysis/stats.h"

namespace dslab::reports {
namespace {

TEST(MannWhitneyU, MatchesScipyExact) {
  // scipy.stats.mannwhitneyu([1,2,3,4,5], [6,7,8,9,10]) -> U 0, p 0.007936507936507936 (exact)
  auto r = stats::mann_whitney_u({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10});
  EXPECT_TRUE(r.exact);
  EXPECT_DOUBLE_EQ(r.u, 0);
  EXPECT_NEAR(r.p_value, 0.007936507936507936, 1e-12);
  // ([1.1,2.2,3.3,4.4], [2.5,3.5,6,7,8,9]) -> U 3, p 0.06666666666666667
  r = stats::mann_whitney_u({1.1, 2.2, 3.3, 4.4}, {2.5, 3.5, 6, 7, 8, 9});
  EXPECT_DOUBLE_EQ(r.u, 3);
  EXPECT_NEAR(r.p_value, 0.06666666666666667, 1e-12);
}

TEST(MannWhitneyU, MatchesScipyAsymptoticWithTies) {
  // x=[10,12,11,14,13,15,16,12.5,11.5,10.5], y=[14,15,13,17,18,16,19,14.5,16.5,17.5] -> U 10, p 0.0027859446415680706
  auto r = stats::mann_whitney_u({10, 12, 11, 14, 13, 15, 16, 12.5, 11.5, 10.5},
                                 {14, 15, 13, 17, 18, 16, 19, 14.5, 16.5, 17.5});
  EXPECT_FALSE(r.exact);
  EXPECT_DOUBLE_EQ(r.u, 10);
  EXPECT_NEAR(r.p_value, 0.0027859446415680706, 1e-12);
  // x=[1,2,2,3,3,3,4,5,6,7], y=[3,4,4,5,5,6,7,8,8,9] -> U 19.5, p 0.022208730897883666
  r = stats::mann_whitney_u({1, 2, 2, 3, 3, 3, 4, 5, 6, 7}, {3, 4, 4, 5, 5, 6, 7, 8, 8, 9});
  EXPECT_DOUBLE_EQ(r.u, 19.5);
  EXPECT_NEAR(r.p_value, 0.022208730897883666, 1e-12);
}

TEST(Verdict, ThresholdThenSignificance) {
  const CompareOptions o;                            // 5%, alpha 0.05
  EXPECT_EQ(decide(1.03, 0.001, o), Verdict::same);  // real but small
  EXPECT_EQ(decide(1.20, 0.001, o), Verdict::slower);
  EXPECT_EQ(decide(0.80, 0.001, o), Verdict::faster);
  EXPECT_EQ(decide(1.20, 0.30, o), Verdict::noisy);  // large but indistinguishable
  EXPECT_EQ(decide(0.99, 0.90, o), Verdict::same);
}

Entry entry(const std::string& variant, int kv_len, std::vector<double> samples) {
  Entry e;
  e.variant = variant;
  e.model = "tiny";
  e.axes = {{"batch", 1}, {"kv_len", kv_len}};
  e.name = variant + "/batch:1/kv_len:" + std::to_string(kv_len);
  e.samples_us = samples;
  e.median_us = stats::median(samples);
  return e;
}

std::vector<double> around(double center, int n = 12) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(center * (1 + 0.01 * ((i * 7) % 5 - 2)));
  return v;
}

TEST(Compare, MatchesByVariantAndAxesAndFlagsTheDoubledOne) {
  ResultsFile base{
      "base.json", {}, {entry("a", 64, around(100)), entry("b", 64, around(50)), entry("a", 128, around(200))}, {}};
  ResultsFile next{"new.json",
                   {},
                   {entry("a", 128, around(200)), entry("b", 64, around(100)), entry("a", 64, around(100)),
                    entry("c", 64, around(1))},
                   {}};
  const auto rep = compare(base, next, {});
  ASSERT_EQ(rep.rows.size(), 3u);
  for (const auto& r : rep.rows) {
    if (r.name.find("b/") == 0) {
      EXPECT_EQ(r.verdict, Verdict::slower) << r.name;
      EXPECT_NEAR(r.ratio, 2.0, 1e-9);
    } else {
      EXPECT_EQ(r.verdict, Verdict::same) << r.name;
    }
  }
  EXPECT_TRUE(rep.regression());
  ASSERT_EQ(rep.unmatched.size(), 1u);  // c exists only in the new file
  EXPECT_NEAR(rep.geomean_ratio, std::cbrt(2.0), 1e-9);
}

TEST(Compare, NormalizationCancelsAMachineThatGotSlower) {
  // Everything twice as slow in the new run (a busier machine): raw says SLOWER, normalized says SAME.
  ResultsFile base{"base.json", {}, {entry("ref", 64, around(10)), entry("a", 64, around(100))}, {}};
  ResultsFile next{"new.json", {}, {entry("ref", 64, around(20)), entry("a", 64, around(200))}, {}};
  EXPECT_TRUE(compare(base, next, {}).regression());
  CompareOptions o;
  o.normalize = "ref";
  const auto find = [](const CompareReport& r, const std::string& prefix) {
    for (const auto& row : r.rows)
      if (row.name.rfind(prefix, 0) == 0) return row;
    ADD_FAILURE() << "no row " << prefix;
    return Comparison{};
  };
  const auto rep = compare(base, next, o);
  ASSERT_EQ(rep.rows.size(), 2u);  // the reference on its own times, against the wide normalizer threshold
  EXPECT_EQ(find(rep, "a/").verdict, Verdict::same);
  EXPECT_NEAR(find(rep, "a/").base_median, 10.0, 1e-9);
  EXPECT_TRUE(find(rep, "ref/").normalizer);
  EXPECT_NE(find(rep, "ref/").verdict, Verdict::slower);  // twice as slow: at the default bound, not beyond it
  // A real regression relative to the reference survives normalization.
  next.entries[1] = entry("a", 64, around(400));
  EXPECT_EQ(find(compare(base, next, o), "a/").verdict, Verdict::slower);
  // The reference itself three times as slow (everything with it): flagged by the wide bound.
  ResultsFile slow_ref{"new.json", {}, {entry("ref", 64, around(30)), entry("a", 64, around(300))}, {}};
  const auto flagged = compare(base, slow_ref, o);
  EXPECT_EQ(find(flagged, "ref/").verdict, Verdict::slower);
  EXPECT_EQ(find(flagged, "a/").verdict, Verdict::same);
}

TEST(Compare, EachFamilyIsNormalizedByItsOwnReference) {
  // mla/ runs by mla/ref, moe/ runs by moe/ref: the MoE family slowed 1.5x against its reference, MLA did not.
  ResultsFile base{"base.json",
                   {},
                   {entry("mla/ref", 64, around(10)), entry("mla/x", 64, around(100)), entry("moe/ref", 64, around(40)),
                    entry("moe/y", 64, around(80))},
                   {}};
  ResultsFile next{"new.json",
                   {},
                   {entry("mla/ref", 64, around(12)), entry("mla/x", 64, around(120)), entry("moe/ref", 64, around(40)),
                    entry("moe/y", 64, around(120))},
                   {}};
  CompareOptions o;
  o.threshold = 0.3;
  o.normalize = "mla/ref,moe/ref";
  const auto rep = compare(base, next, o);
  ASSERT_EQ(rep.rows.size(), 4u);
  for (const auto& r : rep.rows)
    EXPECT_EQ(r.verdict, r.name.rfind("moe/y", 0) == 0 ? Verdict::slower : Verdict::same) << r.name;
  EXPECT_TRUE(rep.unmatched.empty());
}

// One run's entry per repetition: `pass_medians` are the repetitions' medians, each pass's samples tight around
// its own (what a machine that drifts between passes looks like from inside one pass).
Entry repeated(const std::string& variant, const std::vector<double>& pass_medians) {
  Entry e = entry(variant, 64, {});
  for (double m : pass_medians) {
    const auto s = around(m, 8);
    e.samples_us.insert(e.samples_us.end(), s.begin(), s.end());
    e.repetition_medians_us.push_back(stats::median(s));
  }
  e.median_us = stats::median(e.repetition_medians_us);
  return e;
}

TEST(Compare, RepetitionMediansSeeDriftThatOneRunsSamplesCannot) {
  // The machine drifts +-10% between passes; nothing changed. One pass each (per-sample test): a confident and
  // wrong SLOWER. Five passes each (test on the passes' medians): not SLOWER.
  const std::vector<double> base_passes = {100, 110, 92, 104, 97}, new_passes = {108, 95, 111, 101, 99};
  ResultsFile one_base{"base.json", {}, {repeated("a", {base_passes[0]})}, {}};
  ResultsFile one_new{"new.json", {}, {repeated("a", {new_passes[0]})}, {}};
  const auto single = compare(one_base, one_new, {});
  EXPECT_EQ(single.rows[0].verdict, Verdict::slower);
  EXPECT_EQ(single.single_runs, 1u);
  ResultsFile base{"base.json", {}, {repeated("a", base_passes)}, {}};
  ResultsFile next{"new.json", {}, {repeated("a", new_passes)}, {}};
  const auto rep = compare(base, next, {});
  ASSERT_EQ(rep.rows.size(), 1u);
  EXPECT_EQ(rep.rows[0].repetitions, 5u);
  EXPECT_EQ(rep.single_runs, 0u);
  EXPECT_NE(rep.rows[0].verdict, Verdict::slower);
  EXPECT_GT(rep.rows[0].p_value, 0.05);
  // A 1.5x slowdown under the same drift is caught.
  std::vector<double> slow;
  for (double m : new_passes) slow.push_back(1.5 * m);
  next.entries[0] = repeated("a", slow);
  const auto caught = compare(base, next, {});
  EXPECT_EQ(caught.rows[0].verdict, Verdict::slower);
  EXPECT_LT(caught.rows[0].p_value, 0.05);
}

TEST(ResultsFile, RepetitionsOfOneRunAreOneEntryInPassOrder) {
  const auto path = std::filesystem::temp_directory_path() / "dslab_repetitions.json";
  auto pass = [](int index, double us) {
    return nlohmann::json{{"name", "a/tiny/batch:1"},  {"variant", "a"},          {"model", "tiny"},
                          {"axes", {{"batch", 1}}},    {"run_type", "iteration"}, {"repetitions", 3},
                          {"repetition_index", index}, {"real_time", us},         {"time_unit", "us"},
                          {"sample_times", {us, us}}};
  };
  nlohmann::json j = {{"context", nlohmann::json::object()},
                      {"benchmarks",
                       {pass(2, 30),
                        pass(0, 10),
                        pass(1, 50),
                        {{"name", "a/tiny/batch:1_median"}, {"run_type", "aggregate"}, {"real_time", 30}}}}};
  std::ofstream(path) << j.dump();
  const ResultsFile f = load_results(path.string());
  ASSERT_EQ(f.entries.size(), 1u);
  EXPECT_EQ(f.entries[0].repetition_medians_us, (std::vector<double>{10, 50, 30}));
  EXPECT_DOUBLE_EQ(f.entries[0].median_us, 30);
  EXPECT_EQ(f.entries[0].samples_us.size(), 6u);
  j["benchmarks"][1]["repetition_index"] = 2;  // two passes claiming one index: the file is wrong
  std::ofstream(path) << j.dump();
  EXPECT_THROW(load_results(path.string()), BadInput);
  std::filesystem::remove(path);
}

// Two suites of one sweep that share a point (layer-decode's acceptance-v2-lite and proj-v2-lite both run batch 1
// with the own projections) each measure it: two entries, one per suite, not a file in error.
TEST(ResultsFile, TwoSuitesSharingAPointAreTwoEntries) {
  const auto path = std::filesystem::temp_directory_path() / "dslab_two_suites.json";
  auto run = [](const std::string& suite, double us) {
    return nlohmann::json{{"name", "a/tiny/batch:1"}, {"variant", "a"},    {"model", "tiny"},
                          {"axes", {{"batch", 1}}},   {"suite", suite},    {"run_type", "iteration"},
                          {"real_time", us},          {"time_unit", "us"}, {"sample_times", {us, us}}};
  };
  nlohmann::json j = {{"context", nlohmann::json::object()}, {"benchmarks", {run("first", 10), run("second", 12)}}};
  std::ofstream(path) << j.dump();
  const ResultsFile f = load_results(path.string());
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_EQ(f.entries[0].suite, "first");
  EXPECT_DOUBLE_EQ(f.entries[1].median_us, 12);
  j["benchmarks"][1]["suite"] = "first";  // the same suite twice, no repetition index: the file is wrong
  std::ofstream(path) << j.dump();
  EXPECT_THROW(load_results(path.string()), BadInput);
  std::filesystem::remove(path);
}

// Committed device results are kept xz-compressed: read back as the same entries; a damaged file is bad input.
TEST(ResultsFile, ReadsXzCompressedResults) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto plain = dir / "dslab_xz_results.json", packed = dir / "dslab_xz_results.json.xz";
  const nlohmann::json j = {{"context", {{"gpu", "test"}}},
                            {"benchmarks",
                             {{{"name", "a/tiny/batch:1"},
                               {"variant", "a"},
                               {"real_time", 12.5},
                               {"time_unit", "us"},
                               {"sample_times", {12.0, 12.5, 13.0}}}}}};
  std::ofstream(plain) << j.dump();
  std::filesystem::remove(packed);
  ASSERT_EQ(std::system(("xz -k " + plain.string()).c_str()), 0) << "xz (xz-utils) is needed by this test";
  const ResultsFile a = load_results(plain.string()), b = load_results(packed.string());
  ASSERT_EQ(b.entries.size(), 1u);
  EXPECT_EQ(b.entries[0].samples_us, a.entries[0].samples_us);
  EXPECT_EQ(b.context, a.context);
  std::ofstream(packed, std::ios::trunc) << "not xz at all";
  try {
    load_results(packed.string());
    ADD_FAILURE() << "a damaged .xz must be refused";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("not a valid xz file"), std::string::npos) << e.what();
  }
  std::filesystem::remove(plain);
  std::filesystem::remove(packed);
}

TEST(Compare, NormalizesEachRepetitionByItsOwnReference) {
  // The reference and the variant drift together pass by pass: normalized pass by pass, the ratio is exactly 1.
  ResultsFile base{
      "base.json", {}, {repeated("ref", {10, 12, 9, 11, 10}), repeated("a", {100, 120, 90, 110, 100})}, {}};
  ResultsFile next{"new.json", {}, {repeated("ref", {13, 9, 10, 12, 11}), repeated("a", {130, 90, 100, 120, 110})}, {}};
  CompareOptions o;
  o.normalize = "ref";
  const auto rep = compare(base, next, o);
  ASSERT_EQ(rep.rows.size(), 2u);  // a/ and the reference's own times
  for (const auto& r : rep.rows) {
    EXPECT_EQ(r.verdict, Verdict::same) << r.name;
    if (!r.normalizer) EXPECT_NEAR(r.ratio, 1.0, 1e-9);
  }
}

TEST(Compare, ThreeRepetitionsASideStillCatchAOneAndAHalfTimesSlowdown) {
  // Three passes a side, as CI's smoke runs: the U test over 3 against 3 medians cannot go below p = 0.1, so the
  // test runs on the passes' samples pooled - a 1.5x slowdown is SLOWER, an unchanged run is not.
  const std::vector<double> base_passes = {100, 104, 97}, same_passes = {101, 98, 103};
  ResultsFile base{"base.json", {}, {repeated("a", base_passes)}, {}};
  ResultsFile same{"same.json", {}, {repeated("a", same_passes)}, {}};
  const auto unchanged = compare(base, same, {});
  EXPECT_TRUE(unchanged.rows[0].pooled);
  EXPECT_EQ(unchanged.pooled, 1u);
  EXPECT_NE(unchanged.rows[0].verdict, Verdict::slower);
  std::vector<double> slow;
  for (double m : same_passes) slow.push_back(1.5 * m);
  ResultsFile slower{"slow.json", {}, {repeated("a", slow)}, {}};
  const auto caught = compare(base, slower, {});
  EXPECT_EQ(caught.rows[0].verdict, Verdict::slower);
  EXPECT_NEAR(caught.rows[0].ratio, 1.5, 0.05);
}

}  // namespace
}  // namespace dslab::reports

#include "planner/offload.h"

namespace dslab::reports {
namespace {

Entry op_entry(const std::string& variant, const std::string& device, int tokens, double us, double flops,
               double bytes) {
  Entry e;
  e.variant = variant;
  e.device = device;
  e.model = "m";
  e.axes = {{"tokens", tokens}};
  e.name = variant + "/tokens:" + std::to_string(tokens);
  e.samples_us = {us};
  e.median_us = us;
  e.raw = {{"flops", flops}, {"bytes", bytes}};
  return e;
}

TEST(Offload, MemoryBoundExpertsStayOnTheCpuComputeBoundOnesCrossPcie) {
  ResultsFile f;
  f.path = "r.json";
  f.context["machine"] = {{"cpu_model", "cpu"},
                          {"cpu", {{"amx_bf16_flops", 10e12}, {"dram_read_bytes_per_s", 100e9}}},
                          {"gpu", {{"name", "gpu"}, {"tensor_bf16_flops", 800e12}, {"hbm_bytes_per_s", 4e12}}}};
  f.entries = {op_entry("moe/amx/cpu", "cpu", 1, 1e3, 1e8, 1e8),      // 1 ms; GPU: 100 MB over PCIe = 4 ms
               op_entry("moe/amx/cpu", "cpu", 4096, 1e6, 1e13, 1e9),  // 1 s; GPU: 40 ms PCIe + 12.5 ms
               op_entry("mla/a_cc_me/cpu", "cpu", 1, 1e4, 1e9, 3e8),  // GPU-resident: 75 us on the GPU roofline
               op_entry("mla/cd/cpu", "cpu", 1, 3e4, 5e8, 2e9)};
  const OffloadPlan plan = plan_offload({f}, {});
  ASSERT_EQ(plan.ops.size(), 3u);
  EXPECT_DOUBLE_EQ(plan.cpu_ridge, 100);
  EXPECT_DOUBLE_EQ(plan.gpu_ridge, 200);
  EXPECT_EQ(plan.ops[0].device, "cpu");
  EXPECT_NEAR(plan.ops[0].gpu_s, 1e8 / 25e9 + 1e8 / 4e12, 1e-12);
  EXPECT_EQ(plan.ops[1].device, "gpu");
  EXPECT_NEAR(plan.ops[1].gpu_s, 1e9 / 25e9 + 1e13 / 800e12, 1e-9);
  EXPECT_EQ(plan.ops[2].device, "gpu");
  EXPECT_EQ(plan.ops[2].cpu_source, "measured: mla/a_cc_me/cpu");  // the faster of the two measured ways
  EXPECT_NEAR(plan.ops[2].gpu_s, 3e8 / 4e12, 1e-12);               // the way the GPU roofline favours
  // A measured GPU run replaces the estimate.
  f.entries.push_back(op_entry("mla/fused/cuda", "cuda", 1, 20e3, 1e9, 3e8));
  const OffloadPlan measured = plan_offload({f}, {});
  EXPECT_EQ(measured.ops[2].gpu_source, "measured: mla/fused/cuda");
  EXPECT_EQ(measured.ops[2].device, "cpu");  // 10 ms on the CPU beats a measured 20 ms
}

TEST(Offload, GpuFormsAtTheirDefaultsJoinTheCpuOp) {
  // mla/fused/cuda records page_size, len_dist and kv_dtype (axes the CPU forms do not have) and heads; at
  // their defaults and the model's head count the point is the CPU op's point, measured on another device.
  if (!find_variant("mla/fused/cuda")) GTEST_SKIP() << "built without CUDA: the GPU form's axes are unknown";
  ResultsFile f;
  f.path = "r.json";
  f.context["machine"] = {{"cpu_model", "cpu"},
                          {"cpu", {{"amx_bf16_flops", 10e12}, {"dram_read_bytes_per_s", 100e9}}},
                          {"gpu", {{"name", "gpu"}, {"tensor_bf16_flops", 800e12}, {"hbm_bytes_per_s", 4e12}}}};
  Entry cpu = op_entry("mla/a_cc_me/cpu", "cpu", 1, 5e3, 1e9, 3e8);
  cpu.model = "deepseek-v2";
  cpu.axes = {{"batch", 1}, {"q_len", 1}, {"kv_len", 4096}};
  Entry gpu = op_entry("mla/fused/cuda", "cuda", 1, 150, 1e9, 3e8);
  gpu.model = "deepseek-v2";  // 128 heads
  gpu.axes = {{"batch", 1},        {"q_len", 1},      {"kv_len", 4096},
              {"heads", 128},      {"page_size", 64}, {"len_dist", "uniform"},
              {"kv_dtype", "bf16"}};
  Entry other = gpu;  // a non-default page size or head count is another op
  other.axes["page_size"] = 16;
  Entry fewer_heads = gpu;
  fewer_heads.axes["heads"] = 16;
  f.entries = {cpu, gpu, other, fewer_heads};
  const OffloadPlan plan = plan_offload({f}, {});
  ASSERT_EQ(plan.ops.size(), 3u);
  EXPECT_EQ(plan.ops[0].cpu_source, "measured: mla/a_cc_me/cpu");
  EXPECT_EQ(plan.ops[0].gpu_source, "measured: mla/fused/cuda");
  EXPECT_EQ(plan.ops[0].op, "mla deepseek-v2 batch=1 kv_len=4096 q_len=1");
  EXPECT_EQ(plan.ops[1].axes.value("page_size", 0), 16);
  EXPECT_EQ(plan.ops[2].axes.value("heads", 0), 16);
}

}  // namespace
}  // namespace dslab::reports
