#include "harness/collectives.h"

#include <algorithm>
#include <stdexcept>

#include "harness/host.h"

namespace dslab::collectives {

double bus_factor(const std::string& kind, int64_t gpus) {
  const double n = double(gpus), share = (n - 1) / n;
  if (kind == "all_reduce") return 2 * share;
  if (kind == "all_gather" || kind == "reduce_scatter") return share;
  if (kind == "all_to_all") return share / n;
  throw std::logic_error("collective kind '" + kind + "'");
}

Fit fit(const std::vector<Point>& points, int64_t gpus) {
  if (gpus < 2) throw std::invalid_argument("collective fit: one GPU moves nothing over a link");
  if (points.size() < 2) throw std::invalid_argument("collective fit: fewer than two message sizes");
  const auto [smallest, largest] = std::minmax_element(
      points.begin(), points.end(), [](const Point& a, const Point& b) { return a.bytes < b.bytes; });
  if (smallest->bytes == largest->bytes) throw std::invalid_argument("collective fit: one message size");
  Fit f;
  f.latency_s = smallest->seconds;
  const double transfer_s = std::max(largest->seconds - f.latency_s, 1e-3 * largest->seconds);
  f.bus_bytes_per_s = largest->bytes * bus_factor(largest->kind, gpus) / transfer_s;
  return f;
}

std::vector<double> default_sizes() {
  std::vector<double> s;
  for (double b = 8192; b <= 128.0 * 1024 * 1024; b *= 4) s.push_back(b);
  return s;
}

nlohmann::json calibrate() {
  const int gpus = gpu_info().present ? gpu_info().devices : 0;
  if (gpus < 2)
    return {{"absent", std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s") +
                           " visible: collectives need two or more (nothing crosses a link)"}};
  try {
    return measure(gpus, default_sizes());
  } catch (const std::runtime_error& e) {
    return {{"absent", e.what()}};
  }
}

}  // namespace dslab::collectives
