// Counter-based random numbers: element i of tensor `name` under `seed` is a pure function of the three,
// so every backend (and every thread) rebuilds bit-identical tensors without sharing generator state.
#pragma once
#include <cstdint>
#include <string_view>

#ifdef __CUDACC__
#define DSLAB_HOST_DEVICE __host__ __device__
#else
#define DSLAB_HOST_DEVICE
#endif

namespace dslab {

// The GPU fills its caches with the same generator (see variants/mla/cuda), so these two run on both sides.
DSLAB_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t stream_id(uint64_t seed, std::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name, mixed with the seed
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return splitmix64(h ^ splitmix64(seed));
}

// Uniform in [-1, 1).
DSLAB_HOST_DEVICE inline float uniform_pm1(uint64_t stream, uint64_t i) {
  return float(int64_t(splitmix64(stream + i * 0x632be59bd9b4e019ull) >> 40) - (1ll << 23)) * (1.0f / (1 << 23));
}

}  // namespace dslab
