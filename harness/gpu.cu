#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cupti.h>
#include <cxxabi.h>

#include <cctype>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/gpu.h"
#include "harness/host.h"

namespace dslab {

const GpuInfo& gpu_info() {
  static const GpuInfo info = [] {
    GpuInfo g;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      g.why_absent = std::string("no GPU: ") + (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
      cudaGetLastError();  // clear the sticky error left by a failed probe
      return g;
    }
    cudaDeviceProp p{};
    DSLAB_CUDA(cudaGetDeviceProperties(&p, 0));
    g.present = true;
    g.devices = count;
    g.name = p.name;
    char uuid[64];
    const auto* u = reinterpret_cast<const unsigned char*>(p.uuid.bytes);
    std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                  u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    g.uuid = uuid;
    g.sms = p.multiProcessorCount;
    DSLAB_CUDA(cudaDeviceGetAttribute(&g.clock_mhz, cudaDevAttrClockRate, 0));
    g.clock_mhz /= 1000;
    DSLAB_CUDA(cudaDeviceGetAttribute(&g.memory_clock_mhz, cudaDevAttrMemoryClockRate, 0));
    g.memory_clock_mhz /= 1000;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.memory_bytes = p.totalGlobalMem;
    g.l2_bytes = size_t(p.l2CacheSize);
    DSLAB_CUDA(cudaRuntimeGetVersion(&g.runtime_version));
    DSLAB_CUDA(cudaDriverGetVersion(&g.driver_version));
    return g;
  }();
  return info;
}

namespace gpu {
namespace {

struct Events {
  cudaEvent_t start{}, stop{};
  // The host waits for `stop` asleep, not spinning (the default while a process has fewer contexts than CPUs): a
  // step whose routed experts run on the CPU needs every core but the one that launched it, and the GPU's timestamps
  // do not include the waiter's wake-up.
  Events() {
    DSLAB_CUDA(cudaEventCreate(&start));
    DSLAB_CUDA(cudaEventCreateWithFlags(&stop, cudaEventBlockingSync));
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  template <class F>
  double seconds(F&& fn) {
    DSLAB_CUDA(cudaEventRecord(start));
    fn();
    DSLAB_CUDA(cudaEventRecord(stop));
    DSLAB_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    DSLAB_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return double(ms) * 1e-3;
  }
};

__global__ void empty_kernel() {}

// A small kernel as a decode step has dozens per layer (a norm, a router): one block reads 16 KB it has never seen
// (a fresh HBM round trip), reduces it, writes one value. Its time in a graph is what such a kernel costs at least.
__global__ void small_kernel(const uint4* src, float* dst) {
  __shared__ float partial[8];
  const uint4 v = src[threadIdx.x], w = src[threadIdx.x + blockDim.x], x = src[threadIdx.x + 2 * blockDim.x],
              y = src[threadIdx.x + 3 * blockDim.x];
  float sum = __uint_as_float(v.x ^ w.y ^ x.z ^ y.w);
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (int i = 0; i < 8; ++i) total += partial[i];
    *dst = total;
  }
}

// Reads n 16-byte words once, four in flight a thread, and keeps nothing. Streaming loads (calibrate()): HBM's
// read-only rate, which a decode kernel's weight or cache stream approaches (a copy also writes, and reads no faster:
// the fused MLA decode read 2.98 TB/s against a 2.98 TB/s copy on an H100). Ordinary loads (flush_l2()):
// allocated in L2 at normal priority, so that L2 ends up holding clean lines of the buffer and nothing of the timed
// code's. The store never happens for the memset bytes read; it keeps the loads.
template <bool kStreaming>
__global__ void read_kernel(const uint4* __restrict__ src, size_t n, uint32_t* __restrict__ sink) {
  const auto load = [](const uint4* p) {
    if constexpr (kStreaming)
      return __ldcs(p);
    else
      return *p;
  };
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = load(src + i), b = load(src + i + stride), c = load(src + i + 2 * stride),
                d = load(src + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = load(src + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

__global__ void spin_kernel(uint64_t nanoseconds) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

void flush_l2() {
  // A read, not a memset (nvbench's flush): a memset leaves L2 full of dirty lines, and the timed code's first
  // kernel then pays their write-back to HBM as it reads. On the H100 (one host): a 30 MB read right
  // after a 2 x L2 memset 18.0 us, after a 2 x L2 read 13.9 us; cuBLAS's 64-row GEMM over a 2112 x 7168 weight
  // 21.9 vs 17.8 us. A decode step's predecessor (the previous layer: weights read, a few MB of activations
  // written) leaves L2 mostly clean, as this flush does.
  static uint4* buffer = nullptr;
  static uint32_t* sink = nullptr;
  static size_t words = 0;
  if (!buffer) {
    const size_t bytes = std::max<size_t>(gpu_info().l2_bytes * 2, 1 << 20);
    words = bytes / sizeof(uint4);
    DSLAB_CUDA(cudaMalloc(&buffer, words * sizeof(uint4)));
    DSLAB_CUDA(cudaMalloc(&sink, sizeof(uint32_t)));
    DSLAB_CUDA(cudaMemset(buffer, 0x5a, words * sizeof(uint4)));
  }
  read_kernel<false><<<unsigned(std::max(1, gpu_info().sms) * 4), 512>>>(buffer, words, sink);
  DSLAB_CHECK_LAUNCH();
}

void occupy_stream(double seconds) {
  spin_kernel<<<1, 1>>>(uint64_t(seconds * 1e9));
  DSLAB_CHECK_LAUNCH();
}

// "void dslab::moe::cuda::(anonymous namespace)::grouped_gemm_kernel<16, 64, ...>(GroupedArgs)" ->
// "grouped_gemm_kernel"; cuBLAS's unmangled names are kept as they are.
std::string short_kernel_name(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && demangled ? demangled : name;
  std::free(demangled);
  if (status != 0 && s.rfind("_ZN", 0) == 0) {  // nested name the demangler refused: its last <length><identifier>
    std::string last;
    size_t pos = 3;
    while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) {
      size_t n = 0;
      while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos]))) n = n * 10 + size_t(s[pos++] - '0');
      if (pos + n > s.size()) break;
      last = s.substr(pos, n);
      pos += n;
    }
    if (!last.empty()) return last.substr(0, 64);
  }
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;)
    s.erase(at, 23);  // (its '(' is no argument list)
  int depth = 0;
  std::string flat;  // without template arguments
  for (char c : s) {
    if (c == '<')
      ++depth;
    else if (c == '>')
      --depth;
    else if (depth == 0)
      flat += c;
  }
  if (const size_t paren = flat.find('('); paren != std::string::npos && paren > 0) flat.resize(paren);
  if (const size_t space = flat.rfind(' '); space != std::string::npos) flat = flat.substr(space + 1);
  if (const size_t colon = flat.rfind("::"); colon != std::string::npos) flat = flat.substr(colon + 2);
  return flat.empty() ? std::string(name).substr(0, 48) : flat.substr(0, 64);
}

