// Warming the L2 with weights a decode step reads next, while the kernels before them leave HBM idle.
//
// At small batches a step has latency-bound stretches - the fused decode and its merge, the router - in which the
// memory system has nothing to stream, followed by weight-streaming kernels (o_proj, the shared experts' GEMVs, the
// next layer's projections) that each pay a ramp to reach the HBM rate. An L2Prefetch issues bulk L2 prefetches
// (cp.async.bulk.prefetch.L2, fire and forget) of those weights from a kernel on a side stream forked at the start of
// such a stretch, so the streaming kernels after it find their weights in L2. Only a hint: nothing is written, so the
// results are the same with it or without it; what it may change is time (the layer's `l2_prefetch` axis).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace dslab::gpu {

// A stretch of device memory to prefetch (bytes counted from data; both are rounded to the 16 bytes a bulk
// prefetch takes: the start up, the end down).
struct L2Range {
  const void* data = nullptr;
  size_t bytes = 0;
};

// The most ranges one prefetch takes (a layer's window: o_proj, the router, the shared experts' two matrices...).
constexpr int kMaxL2Ranges = 8;

class L2Prefetch {
 public:
  L2Prefetch() = default;
  ~L2Prefetch();
  L2Prefetch(const L2Prefetch&) = delete;
  L2Prefetch& operator=(const L2Prefetch&) = delete;
  // The ranges, in the order the step will read them, taken whole while their sum stays within budget_bytes and the
  // one that crosses it cut there (the rest dropped); side: the stream the prefetch kernel runs on (several
  // L2Prefetch of one step may share it). At most kMaxL2Ranges ranges.
  void set(const std::vector<L2Range>& ranges, size_t budget_bytes, cudaStream_t side);
  size_t bytes() const { return bytes_; }
  bool empty() const { return count_ == 0; }
  // Queues the prefetch on the side stream after the work `stream` has queued so far (an event fork, which a graph
  // capture records as an edge). Nothing when empty.
  void issue(cudaStream_t stream);
  // `stream` waits for the prefetch kernel (which only issues the requests, so it has long ended when this is
  // reached); a capture must end with its side streams joined. Nothing when empty.
  void join(cudaStream_t stream);

 private:
  const char* data_[kMaxL2Ranges] = {};
  size_t size_[kMaxL2Ranges] = {};
  int count_ = 0;
  size_t bytes_ = 0;
  cudaStream_t side_ = nullptr;
  cudaEvent_t forked_ = nullptr, done_ = nullptr;
};

}  // namespace dslab::gpu
