// A peer implementation run in a process of its own (a Python library: PyTorch, KTransformers, transformers), driven
// by dslab over a pipe: one JSON object a line each way. The peer times its own runs (its own CUDA events or clock:
// dslab's timers cannot see into another process) and reads its inputs from a file dslab writes, so the same seeds
// and shapes reach both sides and the outputs can be compared. The protocol (scripts/peers/README.md):
//   {"op": "probe"}                        -> {"ok": true} | {"skip": "why it cannot run here"}
//   {"op": "prepare", ...}                 -> {"ok": true} | {"error": "..."}
//   {"op": "run", "flush": bool}           -> {"seconds": t}      (one step, timed by the peer)
//   {"op": "output", "path": FILE}         -> {"ok": true, "shape": [...]}  (the last step's output, raw float32)
//   {"op": "quit"}
#pragma once
#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/variant.h"

namespace dslab::peers {

// The interpreter peers run under: $DSLAB_PYTHON, else the set-up's .venv, else python3 on PATH.
std::string python();
// A file of scripts/peers/: under $DSLAB_ROOT, the source tree this was built from, or the working directory.
std::string peer_script(const std::string& name);
// Whether a peer can run here: asked of the peer itself (`probe`, an op "probe" request), once a process for each
// command and request; the skip reason it gives, or why it could not be asked.
Support probe_support(const std::vector<std::string>& command, const nlohmann::json& probe);
// A file of `owner`'s own in the temporary folder (its owner removes it): dslab_peer_<kind>_<pid>_<owner><extension>.
std::string peer_temp_file(const void* owner, const std::string& kind, const std::string& extension);

class PeerProcess {
 public:
  explicit PeerProcess(const std::vector<std::string>& argv);  // std::runtime_error if it cannot start
  ~PeerProcess();                                              // asks it to quit, then waits for it
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  // One request and its reply; std::runtime_error if the peer died or replied with something not JSON or an "error".
  nlohmann::json request(const nlohmann::json& message);
  // The last step's output: an "output" request into `path`, then its n raw float32 values into out (runtime_error
  // naming the peer if the file holds another count).
  void output(const std::string& path, float* out, size_t n);

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string name_;
};

}  // namespace dslab::peers