namespace {

#define DSLAB_CUPTI(call)                                                                                         \
  do {                                                                                                            \
    CUptiResult dslab_r_ = (call);                                                                                \
    if (dslab_r_ != CUPTI_SUCCESS) {                                                                              \
      const char* dslab_s_ = nullptr;                                                                             \
      cuptiGetResultString(dslab_r_, &dslab_s_);                                                                  \
      throw std::runtime_error(std::string(#call) + " failed: " + (dslab_s_ ? dslab_s_ : "unknown CUPTI error")); \
    }                                                                                                             \
  } while (0)

std::mutex cupti_mu;
struct CuptiSpan {
  uint64_t start, end;
  std::string name;
  bool operator<(const CuptiSpan& o) const { return start < o.start || (start == o.start && end < o.end); }
};
std::vector<CuptiSpan>* cupti_spans = nullptr;  // the intervals of the call in progress
std::map<std::string, double>* cupti_by_kernel = nullptr;

void CUPTIAPI cupti_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t(8) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI cupti_buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    uint64_t start = 0, end = 0;
    std::string name;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        start = k->start, end = k->end;
        name = k->name ? short_kernel_name(k->name) : "kernel";
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        start = c->start, end = c->end;
        name = "memcpy";
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        start = c->start, end = c->end;
        name = "memset";
        break;
      }
      default:
        continue;
    }
    if (cupti_by_kernel) (*cupti_by_kernel)[name] += double(end - start) * 1e-9;
    if (cupti_spans && end > start) cupti_spans->push_back({start, end, std::move(name)});
  }
  std::free(buffer);
}

}  // namespace

