// The three faces of the CPU MoE engine (variants/moe/moe.h): one kernel everywhere, or the faster one
// per expert from a crossover measured on this machine.
#include "variants/moe/moe.h"

namespace dslab::moe {
namespace {

struct MoeAmxCpu : Engine {
  MoeAmxCpu() : Engine(Kernel::amx) {}
};
struct MoeAvx512Cpu : Engine {
  MoeAvx512Cpu() : Engine(Kernel::avx512) {}
};
struct MoeAutoCpu : Engine {
  MoeAutoCpu() : Engine(Kernel::choose) {}
};

}  // namespace
}  // namespace dslab::moe

using dslab::moe::MoeAmxCpu;
using dslab::moe::MoeAutoCpu;
using dslab::moe::MoeAvx512Cpu;
DSLAB_REGISTER_VARIANT(MoeAmxCpu, "moe/amx/cpu", dslab::Device::cpu,
                       "routed experts: AMX bf16 tiles, fused gate/up, atomic-counter task scheduling");
DSLAB_REGISTER_VARIANT(MoeAvx512Cpu, "moe/avx512/cpu", dslab::Device::cpu,
                       "routed experts: AVX-512-BF16 vector-matrix kernels on the same packed weights");
DSLAB_REGISTER_VARIANT(MoeAutoCpu, "moe/auto/cpu", dslab::Device::cpu,
                       "routed experts: AMX or AVX-512 per expert by a crossover measured on this machine");
