// collectives::measure on the GPUs (see collectives.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/collectives.h"
#include "harness/cuda_check.h"
#include "harness/nccl.h"

namespace dslab::collectives {

namespace {

__global__ void fill_kernel(float* x, size_t n, float value) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

// One GPU's part: its communicator, stream, send buffer (every value rank + 1) and receive buffer.
struct Rank {
  int device = 0;
  nccl::Comm comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  float *send = nullptr, *recv = nullptr;
};

class Ranks {
 public:
  Ranks(const nccl::Api& api, int gpus, size_t max_floats) : api_(api), ranks_(static_cast<size_t>(gpus)) {
    std::vector<int> devices(static_cast<size_t>(gpus));
    std::iota(devices.begin(), devices.end(), 0);
    std::vector<nccl::Comm> comms(static_cast<size_t>(gpus));
    nccl::check(api_, api_.CommInitAll(comms.data(), gpus, devices.data()), "CommInitAll");
    for (int r = 0; r < gpus; ++r) {
      Rank& k = ranks_[size_t(r)];
      k.device = r, k.comm = comms[size_t(r)];
      DSLAB_CUDA(cudaSetDevice(r));
      DSLAB_CUDA(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
      DSLAB_CUDA(cudaEventCreate(&k.start));
      DSLAB_CUDA(cudaEventCreate(&k.stop));
      DSLAB_CUDA(cudaMalloc(&k.send, max_floats * 4));
      DSLAB_CUDA(cudaMalloc(&k.recv, max_floats * 4));
      fill_kernel<<<1024, 256, 0, k.stream>>>(k.send, max_floats, float(r + 1));
      DSLAB_CHECK_LAUNCH();
    }
    sync();
  }
  ~Ranks() {
    for (Rank& k : ranks_) {
      cudaSetDevice(k.device);
      cudaFree(k.send), cudaFree(k.recv);
      cudaEventDestroy(k.start), cudaEventDestroy(k.stop);
      cudaStreamDestroy(k.stream);
      if (k.comm) api_.CommDestroy(k.comm);
    }
    cudaSetDevice(0);
  }
  void sync() const {
    for (const Rank& k : ranks_) {
      DSLAB_CUDA(cudaSetDevice(k.device));
      DSLAB_CUDA(cudaStreamSynchronize(k.stream));
    }
  }
  // One collective of `floats` values of the whole tensor (collectives.h's bytes / 4) on every GPU, as one group.
  void run(const std::string& kind, size_t floats) const {
    const size_t n = ranks_.size(), share = floats / n, per_peer = floats / (n * n);
    nccl::check(api_, api_.GroupStart(), "GroupStart");
    for (size_t r = 0; r < n; ++r) {
      const Rank& k = ranks_[r];
      void* s = k.stream;
      if (kind == "all_reduce") {
        nccl::check(api_, api_.AllReduce(k.send, k.recv, floats, nccl::kFloat32, nccl::kSum, k.comm, s), "AllReduce");
      } else if (kind == "all_gather") {
        nccl::check(api_, api_.AllGather(k.send, k.recv, share, nccl::kFloat32, k.comm, s), "AllGather");
      } else if (kind == "reduce_scatter") {
        nccl::check(api_, api_.ReduceScatter(k.send, k.recv, share, nccl::kFloat32, nccl::kSum, k.comm, s),
                    "ReduceScatter");
      } else {  // all_to_all: per_peer values to each GPU, itself included
        for (size_t p = 0; p < n; ++p) {
          nccl::check(api_, api_.Send(k.send + p * per_peer, per_peer, nccl::kFloat32, int(p), k.comm, s), "Send");
          nccl::check(api_, api_.Recv(k.recv + p * per_peer, per_peer, nccl::kFloat32, int(p), k.comm, s), "Recv");
        }
      }
    }
    nccl::check(api_, api_.GroupEnd(), "GroupEnd");
  }
  // Seconds one collective takes: `iterations` back to back on every GPU, the slowest GPU's events.
  double time(const std::string& kind, size_t floats, int iterations) const {
    for (int warm = 0; warm < 2; ++warm) run(kind, floats);
    sync();
    for (const Rank& k : ranks_) {
      DSLAB_CUDA(cudaSetDevice(k.device));
      DSLAB_CUDA(cudaEventRecord(k.start, k.stream));
    }
    for (int i = 0; i < iterations; ++i) run(kind, floats);
    for (const Rank& k : ranks_) {
      DSLAB_CUDA(cudaSetDevice(k.device));
      DSLAB_CUDA(cudaEventRecord(k.stop, k.stream));
    }
    sync();
    double slowest = 0;
    for (const Rank& k : ranks_) {
      float ms = 0;
      DSLAB_CUDA(cudaEventElapsedTime(&ms, k.start, k.stop));
      slowest = std::max(slowest, double(ms) * 1e-3 / iterations);
    }
    return slowest;
  }
  // Every GPU's result of run(kind, floats) against the host's: each GPU sent rank + 1 everywhere.
  void check(const std::string& kind, size_t floats) const {
    run(kind, floats);
    sync();
    const size_t n = ranks_.size(), share = floats / n, per_peer = floats / (n * n);
    const size_t count = kind == "all_reduce" || kind == "all_gather" ? floats : share;
    const float total = float(n * (n + 1) / 2);
    std::vector<float> got(count);
    for (size_t r = 0; r < n; ++r) {
      DSLAB_CUDA(cudaSetDevice(int(r)));
      DSLAB_CUDA(cudaMemcpy(got.data(), ranks_[r].recv, count * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < count; ++i) {
        const float want = kind == "all_gather"   ? float(i / share + 1)
                           : kind == "all_to_all" ? float(i / per_peer + 1)
                                                  : total;
        if (got[i] != want)
          throw std::runtime_error("NCCL " + kind + " of " + std::to_string(floats * 4) + " bytes on GPU " +
                                   std::to_string(r) + ": value " + std::to_string(i) + " is " +
                                   std::to_string(got[i]) + ", expected " + std::to_string(want));
      }
    }
  }

 private:
  const nccl::Api& api_;
  std::vector<Rank> ranks_;
};

}  // namespace

nlohmann::json measure(int gpus, const std::vector<double>& sizes) {
  std::string why;
  const nccl::Api* api = nccl::api(&why);
  if (!api) throw std::runtime_error(why);
  int visible = 0;
  DSLAB_CUDA(cudaGetDeviceCount(&visible));
  if (gpus < 1 || gpus > visible)
    throw std::runtime_error("collectives over " + std::to_string(gpus) + " GPUs: " + std::to_string(visible) +
                             " visible");
  if (sizes.empty()) throw std::invalid_argument("collectives: no message sizes");
  // Values a size: a multiple of gpus^2, so every GPU's share and every peer's part of an all-to-all are whole.
  const size_t quantum = size_t(gpus) * size_t(gpus);
  auto floats_of = [&](double bytes) { return std::max(quantum, size_t(bytes / 4) / quantum * quantum); };
  const size_t max_floats = floats_of(*std::max_element(sizes.begin(), sizes.end()));
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast stays off on the lent machines (read at communicator init)
  const Ranks ranks(*api, gpus, max_floats);
  nlohmann::json points = nlohmann::json::array(), fits = nlohmann::json::object();
  for (const std::string& kind : kinds()) {
    std::vector<Point> measured;
    for (const double size : sizes) {
      const size_t floats = floats_of(size);
      const double bytes = double(floats) * 4;
      const int iterations = bytes <= (1 << 20) ? 50 : bytes <= (32 << 20) ? 10 : 4;
      const double seconds = ranks.time(kind, floats, iterations);
      measured.push_back({kind, bytes, seconds});
      nlohmann::json p{{"kind", kind}, {"bytes", bytes}, {"seconds", seconds}};
      if (gpus > 1) p["bus_bytes_per_s"] = bytes * bus_factor(kind, gpus) / seconds;
      points.push_back(p);
    }
    ranks.check(kind, floats_of(*std::min_element(sizes.begin(), sizes.end())));
    ranks.check(kind, max_floats);
    if (gpus > 1 && sizes.size() > 1) {
      const Fit f = fit(measured, gpus);
      fits[kind] = {{"latency_s", f.latency_s}, {"bus_bytes_per_s", f.bus_bytes_per_s}};
    }
  }
  nlohmann::json out{{"gpus", gpus},
                     {"nccl", api->version_text()},
                     {"library", api->library},
                     {"how",
                      "fp32 tensors from 8 KiB, one communicator a GPU in one process, each size's collective "
                      "back to back (4-50 times after 2 warm-ups), the slowest GPU's CUDA events; results "
                      "checked at the smallest and largest size; NVLink multicast off (NCCL_NVLS_ENABLE=0)"},
                     {"points", points}};
  if (!fits.empty()) out["fit"] = fits;
  return out;
}

}  // namespace dslab::collectives
