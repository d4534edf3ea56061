// The top-k selections (paged_select.h): a block per request for its pages, and for tokens a block or a
// thread-block cluster per request, keys ordered by a byte-radix walk of their scores' histograms.
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/cuda_check.h"
#include "harness/errors.h"
#include "harness/gpu.h"
#include "harness/tuning.h"
#include "variants/common/cuda/device_array.h"
#include "variants/common/rng.h"
#include "variants/mla/cuda/mla_cuda.h"
#include "variants/sparse/cuda/paged_select.h"

namespace dslab::sparse::cuda {

namespace {

// Floats as unsigned integers in the same order (larger float, larger key); 0 is below every float's key.
__device__ inline uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kSelectThreads = 1024, kSelectUnroll = 4, kMaxPages = 65536, kMaxTokens = 1 << 22;

// A thread's run of equal histogram bins, added to the histogram once when the bin changes: scores crowd into few
// bins (the top byte is nearly every key's), and a bin's shared-memory atomics serialise. (__match_any_sync over the
// lanes did this before and cost ~100 us a selection whatever the key count: its time grows with the distinct
// values in the warp, and it ran for every unrolled slot.)
struct BinRun {
  uint32_t bin = 0xffffffffu;
  int count = 0;
  __device__ void add(uint32_t b, int* histogram) {
    if (b != bin) {
      if (count) atomicAdd(&histogram[bin], count);
      bin = b, count = 0;
    }
    ++count;
  }
  // Every lane of the warp: the last runs, one atomic for the warp where all lanes end in the same bin.
  __device__ void flush(int* histogram) {
    const unsigned all = 0xffffffffu;
    const uint32_t first = __shfl_sync(all, bin, 0);
    if (__all_sync(all, count > 0 && bin == first)) {
      const int total = __reduce_add_sync(all, unsigned(count));
      if (threadIdx.x % 32 == 0) atomicAdd(&histogram[first], total);
    } else if (count) {
      atomicAdd(&histogram[bin], count);
    }
    bin = 0xffffffffu, count = 0;
  }
};

// One warp: the byte whose bin holds the remaining-th largest candidate (counting from the top bin down), and how
// many candidates lie in the bins above it. Lane l holds bins 8l..8l+7; a suffix sum over the lanes.
__device__ void pick_byte(const int* histogram, int remaining, uint32_t* digit, int* above_it) {
  const int lane = int(threadIdx.x) % 32;
  int bins[8], sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) bins[i] = histogram[lane * 8 + i], sum += bins[i];
  int suffix = sum;  // bins 8 * lane .. 255
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_down_sync(0xffffffffu, suffix, o);
    if (lane + o < 32) suffix += v;
  }
  int above = suffix - sum;  // bins above this lane's
#pragma unroll
  for (int i = 7; i >= 0; --i) {
    if (above < remaining && above + bins[i] >= remaining) *digit = uint32_t(lane * 8 + i), *above_it = above;
    above += bins[i];
  }
}

