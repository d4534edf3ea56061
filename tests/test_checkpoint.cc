// Hugging Face checkpoints: dslab's reference DeepSeek, its weights read from a checkpoint written by transformers'
// own DeepseekV2 / DeepseekV3 classes (scripts/make_checkpoint.py; V3 in DeepSeek's fp8 form, dequantised on load),
// against transformers' logits and greedy tokens on the same weights and token ids (tests/data/checkpoints/*/
// golden.json): every request of a mixed-length prompt batch, its prompt and 8 greedy decode steps. And bad
// checkpoints: one BadInput naming the file and the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

#include "harness/errors.h"
#include "variants/common/checkpoint.h"
#include "tests/test_util.h"
#include "variants/reference/model.h"

namespace dslab {
namespace {

namespace fs = std::filesystem;

const std::string kData = std::string(DSLAB_SOURCE_DIR) + "/tests/data/checkpoints/";

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / den);
}

// The tolerance: dslab's reference in exact arithmetic (fp64 over the checkpoint's bf16 weights, nothing rounded)
// against transformers in float32 on the same weights: float32's accumulation error, far below bf16's 2e-2.
constexpr double kLogitsTolerance = 1e-4;

void matches_transformers(const std::string& kind) {
  const Checkpoint ck(kData + kind);
  const ref::ModelParams params = ref::load_model_params(ck);
  std::ifstream f(kData + kind + "/golden.json");
  const auto golden = nlohmann::json::parse(f);
  const auto prompts = golden.at("prompts").get<std::vector<std::vector<int32_t>>>();
  const auto tokens = golden.at("tokens").get<std::vector<std::vector<int32_t>>>();
  const auto logits = golden.at("logits").get<std::vector<std::vector<std::vector<double>>>>();
  ASSERT_EQ(prompts.size(), 4u);
  double worst = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    ref::Request request(ck.config(), params, ref::Request::Arithmetic::exact);
    std::vector<double> out = request.forward(prompts[r]);
    for (size_t s = 0; s < logits[r].size(); ++s) {
      const double err = rel_l2(out, logits[r][s]);
      worst = std::max(worst, err);
      EXPECT_LE(err, kLogitsTolerance) << kind << " request " << r << " row " << s;
      if (s == tokens[r].size()) break;
      const int32_t ours = int32_t(std::max_element(out.begin(), out.end()) - out.begin());
      EXPECT_EQ(ours, tokens[r][s]) << kind << " request " << r << " step " << s;
      out = request.forward({tokens[r][s]});  // (transformers' token: one disagreement does not cascade)
    }
  }
  std::printf("%s: %zu requests x %zu rows, worst logits relative L2 %.2e (tolerance %.0e); weights read %.1f MB\n",
              kind.c_str(), prompts.size(), logits[0].size(), worst, kLogitsTolerance, ck.bytes_read() / 1e6);
}

TEST(Checkpoint, DeepseekV2MatchesTransformersLogitsAndGreedyTokens) { matches_transformers("v2"); }

TEST(Checkpoint, DeepseekV3Fp8MatchesTransformersLogitsAndGreedyTokens) {
  const Checkpoint ck(kData + "v3");
  EXPECT_TRUE(ck.quantised_fp8());
  EXPECT_EQ(ck.dtype_of("model.layers.1.mlp.experts.0.down_proj.weight"), "F8_E4M3");
  matches_transformers("v3");
}

