#include "harness/command.h"

#include <algorithm>
#include <stdexcept>

#include "harness/errors.h"

namespace dslab {

namespace {
std::vector<Command>& commands() {
  static std::vector<Command> c;
  return c;
}
}  // namespace

bool register_command(Command c) {
  commands().push_back(std::move(c));
  return true;
}

const std::vector<Command>& registered_commands() { return commands(); }

std::vector<std::string> Args::all(const std::string& k) const {
  std::vector<std::string> v;
  for (auto [it, end] = options.equal_range(k); it != end; ++it) v.push_back(it->second);
  return v;
}

std::string Args::one(const std::string& k, const std::string& fallback) const {
  auto v = all(k);
  if (v.size() > 1)
    throw BadInput("command line: " + k + " given " + std::to_string(v.size()) + " times (expected once)");
  return v.empty() ? fallback : v[0];
}

double Args::number(const std::string& k, double fallback, double min) const {
  const std::string v = one(k);
  if (v.empty()) return fallback;
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || !(d >= min))
    throw BadInput("command line: " + k + " '" + v + "': expected a number >= " + std::to_string(min));
  return d;
}

Args parse_args(int argc, char** argv, int first, const std::vector<std::string>& flags,
                const std::vector<std::string>& valued) {
  Args a;
  for (int i = first; i < argc; ++i) {
    const std::string s = argv[i];
    if (s.rfind("--", 0) != 0) {
      a.positional.push_back(s);
      continue;
    }
    const auto eq = s.find('=');
    const std::string key = s.substr(0, eq);
    const bool is_flag = std::find(flags.begin(), flags.end(), key) != flags.end();
    const bool is_valued = std::find(valued.begin(), valued.end(), key) != valued.end();
    if (!is_flag && !is_valued) throw BadInput("command line: option '" + key + "': unknown option (see --help)");
    std::string value;
    if (is_valued) {
      if (eq != std::string::npos) {
        value = s.substr(eq + 1);
      } else {
        if (i + 1 >= argc) throw BadInput("command line: option '" + key + "': missing value (see --help)");
        value = argv[++i];
      }
    }
    a.options.emplace(key, value);
  }
  return a;
}

std::string joined_command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    const bool quote = a.find_first_of(" \t'\"$") != std::string::npos;
    s += (i ? " " : "") + (quote ? "'" + a + "'" : a);
  }
  return s;
}

}  // namespace dslab