// The block's selection of one request's units (pages or tokens): every fixed unit, and the `need` best of the others
// by key (ties to the lower unit, as the CPU's stable ranking); emit(unit, position) for each chosen one, positions
// in unit order. Returns how many were chosen. The need-th largest key is found a byte at a time from the top: a
// 256-bin histogram of the candidates' next byte (warps stride over the units, so loads coalesce), the byte where
// the count from the top reaches what is still needed. Then each warp counts, and emits, a contiguous segment of
// units 32 at a time (ballots give the order within a step, a scan over the warps the order between segments).
template <class Fixed, class Key, class Emit>
__device__ int select_in_order(int units, int need, Fixed fixed, Key key, Emit emit) {
  constexpr int kWarps = kSelectThreads / 32;
  __shared__ int histogram[256];
  __shared__ uint32_t chosen_digit;
  __shared__ int chosen_above, equal_taken, chosen_total;
  __shared__ int warp_above[kWarps], warp_equal[kWarps], warp_fixed[kWarps], equal_before[kWarps],
      chosen_before[kWarps];
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const unsigned lanes_below = (1u << lane) - 1;
  uint32_t threshold = 0xffffffffu;  // (need 0: nothing is chosen by key)
  if (need > 0) {
    uint32_t prefix = 0, mask = 0;
    int remaining = need;  // of the keys matching prefix under mask, how many more must be taken from the top
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (tid < 256) histogram[tid] = 0;
      __syncthreads();
      // kSelectUnroll steps of 32 units per warp at a time, their loads issued together (bounds uniform over the warp).
      BinRun run;
      for (int base = warp * 32 * kSelectUnroll; base < units; base += kSelectThreads * kSelectUnroll) {
        uint32_t k[kSelectUnroll];
        bool counted[kSelectUnroll];
#pragma unroll
        for (int j = 0; j < kSelectUnroll; ++j) {
          const int u = base + 32 * j + lane;
          counted[j] = u < units && !fixed(u);
          k[j] = counted[j] ? key(u) : 0u;
        }
#pragma unroll
        for (int j = 0; j < kSelectUnroll; ++j)
          if (counted[j] && (k[j] & mask) == prefix) run.add((k[j] >> shift) & 255u, histogram);
      }
      run.flush(histogram);
      __syncthreads();
      if (warp == 0) pick_byte(histogram, remaining, &chosen_digit, &chosen_above);
      __syncthreads();
      prefix |= chosen_digit << shift, mask |= 255u << shift;
      remaining -= chosen_above;
      __syncthreads();  // (the next pass rewrites the shared answer)
    }
    threshold = prefix;  // the need-th largest key
  }
  // Warp w's segment [begin, end), walked 32 units a step (bounds uniform over the warp, for the ballots); whole groups
  // of kSelectUnroll steps, so a step past `end` only ever holds invalid units.
  constexpr int kGroup = 32 * kSelectUnroll;
  const int segment = ((units + kWarps - 1) / kWarps + kGroup - 1) / kGroup * kGroup;
  const int begin = min(units, warp * segment), end = min(units, begin + segment);
  struct Unit {
    bool valid, fixed, above, equal;
  };
  auto look = [&](int u) {
    Unit x{u < end, false, false, false};
    if (!x.valid) return x;
    x.fixed = fixed(u);
    if (!x.fixed && need > 0) {
      const uint32_t k = key(u);
      x.above = k > threshold, x.equal = k == threshold;
    }
    return x;
  };
  int above = 0, equal = 0, fixed_count = 0;
  for (int base = begin; base < end; base += 32 * kSelectUnroll) {
    Unit x[kSelectUnroll];
#pragma unroll
    for (int j = 0; j < kSelectUnroll; ++j) x[j] = look(base + 32 * j + lane);
#pragma unroll
    for (int j = 0; j < kSelectUnroll; ++j) {
      above += __popc(__ballot_sync(0xffffffffu, x[j].above));
      equal += __popc(__ballot_sync(0xffffffffu, x[j].equal));
      fixed_count += __popc(__ballot_sync(0xffffffffu, x[j].fixed));
    }
  }
  if (lane == 0) warp_above[warp] = above, warp_equal[warp] = equal, warp_fixed[warp] = fixed_count;
  __syncthreads();
  if (warp ==
      0) {  // the warps' offsets: equal keys before each (the lowest-indexed are taken), chosen units before each
    const int a = lane < kWarps ? warp_above[lane] : 0, e = lane < kWarps ? warp_equal[lane] : 0,
              f = lane < kWarps ? warp_fixed[lane] : 0;
    int above_total = a, e_incl = e;
    for (int o = 1; o < 32; o <<= 1) {
      above_total += __shfl_xor_sync(0xffffffffu, above_total, o);
      const int v = __shfl_up_sync(0xffffffffu, e_incl, o);
      if (lane >= o) e_incl += v;
    }
    const int taken = need - above_total, e_before = e_incl - e;
    const int chosen = f + a + max(0, min(e, taken - e_before));
    int c_incl = chosen;
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, c_incl, o);
      if (lane >= o) c_incl += v;
    }
    if (lane < kWarps) equal_before[lane] = e_before, chosen_before[lane] = c_incl - chosen;
    if (lane == 31) chosen_total = c_incl;
    if (lane == 0) equal_taken = taken;
  }
  __syncthreads();
  int eq = equal_before[warp], position = chosen_before[warp];
  for (int base = begin; base < end; base += 32 * kSelectUnroll) {
    Unit x[kSelectUnroll];
#pragma unroll
    for (int j = 0; j < kSelectUnroll; ++j) x[j] = look(base + 32 * j + lane);
#pragma unroll
    for (int j = 0; j < kSelectUnroll; ++j) {  // (in unit order: step j's 32 units after step j - 1's)
      const unsigned equal_mask = __ballot_sync(0xffffffffu, x[j].equal);
      const bool take = x[j].fixed || x[j].above || (x[j].equal && eq + __popc(equal_mask & lanes_below) < equal_taken);
      const unsigned take_mask = __ballot_sync(0xffffffffu, take);
      if (take) emit(base + 32 * j + lane, position + __popc(take_mask & lanes_below));
      position += __popc(take_mask), eq += __popc(equal_mask);
    }
  }
  return chosen_total;
}

