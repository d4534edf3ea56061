// Helpers shared by the tests: model loading and fresh seeds (printed, so a failure can be replayed).
#pragma once
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "harness/sweep.h"
#include "variants/common/model_config.h"

namespace dslab::test {

inline ModelConfig model(const std::string& name) {
  const ModelFile f = load_model_file(name);
  return parse_model_config(f.config, f.name, f.path);
}

inline uint64_t fresh_seed() {
  static std::random_device rd;
  const char* given = std::getenv("DSLAB_TEST_SEED");  // (to repeat a failure: the seed its log printed)
  const uint64_t seed = given ? std::strtoull(given, nullptr, 10) : (uint64_t(rd()) << 32) | rd();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

// ---- the dslab command line, as a user runs it ----

struct CliRun {
  int status;
  std::string err;
};

// ctest runs tests in parallel: every file a test touches is named after the test.
inline std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

// The dslab binary: $DSLAB_BINARY (on the device machine, the bundled one), else the one built beside the tests.
inline std::string dslab_binary() {
  const char* env = std::getenv("DSLAB_BINARY");
  return env ? env : DSLAB_BINARY;
}

inline CliRun run_cli(const std::string& args, const std::filesystem::path& out) {
  const std::filesystem::path err_file =
      std::filesystem::temp_directory_path() / ("dslab_cli_err_" + test_name() + ".txt");
  const std::string cmd = dslab_binary() + " " + args + " --out " + out.string() + " >/dev/null 2>" + err_file.string();
  const int rc = std::system(cmd.c_str());
  std::ifstream f(err_file);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, ss.str()};
}

inline void expect_bad_input(const std::string& args, const std::string& expect_in_message) {
  const std::filesystem::path out = std::filesystem::temp_directory_path() / ("dslab_cli_out_" + test_name());
  std::filesystem::remove_all(out);
  const CliRun r = run_cli(args, out);
  EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  EXPECT_NE(r.err.find(expect_in_message), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out / "results.json")) << args;
}

}  // namespace dslab::test
