// Bad input is the user's to fix: one line naming the file/field/value and what was expected, exit status 2.
#pragma once
#include <stdexcept>
#include <string>

namespace dslab {

struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "where: field 'name': value V: expected E"
inline BadInput bad_field(const std::string& where, const std::string& field, const std::string& value,
                          const std::string& expected) {
  return BadInput(where + ": field '" + field + "': value " + value + ": expected " + expected);
}

}  // namespace dslab
