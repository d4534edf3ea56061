#include "variants/common/cuda/pdl.cuh"

#include <atomic>

namespace dslab {
namespace {
std::atomic<bool> g_programmatic_launch{true};
}  // namespace

bool programmatic_launch() { return g_programmatic_launch.load(std::memory_order_relaxed); }
void set_programmatic_launch(bool on) { g_programmatic_launch.store(on, std::memory_order_relaxed); }

}  // namespace dslab
