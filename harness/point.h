// Sweep axes and points. An axis has one spelling everywhere (JSON, --axis, results, plots).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dslab {

// A value on an axis: integer axes hold `integer`, text axes (len_dist, kv_dtype, routing) hold only `text`.
struct AxisValue {
  std::string text;
  int64_t integer = 0;
  bool is_integer = false;
  bool operator==(const AxisValue& o) const { return text == o.text; }
};

enum class AxisKind { positive_int, nonneg_int, text };

struct AxisInfo {
  std::string name;
  AxisKind kind;
  std::string help;
  std::vector<std::string> choices = {};  // a text axis's only values (empty: free text, checked by the variant)
};

// Every axis dslab knows; a name outside this table is bad input.
const std::vector<AxisInfo>& known_axes();
const AxisInfo* find_axis(const std::string& name);

// Parses one axis's values: "1,8,64", "pow2:9:14" (2^9 .. 2^14), "uniform,mixed". `where` names the source for errors.
std::vector<AxisValue> parse_axis_values(const std::string& axis, const std::string& spec, const std::string& where);

// One point of a sweep: a value for each axis the variant declares, in the variant's axis order.
class Point {
 public:
  void set(const std::string& axis, AxisValue v);
  bool has(const std::string& axis) const;
  int64_t integer(const std::string& axis) const;  // throws std::logic_error if absent (a variant bug, not user input)
  const std::string& text(const std::string& axis) const;
  const std::vector<std::pair<std::string, AxisValue>>& entries() const { return entries_; }
  // "batch:1/q_len:1/kv_len:4096"
  std::string label() const;

 private:
  std::vector<std::pair<std::string, AxisValue>> entries_;
  const AxisValue& get(const std::string& axis) const;
};

}  // namespace dslab
