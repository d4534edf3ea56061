#include "harness/safetensors.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace dslab {

void write_safetensors(const std::string& path, const std::vector<DumpTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes with spaces
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw std::runtime_error(path + ": cannot write safetensors file");
    const uint64_t n = text.size();  // little-endian u64 header length (x86)
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(text.data(), std::streamsize(text.size()));
    for (const auto& t : tensors) f.write(static_cast<const char*>(t.data), std::streamsize(t.nbytes));
    if (!f) throw std::runtime_error(path + ": write failed");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace dslab
