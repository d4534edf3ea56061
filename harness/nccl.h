// NCCL, loaded at run time. NCCL is not a Debian package on the hosts dslab builds on, and its PyPI wheel (what
// PyTorch's CUDA build depends on, so a GPU machine with PyTorch has it) is 300+ MB: dslab links neither, and opens
// the library when a multi-GPU measurement asks for it. Where from, in order: $DSLAB_NCCL_LIBRARY; libnccl.so.2 on
// the loader's path; the nvidia-nccl wheel of the first `python3` on PATH. The types and entry points below are the
// subset of NCCL's C ABI (nccl.h, stable since NCCL 2.0) that dslab calls; enums travel as int.
#pragma once
#include <cstddef>
#include <string>

namespace dslab::nccl {

using Comm = struct ncclComm*;  // opaque, NCCL's ncclComm_t
constexpr int kSuccess = 0;     // ncclSuccess
constexpr int kFloat32 = 7;     // ncclFloat32
constexpr int kSum = 0;         // ncclSum

// Streams are cudaStream_t (a pointer), taken as void* so this header needs no CUDA.
struct Api {
  int (*GetVersion)(int* version);
  int (*CommInitAll)(Comm* comms, int ndev, const int* devices);
  int (*CommDestroy)(Comm comm);
  int (*AllReduce)(const void* send, void* recv, size_t count, int type, int op, Comm comm, void* stream);
  int (*AllGather)(const void* send, void* recv, size_t send_count, int type, Comm comm, void* stream);
  int (*ReduceScatter)(const void* send, void* recv, size_t recv_count, int type, int op, Comm comm, void* stream);
  int (*Send)(const void* send, size_t count, int type, int peer, Comm comm, void* stream);
  int (*Recv)(void* recv, size_t count, int type, int peer, Comm comm, void* stream);
  int (*GroupStart)();
  int (*GroupEnd)();
  const char* (*GetErrorString)(int result);
  std::string library;  // the file opened
  int version = 0;      // NCCL's code, e.g. 22703 for 2.27.3
  std::string version_text() const;
};

// The process's NCCL (opened once), or null with *why saying what was tried.
const Api* api(std::string* why);
// Throws std::runtime_error "NCCL <what>: <NCCL's message>" unless result is kSuccess.
void check(const Api& nccl, int result, const char* what);

}  // namespace dslab::nccl