// A copy of the V2 checkpoint with one thing broken by `damage`; the BadInput's text.
std::string load_error(const std::function<void(const fs::path&)>& damage) {
  const fs::path dir = fs::temp_directory_path() / ("dslab_bad_checkpoint_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(kData + "v2", dir);
  damage(dir);
  std::string what;
  try {
    const Checkpoint ck(dir.string());
    ref::load_model_params(ck);
  } catch (const BadInput& e) {
    what = e.what();
  }
  fs::remove_all(dir);
  return what;
}

void rewrite_json(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  edit(j);
  std::ofstream(path) << j.dump();
}

TEST(Checkpoint, BadCheckpointsSayWhichFileAndTensor) {
  // A tensor the model needs, gone from the index and its shard's header alike (the index names it nowhere).
  std::string e = load_error([](const fs::path& d) {
    rewrite_json(d / "model.safetensors.index.json",
                 [](nlohmann::json& j) { j["weight_map"].erase("model.layers.1.self_attn.kv_b_proj.weight"); });
  });
  EXPECT_NE(e.find("model.layers.1.self_attn.kv_b_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("not in the checkpoint"), std::string::npos) << e;
  // The config says another shape than the tensor has.
  e = load_error(
      [](const fs::path& d) { rewrite_json(d / "config.json", [](nlohmann::json& j) { j["kv_lora_rank"] = 48; }); });
  EXPECT_NE(e.find("kv_a_proj_with_mqa.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [64, 128]"), std::string::npos) << e;
  // A truncated shard.
  e = load_error([](const fs::path& d) { fs::resize_file(d / "model-00002-of-00002.safetensors", 100000); });
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // A malformed index, a malformed config, a config dslab cannot run.
  e = load_error([](const fs::path& d) { std::ofstream(d / "model.safetensors.index.json") << "{\"weight_map\": ["; });
  EXPECT_NE(e.find("model.safetensors.index.json: malformed JSON"), std::string::npos) << e;
  e = load_error([](const fs::path& d) { std::ofstream(d / "config.json") << "not json"; });
  EXPECT_NE(e.find("config.json: malformed JSON"), std::string::npos) << e;
  e = load_error([](const fs::path& d) {
    rewrite_json(d / "config.json", [](nlohmann::json& j) { j["quantization_config"] = {{"quant_method", "gptq"}}; });
  });
  EXPECT_NE(e.find("quantization_config"), std::string::npos) << e;
  // A tensor of a dtype dslab does not read (its header says I8).
  e = load_error([](const fs::path& d) {
    const fs::path shard = d / "model-00001-of-00002.safetensors";
    std::ifstream in(shard, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t at = bytes.find("\"BF16\"");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 6, "\"I16\" ");  // (same length: the header's size and the offsets stay right)
    std::ofstream(shard, std::ios::binary) << bytes;
  });
  EXPECT_NE(e.find("dtype I16"), std::string::npos) << e;
  // Not a checkpoint folder at all.
  e = load_error([](const fs::path& d) { fs::remove(d / "model.safetensors.index.json"); });
  EXPECT_NE(e.find("no model.safetensors.index.json or model.safetensors"), std::string::npos) << e;
}

}  // namespace
}  // namespace dslab

namespace dslab {
namespace {

// dslab run --weights: the CPU MLA forms on a checkpoint's first layer and a CPU MoE engine on its first MoE layer
// (router, bias and experts: fp8 dequantised), verified; a variant that does not read weights skipped with its reason;
// a bad checkpoint one line, exit 2, no results.
TEST(CheckpointCli, WeightsRunTheCpuFormsAndExpertsOnTheCheckpoints) {
  const fs::path out = fs::temp_directory_path() / ("dslab_weights_out_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const fs::path sweep = out.string() + ".json";
  std::ofstream(sweep) << R"({"name": "weights", "model": "tiny", "suites": [
      {"name": "mla", "variants": ["mla/a_cc_me/cpu", "mla/cd/cpu"], "axes": {"batch": [2], "kv_len": [40]}},
      {"name": "moe", "variants": ["moe/onednn/cpu"], "axes": {"tokens": [4], "routing": ["model"]}},
      {"name": "sparse", "variants": ["sparse/oracle/cpu"], "axes": {"kv_len": [1024], "budget": [256]}}]})";
  const test::CliRun r = test::run_cli(
      "run " + sweep.string() + " --weights " + kData + "v3 --min-samples 2 --min-time 0 --timeout 0.2", out);
  fs::remove(sweep);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(std::ifstream(out / "results.json"));
  EXPECT_EQ(j.at("context").at("weights"), kData + "v3");
  int verified = 0;
  for (const auto& b : j.at("benchmarks")) {
    EXPECT_EQ(b.at("model"), "v3");
    verified += b.value("verify_pass", false);
  }
  EXPECT_EQ(verified, 3);  // the two MLA forms on the first layer's attention, the MoE on the first MoE layer's experts
  EXPECT_NE(r.err.find("reads no checkpoint (--weights) yet"), std::string::npos) << r.err;  // sparse/oracle/cpu
  fs::remove_all(out);
}

TEST(CheckpointCli, BadCheckpointIsOneLineAndExitTwo) {
  const fs::path dir = fs::temp_directory_path() / ("dslab_weights_bad_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(kData + "v2", dir);
  fs::resize_file(dir / "model-00002-of-00002.safetensors", 5000);
  test::expect_bad_input("run --weights " + dir.string() + " --variant mla/a_cc_me/cpu --axis kv_len=8",
                         "model-00002-of-00002.safetensors");
  test::expect_bad_input("run --weights " + dir.string() + " --model tiny --variant mla/a_cc_me/cpu",
                         "--model and --weights");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dslab
