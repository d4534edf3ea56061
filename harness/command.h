// `dslab COMMAND`: each command registers itself next to its definition, so rooms downstream of the
// harness (analysis/, planner/) add commands without the harness depending on them.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dslab {

struct Command {
  std::string name;
  std::string summary;                            // one line for `dslab --help`
  std::string help;                               // full text for `dslab CMD --help`
  std::function<int(int argc, char** argv)> run;  // argv[0] = "dslab", argv[1] = name
};

bool register_command(Command c);
const std::vector<Command>& registered_commands();

// Options of the form --flag or --key VALUE / --key=VALUE; anything else is positional.
struct Args {
  std::vector<std::string> positional;
  std::multimap<std::string, std::string> options;
  bool has(const std::string& k) const { return options.count(k) > 0; }
  std::vector<std::string> all(const std::string& k) const;
  std::string one(const std::string& k, const std::string& fallback = "") const;  // BadInput if repeated
  double number(const std::string& k, double fallback, double min) const;         // BadInput if not a number >= min
};
// The command line as one string, arguments with spaces or quotes quoted (results' context.command_line).
std::string joined_command_line(int argc, char** argv);

Args parse_args(int argc, char** argv, int first, const std::vector<std::string>& flags,
                const std::vector<std::string>& valued);

}  // namespace dslab

#define DSLAB_REGISTER_COMMAND(id, ...) static const bool dslab_command_##id = ::dslab::register_command({__VA_ARGS__})
