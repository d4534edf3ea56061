// Experiment (not part of dslab): does a memset-based L2 flush slow the next kernel by write-back of dirty lines?
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#define CK(x) do{auto e=(x); if(e!=cudaSuccess){printf("err %s line %d\n",cudaGetErrorString(e),__LINE__);return 1;}}while(0)
__global__ void read_kernel(const float4* p, size_t n, float* sink){ float s=0; for(size_t i=blockIdx.x*blockDim.x+threadIdx.x;i<n;i+=size_t(gridDim.x)*blockDim.x){float4 v=p[i]; s+=v.x+v.y+v.z+v.w;} if(s==1234.5f) *sink=s; }
int main(){
  int l2=0; cudaDeviceGetAttribute(&l2,cudaDevAttrL2CacheSize,0);
  size_t fb=size_t(l2)*2; void* flush; CK(cudaMalloc(&flush,fb)); CK(cudaMemset(flush,1,fb));
  float* sink; CK(cudaMalloc(&sink,4));
  size_t pb=size_t(30)<<20; void* probe; CK(cudaMalloc(&probe,pb)); CK(cudaMemset(probe,2,pb));
  cublasHandle_t h; cublasCreate(&h);
  struct S{int m,n,k; const char* name;} shapes[]={{2112,64,7168,"qkv_a 16h b64"},{1536,64,7168,"q_a 64"},{7168,64,2048,"o_proj 16h b64"},{3072,64,1536,"q_b 16h b64"}};
  __nv_bfloat16 *w,*x; float* y; CK(cudaMalloc(&w,size_t(7168)*7168*2)); CK(cudaMalloc(&x,size_t(7168)*128*2)); CK(cudaMalloc(&y,size_t(7168)*128*4));
  CK(cudaMemset(w,0x3c,size_t(7168)*7168*2)); CK(cudaMemset(x,0x3c,size_t(7168)*128*2));
  cudaEvent_t a,b; cudaEventCreate(&a); cudaEventCreate(&b);
  const char* modes[]={"memset 2xL2 (dslab now)","read 2xL2 (clean lines)","memset then read","none (hot)"};
  for(int target=0; target<5; ++target){
    for(int mode=0; mode<4; ++mode){
      std::vector<float> t;
      for(int r=0;r<25;++r){
        if(mode==0||mode==2) cudaMemsetAsync(flush,r&0xff,fb);
        if(mode==1||mode==2) read_kernel<<<1056,512>>>((const float4*)flush,fb/16,sink);
        cudaEventRecord(a);
        if(target<4){ auto s=shapes[target]; float al=1,be=0;
          cublasGemmEx(h,CUBLAS_OP_T,CUBLAS_OP_N,s.m,s.n,s.k,&al,w,CUDA_R_16BF,s.k,x,CUDA_R_16BF,s.k,&be,y,CUDA_R_32F,s.m,CUBLAS_COMPUTE_32F,CUBLAS_GEMM_DEFAULT);
        } else read_kernel<<<1056,512>>>((const float4*)probe,pb/16,sink);
        cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms,a,b); if(r>=5) t.push_back(ms*1e3f);
      }
      CK(cudaGetLastError());
      std::sort(t.begin(),t.end());
      double bytes = target<4 ? 2.0*shapes[target].m*shapes[target].k : double(pb);
      printf("%-16s %-26s median %7.1f us  p10 %7.1f  (%.2f TB/s)\n", target<4?shapes[target].name:"read 30 MB", modes[mode], t[t.size()/2], t[t.size()/10], bytes/(t[t.size()/2]*1e-6)/1e12);
    }
  }
  return 0;
}