struct SelectArgs {
  const float* scores;
  const int32_t* page_table;
  int pages_per_request;
  const int32_t* keys;
  int page_size, tokens, n_init, local, max_out, q_len;
  int32_t *physical, *logical, *length, *before;
};

// A block per request: the sinks' and window's pages, the best-scored others while the budget lasts.
__global__ void __launch_bounds__(kSelectThreads) compact_pages_kernel(SelectArgs a) {
  const int r = int(blockIdx.x);
  const int keys = a.keys[r], P = a.page_size;
  const int pages = (keys + P - 1) / P;
  const int sink_end = (min(a.n_init, keys) + P - 1) / P;  // pages [0, sink_end)
  const int window_first = max(0, keys - a.local) / P;     // pages [window_first, pages)
  const int fixed_count = min(sink_end, window_first) + (pages - window_first);
  const int need = max(0, min(pages, max(1, a.tokens / P)) - fixed_count);
  const float* score = a.scores + int64_t(r) * a.pages_per_request;
  const int32_t* table = a.page_table + int64_t(r) * a.pages_per_request;
  const int total = select_in_order(
      pages, need, [&](int p) { return p < sink_end || p >= window_first; }, [&](int p) { return order_key(score[p]); },
      [&](int p, int position) {
        if (position < a.max_out)
          a.physical[int64_t(r) * a.max_out + position] = table[p], a.logical[int64_t(r) * a.max_out + position] = p;
      });
  if (threadIdx.x == 0) {
    const int length = (total - 1) * P + (keys - (pages - 1) * P);
    a.length[r] = length;
    if (a.before) a.before[r] = length - a.q_len;
  }
}

// Request r of a token selection: its keys, the sinks [0, sinks) and window [window_first, keys) always kept, how many
// others the budget takes, its scores and page table row.
struct TokenRequest {
  int keys, sinks, window_first, need;
  const float* score;
  const int32_t* table;
};
__device__ TokenRequest token_request(const SelectArgs& a, int r, int64_t scores_per_request) {
  TokenRequest q;
  q.keys = a.keys[r];
  q.sinks = min(a.n_init, q.keys), q.window_first = max(0, q.keys - a.local);
  const int fixed_count = min(q.sinks, q.window_first) + (q.keys - q.window_first);
  q.need = max(0, min(q.keys, a.tokens) - fixed_count);
  q.score = a.scores + int64_t(r) * scores_per_request;
  q.table = a.page_table + int64_t(r) * a.pages_per_request;
  return q;
}

