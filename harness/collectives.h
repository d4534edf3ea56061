// The collectives of a multi-GPU step, calibrated: NCCL's all-reduce, all-gather, reduce-scatter and all-to-all over
// this machine's GPUs, timed per message size, checked against the host's answer, and fitted to the planner's model
// of a collective (planner::collective_seconds): time = latency + bytes x factor / bus bandwidth, the factor NCCL's
// (its nccl-tests "bus bandwidth"): 2(n-1)/n for an all-reduce of `bytes`, (n-1)/n for an all-gather of `bytes` out or
// a reduce-scatter of `bytes` in, (n-1)/n^2 for an all-to-all of `bytes` in all (each GPU sends `bytes` / n, of which
// (n-1)/n leaves it). `dslab calibrate` writes the result under "collectives" in the machine file; `dslab plan --gpus`
// prices the collectives with it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dslab::collectives {

inline const std::vector<std::string>& kinds() {
  static const std::vector<std::string> k = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  return k;
}
// The factor above; logic_error for another kind.
double bus_factor(const std::string& kind, int64_t gpus);

struct Point {
  std::string kind;
  double bytes = 0, seconds = 0;
};
struct Fit {
  double latency_s = 0, bus_bytes_per_s = 0;
};
// From one kind's points on `gpus` GPUs: the latency is the smallest message's time, the bus bandwidth the largest
// message's bytes x factor over its time less that latency (the two ends of NCCL's curve: a small message is all
// latency, a large one all bandwidth). std::invalid_argument for fewer than two sizes or one GPU (nothing crosses a
// link).
Fit fit(const std::vector<Point>& points, int64_t gpus);

// Message sizes (bytes of the whole tensor): 8 KiB to 128 MiB, x4.
std::vector<double> default_sizes();

// Each kind at each size over GPUs 0..gpus-1, one communicator a GPU in this process (ncclCommInitAll); each kind's
// result at the smallest and the largest size checked against the host's. JSON: {"gpus", "nccl", "library", "how",
// "points": [{"kind", "bytes", "seconds", "bus_bytes_per_s"}], "fit": {kind: {"latency_s", "bus_bytes_per_s"}}}
// ("fit" only from 2 GPUs). std::runtime_error when NCCL cannot be opened, there are fewer GPUs, or a result is wrong.
nlohmann::json measure(int gpus, const std::vector<double>& sizes);

// What `dslab calibrate` records: measure() over every visible GPU when there are 2 or more, else {"absent": why}.
nlohmann::json calibrate();

}  // namespace dslab::collectives
