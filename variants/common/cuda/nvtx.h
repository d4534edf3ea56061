// A named NVTX range for the scope of one op, so Nsight Systems' timeline shows a step's ops by name.
#pragma once
#include <nvtx3/nvToolsExt.h>

namespace dslab::gpu {

struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace dslab::gpu
