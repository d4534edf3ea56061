#include "variants/common/cuda/l2_prefetch.h"

#include <algorithm>
#include <cstdint>

#include "harness/cuda_check.h"

namespace dslab::gpu {
namespace {

struct PrefetchArgs {
  const char* data[kMaxL2Ranges];
  unsigned long long bytes[kMaxL2Ranges];
  int count;
};

// Each thread issues bulk L2 prefetches of kChunk bytes, range after range in the order given (the first range's
// chunks go out first across the grid). The instruction returns at once: the kernel ends when its requests are
// issued, and the L2 fills behind it.
constexpr unsigned kPrefetchChunk = 32 * 1024;
constexpr int kPrefetchBlocks = 4, kPrefetchThreads = 128;
__global__ void __launch_bounds__(kPrefetchThreads) l2_prefetch_kernel(PrefetchArgs a) {
  const unsigned long long thread = blockIdx.x * blockDim.x + threadIdx.x, threads = gridDim.x * blockDim.x;
  for (int r = 0; r < a.count; ++r) {
    const unsigned long long chunks = (a.bytes[r] + kPrefetchChunk - 1) / kPrefetchChunk;
    for (unsigned long long c = thread; c < chunks; c += threads) {
      const unsigned long long at = c * kPrefetchChunk;
      const unsigned n = unsigned(min(static_cast<unsigned long long>(kPrefetchChunk), a.bytes[r] - at));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(a.data[r] + at), "r"(n) : "memory");
#endif
    }
  }
}

}  // namespace

L2Prefetch::~L2Prefetch() {
  if (forked_) cudaEventDestroy(forked_);
  if (done_) cudaEventDestroy(done_);
}

void L2Prefetch::set(const std::vector<L2Range>& ranges, size_t budget_bytes, cudaStream_t side) {
  count_ = 0;
  bytes_ = 0;
  side_ = side;
  for (const L2Range& r : ranges) {
    if (count_ == kMaxL2Ranges || bytes_ >= budget_bytes) break;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(r.data) + 15) & ~uintptr_t(15),
                    end = (reinterpret_cast<uintptr_t>(r.data) + r.bytes) & ~uintptr_t(15);
    if (!r.data || end <= begin) continue;
    const size_t n = std::min<size_t>(end - begin, (budget_bytes - bytes_) & ~size_t(15));
    if (n == 0) break;
    data_[count_] = reinterpret_cast<const char*>(begin);
    size_[count_++] = n;
    bytes_ += n;
  }
  if (count_ && !forked_) {
    DSLAB_CUDA(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
    DSLAB_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
}

void L2Prefetch::issue(cudaStream_t stream) {
  if (!count_) return;
  PrefetchArgs a{};
  for (int r = 0; r < count_; ++r) a.data[r] = data_[r], a.bytes[r] = size_[r];
  a.count = count_;
  DSLAB_CUDA(cudaEventRecord(forked_, stream));
  DSLAB_CUDA(cudaStreamWaitEvent(side_, forked_, 0));
  l2_prefetch_kernel<<<kPrefetchBlocks, kPrefetchThreads, 0, side_>>>(a);
  DSLAB_CHECK_LAUNCH();
  DSLAB_CUDA(cudaEventRecord(done_, side_));
}

void L2Prefetch::join(cudaStream_t stream) {
  if (count_) DSLAB_CUDA(cudaStreamWaitEvent(stream, done_, 0));
}

}  // namespace dslab::gpu
