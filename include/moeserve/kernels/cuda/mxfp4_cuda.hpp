// MXFP4 dequantisation on a CUDA device, bit-exact to Mxfp4DecodeMatrix
// (kernels/cpu/mxfp4_ref.cpp) for every finite result; a scale of 255 gives
// NaN on both, though the NaN bit pattern may differ.
//
// Defined only when moeserve is built with CUDA (MOESERVE_HAVE_CUDA, set for
// users of moeserve_kernels). This header includes no CUDA header, so plain
// C++ callers can use it; streams are the driver's CUstream_st*, which is what
// cudaStream_t is.
//
// Errors are values: a CudaStatus carries the cudaError_t as an int (0 is
// cudaSuccess) and a message saying what failed.
// Thread safety: functions may be called from any thread; they touch only the
// caller's buffers and the current device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

struct CUstream_st;

namespace moeserve::kernels::cuda {

struct CudaStatus {
  int code = 0;         // a cudaError_t value; 0 is cudaSuccess
  std::string message;  // empty on success
  bool ok() const { return code == 0; }
};

// True when the CUDA runtime loads and reports at least one device. Never
// fails: a missing driver or device is simply false.
bool CudaDeviceAvailable();

// Decodes a [rows, cols] MXFP4 matrix (cols % 32 == 0) from the on-disk
// layout, blocks [rows, cols/32, 16] and scales [rows, cols/32], into
// row-major fp32. All pointers are device pointers; blocks must be 4-byte and
// out 16-byte aligned (cudaMalloc gives 256). Runs asynchronously on stream
// (nullptr: the legacy default stream); only launch errors are reported here.
CudaStatus Mxfp4DecodeMatrixCuda(const uint8_t* blocks, const uint8_t* scales, size_t rows, size_t cols,
                                 float* out, CUstream_st* stream = nullptr);

// The same from host buffers: copies to the device, decodes, copies back and
// waits. For tests and one-off conversions, not the serving path.
CudaStatus Mxfp4DecodeMatrixCudaFromHost(const uint8_t* blocks, const uint8_t* scales, size_t rows, size_t cols,
                                         float* out);

}  // namespace moeserve::kernels::cuda
