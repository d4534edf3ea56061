// GPU side of the harness: device facts, event timing with an L2 flush, and the GPU ceilings for
// `dslab calibrate`. Built from gpu.cu when CUDA is found, else from gpu_absent.cc.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

struct CUstream_st;  // cudaStream_t, without the CUDA headers (this header is also built without CUDA)
struct CUevent_st;

namespace dslab::gpu {

// Events at op boundaries inside one step, so a step's time can be split by op (counters "op_us.<op>").
// An op calls mark(name, stream) when its work is queued: the time since the previous mark is charged to it;
// an op marked several times in a step (one per layer) is summed.
class OpMarks {
 public:
  OpMarks() = default;
  OpMarks(const OpMarks&) = delete;
  OpMarks& operator=(const OpMarks&) = delete;
  ~OpMarks();
  void begin(CUstream_st* stream);  // the step starts here
  void mark(const char* op, CUstream_st* stream);
  // Marks named `op` are not recorded: their time goes to the next mark (two ops timed as one bracket, with no event
  // between them to stop the second's early launch).
  // (Idempotent: a step that says so each time it runs adds the name once.)
  void leave_out(const std::string& op) {
    if (std::find(left_out_.begin(), left_out_.end(), op) == left_out_.end()) left_out_.push_back(op);
  }
  std::map<std::string, double> elapsed_us() const;  // after the step's work has completed

 private:
  std::vector<std::pair<const char*, CUevent_st*>> marks_;  // events reused from step to step
  size_t used_ = 0;
  std::vector<std::string> left_out_;
};

// What the GPU did while fn's work ran, from CUPTI activity records (kernels, copies, memsets): busy_s is the
// union of their intervals (overlapping work counted once), sum_s their summed durations, span_s first start to
// last end. A step's busy time against its wall time says how much is lost between kernels.
struct KernelTimes {
  double busy_s = 0, sum_s = 0, span_s = 0;
  int records = 0;
  std::map<std::string, double> by_kernel_s;  // summed durations by kernel (short name: no namespaces, templates,
                                              // parameters), copies and memsets as "memcpy" / "memset"
  struct Span {
    std::string name;       // as in by_kernel_s
    double start_s, end_s;  // from the first record's start
  };
  std::vector<Span> timeline;  // every record, by start
};
// records == 0: CUPTI was unavailable (another tool holds it) and nothing was measured.
KernelTimes kernel_times(const std::function<void()>& fn);

// A kernel's name as the per-kernel counters show it: demangled, without namespaces, template arguments or
// parameters ("void dslab::mla::cuda::fused_decode::roles::decode_kernel<...>(Params)" -> "decode_kernel").
std::string short_kernel_name(const char* name);

// Median GPU time of each marked op over `steps` eager steps, each from a flushed L2 and queued behind a
// blocking kernel so host launch costs do not show: {"op_us.<op>": microseconds}.
// occupy_s must exceed the host's time to queue one step.
std::map<std::string, double> time_ops(const std::function<void(OpMarks&)>& step, int steps = 9,
                                       double occupy_s = 2e-3);

// Times one call of fn with CUDA events on the default stream; with flush_l2 it first evicts L2 (flush_l2() below)
// so the call starts from HBM.
double time_seconds(const std::function<void()>& fn, bool flush_l2);
// A tuner's time of one candidate: fn once to warm up, then the fastest of `runs` calls, each from a flushed L2.
double fastest_seconds(const std::function<void()>& fn, int runs = 3);

// Reads a buffer twice L2's size on the default stream: whatever runs next starts from HBM, with L2 holding clean
// lines of other data (no write-back to pay, as after a memset: gpu.cu says what that cost).
void flush_l2();
// Keeps the default stream busy for about `seconds` (a kernel spinning on the global timer), so that the work
// the host queues meanwhile runs back to back, whatever the host's launch speed: nvbench's blocking kernel.
void occupy_stream(double seconds);

// HBM copy bandwidth, cuBLAS bf16 GEMM rate and kernel-launch overhead, each with how it was measured.
nlohmann::json calibrate();

}  // namespace dslab::gpu
