// Statistics for comparing runs: the Mann-Whitney U test, as scipy.stats.mannwhitneyu computes it
// (two-sided; exact when a sample is smaller than 8 and there are no ties, else the normal
// approximation with tie and continuity corrections).
#pragma once
#include <vector>

namespace dslab::stats {

struct UTest {
  double u = 0;        // U of the first sample
  double p_value = 1;  // two-sided
  bool exact = false;
};
UTest mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y);

double median(std::vector<double> v);
double geomean(const std::vector<double>& v);

}  // namespace dslab::stats
