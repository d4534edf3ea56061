// A registry of ops by name: the implementations a composite (a layer) can pick by an axis. Each family keeps
// one (OpRegistry<MlaOp>, OpRegistry<MoeOp>), filled by static registrations next to the ops' definitions, as
// variants fill the variant registry.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dslab {

template <class Op>
class OpRegistry {
 public:
  using Factory = std::unique_ptr<Op> (*)();
  static OpRegistry& instance() {
    static OpRegistry registry;
    return registry;
  }
  void add(const std::string& name, Factory make) { ops_[name] = make; }
  std::unique_ptr<Op> make(const std::string& name) const {  // nullptr if unknown
    const auto it = ops_.find(name);
    return it == ops_.end() ? nullptr : it->second();
  }
  std::vector<std::string> names() const {  // sorted
    std::vector<std::string> out;
    for (const auto& entry : ops_) out.push_back(entry.first);
    return out;
  }

 private:
  std::map<std::string, Factory> ops_;
};

}  // namespace dslab
