// A registry of ops by name: the implementations a composite (a layer) can pick by an axis. Each family keeps
// one (OpRegistry<MlaOp>, OpRegistry<MoeOp>), filled by static registrations next to the ops' definitions, as
// variants fill the variant registry.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/variant.h"

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

// Registers op `name` in its family's registry and, under the same name, the family variant that times it alone
// (FamilyVariant(name) makes the op by that name): one line next to an op's definition makes both.
template <class Op, class FamilyVariant>
bool register_op_and_variant(const char* name, const char* summary, typename OpRegistry<Op>::Factory make) {
  OpRegistry<Op>::instance().add(name, make);
  const std::string n = name;
  return register_variant({n, Device::cuda, summary, [n] { return std::unique_ptr<Variant>(new FamilyVariant(n)); }});
}

}  // namespace dslab