KernelTimes kernel_times(const std::function<void()>& fn) {
  std::lock_guard<std::mutex> lock(cupti_mu);
  // Another tool holding the profiling interface (compute-sanitizer, Nsight) makes CUPTI refuse: then no records,
  // and the caller reports none, rather than the point failing.
  static const bool available =
      cuptiActivityRegisterCallbacks(cupti_buffer_requested, cupti_buffer_completed) == CUPTI_SUCCESS;
  if (!available || cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    fn();
    DSLAB_CUDA(cudaDeviceSynchronize());
    return {};
  }
  std::vector<CuptiSpan> spans;
  KernelTimes t;
  DSLAB_CUDA(cudaDeviceSynchronize());
  const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                      CUPTI_ACTIVITY_KIND_MEMSET};
  for (auto k : kinds) DSLAB_CUPTI(cuptiActivityEnable(k));
  cupti_spans = &spans;
  cupti_by_kernel = &t.by_kernel_s;
  try {
    fn();
    DSLAB_CUDA(cudaDeviceSynchronize());
  } catch (...) {
    for (auto k : kinds) cuptiActivityDisable(k);
    cuptiActivityFlushAll(1);
    cupti_spans = nullptr;
    cupti_by_kernel = nullptr;
    throw;
  }
  for (auto k : kinds) DSLAB_CUPTI(cuptiActivityDisable(k));
  DSLAB_CUPTI(cuptiActivityFlushAll(1));
  cupti_spans = nullptr;
  cupti_by_kernel = nullptr;
  t.records = int(spans.size());
  if (spans.empty()) return t;
  std::sort(spans.begin(), spans.end());
  uint64_t busy = 0, sum = 0, open = spans[0].start, close = spans[0].end, last = 0;
  for (const auto& [s, e, name] : spans) {
    t.timeline.push_back({name, double(s - spans[0].start) * 1e-9, double(e - spans[0].start) * 1e-9});
    sum += e - s;
    last = std::max(last, e);
    if (s > close) {
      busy += close - open;
      open = s, close = e;
    } else {
      close = std::max(close, e);
    }
  }
  busy += close - open;
  t.busy_s = double(busy) * 1e-9;
  t.sum_s = double(sum) * 1e-9;
  t.span_s = double(last - spans[0].start) * 1e-9;
  return t;
}

OpMarks::~OpMarks() {
  for (auto& m : marks_) cudaEventDestroy(m.second);
}

void OpMarks::begin(cudaStream_t stream) {
  used_ = 0;
  mark("start", stream);
}

void OpMarks::mark(const char* op, cudaStream_t stream) {
  for (const std::string& name : left_out_)
    if (name == op) return;
  if (used_ == marks_.size()) {
    cudaEvent_t e{};
    DSLAB_CUDA(cudaEventCreate(&e));
    marks_.push_back({op, e});
  }
  marks_[used_].first = op;
  DSLAB_CUDA(cudaEventRecord(marks_[used_++].second, stream));
}

std::map<std::string, double> OpMarks::elapsed_us() const {
  std::map<std::string, double> us;
  for (size_t m = 1; m < used_; ++m) {
    float ms = 0;
    DSLAB_CUDA(cudaEventElapsedTime(&ms, marks_[m - 1].second, marks_[m].second));
    us[marks_[m].first] += double(ms) * 1e3;
  }
  return us;
}

std::map<std::string, double> time_ops(const std::function<void(OpMarks&)>& step, int steps, double occupy_s) {
  OpMarks marks;
  std::map<std::string, std::vector<double>> us;
  for (int i = 0; i < steps; ++i) {
    flush_l2();
    occupy_stream(occupy_s);
    marks.begin(0);
    step(marks);
    DSLAB_CUDA(cudaDeviceSynchronize());
    for (const auto& [op, t] : marks.elapsed_us()) us[op].push_back(t);
  }
  std::map<std::string, double> medians;
  for (auto& [op, v] : us) {
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    medians["op_us." + op] = v[v.size() / 2];
  }
  return medians;
}

double time_seconds(const std::function<void()>& fn, bool flush) {
  static Events events;
  if (flush) flush_l2();
  return events.seconds(fn);
}

double fastest_seconds(const std::function<void()>& fn, int runs) {
  time_seconds(fn, /*flush_l2=*/true);  // warm-up
  double fastest = 0;
  for (int run = 0; run < runs; ++run) {
    const double s = time_seconds(fn, /*flush_l2=*/true);
    fastest = run == 0 ? s : std::min(fastest, s);
  }
  return fastest;
}

