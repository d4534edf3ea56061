// Device memory for every GPU family: an owned allocation or a stretch of a per-step scratch arena.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "harness/cuda_check.h"

namespace dslab::gpu {

class ScratchArena;

// A device allocation, owned (resize) or a stretch of a ScratchArena (scratch: the arena owns it).
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) { resize(n); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_), owned_(o.owned_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(owned_, o.owned_);
    return *this;
  }
  ~DeviceArray() { release(); }
  void resize(size_t n) {
    release();
    n_ = n;
    if (n) DSLAB_CUDA(cudaMalloc(&p_, n * sizeof(T)));
  }
  // n elements of the op's forward()-only scratch: from the arena when one is given, else owned (resize).
  inline void scratch(ScratchArena* arena, size_t n);
  void zero() { fill_bytes(0); }
  void fill_bytes(uint8_t byte) {
    if (n_) DSLAB_CUDA(cudaMemset(p_, byte, n_ * sizeof(T)));
  }
  template <class U>
  void upload(const std::vector<U>& host) {
    static_assert(sizeof(U) == sizeof(T));
    resize(host.size());
    if (n_) DSLAB_CUDA(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (owned_) cudaFree(p_);
    p_ = nullptr, n_ = 0, owned_ = true;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
  bool owned_ = true;
};

// Scratch that lives only inside one op's forward(): ops that run one after another on one stream (a model's
// layers: attention, MoE, attention, ...) all take theirs from one arena, each from its start (rewind() before
// each op's prepare), so a step holds its largest op's scratch instead of every layer's. Sized up front by the
// formulas the planner counts (layer::gpu_step_arena_bytes): an op that takes more than they say throws, so a
// formula that falls behind the code is caught by the first run, not by an out-of-memory on a budget.
class ScratchArena {
 public:
  ScratchArena() = default;
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;
  ~ScratchArena() { cudaFree(base_); }
  void reserve(size_t bytes) {
    cudaFree(base_);
    base_ = nullptr, capacity_ = 0, used_ = 0, high_water_ = 0;
    if (bytes) DSLAB_CUDA(cudaMalloc(&base_, bytes));
    capacity_ = bytes;
  }
  void rewind() { used_ = 0; }
  void* take(size_t bytes) {
    const size_t start = (used_ + kAlign - 1) / kAlign * kAlign;
    if (start + bytes > capacity_)
      throw std::runtime_error("scratch arena: " + std::to_string(start + bytes) + " bytes taken of " +
                               std::to_string(capacity_) +
                               " reserved (the scratch formula in variants/*/ counts less than an op allocates)");
    used_ = start + bytes;
    high_water_ = std::max(high_water_, used_);
    return static_cast<char*>(base_) + start;
  }
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }  // the most any op took
  static constexpr size_t kAlign = 256;              // (cudaMalloc's alignment: vector loads and TMA need no less)

 private:
  void* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0;
};

template <class T>
void DeviceArray<T>::scratch(ScratchArena* arena, size_t n) {
  if (!arena) return resize(n);
  release();
  n_ = n;
  owned_ = false;
  if (n) p_ = static_cast<T*>(arena->take(n * sizeof(T)));
}

// The paged latent cache: token slot = page * page_size + offset; each slot holds [c_kv (kv_lora_rank) ‖ k_pe

}  // namespace dslab::gpu
