// Stand-in when dslab is built without CUDA: no GPU, and saying so is the only behaviour.
#include <stdexcept>

#include "harness/collectives.h"
#include "harness/gpu.h"
#include "harness/host.h"

namespace dslab {

const GpuInfo& gpu_info() {
  static const GpuInfo info = [] {
    GpuInfo g;
    g.why_absent = "no GPU: dslab was built without CUDA (nvcc not found at configure time)";
    return g;
  }();
  return info;
}

namespace gpu {
double time_seconds(const std::function<void()>&, bool) {
  throw std::logic_error("GPU timing in a build without CUDA");
}
double fastest_seconds(const std::function<void()>&, int) {
  throw std::logic_error("GPU timing in a build without CUDA");
}
void flush_l2() { throw std::logic_error("GPU L2 flush in a build without CUDA"); }
void occupy_stream(double) { throw std::logic_error("GPU stream in a build without CUDA"); }
nlohmann::json calibrate() { return nullptr; }
OpMarks::~OpMarks() = default;
KernelTimes kernel_times(const std::function<void()>&) {
  throw std::logic_error("GPU kernel timing in a build without CUDA");
}
void OpMarks::begin(CUstream_st*) { throw std::logic_error("GPU op timing in a build without CUDA"); }
void OpMarks::mark(const char*, CUstream_st*) { throw std::logic_error("GPU op timing in a build without CUDA"); }
std::map<std::string, double> OpMarks::elapsed_us() const { return {}; }
std::map<std::string, double> time_ops(const std::function<void(OpMarks&)>&, int, double) {
  throw std::logic_error("GPU op timing in a build without CUDA");
}
}  // namespace gpu

namespace collectives {
nlohmann::json measure(int, const std::vector<double>&) {
  throw std::runtime_error("collectives: dslab was built without CUDA");
}
}  // namespace collectives

}  // namespace dslab