nlohmann::json calibrate() {
  if (!gpu_info().present) return nullptr;
  nlohmann::json out;
  Events ev;
  // Each try after a short idle: the host's clock (which launch and copy latencies follow) recovers between tries,
  // so the best of them is the same from one calibration to the next.
  auto best_of = [](int n, auto&& once) {
    double best = 1e30;
    for (int i = 0; i < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      best = std::min(best, once());
    }
    return best;
  };
  {  // HBM: device-to-device copy of 2 GiB, counting bytes read plus written.
    const size_t bytes = size_t(2) << 30;
    void *a = nullptr, *b = nullptr;
    DSLAB_CUDA(cudaMalloc(&a, bytes));
    DSLAB_CUDA(cudaMalloc(&b, bytes));
    DSLAB_CUDA(cudaMemset(a, 1, bytes));
    DSLAB_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    const double copy_s = best_of(
        10, [&] { return ev.seconds([&] { DSLAB_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }); });
    // ... and a read-only stream of the same 2 GiB (4 CTAs of 512 threads an SM), the faster of the two the ceiling.
    const double read_s = best_of(10, [&] {
      return ev.seconds([&] {
        read_kernel<true><<<unsigned(4 * gpu_info().sms), 512>>>(static_cast<const uint4*>(a), bytes / 16,
                                                                 static_cast<uint32_t*>(b));
        DSLAB_CHECK_LAUNCH();
      });
    });
    out["hbm_copy_bytes_per_s"] = 2.0 * double(bytes) / copy_s;
    out["hbm_read_bytes_per_s"] = double(bytes) / read_s;
    out["hbm_bytes_per_s"] =
        std::max(out["hbm_copy_bytes_per_s"].get<double>(), out["hbm_read_bytes_per_s"].get<double>());
    out["hbm_how"] =
        "the faster of cudaMemcpyAsync device-to-device of 2 GiB, (read+write bytes)/time, and a read-only stream of "
        "the same "
        "2 GiB (16-byte streaming loads), bytes/time; each best of 10, CUDA events";
    DSLAB_CUDA(cudaFree(a));
    DSLAB_CUDA(cudaFree(b));
  }
  {  // Tensor cores: cuBLAS bf16 GEMM with fp32 accumulation, 8192^3, random-ish (non-zero) operands.
    const int n = 8192;
    const size_t elems = size_t(n) * n;
    std::vector<__nv_bfloat16> host(elems);
    for (size_t i = 0; i < elems; ++i) host[i] = __float2bfloat16(float(int((i * 2654435761u) >> 20) % 17 - 8) / 8.0f);
    __nv_bfloat16 *A, *B, *C;
    DSLAB_CUDA(cudaMalloc(&A, elems * 2));
    DSLAB_CUDA(cudaMalloc(&B, elems * 2));
    DSLAB_CUDA(cudaMalloc(&C, elems * 2));
    DSLAB_CUDA(cudaMemcpy(A, host.data(), elems * 2, cudaMemcpyHostToDevice));
    DSLAB_CUDA(cudaMemcpy(B, host.data(), elems * 2, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    DSLAB_CUBLAS(cublasCreate(&h));
    const float alpha = 1, beta = 0;
    auto gemm = [&] {
      DSLAB_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n,
                                &beta, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    gemm();
    DSLAB_CUDA(cudaDeviceSynchronize());
    const double s = best_of(10, [&] { return ev.seconds(gemm); });
    out["tensor_bf16_flops"] = 2.0 * double(n) * n * n / s;
    out["tensor_bf16_how"] = "cublasGemmEx bf16 in/out, fp32 compute, 8192^3, best of 10, CUDA events";
    // Decode-sized GEMMs (one row) stream their weights below a copy's rate (each launch ramps up and drains): eight
    // 2048 x 4096 weights (16 MiB each, 128 MiB in all: more than L2 holds) one after another, weight bytes over time.
    {
      const int64_t rows = 4096, cols = 2048, count = 8;
      __nv_bfloat16* y = C;  // (the big GEMM's output is scratch here; A's first elements serve as the input row)
      auto gemvs = [&] {
        for (int64_t i = 0; i < count; ++i)
          DSLAB_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), 1, int(cols), &alpha, B + i * rows * cols,
                                    CUDA_R_16BF, int(cols), A, CUDA_R_16BF, int(cols), &beta, y, CUDA_R_16BF, int(rows),
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      gemvs();
      DSLAB_CUDA(cudaDeviceSynchronize());
      // In a CUDA graph, as a decode step runs them: launched one by one, the host's launch gaps (which vary with
      // the host) would sit between the GEMMs and in the number.
      void* workspace = nullptr;
      const size_t workspace_bytes = size_t(32) << 20;
      DSLAB_CUDA(cudaMalloc(&workspace, workspace_bytes));
      DSLAB_CUBLAS(cublasSetWorkspace(h, workspace, workspace_bytes));
      cudaStream_t capture{};
      DSLAB_CUDA(cudaStreamCreate(&capture));
      DSLAB_CUBLAS(cublasSetStream(h, capture));
      cudaGraph_t graph{};
      cudaGraphExec_t exec{};
      DSLAB_CUDA(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal));
      gemvs();
      DSLAB_CUDA(cudaStreamEndCapture(capture, &graph));
      DSLAB_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      DSLAB_CUDA(cudaGraphDestroy(graph));
      DSLAB_CUBLAS(cublasSetStream(h, 0));
      const int replays = 5;
      DSLAB_CUDA(cudaGraphLaunch(exec, 0));
      const double g = best_of(10, [&] {
        return ev.seconds([&] {
          for (int i = 0; i < replays; ++i) DSLAB_CUDA(cudaGraphLaunch(exec, 0));
        });
      });
      DSLAB_CUDA(cudaGraphExecDestroy(exec));
      DSLAB_CUDA(cudaStreamDestroy(capture));
      DSLAB_CUDA(cudaDeviceSynchronize());
      DSLAB_CUDA(cudaFree(workspace));
      out["gemv_bytes_per_s"] = double(replays * count * rows * cols * 2) / g;
      out["gemv_how"] =
          "cublasGemmEx bf16, one row times eight 4096 x 2048 weights in turn (128 MiB) in a CUDA graph, 5 replays, "
          "weight bytes / time, best of 10";
    }
    cublasDestroy(h);
    DSLAB_CUDA(cudaFree(A));
    DSLAB_CUDA(cudaFree(B));
    DSLAB_CUDA(cudaFree(C));
  }
  {  // Launch overhead: back-to-back empty kernels.
    const int launches = 2000;
    empty_kernel<<<1, 1>>>();
    DSLAB_CHECK_LAUNCH();
    const double s = best_of(20, [&] {
      return ev.seconds([&] {
        for (int i = 0; i < launches; ++i) empty_kernel<<<1, 1>>>();
        DSLAB_CHECK_LAUNCH();
      });
    });
    out["launch_overhead_s"] = s / launches;
    out["launch_how"] = "2000 back-to-back empty <<<1,1>>> launches on one stream, time/2000, best of 20";
  }
  {  // Host <-> device over the link, from pinned memory (what a hybrid layer's hidden states cross).
    const size_t bytes = size_t(1) << 30;
    void *host = nullptr, *dev = nullptr;
    DSLAB_CUDA(cudaMallocHost(&host, bytes));
    DSLAB_CUDA(cudaMalloc(&dev, bytes));
    std::memset(host, 1, bytes);
    DSLAB_CUDA(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    const double h2d = best_of(
        5, [&] { return ev.seconds([&] { DSLAB_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice)); }); });
    const double d2h = best_of(
        5, [&] { return ev.seconds([&] { DSLAB_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost)); }); });
    out["h2d_pinned_bytes_per_s"] = double(bytes) / h2d;
    out["d2h_pinned_bytes_per_s"] = double(bytes) / d2h;
    out["link_how"] =
        "cudaMemcpyAsync of 1 GiB between pinned host memory and the device, each way, best of 5, CUDA events";
    // A small transfer's fixed cost (a decode step's hidden states are a few KB).
    const double small = best_of(
        50, [&] { return ev.seconds([&] { DSLAB_CUDA(cudaMemcpyAsync(dev, host, 4096, cudaMemcpyHostToDevice)); }); });
    out["h2d_4k_s"] = small;
    out["h2d_4k_how"] = "cudaMemcpyAsync of 4 KB from pinned host memory, best of 50, CUDA events";
    DSLAB_CUDA(cudaFreeHost(host));
    DSLAB_CUDA(cudaFree(dev));
  }
  {  // CUDA graphs: the cost of launching one, and of each kernel node inside it.
    cudaStream_t stream{};
    DSLAB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto graph_of = [&](int kernels) {
      cudaGraph_t g{};
      cudaGraphExec_t exec{};
      DSLAB_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kernels; ++i) empty_kernel<<<1, 1, 0, stream>>>();
      DSLAB_CUDA(cudaStreamEndCapture(stream, &g));
      DSLAB_CUDA(cudaGraphInstantiate(&exec, g, 0));
      DSLAB_CUDA(cudaGraphDestroy(g));
      return exec;
    };
    cudaGraphExec_t one = graph_of(1), hundred = graph_of(100);
    const int launches = 1000;
    DSLAB_CUDA(cudaGraphLaunch(one, 0));
    DSLAB_CUDA(cudaGraphLaunch(hundred, 0));
    const double s1 = best_of(20, [&] {
      return ev.seconds([&] {
        for (int i = 0; i < launches; ++i) DSLAB_CUDA(cudaGraphLaunch(one, 0));
      });
    });
    const double s100 = best_of(20, [&] { return ev.seconds([&] { DSLAB_CUDA(cudaGraphLaunch(hundred, 0)); }); });
    out["graph_launch_overhead_s"] = s1 / launches;
    out["graph_kernel_node_s"] = s100 / 100;
    out["graph_how"] =
        "1000 back-to-back launches of a one-empty-kernel graph (per launch); one launch of a graph of 100 empty "
        "kernels (per node); best of 20";
    DSLAB_CUDA(cudaGraphExecDestroy(one));
    DSLAB_CUDA(cudaGraphExecDestroy(hundred));
    // 100 small kernels in a graph, each reading 16 KB at its own place in a buffer larger than L2 (a new place
    // each launch), so each pays a launch in the graph, an HBM round trip, a block reduction and a store.
    const size_t span = size_t(1) << 20, buffer = 100 * span * 4;  // 100 kernels x 4 graphs, 1 MiB apart
    uint4* src = nullptr;
    float* dst = nullptr;
    DSLAB_CUDA(cudaMalloc(&src, buffer));
    DSLAB_CUDA(cudaMalloc(&dst, sizeof(float)));
    DSLAB_CUDA(cudaMemset(src, 1, buffer));
    std::vector<cudaGraphExec_t> smalls;
    for (int round = 0; round < 4; ++round) {
      cudaGraph_t g{};
      cudaGraphExec_t exec{};
      DSLAB_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < 100; ++i) {
        small_kernel<<<1, 256, 0, stream>>>(src + (size_t(round) * 100 + size_t(i)) * span / sizeof(uint4), dst);
        DSLAB_CHECK_LAUNCH();
      }
      DSLAB_CUDA(cudaStreamEndCapture(stream, &g));
      DSLAB_CUDA(cudaGraphInstantiate(&exec, g, 0));
      DSLAB_CUDA(cudaGraphDestroy(g));
      smalls.push_back(exec);
    }
    double best = 1e30;
    for (cudaGraphExec_t exec : smalls) {  // each graph once, its 16 KB reads not yet in L2
      flush_l2();
      best = std::min(best, ev.seconds([&] { DSLAB_CUDA(cudaGraphLaunch(exec, 0)); }));
      DSLAB_CUDA(cudaGraphExecDestroy(exec));
    }
    out["small_kernel_s"] = best / 100;
    {  // A host round trip in the stream, as a hybrid step makes one per MoE layer: a kernel, then a host function that
       // wakes the CPU's worker team (all cores but one), then the next kernel; per round trip, best of 20 x 50.
      const int threads = std::max(1, cpu_info().logical_cpus - 1);
      struct Arg {
        int threads;
      } arg{threads};
      auto host = [](void* a) { parallel_noop(static_cast<Arg*>(a)->threads); };
      double best_trip = 1e30;
      for (int rep = 0; rep < 20; ++rep) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        best_trip = std::min(best_trip, ev.seconds([&] {
          for (int i = 0; i < 50; ++i) {
            empty_kernel<<<1, 1>>>();
            DSLAB_CHECK_LAUNCH();
            DSLAB_CUDA(cudaLaunchHostFunc(0, host, &arg));
          }
        }) / 50);
      }
      out["host_roundtrip_s"] = best_trip;
      out["host_roundtrip_how"] =
          "kernel, then a host function running an empty OpenMP region on all cores but one, 50 in a stream; per pair, "
          "best of 20";
    }
    out["small_kernel_how"] =
        "a graph of 100 one-block kernels, each reading 16 KB not in L2, reducing it and storing a value; per kernel, "
        "best of 4";
    DSLAB_CUDA(cudaFree(src));
    DSLAB_CUDA(cudaFree(dst));
    DSLAB_CUDA(cudaStreamDestroy(stream));
  }
  return out;
}

}  // namespace gpu
}  // namespace dslab
