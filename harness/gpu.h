// GPU side of the harness: device facts, event timing with an L2 flush, and the GPU ceilings for
// `dslab calibrate`. Built from gpu.cu when CUDA is found, else from gpu_absent.cc.
#pragma once
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace dslab::gpu {

// Times one call of fn with CUDA events on the default stream; with flush_l2 it first overwrites an
// L2-sized buffer (as nvbench's cold timer does) so the call starts from HBM.
double time_seconds(const std::function<void()>& fn, bool flush_l2);

// HBM copy bandwidth, cuBLAS bf16 GEMM rate and kernel-launch overhead, each with how it was measured.
nlohmann::json calibrate();

}  // namespace dslab::gpu
