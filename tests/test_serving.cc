// Continuous batching's plan (harness/serving.h): admission, chunked prefill, page accounting, and the serving
// metrics' definitions against timelines computed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "harness/errors.h"
#include "harness/serving.h"

namespace dslab::serving {
namespace {

// Runs the scheduler with every step taking `step_s`, idle time skipped to the next arrival; checks the page
// accounting at every step (no page held twice, none lost).
std::vector<std::vector<StepWork>> run(Scheduler& s, int64_t total_pages, double step_s = 1.0) {
  std::vector<std::vector<StepWork>> steps;
  double now = 0;
  while (!s.done()) {
    auto work = s.next_step(now);
    if (work.empty()) {
      EXPECT_GT(s.next_arrival(), now) << "nothing to run, yet a request has arrived";
      now = s.next_arrival();
      continue;
    }
    now += step_s;
    s.complete(now);
    steps.push_back(work);
    EXPECT_LE(s.free_pages(), total_pages);
    EXPECT_LT(steps.size(), 10000u) << "the schedule does not finish";
    if (steps.size() >= 10000u) break;
  }
  EXPECT_EQ(s.free_pages(), total_pages);  // every page back
  return steps;
}

TEST(Scheduler, ChunkedPrefillThenDecodeOneTokenAStep) {
  // One request, prompt 10 tokens in chunks of 4: steps 1-3 prefill 4, 4, 2 (its first token at the end of step 3),
  // then output 3 tokens: 2 more decode steps.
  SchedulerConfig c{1, 4, 4, 16};
  Scheduler s(c, {{10, 3, 0.0}});
  const auto steps = run(s, 16);
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps[0][0].tokens, 4);
  EXPECT_EQ(steps[1][0].first_token, 4);
  EXPECT_EQ(steps[2][0].tokens, 2);
  EXPECT_FALSE(steps[2][0].decode);
  EXPECT_TRUE(steps[3][0].decode);
  EXPECT_EQ(steps[3][0].first_token, 10);  // the first output token, fed back at position 10
  EXPECT_EQ(steps[4][0].first_token, 11);
  const auto& t = s.timelines()[0];
  EXPECT_EQ(t.first_token_s, 3.0);
  EXPECT_EQ(t.finish_s, 5.0);
  EXPECT_EQ(t.token_s, (std::vector<double>{3, 4, 5}));
}

TEST(Scheduler, DecodesFirstThenPromptsShareTheBudget) {
  // Two requests at once, budget 8 tokens a step: A's prompt 6 fits in step 1 with 2 of B's 5; step 2: A decodes (1),
  // B's remaining 3; step 3: both decode.
  SchedulerConfig c{2, 8, 4, 16};
  Scheduler s(c, {{6, 2, 0.0}, {5, 2, 0.0}});
  const auto steps = run(s, 16);
  ASSERT_GE(steps.size(), 3u);
  ASSERT_EQ(steps[0].size(), 2u);
  EXPECT_EQ(steps[0][0].request, 0);
  EXPECT_EQ(steps[0][0].tokens, 6);
  EXPECT_EQ(steps[0][1].tokens, 2);
  ASSERT_EQ(steps[1].size(), 2u);
  EXPECT_TRUE(steps[1][0].decode);
  EXPECT_EQ(steps[1][1].request, 1);
  EXPECT_EQ(steps[1][1].tokens, 3);
  EXPECT_EQ(s.timelines()[0].finish_s, 2.0);
  EXPECT_EQ(s.timelines()[1].first_token_s, 2.0);
  EXPECT_EQ(s.timelines()[1].finish_s, 3.0);
}

TEST(Scheduler, AdmissionWaitsForASlotAndForPagesAndReusesFreedPages) {
  // 3 pages of 4 tokens: A (4 + 4 tokens: 2 pages) runs; B (2 pages) must wait for A's pages though a slot is free;
  // when A finishes, B gets A's pages back.
  SchedulerConfig c{2, 16, 4, 3};
  Scheduler s(c, {{4, 4, 0.0}, {4, 4, 0.0}});
  auto first = s.next_step(0);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.free_pages(), 1);
  const std::set<int32_t> a_pages(s.pages_of(0).begin(), s.pages_of(0).end());
  s.complete(1);
  double now = 1;
  while (s.timelines()[0].finish_s < 0) {
    ASSERT_EQ(s.next_step(now).size(), 1u);  // B still waits
    s.complete(now += 1);
  }
  s.next_step(now);
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(std::set<int32_t>(s.pages_of(1).begin(), s.pages_of(1).end()), a_pages);
  // A concurrency limit of one: the second request starts only when the first finishes.
  Scheduler one({1, 16, 4, 100}, {{4, 3, 0.0}, {4, 3, 0.0}});
  run(one, 100);
  EXPECT_EQ(one.timelines()[1].first_token_s, one.timelines()[0].finish_s + 1);
}

