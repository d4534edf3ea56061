#include "variants/peers/peer_process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>

namespace dslab::peers {

std::string python() {
  if (const char* env = std::getenv("DSLAB_PYTHON")) return env;
  const std::string venv = std::string(DSLAB_SOURCE_DIR) + "/.venv/bin/python";
  if (std::filesystem::exists(venv)) return venv;
  return "python3";
}

std::string peer_script(const std::string& name) {
  const char* roots[] = {std::getenv("DSLAB_ROOT"), DSLAB_SOURCE_DIR, "."};
  for (const char* root : roots) {
    if (!root) continue;
    const std::string path = std::string(root) + "/scripts/peers/" + name;
    if (std::filesystem::exists(path)) return path;
  }
  return "scripts/peers/" + name;
}

Support probe_support(const std::vector<std::string>& command, const nlohmann::json& probe) {
  static std::mutex mu;
  static std::map<std::string, std::string> why;  // by command and request
  std::lock_guard<std::mutex> lock(mu);
  std::string key = probe.dump();
  for (const auto& a : command) key += " " + a;
  if (!why.count(key)) {
    try {
      PeerProcess process(command);
      why[key] = process.request(probe).value("skip", "");
    } catch (const std::exception& e) {
      why[key] = e.what();
    }
  }
  return why[key].empty() ? Support{} : Support::no(why[key]);
}

std::string peer_temp_file(const void* owner, const std::string& kind, const std::string& extension) {
  return (std::filesystem::temp_directory_path() / ("dslab_peer_" + kind + "_" + std::to_string(getpid()) + "_" +
                                                    std::to_string(reinterpret_cast<uintptr_t>(owner)) + extension))
      .string();
}

PeerProcess::PeerProcess(const std::vector<std::string>& argv) : name_(argv.size() > 1 ? argv[1] : "") {
  // A peer that exits leaves its pipe without a reader: a write must fail (EPIPE, reported below), not kill dslab.
  std::signal(SIGPIPE, SIG_IGN);
  int down[2], up[2];  // dslab -> peer, peer -> dslab
  if (pipe(down) != 0 || pipe(up) != 0) throw std::runtime_error("peer: cannot make a pipe");
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("peer: cannot fork");
  if (pid_ == 0) {
    dup2(down[0], STDIN_FILENO);
    dup2(up[1], STDOUT_FILENO);
    close(down[0]), close(down[1]), close(up[0]), close(up[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "peer: cannot run %s\n", args[0]);
    _exit(127);
  }
  close(down[0]), close(up[1]);
  to_ = fdopen(down[1], "w");
  from_ = fdopen(up[0], "r");
}

PeerProcess::~PeerProcess() {
  if (to_) {
    std::fputs("{\"op\": \"quit\"}\n", to_);
    std::fclose(to_);
  }
  if (from_) std::fclose(from_);
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

nlohmann::json PeerProcess::request(const nlohmann::json& message) {
  const std::string line = message.dump() + "\n";
  if (std::fputs(line.c_str(), to_) < 0 || std::fflush(to_) != 0)
    throw std::runtime_error("peer " + name_ + ": it is gone (a broken pipe)");
  std::string reply;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, from_)) {
    reply += buf;
    if (!reply.empty() && reply.back() == '\n') break;
  }
  if (reply.empty()) throw std::runtime_error("peer " + name_ + ": it exited without replying (see its stderr)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(reply);
  } catch (const nlohmann::json::exception&) {
    throw std::runtime_error("peer " + name_ + ": a reply that is not JSON: " + reply.substr(0, 200));
  }
  if (j.contains("error")) throw std::runtime_error("peer " + name_ + ": " + j.at("error").get<std::string>());
  return j;
}

void PeerProcess::output(const std::string& path, float* out, size_t n) {
  request({{"op", "output"}, {"path", path}});
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(out), std::streamsize(n * 4));
  if (f.gcount() != std::streamsize(n * 4))
    throw std::runtime_error("peer " + name_ + ": its output has " + std::to_string(f.gcount() / 4) +
                             " values, expected " + std::to_string(n));
}

}  // namespace dslab::peers
