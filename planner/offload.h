// `dslab offload`: an arithmetic-intensity-guided placement of each measured op between the CPU and
// the GPU, in the spirit of KTransformers (attention and dense parts on the GPU, routed experts on the
// CPU unless moving their weights to the GPU pays for itself).
//
// An op is one family at one model and point (e.g. moe at deepseek-v3, tokens=2048). Its time on a
// device is the best measured variant there, else a roofline estimate from that device's calibrated
// ceilings: max(FLOPs / compute, bytes / bandwidth). Ops of a host-resident family (routed experts,
// whose weights do not fit in GPU memory) pay bytes / PCIe bandwidth on the GPU first. The op goes
// where it is faster; its arithmetic intensity against each device's ridge point says why.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/results_file.h"

namespace dslab::reports {

struct OffloadOptions {
  std::vector<std::string> host_resident = {"moe"};  // families whose weights live in host memory
  double pcie_bytes_per_s = 25e9;                    // host-to-device copy bandwidth
};

struct Placement {
  std::string op, family, model;
  nlohmann::json axes;
  double flops = 0, bytes = 0, intensity = 0;  // of the way it is computed where it is placed
  double cpu_s = 0, gpu_s = 0;                 // 0: no estimate possible
  std::string cpu_source, gpu_source;  // "measured: <variant>" | "roofline estimate" | "roofline estimate + PCIe"
  std::string device;                  // cpu | gpu
  std::string reason;
};

struct OffloadPlan {
  double cpu_ridge = 0, gpu_ridge = 0;  // FLOP/byte where each device turns compute-bound
  std::string cpu_name, gpu_name;
  std::vector<Placement> ops;
  nlohmann::json to_json() const;
};

// Ceilings come from the first results file whose context carries a machine file with both sections.
OffloadPlan plan_offload(const std::vector<ResultsFile>& files, const OffloadOptions& o);

}  // namespace dslab::reports