TEST(Scheduler, LaterArrivalsJoinTheRunningBatch) {
  SchedulerConfig c{4, 64, 16, 64};
  Scheduler s(c, {{8, 10, 0.0}, {8, 2, 2.5}});
  const auto steps = run(s, 64);
  // B arrives at 2.5: admitted at the step starting at 3 (after A's prefill at 0-1 and decodes at 1-2, 2-3).
  EXPECT_EQ(s.timelines()[1].first_token_s, 4.0);
  EXPECT_EQ(steps[3].size(), 2u);  // A's decode and B's whole prompt in one step
}

TEST(Scheduler, RequestsThatCannotRunAreBadInput) {
  EXPECT_THROW(Scheduler({1, 16, 4, 2}, {{8, 4, 0.0}}), BadInput);  // 3 pages needed, 2 in the cache
  EXPECT_THROW(Scheduler({1, 16, 4, 8}, {{0, 4, 0.0}}), BadInput);
  EXPECT_THROW(Scheduler({0, 16, 4, 8}, {{1, 1, 0.0}}), BadInput);
}

TEST(ServingMetrics, DefinitionsAgainstAHandComputedTimeline) {
  // A: arrives 0, tokens at 2, 3, 5 (3 tokens): TTFT 2, TPOT (5 - 2) / 2 = 1.5, ITL 1 and 2, E2E 5.
  // B: arrives 1, one token at 4: TTFT 3, no TPOT, no ITL, E2E 3.
  const std::vector<RequestSpec> q = {{10, 3, 0.0}, {6, 1, 1.0}};
  std::vector<RequestTimeline> t(2);
  t[0] = {0.0, 2.0, 5.0, {2, 3, 5}};
  t[1] = {1.0, 4.0, 4.0, {4}};
  const ServingMetrics m = serving_metrics(q, t);
  EXPECT_EQ(m.requests, 2);
  EXPECT_DOUBLE_EQ(m.duration_s, 5.0);
  EXPECT_DOUBLE_EQ(m.ttft_s.mean, 2.5);
  EXPECT_DOUBLE_EQ(m.ttft_s.p50, 2.5);
  EXPECT_DOUBLE_EQ(m.ttft_s.p90, 2.9);  // numpy: 2 + 0.9 * (3 - 2)
  EXPECT_EQ(m.tpot_s.count, 1);
  EXPECT_DOUBLE_EQ(m.tpot_s.mean, 1.5);
  EXPECT_EQ(m.itl_s.count, 2);
  EXPECT_DOUBLE_EQ(m.itl_s.p50, 1.5);
  EXPECT_DOUBLE_EQ(m.e2e_s.mean, 4.0);
  EXPECT_DOUBLE_EQ(m.output_tokens_per_s, 4.0 / 5.0);
  EXPECT_DOUBLE_EQ(m.total_tokens_per_s, 20.0 / 5.0);
  t[0].token_s.pop_back();  // a timeline that lost a token
  EXPECT_THROW(serving_metrics(q, t), BadInput);
}

