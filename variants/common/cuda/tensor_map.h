// Tensor maps for the tensor memory accelerator (variants/common/cuda/tma.cuh), encoded by the driver's
// cuTensorMapEncodeTiled, which is fetched at run time (the runtime library, not libcuda, is what we link).
#pragma once
#include <cuda.h>  // CUtensorMap

#include <cstdint>

namespace dslab {

// A row-major 2-D tensor [rows][columns] of `element_bytes`-byte elements (bf16: 2, a byte type: 1) at `base`, read
// in boxes of box_rows x box_columns; swizzle_bytes 128 (or 64) lays each box out as Hopper's warpgroup MMA reads a
// K-major operand of 128-byte (64-byte) rows, 16-byte chunks XOR-ed by the row mod 8 (by row / 2 mod 4:
// variants/common/cuda/wgmma.cuh), 0 as it is. Throws where the driver refuses it. Rows are `row_stride` elements apart
// (0: `columns`, packed).
CUtensorMap tensor_map_2d(const void* base, int64_t rows, int64_t columns, int element_bytes, int box_rows,
                          int box_columns, int swizzle_bytes, int64_t row_stride = 0);

}  // namespace dslab
