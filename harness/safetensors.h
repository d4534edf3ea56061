// --dump: a point's weights, inputs and outputs as a safetensors file, so a PyTorch user can cross-check
// a variant in a few lines (safetensors.torch.load_file).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "harness/variant.h"

namespace dslab {
void write_safetensors(const std::string& path, const std::vector<DumpTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);
}
