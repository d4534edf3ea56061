#include "analysis/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dslab::stats {
namespace {

// P(U >= k) under H0 for sample sizes m, n: counts of rank arrangements with each U, by recursion
// c(m, n, u) = c(m-1, n, u-n) + c(m, n-1, u).
double exact_sf(int m, int n, int k) {
  std::vector<std::vector<std::vector<double>>> c(static_cast<size_t>(m + 1),
                                                  std::vector<std::vector<double>>(size_t(n + 1)));
  for (int i = 0; i <= m; ++i)
    for (int j = 0; j <= n; ++j) {
      auto& cur = c[size_t(i)][size_t(j)];
      cur.assign(size_t(i * j + 1), 0.0);
      if (i == 0 || j == 0) {
        cur[0] = 1;
        continue;
      }
      const auto& a = c[size_t(i - 1)][size_t(j)];
      const auto& b = c[size_t(i)][size_t(j - 1)];
      for (int u = 0; u <= i * j; ++u)
        cur[size_t(u)] =
            (u - j >= 0 && size_t(u - j) < a.size() ? a[size_t(u - j)] : 0) + (size_t(u) < b.size() ? b[size_t(u)] : 0);
    }
  const auto& dist = c[size_t(m)][size_t(n)];
  const double total = std::accumulate(dist.begin(), dist.end(), 0.0);
  double tail = 0;
  for (int u = std::max(k, 0); u <= m * n; ++u) tail += dist[size_t(u)];
  return tail / total;
}

}  // namespace

UTest mann_whitney_u(const std::vector<double>& x, const std::vector<double>& y) {
  UTest r;
  const size_t n1 = x.size(), n2 = y.size(), n = n1 + n2;
  if (n1 == 0 || n2 == 0) return r;
  std::vector<std::pair<double, int>> all;
  for (double v : x) all.push_back({v, 0});
  for (double v : y) all.push_back({v, 1});
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double rank_sum_x = 0, tie_term = 0;
  bool ties = false;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && all[j].first == all[i].first) ++j;
    const double avg_rank = double(i + j + 1) / 2.0;  // ranks i+1 .. j share their mean
    for (size_t k = i; k < j; ++k)
      if (all[k].second == 0) rank_sum_x += avg_rank;
    const double t = double(j - i);
    tie_term += t * t * t - t;
    ties |= j - i > 1;
    i = j;
  }
  const double u1 = rank_sum_x - double(n1 * (n1 + 1)) / 2.0, u2 = double(n1 * n2) - u1;
  const double u_max = std::max(u1, u2);
  r.u = u1;
  if ((n1 < 8 || n2 < 8) && !ties) {
    r.exact = true;
    r.p_value = std::min(1.0, 2.0 * exact_sf(int(n1), int(n2), int(std::lround(u_max))));
    return r;
  }
  const double mu = double(n1 * n2) / 2.0;
  const double sigma = std::sqrt(double(n1 * n2) / 12.0 * ((double(n) + 1) - tie_term / (double(n) * double(n - 1))));
  if (sigma == 0) return r;
  const double z = (u_max - mu - 0.5) / sigma;
  r.p_value = std::min(1.0, std::erfc(z / std::sqrt(2.0)));  // 2 * (1 - Phi(z))
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

double geomean(const std::vector<double>& v) {
  if (v.empty()) return 1;
  double s = 0;
  for (double x : v) s += std::log(x);
  return std::exp(s / double(v.size()));
}

}  // namespace dslab::stats
