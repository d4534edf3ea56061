#include "variants/common/cuda/tensor_map.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <stdexcept>
#include <string>

#include "harness/cuda_check.h"

namespace dslab {

CUtensorMap tensor_map_2d(const void* base, int64_t rows, int64_t columns, int element_bytes, int box_rows,
                          int box_columns, int swizzle_bytes, int64_t row_stride) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    DSLAB_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !fn)
      throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (element_bytes != 1 && element_bytes != 2) throw std::invalid_argument("tensor_map_2d: elements of 1 or 2 bytes");
  if (swizzle_bytes != 0 && swizzle_bytes != 64 && swizzle_bytes != 128)
    throw std::invalid_argument("tensor_map_2d: a swizzle of 0, 64 or 128 bytes");
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                           : CU_TENSOR_MAP_SWIZZLE_NONE;
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(columns), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t((row_stride > 0 ? row_stride : columns) * element_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(box_columns), cuuint32_t(box_rows)}, element_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
             const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw std::runtime_error("cuTensorMapEncodeTiled failed: CUresult " + std::to_string(int(r)));
  return map;
}

}  // namespace dslab