// A block per request: the sink and window tokens, the best-scored others while the budget lasts; each as its
// cache slot (page_table's page * page_size + offset), so the decode kernel walks them as pages of one key.
__global__ void __launch_bounds__(kSelectThreads) compact_tokens_kernel(SelectArgs a, int64_t scores_per_request) {
  const int r = int(blockIdx.x), P = a.page_size;
  const TokenRequest q = token_request(a, r, scores_per_request);
  const int keys = q.keys, sinks = q.sinks, window_first = q.window_first, need = q.need;
  const float* score = q.score;
  const int32_t* table = q.table;
  const int total = select_in_order(
      keys, need, [&](int k) { return k < sinks || k >= window_first; }, [&](int k) { return order_key(score[k]); },
      [&](int k, int position) {
        if (position < a.max_out) {
          a.physical[int64_t(r) * a.max_out + position] = table[k / P] * P + k % P;
          a.logical[int64_t(r) * a.max_out + position] = k;
        }
      });
  if (threadIdx.x == 0) {
    a.length[r] = total;
    if (a.before) a.before[r] = total - a.q_len;
  }
}

// Tokens of one request, 4 to 8 CTAs of a thread-block cluster (one CTA walking 128K scores is a batch-1 step's
// slowest kernel; the size is chosen at launch, topk_launch): each thread owns a contiguous run of keys, kept in
// registers up to kClusterKeysPerThread of them (the scores read once) or, past that, read again from global memory
// (L2) at each pass (kStream: one CTA walking 1M scores took 1.4 ms); the byte histograms add into CTA 0's shared
// memory (distributed shared memory) and CTA 0 picks each byte; the CTAs' counts meet there too, for each CTA's
// offsets. Same selection as compact_tokens_kernel.
constexpr int kClusterMaxCtas = 8, kClusterMinCtas = 4, kClusterKeysPerThread = 22, kClusterMinKeys = 16384;
// A streaming pass's cost against a register pass's, per key, for the choice of cluster size: an estimate (each pass
// reads its keys from L2 again), which only decides between a size whose keys fit the registers and a smaller one
// whose do not.
constexpr double kStreamingCost = 1.5;
bool cluster_streams(int64_t scores, int ctas) {
  return scores > int64_t(ctas) * kSelectThreads * kClusterKeysPerThread;
}
// Which top-k kernel a launch takes: one block, or a cluster (holding the scores in registers or re-reading them each
// pass).
enum class TopkKernel { block, cluster, cluster_streaming };
TopkKernel topk_kernel(const TopkLaunch& t) {
  return t.ctas_per_request == 1 ? TopkKernel::block
         : t.streaming           ? TopkKernel::cluster_streaming
                                 : TopkKernel::cluster;
}
template <bool kStream>
__global__ void __launch_bounds__(kSelectThreads)
    compact_tokens_cluster_kernel(SelectArgs a, int64_t scores_per_request) {
  namespace cg = cooperative_groups;
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int histogram[256], local[256];  // CTA 0's histogram is the cluster's
  __shared__ uint32_t chosen_digit;
  __shared__ int chosen_above, cta_above[kClusterMaxCtas], cta_equal[kClusterMaxCtas], cta_chosen[kClusterMaxCtas];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), ctas = int(cluster.num_blocks()), r = int(blockIdx.y),
            tid = int(threadIdx.x), P = a.page_size;
  const TokenRequest q = token_request(a, r, scores_per_request);
  const int keys = q.keys, sinks = q.sinks, window_first = q.window_first, need = q.need;
  const float* score = q.score;
  const int32_t* table = q.table;
  const int per_cta = (keys + ctas - 1) / ctas, per_thread = (per_cta + kSelectThreads - 1) / kSelectThreads;
  const int first = min(keys, rank * per_cta + tid * per_thread),
            last = min(min(keys, (rank + 1) * per_cta), first + per_thread);
  uint32_t key[kStream ? 1 : kClusterKeysPerThread];
  uint32_t fixed_bits = 0, candidate_bits = 0;
  if constexpr (!kStream) {
#pragma unroll
    for (int i = 0; i < kClusterKeysPerThread; ++i) {
      const int u = first + i;
      key[i] = 0;
      if (u < last) {
        if (u < sinks || u >= window_first)
          fixed_bits |= 1u << i;
        else
          key[i] = order_key(score[u]), candidate_bits |= 1u << i;
      }
    }
  }
  // f(unit, fixed, candidate, key) for each of this thread's keys, in order (registers: also the slots past its run,
  // neither fixed nor candidates).
  auto for_each_key = [&](auto&& f) {
    if constexpr (kStream) {
      for (int u = first; u < last; ++u) {
        const bool fixed = u < sinks || u >= window_first;
        f(u, fixed, !fixed, fixed ? 0u : order_key(score[u]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < kClusterKeysPerThread; ++i)
        f(first + i, bool(fixed_bits >> i & 1u), bool(candidate_bits >> i & 1u), key[i]);
    }
  };
  int* cluster_histogram = cluster.map_shared_rank(histogram, 0);
  cluster.sync();  // (every CTA of the cluster running before any reaches into another's shared memory)
  uint32_t threshold = 0xffffffffu;
  if (need > 0) {
    uint32_t prefix = 0, mask = 0;
    int remaining = need;
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (tid < 256) local[tid] = 0;
      if (rank == 0 && tid < 256) histogram[tid] = 0;
      cluster.sync();  // (CTA 0's zeroed histogram, and every CTA done reading the last answer)
      BinRun run;
      for_each_key([&](int, bool, bool candidate, uint32_t k) {
        if (candidate && (k & mask) == prefix) run.add((k >> shift) & 255u, local);
      });
      run.flush(local);
      __syncthreads();
      if (tid < 256 && local[tid]) atomicAdd(&cluster_histogram[tid], local[tid]);
      cluster.sync();
      if (rank == 0 && tid < 32) pick_byte(histogram, remaining, &chosen_digit, &chosen_above);
      cluster.sync();
      // One thread per CTA fetches the answer from CTA 0 (8192 threads reading one remote word queue at CTA 0's SM:
      // ~100 us a selection), the others read the local copy.
      if (rank != 0 && tid == 0)
        chosen_digit = *cluster.map_shared_rank(&chosen_digit, 0),
        chosen_above = *cluster.map_shared_rank(&chosen_above, 0);
      __syncthreads();
      prefix |= chosen_digit << shift, mask |= 255u << shift;
      remaining -= chosen_above;
    }
    threshold = prefix;
  }
  // This thread's fixed units, keys above the threshold and keys equal to it; the CTA's, then the cluster's.
  int fixed_here = 0, above = 0, equal = 0;
  for_each_key([&](int, bool fixed, bool candidate, uint32_t k) {
    fixed_here += fixed;
    if (candidate && need > 0) above += k > threshold, equal += k == threshold;
  });
  int above_cta = 0, equal_before = 0, equal_cta = 0, unused = 0;
  Scan(temp).ExclusiveSum(above, unused, above_cta);
  __syncthreads();
  Scan(temp).ExclusiveSum(equal, equal_before, equal_cta);
  __syncthreads();
  if (tid == 0)
    cluster.map_shared_rank(cta_above, 0)[rank] = above_cta, cluster.map_shared_rank(cta_equal, 0)[rank] = equal_cta;
  cluster.sync();
  if (rank != 0 && tid < ctas)
    cta_above[tid] = cluster.map_shared_rank(cta_above, 0)[tid],
    cta_equal[tid] = cluster.map_shared_rank(cta_equal, 0)[tid];
  __syncthreads();
  int above_total = 0, equal_before_cta = 0;
  for (int c = 0; c < ctas; ++c) {
    above_total += cta_above[c];
    if (c < rank) equal_before_cta += cta_equal[c];
  }
  const int equal_taken = need - above_total;  // the lowest-indexed equal ones
  equal_before += equal_before_cta;
  const int chosen = fixed_here + above + max(0, min(equal, equal_taken - equal_before));
  int position = 0, chosen_cta = 0;
  Scan(temp).ExclusiveSum(chosen, position, chosen_cta);
  if (tid == 0) cluster.map_shared_rank(cta_chosen, 0)[rank] = chosen_cta;
  cluster.sync();
  if (rank != 0 && tid < ctas) cta_chosen[tid] = cluster.map_shared_rank(cta_chosen, 0)[tid];
  __syncthreads();
  int total = 0;
  for (int c = 0; c < ctas; ++c) {
    const int n = cta_chosen[c];
    total += n, position += c < rank ? n : 0;
  }
  int eq = equal_before;
  for_each_key([&](int u, bool fixed, bool candidate, uint32_t k) {
    bool take = fixed;
    if (!take && candidate && need > 0) take = k > threshold || (k == threshold && eq++ < equal_taken);
    if (take) {
      if (position < a.max_out) {
        a.physical[int64_t(r) * a.max_out + position] = table[u / P] * P + u % P;
        a.logical[int64_t(r) * a.max_out + position] = u;
      }
      ++position;
    }
  });
  if (rank == 0 && tid == 0) {
    a.length[r] = total;
    if (a.before) a.before[r] = total - a.q_len;
  }
  cluster.sync();  // (no CTA leaves while another still reads CTA 0's shared memory)
}

}  // namespace

