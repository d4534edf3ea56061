// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may be scheduled while the kernel
// before it on the stream is still running; its CTAs start, then wait in pdl_wait() until that kernel has
// finished and its writes are visible. What it saves is the gap between two kernels (the next grid's launch and
// its CTAs' start), which at decode batch sizes is a large share of a step of ~20 short kernels per layer.
//
// The contract, for every kernel launched through launch_pdl: call pdl_wait() before touching any global memory
// a kernel before it on the stream may read or write, then pdl_launch_dependents() to let the kernel after it
// start early (after the wait, so a chain of dependents cannot pile up waiting CTAs on the SMs). A kernel
// launched without the attribute (cuBLAS's, or with PDL switched off) gets a plain stream dependency, and the
// two calls cost nothing. The attribute is recorded into CUDA graphs as programmatic edges. The MoE's shared experts
// run on a side stream forked by an event and are launched without the attribute (MoeOp::forward): launched with it,
// their first kernel behind the fork's event wait did not stay behind it in measurement (moe-gpu.md). So every kernel
// queued right behind another stream's event wait is launched plainly: moe/host/cuda's hot experts on that side stream
// too (HostMoe::experts).
//
// Because every kernel triggers only after its own wait, a kernel that starts has the one before it past its wait,
// so every kernel two or more launches back has finished: what only those (or the host, before the step) write may
// be read before pdl_wait(). decode_kernel (mla/fused/cuda: the schedule, page table and cache) and the grouped MoE's
// down GEMM (the router's tile list, the weights) copy their first operands so; the decode not where the kernel just
// before it writes the cache (the latent norm with the W_UK absorb at 1-2 tokens: MlaOp::cache_written_just_before).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "harness/cuda_check.h"

namespace dslab {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether launch_pdl sets the attribute (the layer's `pdl` axis; on by default).
bool programmatic_launch();
void set_programmatic_launch(bool on);
// The setting for one scope (a variant's own launches), restored after it.
class ProgrammaticLaunchScope {
 public:
  explicit ProgrammaticLaunchScope(bool on) : before_(programmatic_launch()) { set_programmatic_launch(on); }
  ~ProgrammaticLaunchScope() { set_programmatic_launch(before_); }
  ProgrammaticLaunchScope(const ProgrammaticLaunchScope&) = delete;
  ProgrammaticLaunchScope& operator=(const ProgrammaticLaunchScope&) = delete;

 private:
  bool before_;
};

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = programmatic_launch() ? 1 : 0;
  DSLAB_CUDA(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace dslab
