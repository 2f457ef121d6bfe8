// MXFP4 (OCP Microscaling v1.0, E2M1 elements, E8M0 shared scale per 32
// elements), bit-exact to model.md section 7 and the gpt-oss nibble order:
// byte j of a 16-byte block holds element 2j in its low nibble and element
// 2j+1 in its high nibble.
//
// Plain functions over plain buffers; no allocation, no dependencies.
// Thread safety: all functions are pure and reentrant.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moeserve::kernels {

inline constexpr int kMxfp4BlockElems = 32;   // elements sharing one scale
inline constexpr int kMxfp4BlockBytes = 16;   // packed nibbles per block
inline constexpr uint8_t kMxfp4NanScale = 255;

// The 16 E2M1 values, indexed by code (sign in bit 3).
extern const float kE2M1Values[16];

// 2^(scale-127) as a float (scale 0 gives 2^-127, a float denormal); 255 -> NaN.
float E8M0ToFloat(uint8_t scale);

// Quantises one block of 32 floats. Returns false (writing nothing) when any
// input is NaN or infinite; the caller reports which.
bool Mxfp4EncodeBlock(const float* in, uint8_t* packed16, uint8_t* scale);

// Dequantises one block. A scale of 255 yields NaN elements: loaders must
// refuse such checkpoints before calling this (see Mxfp4FindNanScale).
void Mxfp4DecodeBlock(const uint8_t* packed16, uint8_t scale, float* out32);

// Encodes a row-major [rows, cols] matrix (cols % 32 == 0) into
// blocks [rows, cols/32, 16] and scales [rows, cols/32]. Returns the index of
// the first non-finite input, or -1 on success (nothing meaningful is written
// on failure).
long long Mxfp4EncodeMatrix(const float* in, size_t rows, size_t cols, uint8_t* blocks, uint8_t* scales);

// Decodes a [rows, cols] matrix from the on-disk layout into row-major fp32.
void Mxfp4DecodeMatrix(const uint8_t* blocks, const uint8_t* scales, size_t rows, size_t cols, float* out);

// Index of the first scale byte equal to 255 in scales[0..n), or -1.
long long Mxfp4FindNanScale(const uint8_t* scales, size_t n);

}  // namespace moeserve::kernels