void compact_pages(const float* scores, const int32_t* page_table, int64_t pages_per_request, const int32_t* keys,
                   int64_t page_size, const Budget& budget, int64_t batch, int64_t max_pages, int64_t q_len,
                   int32_t* physical, int32_t* logical, int32_t* length, int32_t* before, cudaStream_t stream) {
  if (pages_per_request > kMaxPages)
    throw std::invalid_argument("sparse compact_pages: at most 65536 pages per request");
  const SelectArgs a{scores,
                     page_table,
                     int(pages_per_request),
                     keys,
                     int(page_size),
                     int(budget.tokens),
                     int(budget.n_init),
                     int(budget.local),
                     int(max_pages),
                     int(q_len),
                     physical,
                     logical,
                     length,
                     before};
  compact_pages_kernel<<<unsigned(batch), kSelectThreads, 0, stream>>>(a);
  DSLAB_CHECK_LAUNCH();
}

// A launch of `ctas`-CTA clusters of the cluster kernel, one cluster per request (grid y); `attribute` holds the
// cluster dimension the configuration points to.
cudaLaunchConfig_t cluster_config(int ctas, int64_t requests, cudaStream_t stream, cudaLaunchAttribute& attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(ctas), unsigned(requests));
  config.blockDim = dim3(kSelectThreads);
  config.stream = stream;
  attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = unsigned(ctas), attribute.val.clusterDim.y = 1, attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

