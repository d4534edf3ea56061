// Helpers shared by the tests: model loading and fresh seeds (printed, so a failure can be replayed).
#pragma once
#include <gtest/gtest.h>

#include <random>
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
  const uint64_t seed = (uint64_t(rd()) << 32) | rd();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace dslab::test
