// FlashInfer's Hopper MLA decode behind flashinfer_mla.h. Compiled only against the fetched release's headers (see
// CMakeLists.txt): nothing of FlashInfer is copied into this tree.
#include <flashinfer/attention/mla_hopper.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/fastdiv.cuh>

#include "variants/mla/cuda/flashinfer_mla.h"

namespace dslab::mla::cuda::flashinfer_mla {
namespace {

using IdType = int32_t;
using Params = flashinfer::MLAParams<nv_bfloat16, nv_bfloat16, nv_bfloat16, IdType>;
constexpr int kLatent = 512, kRope = 64, kWidth = kLatent + kRope;
constexpr int kMaxWorks = 16384;  // MLAPlan's max_total_num_works: each per-work array is sized for it

template <class T>
T* at(void* base, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace

std::string version() { return DSLAB_FLASHINFER_VERSION; }

size_t int_workspace_bytes(int sms) {
  // ten per-work arrays and four per-SM ones, each aligned to 16 bytes (MLAPlan's layout), plus room for alignment
  return size_t(10) * (kMaxWorks * sizeof(IdType) + 16) + size_t(5) * (size_t(sms) * sizeof(IdType) + 16) + 256;
}

size_t float_workspace_bytes(int sms) {
  // partial outputs (bf16) and LSEs for two 64-row tiles per SM (MLAPlan's partial_o / partial_lse)
  return size_t(2) * size_t(sms) * 64 * (kLatent * 2 + sizeof(float)) + 256;
}

std::vector<int64_t> plan(void* device_int_base, void* host_ints, size_t int_bytes, void* float_workspace,
                          size_t float_bytes, const std::vector<int64_t>& kv_lens, int64_t q_len,
                          int64_t pages_per_request, int64_t heads, bool causal, size_t* staged_bytes) {
  const size_t batch = kv_lens.size();
  std::vector<IdType> qo_indptr(batch + 1), kv_indptr(batch + 1), kv_len(batch);
  for (size_t i = 0; i <= batch; ++i) {
    qo_indptr[i] = IdType(int64_t(i) * q_len);
    kv_indptr[i] = IdType(int64_t(i) * pages_per_request);
    if (i < batch) kv_len[i] = IdType(kv_lens[i]);
  }
  flashinfer::MLAPlanInfo info;
  // (MLAPlan fills the host buffer only; the stream it takes is unused)
  const cudaError_t e = flashinfer::MLAPlan<IdType>(
      float_workspace, float_bytes, device_int_base, host_ints, int_bytes, info, *staged_bytes, qo_indptr.data(),
      kv_indptr.data(), kv_len.data(), uint32_t(batch), uint32_t(heads), uint32_t(kLatent), causal, cudaStream_t(0));
  if (e != cudaSuccess) throw std::runtime_error(std::string("FlashInfer MLAPlan: ") + cudaGetErrorString(e));
  return info.ToVector();
}

cudaError_t run(const Step& s, const std::vector<int64_t>& plan_info, void* device_int_base, void* float_workspace,
                cudaStream_t stream) {
  flashinfer::MLAPlanInfo info;
  info.FromVector(plan_info);
  Params p;
  auto* q = static_cast<nv_bfloat16*>(const_cast<void*>(s.q));
  auto* cache = static_cast<nv_bfloat16*>(const_cast<void*>(s.cache));
  p.q_nope = q;
  p.q_pe = q + kLatent;
  p.ckv = cache;
  p.kpe = cache + kLatent;
  p.partial_o = at<nv_bfloat16>(float_workspace, info.partial_o_offset);
  p.partial_lse = at<float>(float_workspace, info.partial_lse_offset);
  p.final_o = static_cast<nv_bfloat16*>(s.out);
  p.final_lse = nullptr;
  p.q_indptr = at<IdType>(device_int_base, info.q_indptr_offset);
  p.kv_indptr = at<IdType>(device_int_base, info.kv_indptr_offset);
  p.partial_indptr = at<IdType>(device_int_base, info.partial_indptr_offset);
  p.merge_packed_offset_start = at<IdType>(device_int_base, info.merge_packed_offset_start_offset);
  p.merge_packed_offset_end = at<IdType>(device_int_base, info.merge_packed_offset_end_offset);
  p.merge_partial_packed_offset_start = at<IdType>(device_int_base, info.merge_partial_packed_offset_start_offset);
  p.merge_partial_packed_offset_end = at<IdType>(device_int_base, info.merge_partial_packed_offset_end_offset);
  p.merge_partial_stride = at<IdType>(device_int_base, info.merge_partial_stride_offset);
  p.kv_indices = const_cast<IdType*>(s.page_table);
  p.q_len = at<IdType>(device_int_base, info.q_len_offset);
  p.kv_len = at<IdType>(device_int_base, info.kv_len_offset);
  p.q_start = at<IdType>(device_int_base, info.q_start_offset);
  p.kv_start = at<IdType>(device_int_base, info.kv_start_offset);
  p.kv_end = at<IdType>(device_int_base, info.kv_end_offset);
  p.work_indptr = at<IdType>(device_int_base, info.work_indptr_offset);
  p.block_size = flashinfer::uint_fastdiv(uint32_t(s.page_size));
  p.num_heads = flashinfer::uint_fastdiv(uint32_t(s.heads));
  p.q_nope_stride_n = p.q_pe_stride_n = uint32_t(s.heads * kWidth);
  p.q_nope_stride_h = p.q_pe_stride_h = uint32_t(kWidth);
  p.ckv_stride_page = p.kpe_stride_page = uint32_t(s.page_size * kWidth);
  p.ckv_stride_n = p.kpe_stride_n = uint32_t(kWidth);
  p.o_stride_n = uint32_t(s.heads * kLatent);
  p.o_stride_h = uint32_t(kLatent);
  p.sm_scale = s.sm_scale;
  p.return_lse_base_on_e = false;
  if (s.causal)
    return flashinfer::mla::BatchMLAPageAttentionHopper<flashinfer::MaskMode::kCausal, kLatent, kRope>(
        p, info.num_blks_x, info.num_blks_y, stream);
  return flashinfer::mla::BatchMLAPageAttentionHopper<flashinfer::MaskMode::kNone, kLatent, kRope>(
      p, info.num_blks_x, info.num_blks_y, stream);
}

}  // namespace dslab::mla::cuda::flashinfer_mla
