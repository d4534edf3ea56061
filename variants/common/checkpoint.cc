#include "variants/common/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/errors.h"

namespace dslab {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw BadInput(path + ": cannot open (expected a Hugging Face checkpoint folder's file)");
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw BadInput(path + ": malformed JSON (" + std::string(e.what()) + ")");
  }
}

size_t element_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "F8_E4M3") return 1;
  return 0;  // a dtype dslab does not read (the caller says so, naming the tensor)
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(float(man), -24);
  uint32_t u = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, 0x7f / 0xff NaN.
float e4m3_to_float(uint8_t v) {
  const float sign = v & 0x80 ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 15 && man == 7) return NAN;
  return exp == 0 ? sign * std::ldexp(float(man), -9) : sign * std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
}

// One stored element to float, by dtype.
using Decode = float (*)(const uint8_t*);
float decode_f32(const uint8_t* q) {
  float f;
  std::memcpy(&f, q, 4);
  return f;
}
float decode_bf16(const uint8_t* q) {
  uint16_t h;
  std::memcpy(&h, q, 2);
  return to_float(bf16{h});
}
float decode_f16(const uint8_t* q) {
  uint16_t h;
  std::memcpy(&h, q, 2);
  return f16_to_float(h);
}
float decode_e4m3(const uint8_t* q) { return e4m3_to_float(*q); }

}  // namespace

// One mapped shard: the header's length, its tensors' data after it.
struct Checkpoint::Shard {
  std::string path;
  const uint8_t* map = nullptr;
  size_t size = 0;
  uint64_t data_begin = 0;
  ~Shard() {
    if (map) munmap(const_cast<uint8_t*>(map), size);
  }
};

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw BadInput(dir + ": not a folder (expected a Hugging Face checkpoint folder)");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const nlohmann::json config = read_json(config_path);
  config_ = parse_model_config(config, fs::path(dir).filename().string(), config_path);
  if (config.contains("quantization_config") && !config.at("quantization_config").is_null()) {
    const auto& q = config.at("quantization_config");
    const bool fp8 = q.is_object() && q.value("quant_method", "") == "fp8" && q.contains("weight_block_size") &&
                     q.at("weight_block_size") == nlohmann::json::array({128, 128});
    if (!fp8)
      throw bad_field(config_path, "quantization_config", q.dump(),
                      "fp8 with weight_block_size [128, 128] (DeepSeek-V3's), or none");
    fp8_block_ = 128;
  }
  // Which shard holds which tensor: the index, or the one file.
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(index_path)) {
    const nlohmann::json index = read_json(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object())
      throw BadInput(index_path + ": field 'weight_map': missing or not an object (expected tensor name -> shard)");
    for (const auto& [name, shard] : index.at("weight_map").items()) {
      if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos)
        throw bad_field(index_path, "weight_map." + name, shard.dump(), "a shard file name in this folder");
      weight_map[name] = shard.get<std::string>();
    }
  } else if (!fs::exists(fs::path(dir) / "model.safetensors")) {
    throw BadInput(dir + ": no model.safetensors.index.json or model.safetensors (expected a Hugging Face checkpoint)");
  }
  std::map<std::string, Shard*> by_file;
  auto open_shard = [&](const std::string& file) -> Shard* {
    if (const auto it = by_file.find(file); it != by_file.end()) return it->second;
    auto s = std::make_unique<Shard>();
    s->path = (fs::path(dir) / file).string();
    const int fd = ::open(s->path.c_str(), O_RDONLY);
    if (fd < 0) throw BadInput(s->path + ": cannot open (named by " + index_path + ")");
    struct stat st {};
    ::fstat(fd, &st);
    s->size = size_t(st.st_size);
    if (s->size < 8) {
      ::close(fd);
      throw BadInput(s->path + ": " + std::to_string(s->size) + " bytes: expected a safetensors file (truncated?)");
    }
    void* map = ::mmap(nullptr, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) throw BadInput(s->path + ": cannot be mapped");
    s->map = static_cast<const uint8_t*>(map);
    uint64_t header_len = 0;
    std::memcpy(&header_len, s->map, 8);
    if (header_len > s->size - 8)
      throw BadInput(s->path + ": header of " + std::to_string(header_len) + " bytes, the file has " +
                     std::to_string(s->size) + ": expected a whole safetensors file (truncated?)");
    s->data_begin = 8 + header_len;
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(s->map + 8, s->map + 8 + header_len);
    } catch (const nlohmann::json::exception& e) {
      throw BadInput(s->path + ": malformed safetensors header (" + std::string(e.what()) + ")");
    }
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") continue;
      Tensor t;
      t.shard = s.get();
      try {
        t.dtype = v.at("dtype").get<std::string>();
        t.shape = v.at("shape").get<std::vector<int64_t>>();
        const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
        if (off.size() != 2 || off[1] < off[0]) throw std::runtime_error("data_offsets");
        t.begin = off[0], t.end = off[1];
      } catch (const std::exception&) {
        throw BadInput(s->path + ": tensor '" + name + "': malformed header entry " + v.dump());
      }
      if (s->data_begin + t.end > s->size)
        throw BadInput(s->path + ": tensor '" + name + "': data ends at byte " + std::to_string(s->data_begin + t.end) +
                       ", the file has " + std::to_string(s->size) + " (truncated shard?)");
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      const size_t eb = element_bytes(t.dtype);
      if (eb && uint64_t(n) * eb != t.end - t.begin)
        throw BadInput(s->path + ": tensor '" + name + "': " + std::to_string(t.end - t.begin) + " bytes for shape " +
                       shape_text(t.shape) + " of " + t.dtype);
      if (weight_map.empty() || weight_map.count(name)) tensors_[name] = t;
    }
    by_file[file] = s.get();
    shards_.push_back(std::move(s));
    return by_file[file];
  };
  if (weight_map.empty()) {
    open_shard("model.safetensors");
  } else {
    for (const auto& [name, file] : weight_map) {
      open_shard(file);
      if (!tensors_.count(name))
        throw BadInput(index_path + ": tensor '" + name + "': the index puts it in " + file +
                       ", whose header does not have it");
    }
  }
}

