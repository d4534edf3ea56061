// The generation engine (layer/deepseek/cuda's, behind `dslab generate`): its logits and greedy tokens against Hugging
// Face transformers' on the golden checkpoints (a mixed-length prompt batch prefilled, then 8 decode steps of the
// whole batch), and `dslab generate`'s own check that batched tokens equal one-at-a-time tokens, graph and eager.
// `dslab generate`'s bad input is checked on every machine.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/engine.h"
#include "harness/host.h"
#include "test_util.h"

namespace dslab {
namespace {

namespace fs = std::filesystem;
const std::string kData = std::string(DSLAB_SOURCE_DIR) + "/tests/data/checkpoints/";

Point engine_point(const Engine& e, const std::map<std::string, std::string>& over) {
  Point p;
  for (const auto& [name, value] : e.axes()) p.set(name, {over.count(name) ? over.at(name) : value, 0, false});
  return p;
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

// bf16 weights, activations and cache against transformers' float32 on the same weights (the bar).
constexpr double kLogitsTolerance = 2e-2;

void engine_matches_transformers(const std::string& kind, const std::string& executor) {
  auto engine = EngineRegistry::instance().make("layer/deepseek/cuda");
  if (!engine) GTEST_SKIP() << "the engine is not built (no CUDA toolkit at configure time)";
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  std::ifstream f(kData + kind + "/golden.json");
  const auto golden = nlohmann::json::parse(f);
  const auto prompts = golden.at("prompts").get<std::vector<std::vector<int32_t>>>();
  const auto tokens = golden.at("tokens").get<std::vector<std::vector<int32_t>>>();
  const auto logits = golden.at("logits").get<std::vector<std::vector<std::vector<double>>>>();
  ModelFile model = load_model_file(kData + kind + "/config.json");
  model.weights = kData + kind;
  EngineLimits limits;
  limits.max_running = int64_t(prompts.size());
  limits.chunk_tokens = 8;  // (prompts longer than a chunk run in several)
  limits.page_size = 16;
  for (size_t r = 0; r < prompts.size(); ++r)
    limits.max_context = std::max(limits.max_context, int64_t(prompts[r].size() + tokens[r].size()) + 1);
  const int64_t per_request = (limits.max_context + limits.page_size - 1) / limits.page_size;
  limits.pages = per_request * limits.max_running;
  const Point p = engine_point(*engine, {{"attn", "mla/a_cc_me/cuda"},
                                         {"prefill_attn", "mla/cc/cuda"},
                                         {"moe", "moe/grouped/cuda"},
                                         {"executor", executor}});
  const Support s = engine->supports(model, p, limits);
  ASSERT_TRUE(s.ok) << s.reason;
  engine->prepare(model, p, limits, 1);
  // Each request's pages, in reverse order of the pool (a page table is not contiguous).
  std::vector<std::vector<int32_t>> pages(prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r)
    for (int64_t i = 0; i < per_request; ++i) pages[r].push_back(int32_t(limits.pages - 1 - int64_t(r) * per_request - i));
  // The prompts, all in one step; then the decodes, transformers' tokens fed (one disagreement does not cascade).
  std::vector<EnginePiece> pieces(prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r) {
    pieces[r].request = int64_t(r);
    pieces[r].tokens = prompts[r];
    pieces[r].pages = &pages[r];
    pieces[r].wants_token = true;
  }
  double worst = 0;
  const size_t steps = tokens[0].size();
  for (size_t step = 0; step <= steps; ++step) {
    std::vector<std::vector<float>> out;
    const std::vector<int32_t> next = engine->step(pieces, &out);
    ASSERT_EQ(out.size(), prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      if (step >= logits[r].size()) continue;
      const double err = rel_l2(out[r], logits[r][step]);
      worst = std::max(worst, err);
      EXPECT_LE(err, kLogitsTolerance) << kind << " " << executor << " request " << r << " step " << step;
      if (step < tokens[r].size()) EXPECT_EQ(next[r], tokens[r][step]) << kind << " request " << r << " step " << step;
    }
    if (step == steps) break;
    for (size_t r = 0; r < prompts.size(); ++r) {
      pieces[r].position = int64_t(prompts[r].size() + step);
      pieces[r].tokens = {tokens[r][step]};
      pieces[r].decode = true;
    }
  }
  std::printf("%s %s: %zu requests, prefill + %zu decode steps, worst logits relative L2 %.2e (tolerance %.0e)\n",
              kind.c_str(), executor.c_str(), prompts.size(), steps, worst, kLogitsTolerance);
}

TEST(GpuEngine, DeepseekV2MatchesTransformersGraphed) { engine_matches_transformers("v2", "graph"); }
TEST(GpuEngine, DeepseekV2MatchesTransformersEager) { engine_matches_transformers("v2", "eager"); }
TEST(GpuEngine, DeepseekV3Fp8MatchesTransformersGraphed) { engine_matches_transformers("v3", "graph"); }

// Through the command line, as a user runs it: a mixed request set at concurrency 4 (slots reused, pages freed and
// reused, prompts in chunks beside decodes), graph and eager, every request's tokens checked against its tokens run
// alone by the command itself (exit 0 only if all are identical).
TEST(GpuEngine, GenerateBatchedTokensEqualOneAtATime) {
  if (!EngineRegistry::instance().make("layer/deepseek/cuda")) GTEST_SKIP() << "not built";
  if (!gpu_info().present) GTEST_SKIP() << gpu_info().why_absent;
  const fs::path out = fs::temp_directory_path() / ("dslab_generate_" + test::test_name());
  fs::remove_all(out);
  const test::CliRun r = test::run_cli(
      "generate --model tiny --requests 10 --input uniform:3,40 --output uniform:1,12 --concurrency 4 --chunk 24 "
      "--page-size 16 --axis attn=mla/a_cc_me/cuda --axis prefill_attn=mla/cc/cuda --axis moe=moe/grouped/cuda "
      "--axis executor=graph,eager",
      out);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto results = nlohmann::json::parse(std::ifstream(out / "results.json"));
  ASSERT_EQ(results.at("benchmarks").size(), 2u);
  for (const auto& e : results.at("benchmarks")) {
    EXPECT_TRUE(e.at("verification").at("pass").get<bool>()) << e.at("verification").dump();
    EXPECT_EQ(e.at("generation").at("requests").get<int64_t>(), 10);
    EXPECT_GT(e.at("generation").at("output_tokens_per_s").get<double>(), 0);
  }
  EXPECT_TRUE(fs::exists(out / "report.md"));
}

TEST(Generate, BadInputIsOneLineAndExitTwo) {
  if (!EngineRegistry::instance().make("layer/deepseek/cuda")) GTEST_SKIP() << "not built";
  test::expect_bad_input("generate --model tiny --input uniform:5", "--input 'uniform:5'");
  test::expect_bad_input("generate --model tiny --output lognormal:1,-1", "output_len");
  test::expect_bad_input("generate --model tiny --concurrency 0", "--concurrency");
  test::expect_bad_input("generate --model tiny --axis colour=red", "--axis 'colour=red'");
  test::expect_bad_input("generate --model tiny --axis executor=fast", "axis 'executor'");
  test::expect_bad_input("generate --model tiny --engine layer/none", "--engine 'layer/none'");
  test::expect_bad_input("generate --model tiny --trace /nonexistent/trace.jsonl", "/nonexistent/trace.jsonl");
  test::expect_bad_input("generate --model tiny --trace x.jsonl --requests 3", "--trace and --requests");
  test::expect_bad_input("generate", "--model");
  const fs::path trace = fs::temp_directory_path() / ("dslab_trace_" + test::test_name() + ".jsonl");
  std::ofstream(trace) << "{\"prompt\": [1, 2, 3], \"output_len\": 4}\n{\"prompt\": [1, 5000], \"output_len\": 2}\n";
  test::expect_bad_input("generate --model tiny --trace " + trace.string(), "token id 5000");
  std::ofstream(trace) << "{\"prompt\": [1, 2, 3], \"input_len\": 4, \"output_len\": 4}\n";
  test::expect_bad_input("generate --model tiny --trace " + trace.string(), "field 'input_len'");
}

}  // namespace
}  // namespace dslab
