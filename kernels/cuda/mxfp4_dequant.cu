// MXFP4 -> fp32 on the GPU; the reference is Mxfp4DecodeMatrix in
// kernels/cpu/mxfp4_ref.cpp and tests/kernels/mxfp4_cuda_test.cpp compares
// the two bit for bit.
//
// The on-disk layout [rows, cols/32, 16] is the row-major element order
// packed two per byte, so the matrix is one flat run: byte k holds elements
// 2k (low nibble) and 2k+1 (high nibble) and uses scale k/16. Each thread
// takes one 32-bit word (8 elements, always inside one block) and writes two
// float4s, so loads and stores are full-width and coalesced.
#include "moeserve/kernels/cuda/mxfp4_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace moeserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxGrid = size_t{1} << 20;  // grid-stride beyond this

// The E2M1 value of a 4-bit code built from its bits rather than read from a
// table: a __constant__ table would serialise a warp whose lanes read
// different entries. Code = sign(1) exponent(2) mantissa(1); exponent 0 is
// subnormal, so magnitude 1 is 0.5 and 0 is 0; otherwise 2^(e-1) * (1 + m/2),
// whose float exponent field is e + 126.
__device__ __forceinline__ float E2M1ToFloat(uint32_t code) {
  const uint32_t mag = code & 7u;
  uint32_t bits = mag < 2 ? mag * 0x3F000000u : ((((mag >> 1) + 126u) << 23) | ((mag & 1u) << 22));
  bits |= (code & 8u) << 28;
  return __uint_as_float(bits);
}

// 2^(s-127) built from its bits, so no exp2 approximation is involved:
// s = 1..254 is the normal float with exponent field s; s = 0 is the
// denormal 2^-127 (mantissa bit 22); s = 255 is NaN.
__device__ __forceinline__ float E8M0ToFloatDevice(uint32_t s) {
  if (s == 0) return __uint_as_float(0x00400000u);
  if (s == 255) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(s << 23);
}

// The product is exact (or overflows to inf, as on the CPU) because every
// E2M1 value times 2^(s-127) is a float; nvcc keeps denormals unless built
// with -ftz=true / --use_fast_math, which this file must never be.
__global__ void Mxfp4DecodeKernel(const uint32_t* __restrict__ words, const uint8_t* __restrict__ scales,
                                  size_t nwords, float4* __restrict__ out) {
  for (size_t w = blockIdx.x * size_t{blockDim.x} + threadIdx.x; w < nwords; w += size_t{gridDim.x} * blockDim.x) {
    const uint32_t packed = words[w];  // little-endian: byte 0 in bits 0..7
    const float s = E8M0ToFloatDevice(scales[w / 4]);  // 4 words per 16-byte block
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = E2M1ToFloat((packed >> (4 * i)) & 0xFu) * s;
    out[2 * w] = make_float4(v[0], v[1], v[2], v[3]);
    out[2 * w + 1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

CudaStatus Fail(cudaError_t err, const std::string& what) {
  return CudaStatus{static_cast<int>(err), what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")"};
}

// Frees a device allocation on every return path.
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

}  // namespace

bool CudaDeviceAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // a missing driver or device must not poison later calls
    return false;
  }
  return count > 0;
}

CudaStatus Mxfp4DecodeMatrixCuda(const uint8_t* blocks, const uint8_t* scales, size_t rows, size_t cols, float* out,
                                 CUstream_st* stream) {
  if (cols % 32 != 0) {
    return CudaStatus{static_cast<int>(cudaErrorInvalidValue),
                      "mxfp4 decode: cols " + std::to_string(cols) + " is not a multiple of 32"};
  }
  if (reinterpret_cast<uintptr_t>(blocks) % 4 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return CudaStatus{static_cast<int>(cudaErrorMisalignedAddress),
                      "mxfp4 decode: blocks must be 4-byte aligned and out 16-byte aligned"};
  }
  const size_t nwords = rows * cols / 8;  // 8 elements per 32-bit word
  if (nwords == 0) return {};
  const size_t grid = std::min((nwords + kThreads - 1) / kThreads, kMaxGrid);
  Mxfp4DecodeKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(blocks), scales, nwords, reinterpret_cast<float4*>(out));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Fail(err, "mxfp4 decode: kernel launch");
  return {};
}

CudaStatus Mxfp4DecodeMatrixCudaFromHost(const uint8_t* blocks, const uint8_t* scales, size_t rows, size_t cols,
                                         float* out) {
  if (cols % 32 != 0) {
    return CudaStatus{static_cast<int>(cudaErrorInvalidValue),
                      "mxfp4 decode: cols " + std::to_string(cols) + " is not a multiple of 32"};
  }
  const size_t n = rows * cols;
  if (n == 0) return {};
  const size_t block_bytes = n / 2, scale_bytes = n / 32, out_bytes = n * sizeof(float);

  DeviceBuffer d_blocks, d_scales, d_out;
  cudaError_t err = cudaMalloc(&d_blocks.ptr, block_bytes);
  if (err == cudaSuccess) err = cudaMalloc(&d_scales.ptr, scale_bytes);
  if (err == cudaSuccess) err = cudaMalloc(&d_out.ptr, out_bytes);
  if (err != cudaSuccess) return Fail(err, "mxfp4 decode: cudaMalloc of " + std::to_string(block_bytes + scale_bytes + out_bytes) + " bytes");

  err = cudaMemcpy(d_blocks.ptr, blocks, block_bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaMemcpy(d_scales.ptr, scales, scale_bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return Fail(err, "mxfp4 decode: copy to device");

  CudaStatus st = Mxfp4DecodeMatrixCuda(static_cast<const uint8_t*>(d_blocks.ptr), static_cast<const uint8_t*>(d_scales.ptr),
                                        rows, cols, static_cast<float*>(d_out.ptr), nullptr);
  if (!st.ok()) return st;
  // cudaMemcpy on the legacy default stream waits for the kernel and reports
  // any error it raised while running.
  err = cudaMemcpy(out, d_out.ptr, out_bytes, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return Fail(err, "mxfp4 decode: kernel or copy to host");
  return {};
}

}  // namespace moeserve::kernels::cuda
