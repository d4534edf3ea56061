// A Hugging Face checkpoint folder as DeepSeek's are published: config.json, model.safetensors.index.json (or a
// single model.safetensors) and its shards. Shards are mapped read-only; a tensor is read by name and converted to
// what the caller holds (bf16, or fp32 for the router's bias): bf16, f16 and f32 as stored; e4m3 (DeepSeek-V3 / R1)
// dequantised with its weight_scale_inv, one fp32 scale per 128 x 128 block. Anything wrong - a missing or
// malformed file, a tensor missing or of the wrong shape or dtype, a shard shorter than its header says - is
// BadInput naming the file and the tensor, thrown before the caller holds any of it.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "variants/common/bf16.h"
#include "variants/common/model_config.h"

namespace dslab {

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);  // reads config.json, the index and every shard's header
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // The tensor `name`, which must have exactly `shape`, as bf16 (fp8 dequantised by its block scales).
  std::vector<bf16> bf16_tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  // The same into `out` (the tensor's element count of them). Safe to call from several threads at once.
  void read_bf16(const std::string& name, const std::vector<int64_t>& shape, bf16* out) const;
  std::vector<float> f32_tensor(const std::string& name, const std::vector<int64_t>& shape) const;
  // Bytes of tensor data read so far (for a load rate) and the stored dtype of a tensor ("BF16", "F8_E4M3", ...).
  double bytes_read() const { return double(bytes_read_.load()); }
  std::string dtype_of(const std::string& name) const;
  bool quantised_fp8() const { return fp8_block_ > 0; }
  // One line on stderr: what was read, how many bytes, in how long, at what rate (the load rate of a run).
  void report_load(const std::string& what, std::chrono::steady_clock::duration took) const;

 private:
  struct Shard;
  struct Tensor {
    const Shard* shard = nullptr;
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets in the shard's data section
  };
  const Tensor& find(const std::string& name, const std::vector<int64_t>& shape) const;
  const uint8_t* data(const Tensor& t) const;
  std::vector<float> values(const std::string& name, const std::vector<int64_t>& shape) const;

  std::string dir_;
  ModelConfig config_;
  int64_t fp8_block_ = 0;  // quantization_config.weight_block_size (128) where the weights are fp8
  std::vector<std::unique_ptr<Shard>> shards_;
  std::map<std::string, Tensor> tensors_;
  mutable std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace dslab
