// Sampling a variant's run(): warm-up, then samples until the stop rule says enough; summary statistics.
#pragma once
#include <string>
#include <vector>

#include "harness/variant.h"

namespace dslab {

struct StopRule {
  int min_samples = 5;
  int max_samples = 10000;
  double min_time_s = 0.3;  // of summed sample time
  double max_noise = 0.01;  // relative standard error of the mean: stdev / sqrt(n) / mean
  double timeout_s = 5;     // wall time for the point, flushes included
  // 0: off. Above it, (p90 - p10) / median of a subject's samples says the host was disturbed while it ran (a
  // second-long stall moved a 25-sample median 38% on a lent machine): the subject is sampled again, alone, under
  // the same rule, and the window with the smaller spread is kept (the results say so).
  double max_spread = 0;
};

struct SampleSet {
  std::vector<double> seconds;
  std::string stop_reason;  // converged | timeout | max_samples
  std::string cache_state;  // hot | flushed (cache overwritten before each sample) | streaming (working set > 4x cache)
  double discarded_spread = -1;  // resampled (StopRule::max_spread): the spread of the window not kept, else -1
  double spread() const;         // (p90 - p10) / median of seconds
};

struct Stats {
  double median = 0, p10 = 0, p90 = 0, mean = 0, stdev = 0;
};
Stats summarize(std::vector<double> seconds);

struct Subject {
  Variant* variant;
  Device device;
  double working_set_bytes;
};

// CPU: steady clock around run(), the sample (flush, eviction, run) on the team thread (harness/team_thread.h). CUDA:
// events around run(). Cold (unless hot): CPU caches are overwritten before each sample when the working set would fit
// in them, and the variant's cold_buffers() evicted line by line before every sample (a GPU variant's too: host memory
// its step reads); GPU L2 is always flushed. Several subjects (the variants of one point) are sampled round-robin, one
// sample each per round in a shuffled order, so a machine that drifts (a noisy neighbour, a frequency change) moves all
// of them alike and their ratios hold; each stops on its own rule, and the timeout is per subject.
std::vector<SampleSet> measure_interleaved(const std::vector<Subject>& subjects, const StopRule& rule, bool hot);

}  // namespace dslab