TopkLaunch topk_cluster_launch_given(int64_t scores_per_request, int64_t batch, int ctas,
                                     const std::function<int(int, bool)>& max_active) {
  if (ctas < kClusterMinCtas || ctas > kClusterMaxCtas)
    throw std::invalid_argument("sparse top-k: a cluster of 4 to 8 CTAs");
  TopkLaunch t;
  t.ctas_per_request = ctas;
  t.streaming = cluster_streams(scores_per_request, ctas);
  t.max_active_clusters = max_active(ctas, t.streaming);
  if (t.max_active_clusters <= 0)
    throw std::invalid_argument("sparse top-k: no cluster of " + std::to_string(ctas) + " CTAs fits");
  t.rounds = int((std::max<int64_t>(batch, 1) + t.max_active_clusters - 1) / t.max_active_clusters);
  return t;
}

TopkLaunch topk_launch_given(int64_t scores_per_request, int64_t batch,
                             const std::function<int(int, bool)>& max_active) {
  if (scores_per_request < kClusterMinKeys) return {};
  TopkLaunch best;
  double best_cost = 0;
  for (int ctas = kClusterMaxCtas; ctas >= kClusterMinCtas; --ctas) {  // (a tie keeps the larger cluster)
    const TopkLaunch t = topk_cluster_launch_given(scores_per_request, batch, ctas, max_active);
    const double cost =
        double(t.rounds) * double((scores_per_request + ctas - 1) / ctas) * (t.streaming ? kStreamingCost : 1.0);
    if (best.ctas_per_request == 1 || cost < best_cost) best = t, best_cost = cost;
  }
  return best;
}

