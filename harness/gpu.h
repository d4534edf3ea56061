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

// Overwrites an L2-sized buffer on the default stream: whatever runs next starts from HBM.
void flush_l2();
// Keeps the default stream busy for about `seconds` (a kernel spinning on the global timer), so that the work
// the host queues meanwhile runs back to back, whatever the host's launch speed: nvbench's blocking kernel.
void occupy_stream(double seconds);

// HBM copy bandwidth, cuBLAS bf16 GEMM rate and kernel-launch overhead, each with how it was measured.
nlohmann::json calibrate();

}  // namespace dslab::gpu