TEST(ServingMetrics, ScheduledRunGivesConsistentMetrics) {
  // 16 requests, mixed lengths, all at once, 4 at a time: every token timed, TPOT equals the decode step time where
  // a request decodes alone in its steps (1 s each here), TTFT grows with the queue.
  std::vector<RequestSpec> q;
  for (int i = 0; i < 16; ++i) q.push_back({16 + 8 * (i % 3), 4 + i % 5, 0.0});
  Scheduler s({4, 64, 16, 64}, q);
  run(s, 64);
  const ServingMetrics m = serving_metrics(q, s.timelines());
  EXPECT_EQ(m.output_tokens, [&] {
    int64_t n = 0;
    for (const auto& r : q) n += r.output_len;
    return n;
  }());
  EXPECT_DOUBLE_EQ(m.tpot_s.mean, 1.0);
  EXPECT_DOUBLE_EQ(m.itl_s.p99, 1.0);
  EXPECT_GT(m.ttft_s.p99, m.ttft_s.p50);
}

TEST(RequestSet, DistributionsAreDeterministicAndWithinTheirBounds) {
  RequestSetSpec spec;
  spec.requests = 2000;
  spec.input = {"uniform", 1024, 4096};
  spec.output = {"fixed", 256, 0};
  const auto a = request_set(spec, 5), b = request_set(spec, 5), c = request_set(spec, 6);
  ASSERT_EQ(a.size(), 2000u);
  int64_t lo = 1 << 30, hi = 0;
  double mean = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].input_len, b[i].input_len);  // same seed, same set
    EXPECT_EQ(a[i].output_len, 256);
    EXPECT_EQ(a[i].arrival_s, 0.0);  // all at once
    lo = std::min(lo, a[i].input_len), hi = std::max(hi, a[i].input_len);
    mean += double(a[i].input_len) / double(a.size());
  }
  EXPECT_GE(lo, 1024);
  EXPECT_LE(hi, 4096);
  EXPECT_LT(lo, 1100);  // the range is covered
  EXPECT_GT(hi, 4000);
  EXPECT_NEAR(mean, 2560, 60);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) differs |= a[i].input_len != c[i].input_len;
  EXPECT_TRUE(differs);
  // Lognormal: the median near exp(mu); Poisson arrivals: mean gap near 1 / rate.
  spec.input = {"lognormal", std::log(500.0), 0.5};
  spec.rate = 4;
  const auto l = request_set(spec, 9);
  std::vector<double> lengths, gaps;
  for (size_t i = 0; i < l.size(); ++i) {
    lengths.push_back(double(l[i].input_len));
    if (i) gaps.push_back(l[i].arrival_s - l[i - 1].arrival_s);
  }
  EXPECT_NEAR(distribution(lengths).p50, 500, 25);
  EXPECT_NEAR(distribution(gaps).mean, 0.25, 0.02);
  spec.input = {"uniform", 10, 5};
  EXPECT_THROW(request_set(spec, 1), BadInput);
  spec.input = {"zipf", 1, 2};
  EXPECT_THROW(request_set(spec, 1), BadInput);
}

TEST(RequestSet, TracesReadAndBadLinesNamed) {
  const auto path = std::filesystem::temp_directory_path() / "dslab_trace_test.jsonl";
  std::ofstream(path) << R"({"input_len": 100, "output_len": 20, "arrival_s": 0.5})"
                      << "\n\n"
                      << R"({"input_len": 7, "output_len": 1})"
                      << "\n";
  const auto t = load_trace(path.string());
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].input_len, 100);
  EXPECT_EQ(t[0].arrival_s, 0.5);
  EXPECT_EQ(t[1].arrival_s, 0.0);
  auto error = [&](const std::string& text) {
    std::ofstream(path) << text;
    try {
      load_trace(path.string());
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(R"({"input_len": 0, "output_len": 3})").find(":1: field 'input_len'"), std::string::npos);
  EXPECT_NE(error("{\"input_len\": 3, \"output_len\": 3}\n{\"input_len\": 3, \"outputlen\": 3}")
                .find(":2: field 'outputlen': unknown"),
            std::string::npos);
  EXPECT_NE(error("not json").find("malformed JSON"), std::string::npos);
  EXPECT_NE(error("").find("no requests"), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dslab::serving
