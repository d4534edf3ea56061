// The peer runner (variants/peers): a peer in its own process, through the command line as a user runs it - its
// results in dslab's schema beside dslab's variants, its output verified against the reference (a wrong output fails),
// a missing library a skip with the reason, a peer that dies an error naming it. Runs on every machine: the NumPy peer
// needs only the set-up's .venv; the others are made to fail on purpose by stand-in scripts (DSLAB_ROOT).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace dslab {
namespace {

namespace fs = std::filesystem;

fs::path out_dir() { return fs::temp_directory_path() / ("dslab_peers_" + test::test_name()); }

nlohmann::json run_ok(const std::string& args) {
  fs::remove_all(out_dir());
  const test::CliRun r = test::run_cli(args, out_dir());
  EXPECT_EQ(r.status, 0) << r.err;
  return nlohmann::json::parse(std::ifstream(out_dir() / "results.json"));
}

// A stand-in tree whose scripts/peers/mla.py is `body` (DSLAB_ROOT points the runner at it).
struct StandIn {
  fs::path root = fs::temp_directory_path() / ("dslab_peer_root_" + test::test_name());
  explicit StandIn(const std::string& body) {
    fs::create_directories(root / "scripts" / "peers");
    std::ofstream(root / "scripts" / "peers" / "mla.py") << body;
    setenv("DSLAB_ROOT", root.c_str(), 1);
  }
  ~StandIn() {
    unsetenv("DSLAB_ROOT");
    fs::remove_all(root);
  }
};

TEST(Peers, NumpyPeerRunsBesideTheVariantsAndIsVerified) {
  const auto j = run_ok(
      "run --model deepseek-v2-lite --variant peer/numpy_a_cc_me/cpu --variant mla/a_cc_me/cpu --axis batch=2 "
      "--axis kv_len=256 --min-samples 3 --max-noise 1");
  int peers = 0;
  for (const auto& e : j.at("benchmarks")) {
    if (e.at("variant") != "peer/numpy_a_cc_me/cpu") continue;
    ++peers;
    EXPECT_GT(e.at("real_time").get<double>(), 0);
    EXPECT_EQ(e.at("axes").at("kv_len"), 256);
    EXPECT_LT(e.at("verify_rel_err").get<double>(), 1e-4);  // (float32 against fp64)
    EXPECT_TRUE(e.at("verify_pass").get<bool>());
  }
  EXPECT_EQ(peers, 1);
  // `dslab report` places it beside dslab's variant.
  const test::CliRun report = test::run_cli("report " + (out_dir() / "results.json").string(), out_dir() / "report");
  ASSERT_EQ(report.status, 0) << report.err;
  std::ifstream md(out_dir() / "report" / "report.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("peer/numpy_a_cc_me/cpu"), std::string::npos);
  EXPECT_NE(text.find("mla/a_cc_me/cpu"), std::string::npos);
}

TEST(Peers, AWrongOutputFailsVerification) {
  // A peer that answers every request and outputs zeros: the run goes through, its verification fails (exit 1).
  StandIn peer(R"(import json, sys
import numpy as np
for line in sys.stdin:
    m = json.loads(line)
    if m['op'] == 'quit': break
    if m['op'] == 'output':
        np.zeros(2 * 1 * 2048, np.float32).tofile(m['path'])
    sys.stdout.write(json.dumps({'ok': True, 'seconds': 1e-3}) + '\n'); sys.stdout.flush()
)");
  fs::remove_all(out_dir());
  const test::CliRun r = test::run_cli(
      "run --model deepseek-v2-lite --variant peer/numpy_a_cc_me/cpu --axis batch=2 --axis kv_len=256 "
      "--min-samples 3",
      out_dir());
  EXPECT_EQ(r.status, 1) << r.err;
  const auto j = nlohmann::json::parse(std::ifstream(out_dir() / "results.json"));
  EXPECT_FALSE(j.at("benchmarks")[0].at("verify_pass").get<bool>());
}

TEST(Peers, AMissingLibraryIsASkipWithTheReason) {
  // PyTorch made unimportable for the peer: its variants are skipped, saying what is missing.
  const fs::path shadow = fs::temp_directory_path() / ("dslab_no_torch_" + test::test_name());
  fs::create_directories(shadow);
  std::ofstream(shadow / "torch.py") << "raise ImportError('torch is hidden by the test')\n";
  setenv("PYTHONPATH", shadow.c_str(), 1);
  fs::remove_all(out_dir());
  const test::CliRun r = test::run_cli(
      "run --model deepseek-v2-lite --variant peer/pytorch_a_cc_me/cpu --axis batch=1 --axis kv_len=256", out_dir());
  unsetenv("PYTHONPATH");
  fs::remove_all(shadow);
  EXPECT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(std::ifstream(out_dir() / "results.json"));
  const auto& e = j.at("skipped").at(0);
  EXPECT_EQ(e.at("variant"), "peer/pytorch_a_cc_me/cpu");
  EXPECT_NE(e.at("reason").get<std::string>().find("needs torch"), std::string::npos) << e.dump();
}

TEST(Peers, APeerThatDiesIsAnErrorNamingIt) {
  StandIn peer("import sys\nsys.stdin.readline()\nprint('{\"ok\": true}', flush=True)\nsys.exit(3)\n");
  fs::remove_all(out_dir());
  const test::CliRun r = test::run_cli(
      "run --model deepseek-v2-lite --variant peer/numpy_a_cc_me/cpu --axis batch=1 --axis kv_len=256", out_dir());
  const auto j = nlohmann::json::parse(std::ifstream(out_dir() / "results.json"));
  const auto& e = j.at("skipped").at(0);
  EXPECT_NE(e.at("reason").get<std::string>().find("peer"), std::string::npos) << e.dump();
}

bool cpu_has_flag(const std::string& flag) {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

TEST(Peers, KTransformersMoeRunsBesideTheEnginesAndIsVerified) {
  // kt-kernel's BF16 class for CPUs without AMX runs on any x86-64 with AVX2 (the set-up fetches the library); its
  // AMX classes run where the CPU has AMX and otherwise skip saying so. The tiny model with 64-wide experts: the AMX
  // classes take sizes in multiples of their tiles' K step (32 bf16, 64 int8 values).
  nlohmann::json model =
      nlohmann::json::parse(std::ifstream(fs::path(DSLAB_SOURCE_DIR) / "workloads/models/tiny.json"));
  model["moe_intermediate_size"] = 64;
  const fs::path model_path = fs::temp_directory_path() / "dslab_peers_tiny_kt.json";
  std::ofstream(model_path) << model.dump();
  const auto j = run_ok("run --model " + model_path.string() +
                        " --variant peer/ktransformers_avx2_bf16/cpu --variant peer/ktransformers_amx_bf16/cpu "
                        "--variant peer/ktransformers_amx_int8/cpu --axis tokens=1,8 --min-samples 3 --min-time 0.01 "
                        "--max-noise 1");
  int runs = 0;
  for (const auto& e : j.at("benchmarks")) {
    ++runs;
    EXPECT_GT(e.at("real_time").get<double>(), 0);
    EXPECT_TRUE(e.at("verify_pass").get<bool>()) << e.dump();
    EXPECT_LT(e.at("verify_rel_err").get<double>(),
              e.at("name").get<std::string>().find("int8") != std::string::npos ? 5e-2 : 1e-2);
    EXPECT_GE(e.at("counters").at("threads").get<double>(), 1);
  }
  for (const auto& e : j.at("skipped")) {
    const std::string why = e.at("reason");
    if (why.find("kt-kernel") != std::string::npos && why.find("not there") != std::string::npos)
      GTEST_SKIP() << "kt-kernel is not fetched on this machine: " << why;
    EXPECT_NE(e.at("variant"), "peer/ktransformers_avx2_bf16/cpu") << e.dump();
    EXPECT_FALSE(cpu_has_flag("amx_bf16")) << why;
    EXPECT_NE(why.find("needs AMX"), std::string::npos) << why;
  }
  EXPECT_EQ(runs, cpu_has_flag("amx_bf16") ? 6 : 2);
}

TEST(Peers, KTransformersAmxClassesSkipSizesTheirTilesCannotTake) {
  // The tiny model's experts are 24 wide: kt-kernel's AMX classes would fault on them; they say why and skip.
  const auto j = run_ok(
      "run --model tiny --variant peer/ktransformers_amx_bf16/cpu --variant peer/ktransformers_amx_int8/cpu "
      "--axis tokens=1");
  EXPECT_TRUE(j.at("benchmarks").empty());
  ASSERT_EQ(j.at("skipped").size(), 2u);
  for (const auto& e : j.at("skipped")) {
    const std::string why = e.at("reason");
    if (!cpu_has_flag("amx_bf16") || why.find("not there") != std::string::npos) continue;  // (skipped for that)
    EXPECT_NE(why.find("multiples of"), std::string::npos) << why;
    EXPECT_NE(why.find("24"), std::string::npos) << why;
  }
}

// Hugging Face transformers' decode step on a checkpoint (the small V2 golden one): its logits against the fp64
// reference model's on the same prompts and step tokens. Without --weights it says it needs them; without torch and
// transformers (CI's .venv has neither) it skips saying so.
TEST(Peers, TransformersStepOnACheckpointIsVerified) {
  const std::string weights = std::string(DSLAB_SOURCE_DIR) + "/tests/data/checkpoints/v2";
  fs::remove_all(out_dir());
  const test::CliRun r = test::run_cli("run --weights " + weights +
                                           " --variant peer/transformers/cpu --axis batch=2 --axis kv_len=12 "
                                           "--min-samples 3 --min-time 0.01 --max-noise 1",
                                       out_dir());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(std::ifstream(out_dir() / "results.json"));
  if (!j.at("skipped").empty()) {
    const std::string why = j.at("skipped")[0].at("reason");
    ASSERT_NE(why.find("needs torch and transformers"), std::string::npos) << why;
    GTEST_SKIP() << why;
  }
  const auto& e = j.at("benchmarks").at(0);
  EXPECT_GT(e.at("real_time").get<double>(), 0);
  EXPECT_TRUE(e.at("verify_pass").get<bool>()) << e.dump();
  EXPECT_GT(e.at("verify_rel_err").get<double>(), 0);
  EXPECT_EQ(e.at("counters").at("checked_against_reference").get<double>(), 1);
}

TEST(Peers, TransformersStepNeedsACheckpoint) {
  fs::remove_all(out_dir());
  const test::CliRun r =
      test::run_cli("run --model deepseek-v2-lite --variant peer/transformers/cpu --axis kv_len=64", out_dir());
  EXPECT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(std::ifstream(out_dir() / "results.json"));
  const std::string why = j.at("skipped").at(0).at("reason");
  EXPECT_TRUE(why.find("needs --weights") != std::string::npos ||
              why.find("needs torch and transformers") != std::string::npos)
      << why;
}

}  // namespace
}  // namespace dslab
