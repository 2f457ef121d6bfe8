// NCCL implementation of the collectives (see nccl_group.hpp). Compiled only
// when NCCL is found; kernels/comm/nccl_absent.cpp answers otherwise.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <numeric>
#include <string>

#include "moeserve/kernels/comm/nccl_group.hpp"

namespace moeserve::kernels::comm {
namespace {

std::string CudaText(cudaError_t e) { return cudaGetErrorString(e); }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, ncclComm_t comm, cudaStream_t stream, int device)
      : bootstrap_(bootstrap), comm_(comm), stream_(stream), device_(device) {}
  ~NcclCommunicator() override {
    if (scratch_) cudaFree(scratch_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  const char* backend() const override { return "nccl"; }
  uint64_t bytes_sent() const override { return bytes_sent_; }

  CommResult<std::vector<int64_t>> ExchangeCounts(std::span<const int64_t> send_counts) override {
    return bootstrap_.ExchangeCounts(send_counts);
  }

  CommResult<void> AllToAllV(const void* send, std::span<const int64_t> send_bytes, void* recv,
                             std::span<const int64_t> recv_bytes) override {
    if (!broken_.empty()) return CommFail(broken_);
    const int W = size();
    if (static_cast<int>(send_bytes.size()) != W || static_cast<int>(recv_bytes.size()) != W)
      return CommFail("all-to-all-v: one size per rank expected");
    const size_t in_total = static_cast<size_t>(std::accumulate(send_bytes.begin(), send_bytes.end(), int64_t{0}));
    const size_t out_total = static_cast<size_t>(std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0}));
    cudaSetDevice(device_);
    const char* d_in = static_cast<const char*>(send);
    char* d_out = static_cast<char*>(recv);
    const bool stage_in = !IsDevice(send), stage_out = !IsDevice(recv);
    if (stage_in || stage_out) {
      if (auto st = Reserve(in_total + out_total); !st) return st;
      if (stage_in) {
        d_in = scratch_;
        if (in_total && !Check(cudaMemcpyAsync(scratch_, send, in_total, cudaMemcpyHostToDevice, stream_))) return CommFail(broken_);
      }
      if (stage_out) d_out = scratch_ + in_total;
    }
    ncclGroupStart();
    size_t in_off = 0, out_off = 0;
    for (int r = 0; r < W; ++r) {
      const size_t sb = static_cast<size_t>(send_bytes[static_cast<size_t>(r)]);
      const size_t rb = static_cast<size_t>(recv_bytes[static_cast<size_t>(r)]);
      if (sb) ncclSend(d_in + in_off, sb, ncclUint8, r, comm_, stream_);
      if (rb) ncclRecv(d_out + out_off, rb, ncclUint8, r, comm_, stream_);
      in_off += sb;
      out_off += rb;
    }
    if (ncclResult_t rc = ncclGroupEnd(); rc != ncclSuccess) return Break(std::string("ncclGroupEnd: ") + ncclGetErrorString(rc));
    if (stage_out && out_total && !Check(cudaMemcpyAsync(recv, d_out, out_total, cudaMemcpyDeviceToHost, stream_)))
      return CommFail(broken_);
    if (!Check(cudaStreamSynchronize(stream_))) return CommFail(broken_);
    bytes_sent_ += in_total - static_cast<size_t>(send_bytes[static_cast<size_t>(rank())]);
    return {};
  }

  CommResult<void> Barrier() override { return bootstrap_.Barrier(); }

  CommResult<void> Broadcast(void* data, size_t bytes, int root) override {
    if (!broken_.empty()) return CommFail(broken_);
    if (bytes == 0) return {};
    cudaSetDevice(device_);
    char* d = static_cast<char*>(data);
    const bool stage = !IsDevice(data);
    if (stage) {
      if (auto st = Reserve(bytes); !st) return st;
      d = scratch_;
      if (!Check(cudaMemcpyAsync(d, data, bytes, cudaMemcpyHostToDevice, stream_))) return CommFail(broken_);
    }
    if (ncclResult_t rc = ncclBroadcast(d, d, bytes, ncclUint8, root, comm_, stream_); rc != ncclSuccess)
      return Break(std::string("ncclBroadcast: ") + ncclGetErrorString(rc));
    if (stage && !Check(cudaMemcpyAsync(data, d, bytes, cudaMemcpyDeviceToHost, stream_))) return CommFail(broken_);
    if (!Check(cudaStreamSynchronize(stream_))) return CommFail(broken_);
    if (rank() == root) bytes_sent_ += bytes * static_cast<uint64_t>(size() - 1);
    return {};
  }

 private:
  static bool IsDevice(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  CommResult<void> Reserve(size_t bytes) {
    if (bytes <= scratch_bytes_) return {};
    if (scratch_) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    if (!Check(cudaMalloc(reinterpret_cast<void**>(&scratch_), bytes))) return CommFail(broken_);
    scratch_bytes_ = bytes;
    return {};
  }
  bool Check(cudaError_t e) {
    if (e == cudaSuccess) return true;
    broken_ = "nccl group: CUDA error " + CudaText(e);
    return false;
  }
  CommResult<void> Break(std::string why) {
    broken_ = "nccl group failed: " + why;
    return CommFail(broken_);
  }

  Communicator& bootstrap_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::string broken_;
  uint64_t bytes_sent_ = 0;
};

}  // namespace

bool NcclAvailable() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

CommResult<std::unique_ptr<Communicator>> JoinNcclGroup(Communicator& bootstrap, int cuda_device) {
  if (cudaError_t e = cudaSetDevice(cuda_device); e != cudaSuccess)
    return CommFail("nccl: cannot use CUDA device " + std::to_string(cuda_device) + ": " + CudaText(e));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    if (ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess) return CommFail(std::string("ncclGetUniqueId: ") + ncclGetErrorString(rc));
  }
  if (auto st = bootstrap.Broadcast(&id, sizeof(id), 0); !st) return std::unexpected(st.error());
  ncclComm_t comm = nullptr;
  if (ncclResult_t rc = ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()); rc != ncclSuccess)
    return CommFail(std::string("ncclCommInitRank: ") + ncclGetErrorString(rc));
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    ncclCommDestroy(comm);
    return CommFail("nccl: stream: " + CudaText(e));
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(bootstrap, comm, stream, cuda_device));
}

}  // namespace moeserve::kernels::comm