void compact_tokens_as(const TopkLaunch& launch, const float* scores, int64_t scores_per_request,
                       const int32_t* page_table, int64_t pages_per_request, const int32_t* keys, int64_t page_size,
                       const Budget& budget, int64_t batch, int64_t max_tokens, int64_t q_len, int32_t* slots,
                       int32_t* logical, int32_t* length, int32_t* before, cudaStream_t stream) {
  if (pages_per_request * page_size > kMaxTokens)
    throw std::invalid_argument("sparse compact_tokens: at most 4M keys per request");
  if (batch <= 0) return;
  const SelectArgs a{scores,
                     page_table,
                     int(pages_per_request),
                     keys,
                     int(page_size),
                     int(budget.tokens),
                     int(budget.n_init),
                     int(budget.local),
                     int(max_tokens),
                     int(q_len),
                     slots,
                     logical,
                     length,
                     before};
  const TopkKernel kernel = topk_kernel(launch);
  if (kernel == TopkKernel::block) {
    compact_tokens_kernel<<<unsigned(batch), kSelectThreads, 0, stream>>>(a, scores_per_request);
  } else {
    if (kernel == TopkKernel::cluster && cluster_streams(scores_per_request, launch.ctas_per_request))
      throw std::logic_error("sparse compact_tokens: a cluster holding its keys in registers, but too small for them");
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = cluster_config(launch.ctas_per_request, batch, stream, cluster);
    DSLAB_CUDA(kernel == TopkKernel::cluster_streaming
                   ? cudaLaunchKernelEx(&config, compact_tokens_cluster_kernel<true>, a, scores_per_request)
                   : cudaLaunchKernelEx(&config, compact_tokens_cluster_kernel<false>, a, scores_per_request));
  }
  DSLAB_CHECK_LAUNCH();
}

void compact_tokens(const float* scores, int64_t scores_per_request, const int32_t* page_table,
                    int64_t pages_per_request, const int32_t* keys, int64_t page_size, const Budget& budget,
                    int64_t batch, int64_t max_tokens, int64_t q_len, int32_t* slots, int32_t* logical, int32_t* length,
                    int32_t* before, cudaStream_t stream) {
  compact_tokens_as(topk_launch(scores_per_request, batch), scores, scores_per_request, page_table, pages_per_request,
                    keys, page_size, budget, batch, max_tokens, q_len, slots, logical, length, before, stream);
}

// How many clusters of `ctas` CTAs of the register or streaming kernel this GPU holds at once; asked once per
// (size, kernel): it does not change while the process runs.
static int max_active_clusters(int ctas, bool streaming) {
  static int fits[kClusterMaxCtas + 1][2] = {};
  int& max_active = fits[ctas][streaming ? 1 : 0];
  if (max_active == 0) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = cluster_config(ctas, 1, 0, cluster);
    DSLAB_CUDA(streaming ? cudaOccupancyMaxActiveClusters(&max_active, compact_tokens_cluster_kernel<true>, &config)
                         : cudaOccupancyMaxActiveClusters(&max_active, compact_tokens_cluster_kernel<false>, &config));
    if (max_active <= 0)
      throw std::runtime_error("sparse top-k: this GPU holds no cluster of " + std::to_string(ctas) + " CTAs");
  }
  return max_active;
}

TopkLaunch topk_cluster_launch(int64_t scores_per_request, int64_t batch, int ctas) {
  return topk_cluster_launch_given(scores_per_request, batch, ctas, max_active_clusters);
}

TopkLaunch topk_launch(int64_t scores_per_request, int64_t batch) {
  return topk_launch_given(scores_per_request, batch, max_active_clusters);
}

namespace {

__global__ void fill_scores_kernel(float* scores, int64_t n, uint64_t stream) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    scores[i] = uniform_pm1(stream, uint64_t(i));
}

}  // namespace

