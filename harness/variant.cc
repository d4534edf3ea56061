#include "harness/variant.h"

#include <algorithm>
#include <stdexcept>

#include "harness/host.h"

namespace dslab {

Support gpu_fits(double bytes) {
  const GpuInfo& g = gpu_info();
  if (!g.present) return Support::no(g.why_absent);
  if (bytes > 0.85 * double(g.memory_bytes))
    return Support::no("needs ~" + std::to_string(int64_t(bytes / double(1 << 30))) + " GiB of GPU memory, " + g.name +
                       " has " + std::to_string(int64_t(double(g.memory_bytes) / double(1 << 30))) + " GiB");
  return {};
}
namespace {
std::vector<VariantEntry>& registry() {
  static std::vector<VariantEntry> entries;  // function-local: safe from static-initialisation order
  return entries;
}
}  // namespace

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

bool register_variant(VariantEntry entry) {
  auto& r = registry();
  if (find_variant(entry.name)) throw std::logic_error("variant registered twice: " + entry.name);
  r.push_back(std::move(entry));
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return true;
}

const std::vector<VariantEntry>& registered_variants() { return registry(); }

const VariantEntry* find_variant(const std::string& name) {
  for (const auto& e : registry())
    if (e.name == name) return &e;
  return nullptr;
}

}  // namespace dslab
