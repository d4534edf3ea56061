// Every CPU MLA variant against the fp64 reference on fresh random weights and inputs (bf16: <= 1e-2).
#include <gtest/gtest.h>

#include <cmath>

#include "harness/variant.h"
#include "tests/test_util.h"
#include "variants/reference/reference.h"

namespace dslab {
namespace {

struct Case {
  const char* model;
  int64_t batch, q_len, kv_len;
};

class MlaCpu : public ::testing::TestWithParam<std::string> {};

double run_and_verify(const std::string& variant, const Case& c, uint64_t seed) {
  const VariantEntry* e = find_variant(variant);
  EXPECT_NE(e, nullptr);
  const ModelFile model = load_model_file(c.model);
  Point p;
  p.set("batch", {std::to_string(c.batch), c.batch, true});
  p.set("q_len", {std::to_string(c.q_len), c.q_len, true});
  p.set("kv_len", {std::to_string(c.kv_len), c.kv_len, true});
  auto v = e->make();
  EXPECT_TRUE(v->supports(model, p).ok);
  v->prepare(model, p, seed);
  v->run();
  v->run();  // a second step rewrites the same cache slots: the result must not drift
  return v->verify().rel_err;
}

TEST_P(MlaCpu, MatchesReference) {
  const uint64_t seed = test::fresh_seed();
  for (const Case& c : {Case{"tiny", 2, 1, 37}, Case{"tiny", 1, 5, 20}, Case{"tiny", 3, 2, 0},
                        Case{"deepseek-v2-lite", 2, 1, 300}, Case{"deepseek-v2-lite", 1, 7, 64}}) {
    SCOPED_TRACE(std::string(c.model) + " batch " + std::to_string(c.batch) + " q_len " + std::to_string(c.q_len) +
                 " kv_len " + std::to_string(c.kv_len));
    const double err = run_and_verify(GetParam(), c, seed);
    EXPECT_LE(err, 1e-2);
    EXPECT_GT(err, 0.0) << "bf16 arithmetic cannot match fp64 exactly: is the output really computed?";
  }
}

TEST_P(MlaCpu, MatchesReferenceAtDeepSeekV2Dims) {
  const double err = run_and_verify(GetParam(), {"deepseek-v2", 1, 2, 40}, test::fresh_seed());
  EXPECT_LE(err, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(AllForms, MlaCpu,
                         ::testing::Values("mla/cd/cpu", "mla/cc/cpu", "mla/a_cc/cpu", "mla/a_cc_me/cpu"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (ch == '/') ch = '_';
                           return n;
                         });

TEST(MlaCpuVerify, UnwrittenOutputFails) {
  const ModelFile model = load_model_file("tiny");
  Point p;
  p.set("batch", {"1", 1, true});
  p.set("q_len", {"1", 1, true});
  p.set("kv_len", {"8", 8, true});
  auto v = find_variant("mla/cd/cpu")->make();
  v->prepare(model, p, 3);
  EXPECT_FALSE(v->verify().pass());  // output is poisoned with NaN until run() writes it
}

TEST(MlaCpuVerify, CatchesAWrongOutput) {
  // The check itself must be able to fail: a variant run at one seed verified against another's reference.
  const VariantEntry* e = find_variant("mla/a_cc_me/cpu");
  const ModelFile model = load_model_file("tiny");
  Point p;
  p.set("batch", {"1", 1, true});
  p.set("q_len", {"1", 1, true});
  p.set("kv_len", {"16", 16, true});
  auto v = e->make();
  v->prepare(model, p, 1);
  v->run();
  auto other = e->make();
  other->prepare(model, p, 2);  // replaces the shared problem: v's inputs stay, the reference changes
  auto tensors = v->tensors();
  const DumpTensor* out = nullptr;
  for (const auto& t : tensors)
    if (t.name == "output") out = &t;
  ASSERT_NE(out, nullptr);
  other->run();
  EXPECT_LE(other->verify().rel_err, 1e-2);
  // v's output against other's reference.
  std::vector<double> ref;
  for (const auto& t : other->tensors())
    if (t.name == "reference_output")
      ref.assign(static_cast<const double*>(t.data), static_cast<const double*>(t.data) + t.nbytes / 8);
  EXPECT_GT(ref::relative_l2_error(static_cast<const float*>(out->data), ref.data(), ref.size()), 0.5);
}

}  // namespace
}  // namespace dslab