// Family "topk_ctas", key "keys S batch B budget N max_tokens T page P q_len Q". Measured on random scores (uniform:
// the radix walk's passes do not depend on the values' spread much) over an identity page table: one block, then each
// cluster size this GPU holds, from a flushed L2, the best of three runs after a warm-up.
TopkLaunch tuned_topk_launch(int64_t scores_per_request, int64_t batch, int64_t page_size, const Budget& budget,
                             int64_t max_tokens, int64_t q_len) {
  const TopkLaunch rule = topk_launch(scores_per_request, batch);
  if (scores_per_request < kClusterMinKeys || batch <= 0) return rule;  // one block: nothing to choose
  int device = 0;
  DSLAB_CUDA(cudaGetDevice(&device));
  const std::string key = "keys " + std::to_string(scores_per_request) + " batch " + std::to_string(batch) +
                          " budget " + std::to_string(budget.tokens) + " max_tokens " + std::to_string(max_tokens) +
                          " page " + std::to_string(page_size) + " q_len " + std::to_string(q_len);
  std::vector<int> candidates = {1};
  for (int ctas = kClusterMinCtas; ctas <= kClusterMaxCtas; ++ctas) try {
      max_active_clusters(ctas, cluster_streams(scores_per_request, ctas));
      candidates.push_back(ctas);
    } catch (const std::runtime_error&) {  // (a size this GPU holds no cluster of)
    }
  auto launch_of = [&](int ctas) {
    return ctas == 1 ? TopkLaunch{} : topk_cluster_launch(scores_per_request, batch, ctas);
  };
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, int> chosen;  // this process's choices, by device and key
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = chosen.find({device, key}); it != chosen.end()) return launch_of(it->second);
  TuningCache& cache = TuningCache::instance();
  if (const auto v = cache.lookup("topk_ctas", key); v && v->is_object() && v->contains("ctas")) {
    const int ctas = v->at("ctas").get<int>();
    if (std::find(candidates.begin(), candidates.end(), ctas) != candidates.end()) {
      chosen[{device, key}] = ctas;
      return launch_of(ctas);
    }
  }
  if (cache.mode() == TuningCache::Mode::off) {
    cache.use_default("topk_ctas", key, nlohmann::json{{"ctas", rule.ctas_per_request}});
    chosen[{device, key}] = rule.ctas_per_request;
    return rule;
  }
  const int64_t pages = (scores_per_request + page_size - 1) / page_size;
  gpu::DeviceArray<float> scores(size_t(batch * scores_per_request));
  fill_scores_kernel<<<unsigned(std::min<int64_t>((batch * scores_per_request + 255) / 256, 4096)), 256>>>(
      scores.get(), batch * scores_per_request, splitmix64(0x70b4));
  DSLAB_CHECK_LAUNCH();
  std::vector<int32_t> table(size_t(batch * pages));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  const size_t requests = static_cast<size_t>(batch), chosen_slots = static_cast<size_t>(batch * max_tokens);
  gpu::DeviceArray<int32_t> page_table(table.size()), keys(requests), slots(chosen_slots), logical(chosen_slots),
      length(requests), before(requests);
  page_table.upload(table);
  keys.upload(std::vector<int32_t>(requests, int32_t(scores_per_request)));
  int best = rule.ctas_per_request;
  double best_us = 0, rule_us = 0;
  for (const int ctas : candidates) {
    const TopkLaunch launch = launch_of(ctas);
    const double us = 1e6 * gpu::fastest_seconds([&] {
                        compact_tokens_as(launch, scores.get(), scores_per_request, page_table.get(), pages, keys.get(),
                                          page_size, budget, batch, max_tokens, q_len, slots.get(), logical.get(),
                                          length.get(), before.get(), 0);
                      });
    if (ctas == rule.ctas_per_request) rule_us = us;
    if (best_us == 0 || us < best_us) best = ctas, best_us = us;
  }
  DSLAB_CUDA(cudaDeviceSynchronize());
  chosen[{device, key}] = best;
  cache.record("topk_ctas", key,
               nlohmann::json{{"ctas", best}, {"us", best_us}, {"rule", rule.ctas_per_request}, {"rule_us", rule_us}});
  return launch_of(best);
}

}  // namespace dslab::sparse::cuda
