// `dslab compare BASE.json NEW.json`: per matched run (variant + model + axes) the median ratio, a
// Mann-Whitney U test on the samples and a verdict. With --normalize VARIANT every run is first divided
// by that variant's median at the same point in the same file: on shared, noisy machines the ratio of
// two variants measured in one run is what stays put.
#pragma once
#include <string>
#include <vector>

#include "analysis/results_file.h"

namespace dslab::reports {

enum class Verdict { faster, slower, same, noisy };
const char* verdict_name(Verdict v);

struct CompareOptions {
  double threshold = 0.05;  // a change smaller than this is SAME
  double alpha = 0.05;      // significance of the U test
  std::string normalize;    // reference variant(s), or empty: "A" for every run, "A,B" one per family (mla/, moe/)
  double normalizer_threshold = 1.0;  // a reference variant's own change (not normalized) smaller than this is SAME
};

struct Comparison {
  std::string name;
  double base_median = 0, new_median = 0;  // (normalized) medians
  double ratio = 1;                        // new / base: > 1 is slower
  double p_value = 1;
  size_t repetitions = 1;   // repetition medians per side (fewer than 2: one run's samples were tested)
  bool normalizer = false;  // a reference variant, compared on its own times against normalizer_threshold
  bool pooled = false;      // too few repetitions for their medians' test to reach alpha: it ran on pooled samples
  Verdict verdict = Verdict::same;
};

struct CompareReport {
  std::vector<Comparison> rows;
  std::vector<std::string> unmatched;  // in one file only, or missing their normalizing reference
  double geomean_ratio = 1;
  size_t single_runs = 0;  // rows tested on one run's samples (no repetitions on one side or both)
  size_t pooled = 0;       // rows whose repetitions were too few: tested on their samples pooled
  bool regression() const;
};

Verdict decide(double ratio, double p_value, const CompareOptions& o);
CompareReport compare(const ResultsFile& base, const ResultsFile& next, const CompareOptions& o);

}  // namespace dslab::reports
