// Throwaway: is the per-SM streaming rate systematic? One CTA per SM streams its own slice; smid + duration per run.
#include "probe.cuh"
#include <vector>
#include <algorithm>
#include <cmath>
__global__ void __launch_bounds__(512, 1) stream(const uint4* buf, size_t per_cta, int* smid_out, unsigned long long* ns_out, uint4* sink, int rot) {
  extern __shared__ uint4 sm[];
  unsigned long long t0, t1; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  int smid; asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  const size_t slice = (blockIdx.x + rot) % gridDim.x;
  const uint4* p = buf + slice * per_cta;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (size_t i = threadIdx.x; i < per_cta; i += 512 * 8) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = i + u * 512 < per_cta ? __ldcs(p + i + u * 512) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 8; ++u) acc.x ^= v[u].x, acc.y ^= v[u].y, acc.z ^= v[u].z, acc.w ^= v[u].w;
  }
  sm[threadIdx.x] = acc;
  __syncthreads();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) { smid_out[blockIdx.x] = smid; ns_out[blockIdx.x] = t1 - t0; if (acc.x == 0x12345) sink[0] = acc; }
}
int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t bytes = size_t(2) << 30, per_cta = bytes / 16 / sms;
  uint4* buf; CK(cudaMalloc(&buf, bytes)); CK(cudaMemset(buf, 1, bytes));
  int* smid; unsigned long long* ns; uint4* sink;
  CK(cudaMalloc(&smid, sms * 4)); CK(cudaMalloc(&ns, sms * 8)); CK(cudaMalloc(&sink, 16));
  CK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
  const int runs = 6;
  std::vector<std::vector<double>> us(sms, std::vector<double>(runs, 0));  // by smid
  for (int r = 0; r < runs; ++r) {
    stream<<<sms, 512, 200 << 10>>>(buf, per_cta, smid, ns, sink, r * 17); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    std::vector<int> s(sms); std::vector<unsigned long long> n(sms);
    CK(cudaMemcpy(s.data(), smid, sms * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(n.data(), ns, sms * 8, cudaMemcpyDeviceToHost));
    for (int i = 0; i < sms; ++i) us[s[i]][r] = n[i] / 1e3;
    std::vector<double> v; for (auto x : n) v.push_back(x / 1e3); std::sort(v.begin(), v.end());
    printf("run %d: per-CTA %.1f MB, min %.1f median %.1f max %.1f us; aggregate at max %.2f TB/s\n", r, per_cta * 16 / 1e6, v[0], v[sms / 2], v[sms - 1], bytes / v[sms - 1] / 1e6);
  }
  // correlation of run 1..5 with run 0 ordering (run 0 is a warm-up)
  auto corr = [&](int a, int b) {
    double ma = 0, mb = 0; for (int i = 0; i < sms; ++i) ma += us[i][a], mb += us[i][b]; ma /= sms; mb /= sms;
    double sab = 0, saa = 0, sbb = 0; for (int i = 0; i < sms; ++i) { sab += (us[i][a] - ma) * (us[i][b] - mb); saa += (us[i][a] - ma) * (us[i][a] - ma); sbb += (us[i][b] - mb) * (us[i][b] - mb); }
    return sab / std::sqrt(saa * sbb);
  };
  for (int r = 2; r < runs; ++r) printf("corr(run1, run%d) = %.3f\n", r, corr(1, r));
  printf("smid: mean us over runs 1..%d\n", runs - 1);
  for (int i = 0; i < sms; ++i) { double m = 0; for (int r = 1; r < runs; ++r) m += us[i][r]; printf("%d:%.0f%s", i, m / (runs - 1), i % 12 == 11 ? "\n" : " "); }
  printf("\n");
  return 0;
}
