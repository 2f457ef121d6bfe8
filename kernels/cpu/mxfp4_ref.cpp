// Reference MXFP4 encode/decode (model.md section 7). This is the yardstick
// the fast kernels (CPU SIMD, CUDA) are tested against, so it favours being
// obviously exact over being quick.
//
// Decisions where section 7 is silent, kept identical to
// tools/reference/mxfp4.py so the two agree bit for bit:
//  - The sign bit always follows the input's sign bit, including -0.0: a
//    -0.0 element encodes as code 8 even in an otherwise all-zero block
//    (which gets scale 0). Decoding code 8 gives -0.0, so encode(decode(x))
//    keeps every sign.
//  - The clamp X <= 127 can never bind for float input (max|v| < 2^128
//    gives X <= 125); X >= -127 binds for max|v| < 2^-125, where every
//    element then rounds to a small code, never past 6.
#include "moeserve/kernels/mxfp4.hpp"

#include <cmath>
#include <limits>

namespace moeserve::kernels {

const float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

namespace {

// Midpoints between consecutive E2M1 magnitudes 0,0.5,1,1.5,2,3,4,6. All are
// exact in binary, so comparing against them decides ties without any
// distance arithmetic that could round.
constexpr double kMidpoints[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};

// Magnitude code (0..7) of a >= 0, already divided by the block scale.
uint8_t RoundToE2M1Magnitude(double a) {
  int i = 0;  // number of midpoints strictly below a = index of the lower neighbour
  while (i < 7 && kMidpoints[i] < a) ++i;
  // Exactly on midpoint i (between codes i and i+1): the even code is the one
  // whose mantissa bit is 0. Above the last midpoint i is 7: saturate at 6.
  if (i < 7 && kMidpoints[i] == a && (i % 2 == 1)) ++i;
  return static_cast<uint8_t>(i);
}

}  // namespace

float E8M0ToFloat(uint8_t scale) {
  if (scale == kMxfp4NanScale) return std::numeric_limits<float>::quiet_NaN();
  // ldexp is exact here, including scale 0 -> 2^-127 (a float denormal).
  return std::ldexp(1.0f, static_cast<int>(scale) - 127);
}

bool Mxfp4EncodeBlock(const float* in, uint8_t* packed16, uint8_t* scale) {
  float amax = 0.0f;
  for (int i = 0; i < kMxfp4BlockElems; ++i) {
    if (!std::isfinite(in[i])) return false;
    amax = std::fmax(amax, std::fabs(in[i]));
  }

  int x = -127;  // all-zero block: scale 0; every element is then +-0 anyway
  if (amax > 0.0f) {
    // frexp gives amax = m * 2^e with m in [0.5, 1), so floor(log2(amax)) is
    // e - 1 exactly, denormals included (log2 in floating point could round up
    // just below a power of two).
    int e = 0;
    std::frexp(amax, &e);
    x = e - 1 - 2;  // 2 = exponent of the largest E2M1 value's leading bit (4..6)
    if (x < -127) x = -127;
    if (x > 127) x = 127;
  }

  uint8_t codes[kMxfp4BlockElems];
  for (int i = 0; i < kMxfp4BlockElems; ++i) {
    // A float times a power of two in double never rounds: with -x in
    // [-125, 127] every product lies between 2^-274 and 2^255, well inside the
    // normal double range, and a float's 24-bit mantissa fits in 53 bits.
    const double a = std::ldexp(static_cast<double>(std::fabs(in[i])), -x);
    const uint8_t sign = std::signbit(in[i]) ? 8 : 0;
    codes[i] = static_cast<uint8_t>(sign | RoundToE2M1Magnitude(a));
  }
  for (int j = 0; j < kMxfp4BlockBytes; ++j) {
    packed16[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
  }
  *scale = static_cast<uint8_t>(x + 127);
  return true;
}

void Mxfp4DecodeBlock(const uint8_t* packed16, uint8_t scale, float* out32) {
  // Every E2M1 value times 2^(s-127) is a float (the smallest, 0.5 * 2^-127,
  // is still a denormal), so this product is exact unless it overflows to
  // inf (s >= 253 with large codes), which is exactly what the value is.
  const float s = E8M0ToFloat(scale);
  for (int j = 0; j < kMxfp4BlockBytes; ++j) {
    out32[2 * j] = kE2M1Values[packed16[j] & 0x0F] * s;
    out32[2 * j + 1] = kE2M1Values[packed16[j] >> 4] * s;
  }
}

long long Mxfp4EncodeMatrix(const float* in, size_t rows, size_t cols, uint8_t* blocks, uint8_t* scales) {
  // Blocks are visited in row-major element order, so the first block that
  // refuses holds the first non-finite input.
  const size_t nblocks = rows * (cols / kMxfp4BlockElems);
  for (size_t b = 0; b < nblocks; ++b) {
    const float* src = in + b * kMxfp4BlockElems;
    if (!Mxfp4EncodeBlock(src, blocks + b * kMxfp4BlockBytes, scales + b)) {
      for (int i = 0; i < kMxfp4BlockElems; ++i) {
        if (!std::isfinite(src[i])) return static_cast<long long>(b * kMxfp4BlockElems + i);
      }
    }
  }
  return -1;
}

void Mxfp4DecodeMatrix(const uint8_t* blocks, const uint8_t* scales, size_t rows, size_t cols, float* out) {
  // [rows, cols/32, 16] is contiguous in the same order as row-major
  // [rows, cols], so the matrix is just a run of blocks.
  const size_t nblocks = rows * (cols / kMxfp4BlockElems);
  for (size_t b = 0; b < nblocks; ++b) {
    Mxfp4DecodeBlock(blocks + b * kMxfp4BlockBytes, scales[b], out + b * kMxfp4BlockElems);
  }
}

long long Mxfp4FindNanScale(const uint8_t* scales, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (scales[i] == kMxfp4NanScale) return static_cast<long long>(i);
  }
  return -1;
}

}  // namespace moeserve::kernels
