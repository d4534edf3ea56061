// FlashInfer's MLA paged decode for Hopper (flashinfer/attention/mla_hopper.cuh and its scheduler, from the pinned
// flashinfer-python release the set-up fetches) behind a plain interface: this header names no FlashInfer type, so
// only flashinfer_mla.cu is compiled against FlashInfer's headers (and the CCCL they ship), and the op beside it
// (flashinfer.cu) against ours. Built when the set-up found the headers (DSLAB_HAVE_FLASHINFER).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dslab::mla::cuda::flashinfer_mla {

// The release the set-up fetches (scripts/setup.sh) and the build compiled against.
std::string version();

// One step's tensors, all bf16, in our layout: the query [tokens][heads][512 + 64] (absorbed latent part, then
// rope), the paged cache [pages][page_size][512 + 64] read through a page table [batch][pages_per_request], the
// latent output [tokens][heads][512].
struct Step {
  const void* q = nullptr;
  const void* cache = nullptr;
  const int32_t* page_table = nullptr;
  void* out = nullptr;
  int64_t tokens = 0, heads = 0, page_size = 0;
  float sm_scale = 0;   // softmax scale (natural log base)
  bool causal = false;  // q_len > 1: each new token sees the keys up to its own
};

// The scheduler's int workspace (worst case, fixed: the plan's offsets into it do not depend on the lengths) and the
// float workspace for the split-KV partial outputs on `sms` SMs.
size_t int_workspace_bytes(int sms);
size_t float_workspace_bytes(int sms);

// FlashInfer's plan (MLAPlan) for requests of q_len new tokens over kv_lens keys each (cached + new), pages_per_request
// apart in the page table: the schedule written to host_ints (what the step's int workspace must hold, as laid out
// from device_int_base, whose address the offsets are aligned against) and the plan's grid and offsets (18 values).
// Host only: the caller copies host_ints[0, *staged_bytes) to device_int_base before the step.
std::vector<int64_t> plan(void* device_int_base, void* host_ints, size_t int_bytes, void* float_workspace,
                          size_t float_bytes, const std::vector<int64_t>& kv_lens, int64_t q_len,
                          int64_t pages_per_request, int64_t heads, bool causal, size_t* staged_bytes);

// Queues the kernel on `stream` with a plan made for this step's shapes (its grid and offsets: plan()'s result).
cudaError_t run(const Step& step, const std::vector<int64_t>& plan_info, void* device_int_base, void* float_workspace,
                cudaStream_t stream);

}  // namespace dslab::mla::cuda::flashinfer_mla
