// Intel AMX for the BF16-activation products (bf16_activations.hpp): the
// registry's "amx" row (cpu_kernels.hpp) runs matmul_bf16_bf16act and
// matmul_mxfp4_bf16act as one tile program, TDPBF16PS over 16 x 16 fp32
// accumulator tiles.
//
// The program is written against a tile backend with six operations
// (configure, release, zero, load, store, BF16 dot product). Two backends
// run it:
//  - the hardware (matmul_amx.cpp): each operation one instruction;
//  - AmxTileModel (below): the instructions' documented semantics in plain
//    C++, so that the program, its activation packing, MXFP4 decoding and
//    output writes are checked against the reference on every CPU, AMX or
//    not (the registry's amx_model row runs the amx row's entries on it).
// What only an AMX machine checks is the six one-instruction wrappers and
// the operating system's permission; the tests that need the hardware
// skip, saying so, elsewhere.
//
// The product, Y[n, out] = bf16(X)[n, in] W^T (W row-major BF16 [out, in]):
//  - A tiles are W's rows (16 outputs x 32 k): BF16 weights read in place;
//    MXFP4 weights decoded to BF16 (exact) a 32-output strip at a time,
//    then reused for every token;
//  - B tiles are the activations rounded to BF16 and packed as TDPBF16PS
//    wants its second operand: for 16 tokens and 32 k, row r holds each
//    token's pair (k = 2r, 2r + 1), a 64-byte row (AmxPackActivations);
//  - each 32-output strip runs 2 x 2 tiles of 16 outputs x 16 tokens over
//    the whole of K, and the accumulators are written to Y transposed.
// Tails (out not a multiple of 32, in not of 32, n not of 32) are zero
// padding: a strip that would read past W or past a row's end reads a
// zero-padded copy of its rows instead; packed activations are padded with
// zeros to 32 tokens and 32 k.
//
// Numerics are those of the family (bf16_activations.hpp): exact BF16
// products summed in fp32. TDPBF16PS treats subnormal inputs as zero and
// flushes subnormal results, as vdpbf16ps does.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "moeserve/kernels/mxfp4_packed.hpp"

namespace moeserve::kernels {

// Whether this CPU runs the amx row: amx_tile and amx_bf16 in CPUID, the
// tile state enabled by the OS (XCR0 bits 17 and 18), AVX-512 with BF16
// (the packing), and the kernel granted this process the tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM; asked once, at the first call).
bool CpuHasAmxBf16();

// The 64-byte operand of LDTILECFG (palette 1).
struct AmxTileConfig {
  uint8_t palette = 0;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row, tiles 0..15 (8 exist in palette 1)
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64, "LDTILECFG reads 64 bytes");

inline constexpr int kAmxTiles = 8;           // palette 1: tmm0 .. tmm7
inline constexpr size_t kAmxTileRows = 16;    // at most
inline constexpr size_t kAmxTileRowBytes = 64;

// The configuration the BF16 product's program loads: every tile 16 rows
// of 64 bytes (C: 16 x 16 fp32; A: 16 x 32 BF16; B: 16 pairs x 16 tokens).
AmxTileConfig AmxBf16ProductConfig();

// The tile instructions' semantics (Intel's pseudo-code for LDTILECFG,
// TILELOADD, TILESTORED, TILEZERO, TDPBF16PS, TILERELEASE), on a CPU
// without them. A configuration or an operand shape the hardware would
// fault on aborts with a message naming it.
class AmxTileModel {
 public:
  void Configure(const AmxTileConfig& config);
  void Release();
  template <int t>
  void Zero() {
    ZeroTile(t);
  }
  template <int t>
  void Load(const void* base, size_t stride_bytes) {
    LoadTile(t, base, stride_bytes);
  }
  template <int t>
  void Store(void* base, size_t stride_bytes) const {
    StoreTile(t, base, stride_bytes);
  }
  // C[m][n] += sum over k of A's pairs times B's: per Intel's pseudo-code,
  // for each k the pair's two products added to the fp32 sum one after
  // the other, nearest even, subnormal inputs as zero, subnormal sums
  // flushed.
  template <int c, int a, int b>
  void DotBf16() {
    DotBf16Tiles(c, a, b);
  }

 private:
  void ZeroTile(int t);
  void LoadTile(int t, const void* base, size_t stride_bytes);
  void StoreTile(int t, void* base, size_t stride_bytes) const;
  void DotBf16Tiles(int c, int a, int b);
  void Check(int t, const char* what) const;

  bool configured_ = false;
  AmxTileConfig config_{};
  std::array<std::array<uint8_t, kAmxTileRows * kAmxTileRowBytes>, kAmxTiles> tile_{};
};

// The packed activations: ceil(n / 32) * 32 tokens by ceil(in / 32) * 32 k,
// as 1 KiB B tiles, token block (16 tokens) major, then k step (32 k):
// element ((tb * ksteps + ks) * 16 + r) * 32 + 2 j + e holds
// bf16(X[16 tb + j][32 ks + 2 r + e]), zero past n or in.
size_t AmxPackedActivationsElements(size_t n, size_t in);
// The plain loop (RoundToBf16 per element), and the AVX-512 BF16 form
// (vcvtne2ps2bf16 and a 16 x 16 transpose; the same bits; the caller checks
// CpuHasAvx512Bf16). Token blocks [tb_begin, tb_end) only, so threads can
// share the work.
void AmxPackActivationsRef(const float* X, size_t n, size_t in, size_t tb_begin, size_t tb_end, uint16_t* packed);
void AmxPackActivations(const float* X, size_t n, size_t in, size_t tb_begin, size_t tb_end, uint16_t* packed);

// An accumulator tile (16 outputs x 16 tokens, fp32, rows of 64 bytes)
// written to Y transposed: Y[t * ldy + m] = tile[m * 16 + t] for m < rows,
// t < cols. The plain loop, and the AVX-512 form (the same values).
void AmxWriteTileTransposedRef(const float* tile, float* Y, size_t ldy, size_t rows, size_t cols);
void AmxWriteTileTransposed(const float* tile, float* Y, size_t ldy, size_t rows, size_t cols);

// A packed MXFP4 group's 16 rows (rows 16 g .. 16 g + 15 of w, all of in)
// as BF16 rows, dst[r * ld + k]: the values exactly (E2M1 times a power of
// two; the upper half of the fp32 DecodePackedRow gives). The plain loop, and
// the AVX-512 form (the same bits; the caller checks CpuHasAvx512Bf16). Rows
// past w.out are zero.
void AmxDecodeMxfp4GroupRef(const Mxfp4PackedView& w, size_t g, uint16_t* dst, size_t ld);
void AmxDecodeMxfp4Group(const Mxfp4PackedView& w, size_t g, uint16_t* dst, size_t ld);

// The amx row's products, matmul_bf16_bf16act and matmul_mxfp4_bf16act, as
// the row runs them (the same tile program, packing, decoding and output
// writes, threaded the same way) but on AmxTileModel: with the plain helpers
// or (`avx512_helpers`, where CpuHasAvx512Bf16) the ones the row uses.
void MatMulBf16Bf16ActOnTileModel(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                                  bool avx512_helpers);
void MatMulMxfp4Bf16ActOnTileModel(const Mxfp4PackedView& w, const float* X, size_t n, float* Y,
                                   bool avx512_helpers);

}  // namespace moeserve::kernels