Checkpoint::~Checkpoint() = default;

std::string Checkpoint::dtype_of(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? "" : it->second.dtype;
}

const Checkpoint::Tensor& Checkpoint::find(const std::string& name, const std::vector<int64_t>& shape) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw BadInput(dir_ + ": tensor '" + name + "': not in the checkpoint (expected by a " +
                   std::to_string(config_.num_hidden_layers) + "-layer model of this config)");
  if (it->second.shape != shape)
    throw BadInput(it->second.shard->path + ": tensor '" + name + "': shape " + shape_text(it->second.shape) +
                   ": expected " + shape_text(shape) + " (from " + dir_ + "/config.json)");
  if (!element_bytes(it->second.dtype))
    throw BadInput(it->second.shard->path + ": tensor '" + name + "': dtype " + it->second.dtype +
                   ": expected BF16, F16, F32 or F8_E4M3");
  return it->second;
}

const uint8_t* Checkpoint::data(const Tensor& t) const { return t.shard->map + t.shard->data_begin + t.begin; }

std::vector<float> Checkpoint::values(const std::string& name, const std::vector<int64_t>& shape) const {
  const Tensor& t = find(name, shape);
  const size_t n = (t.end - t.begin) / element_bytes(t.dtype);
  const uint8_t* p = data(t);
  // Each element's decoding, chosen once for the tensor (not per element).
  const Decode decode = t.dtype == "F32"    ? decode_f32
                        : t.dtype == "BF16" ? decode_bf16
                        : t.dtype == "F16"  ? decode_f16
                                            : decode_e4m3;
  const size_t stride = element_bytes(t.dtype);
  std::vector<float> out(n);
#pragma omp parallel for schedule(static) if (n > (1u << 20))
  for (size_t i = 0; i < n; ++i) out[i] = decode(p + stride * i);
  bytes_read_ += t.end - t.begin;
  if (t.dtype == "F8_E4M3") {
    // w = e4m3 x weight_scale_inv of the weight's 128 x 128 block (DeepSeek-V3's fp8 layout).
    const std::string suffix = "weight";
    if (shape.size() != 2 || name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0 || !fp8_block_)
      throw BadInput(t.shard->path + ": tensor '" + name +
                     "': F8_E4M3 where the config has no fp8 quantization_config: expected BF16, F16 or F32");
    const std::string scale_name = name.substr(0, name.size() - suffix.size()) + "weight_scale_inv";
    const int64_t block = fp8_block_, rows = (shape[0] + block - 1) / block, cols = (shape[1] + block - 1) / block;
    const std::vector<float> scale = values(scale_name, {rows, cols});
    for (int64_t i = 0; i < shape[0]; ++i)
      for (int64_t j = 0; j < shape[1]; ++j)
        out[size_t(i * shape[1] + j)] *= scale[size_t((i / block) * cols + j / block)];
  }
  return out;
}

std::vector<bf16> Checkpoint::bf16_tensor(const std::string& name, const std::vector<int64_t>& shape) const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<bf16> out(size_t(std::max<int64_t>(n, 0)));
  read_bf16(name, shape, out.data());
  return out;
}

void Checkpoint::read_bf16(const std::string& name, const std::vector<int64_t>& shape, bf16* out) const {
  const Tensor& t = find(name, shape);
  if (t.dtype == "BF16") {  // as stored: a copy out of the mapping (the page cache or the disk's read-ahead)
    std::memcpy(out, data(t), t.end - t.begin);
    bytes_read_ += t.end - t.begin;
    return;
  }
  const std::vector<float> v = values(name, shape);
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
}

void Checkpoint::report_load(const std::string& what, std::chrono::steady_clock::duration took) const {
  const double s = std::chrono::duration<double>(took).count();
  std::fprintf(stderr, "weights: %s from %s: %.1f MB read in %.2f s (%.2f GB/s)%s\n", what.c_str(), dir_.c_str(),
               bytes_read() / 1e6, s, s > 0 ? bytes_read() / s / 1e9 : 0.0, fp8_block_ ? ", fp8 dequantised" : "");
}

std::vector<float> Checkpoint::f32_tensor(const std::string& name, const std::vector<int64_t>& shape) const {
  return values(name, shape);
}

}  // namespace dslab
