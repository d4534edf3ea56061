#include "harness/nccl.h"

#include <dlfcn.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace dslab::nccl {

namespace {

// Where the first python3 on PATH has the nvidia-nccl wheel's library ("" if it has none).
std::string wheel_library() {
  std::unique_ptr<FILE, int (*)(FILE*)> p(
      popen("python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], \"lib\", "
            "\"libnccl.so.2\"))' 2>/dev/null",
            "r"),
      pclose);
  if (!p) return "";
  std::array<char, 4096> line{};
  if (!std::fgets(line.data(), int(line.size()), p.get())) return "";
  std::string path(line.data());
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  return path;
}

template <class F>
bool bind(void* lib, const char* name, F*& f, std::string* missing) {
  f = reinterpret_cast<F*>(dlsym(lib, name));
  if (!f) *missing = name;
  return f != nullptr;
}

std::unique_ptr<Api> open(std::string* why) {
  std::vector<std::string> tried;
  void* lib = nullptr;
  std::string file;
  auto attempt = [&](const std::string& path) {
    if (lib || path.empty()) return;
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib)
      file = path;
    else
      tried.push_back(path + " (" + dlerror() + ")");
  };
  if (const char* env = std::getenv("DSLAB_NCCL_LIBRARY")) attempt(env);
  attempt("libnccl.so.2");
  if (!lib) {
    const std::string wheel = wheel_library();
    if (wheel.empty()) tried.push_back("python3's nvidia.nccl (not installed)");
    attempt(wheel);
  }
  if (!lib) {
    *why = "NCCL not found (set DSLAB_NCCL_LIBRARY to libnccl.so.2); tried:";
    for (const std::string& t : tried) *why += " " + t + ";";
    return nullptr;
  }
  auto a = std::make_unique<Api>();
  std::string missing;
  if (!(bind(lib, "ncclGetVersion", a->GetVersion, &missing) &&
        bind(lib, "ncclCommInitAll", a->CommInitAll, &missing) &&
        bind(lib, "ncclCommDestroy", a->CommDestroy, &missing) && bind(lib, "ncclAllReduce", a->AllReduce, &missing) &&
        bind(lib, "ncclAllGather", a->AllGather, &missing) &&
        bind(lib, "ncclReduceScatter", a->ReduceScatter, &missing) && bind(lib, "ncclSend", a->Send, &missing) &&
        bind(lib, "ncclRecv", a->Recv, &missing) && bind(lib, "ncclGroupStart", a->GroupStart, &missing) &&
        bind(lib, "ncclGroupEnd", a->GroupEnd, &missing) &&
        bind(lib, "ncclGetErrorString", a->GetErrorString, &missing))) {
    *why = file + ": no " + missing + " (NCCL 2.7 or later is needed: grouped send and receive)";
    return nullptr;
  }
  a->library = file;
  check(*a, a->GetVersion(&a->version), "GetVersion");
  return a;
}

}  // namespace

std::string Api::version_text() const {
  // Since 2.9 the code is major * 10000 + minor * 100 + patch; before, major * 1000 + minor * 100 + patch.
  const int major = version >= 10000 ? version / 10000 : version / 1000;
  const int minor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(version % 100);
}

const Api* api(std::string* why) {
  static std::mutex mutex;
  static std::unique_ptr<Api> loaded;
  static std::string failure;
  static bool tried = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!tried) {
    tried = true;
    loaded = open(&failure);
  }
  if (!loaded && why) *why = failure;
  return loaded.get();
}

void check(const Api& nccl, int result, const char* what) {
  if (result != kSuccess)
    throw std::runtime_error(std::string("NCCL ") + what + ": " + nccl.GetErrorString(result) + " (" +
                             std::to_string(result) + ")");
}

}  // namespace dslab::nccl
