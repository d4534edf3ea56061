// DeepSeek-V3.2's lightning indexer on the GPU (sparse/dsa/cuda): the index-key cache beside the paged
// latent cache, the step's index queries and every key's index score, as sparse::SelectorState and
// sparse::dsa_token_scores make them on the CPU (the reference these are tested against, tests/test_sparse_cuda.cc).
// The indexer is sparse::Indexer's: kIndexHeads heads of kIndexDim dims, a projection of MLA's own [latent ‖ rope]
// key and absorbed query (sparse::indexer_projection, bf16), e4m3 index keys with one fp32 scale per key, and
// score_k = scale_k * sum_j ReLU(q_j · key_k) / kIndexHeads.
#pragma once
#include <cublas_v2.h>
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dslab::sparse::cuda {

constexpr int kIndexHeads = 64, kIndexDim = 128;

// Every slot's index key (prepare): rows [slots][width] of the cache through a bf16 GEMM with the projection
// [width][kIndexDim], `chunk` rows at a time through scratch [chunk][kIndexDim] fp32, then e4m3 with the row's scale:
// index_keys [slots][kIndexDim], index_scales [slots]. `blas` must queue on `stream`.
void index_all_keys(cublasHandle_t blas, const __nv_bfloat16* cache, int64_t slots, int64_t width,
                    const __nv_bfloat16* projection, float* scratch, int64_t chunk, uint8_t* index_keys,
                    float* index_scales, cudaStream_t stream);

// The index keys of a decode step's new keys: request r's keys lengths[r] .. lengths[r] + q_len - 1, at their slots;
// keys[r] = lengths[r] + q_len (the keys after the step).
void index_step_keys(const __nv_bfloat16* cache, int64_t width, const int32_t* lengths, int64_t q_len,
                     const int32_t* page_table, int64_t pages_per_request, int64_t page_size, int64_t batch,
                     const __nv_bfloat16* projection, uint8_t* index_keys, float* index_scales, int32_t* keys,
                     cudaStream_t stream);

// The index queries: q [tokens][heads][width] (the absorbed query) -> [tokens][kIndexHeads][kIndexDim] e4m3 with a
// scale per (token, index head) in scales [tokens][kIndexHeads], index head j taking MLA head j mod heads (fp32 sums:
// a GEMM of every head's row into scratch [tokens * heads][kIndexDim] fp32, then e4m3). `blas` must queue on `stream`.
void index_queries(cublasHandle_t blas, const __nv_bfloat16* q, int64_t tokens, int64_t heads, int64_t width,
                   const __nv_bfloat16* projection, float* scratch, uint8_t* out, float* scales, cudaStream_t stream);

// The index-key cache [slots][kIndexDim] as a tensor map for indexer_scores' tensor copies (64-key boxes, swizzled as
// the warpgroup MMA reads them): made once where the cache is allocated.
CUtensorMap index_key_map(const uint8_t* index_keys, int64_t slots);

// Every key's index score, one query per request (q_len 1): scores [batch][scores_per_request], keys < keys[r] of
// request r (the rest untouched). FP8 tensor-core products (e4m3 queries and keys, fp32 sums), scaled per head and key.
// With index_key_map (index_keys' map) and pages of whole 64-key tiles, by tensor copies and warpgroup MMAs; else
// (or index_key_map null) by cp.async and mma.sync, a page-table lookup per key where tiles straddle pages.
void indexer_scores(const uint8_t* queries, const float* query_scales, const uint8_t* index_keys,
                    const CUtensorMap* index_key_map, const float* index_scales, const int32_t* page_table,
                    int64_t pages_per_request, int64_t page_size, const int32_t* keys, int64_t batch,
                    int64_t scores_per_request, float* scores, cudaStream_t stream);

}  // namespace dslab::sparse::cuda
