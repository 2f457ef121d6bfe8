// AmxTileModel (the tile instructions' semantics in C++), the products' tile
// configuration, the plain forms of their activation packing, output writes
// and MXFP4 decoding, and the products run on the model (amx_tiles.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "amx_bf16_program.hpp"
#include "moeserve/kernels/amx_tiles.hpp"
#include "moeserve/kernels/bf16_activations.hpp"
#include "variants.hpp"

namespace moeserve::kernels {
namespace {

[[noreturn]] void Fault(const char* what, int t) {
  std::fprintf(stderr, "AmxTileModel: %s (tile %d): the hardware would fault here\n", what, t);
  std::abort();
}

float Bf16At(const uint8_t* row, size_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f;  // DAZ
}

float FlushSubnormal(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f; }

uint16_t Bf16Bits(float x) {
  const float r = RoundToBf16(x);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

AmxTileConfig AmxBf16ProductConfig() {
  AmxTileConfig c;
  c.palette = 1;
  for (int t = 0; t < kAmxTiles; ++t) {
    c.rows[t] = static_cast<uint8_t>(kAmxTileRows);
    c.colsb[t] = static_cast<uint16_t>(kAmxTileRowBytes);
  }
  return c;
}

void AmxTileModel::Configure(const AmxTileConfig& config) {
  // LDTILECFG's checks (palette 1): #GP on a reserved byte, a tile past the
  // palette's eight, a row longer than 64 bytes or more than 16 rows, and a
  // tile with rows but no columns or columns but no rows.
  if (config.palette != 1) Fault("palette other than 1", -1);
  if (config.start_row != 0) Fault("start_row other than 0 (only a restarted load sets it)", -1);
  for (uint8_t b : config.reserved)
    if (b != 0) Fault("reserved byte set", -1);
  for (int t = 0; t < 16; ++t) {
    const bool exists = t < kAmxTiles;
    if (!exists && (config.rows[t] != 0 || config.colsb[t] != 0)) Fault("tile past the palette configured", t);
    if (config.rows[t] > kAmxTileRows) Fault("more than 16 rows", t);
    if (config.colsb[t] > kAmxTileRowBytes) Fault("row longer than 64 bytes", t);
    if ((config.rows[t] == 0) != (config.colsb[t] == 0)) Fault("rows without columns or columns without rows", t);
  }
  config_ = config;
  configured_ = true;
  for (auto& tile : tile_) tile.fill(0);  // LDTILECFG zeroes the tile data
}

void AmxTileModel::Release() {
  configured_ = false;
  config_ = AmxTileConfig{};
  for (auto& tile : tile_) tile.fill(0);
}

void AmxTileModel::Check(int t, const char* what) const {
  if (!configured_) Fault(what, t);  // #UD: no configuration loaded
  if (t < 0 || t >= kAmxTiles) Fault("no such tile", t);
  if (config_.rows[t] == 0) Fault("tile not configured", t);
}

void AmxTileModel::ZeroTile(int t) {
  Check(t, "TILEZERO without a configuration");
  tile_[t].fill(0);
}

void AmxTileModel::LoadTile(int t, const void* base, size_t stride_bytes) {
  Check(t, "TILELOADD without a configuration");
  tile_[t].fill(0);  // what lies past the configured rows and columns reads as zero
  const auto* src = static_cast<const uint8_t*>(base);
  for (size_t r = 0; r < config_.rows[t]; ++r)
    std::memcpy(&tile_[t][r * kAmxTileRowBytes], src + r * stride_bytes, config_.colsb[t]);
}

void AmxTileModel::StoreTile(int t, void* base, size_t stride_bytes) const {
  Check(t, "TILESTORED without a configuration");
  auto* dst = static_cast<uint8_t*>(base);
  for (size_t r = 0; r < config_.rows[t]; ++r)
    std::memcpy(dst + r * stride_bytes, &tile_[t][r * kAmxTileRowBytes], config_.colsb[t]);
}

void AmxTileModel::DotBf16Tiles(int c, int a, int b) {
  Check(c, "TDPBF16PS without a configuration");
  Check(a, "TDPBF16PS without a configuration");
  Check(b, "TDPBF16PS without a configuration");
  // #UD unless the three tiles differ and their shapes agree.
  if (c == a || c == b || a == b) Fault("TDPBF16PS names one tile twice", c);
  const size_t m_rows = config_.rows[c], n_cols = config_.colsb[c] / 4, k_pairs = config_.colsb[a] / 4;
  if (config_.colsb[c] % 4 != 0 || config_.colsb[a] % 4 != 0) Fault("TDPBF16PS row not of whole dwords", c);
  if (config_.rows[a] != m_rows) Fault("TDPBF16PS: A's rows are not C's", a);
  if (config_.rows[b] != k_pairs) Fault("TDPBF16PS: B's rows are not A's pairs", b);
  if (config_.colsb[b] != config_.colsb[c]) Fault("TDPBF16PS: B's row is not C's", b);
  for (size_t m = 0; m < m_rows; ++m) {
    float sum[kAmxTileRows];
    std::memcpy(sum, &tile_[c][m * kAmxTileRowBytes], n_cols * 4);
    const uint8_t* arow = &tile_[a][m * kAmxTileRowBytes];
    for (size_t k = 0; k < k_pairs; ++k) {
      const uint8_t* brow = &tile_[b][k * kAmxTileRowBytes];
      for (size_t n = 0; n < n_cols; ++n) {
        sum[n] = FlushSubnormal(sum[n] + Bf16At(arow, 2 * k) * Bf16At(brow, 2 * n));
        sum[n] = FlushSubnormal(sum[n] + Bf16At(arow, 2 * k + 1) * Bf16At(brow, 2 * n + 1));
      }
    }
    std::memset(&tile_[c][m * kAmxTileRowBytes], 0, kAmxTileRowBytes);  // write_row_and_zero
    std::memcpy(&tile_[c][m * kAmxTileRowBytes], sum, n_cols * 4);
  }
}

size_t AmxPackedActivationsElements(size_t n, size_t in) {
  return cpu::AmxRoundUp(n, 2 * cpu::kAmxTokenBlock) * cpu::AmxRoundUp(in, cpu::kAmxKStep);
}

void AmxPackActivationsRef(const float* X, size_t n, size_t in, size_t tb_begin, size_t tb_end, uint16_t* packed) {
  const size_t ksteps = cpu::AmxRoundUp(in, cpu::kAmxKStep) / cpu::kAmxKStep;
  for (size_t tb = tb_begin; tb < tb_end; ++tb)
    for (size_t ks = 0; ks < ksteps; ++ks)
      for (size_t r = 0; r < kAmxTileRows; ++r)
        for (size_t j = 0; j < cpu::kAmxTokenBlock; ++j)
          for (size_t e = 0; e < 2; ++e) {
            const size_t t = tb * cpu::kAmxTokenBlock + j, k = ks * cpu::kAmxKStep + 2 * r + e;
            packed[((tb * ksteps + ks) * kAmxTileRows + r) * 32 + 2 * j + e] =
                t < n && k < in ? Bf16Bits(X[t * in + k]) : 0;
          }
}

void AmxPackActivations(const float* X, size_t n, size_t in, size_t tb_begin, size_t tb_end, uint16_t* packed) {
  cpu::amx_pack_activations_avx512bf16(X, n, in, tb_begin, tb_end, packed);
}

void AmxWriteTileTransposedRef(const float* tile, float* Y, size_t ldy, size_t rows, size_t cols) {
  for (size_t t = 0; t < cols; ++t)
    for (size_t m = 0; m < rows; ++m) Y[t * ldy + m] = tile[m * cpu::kAmxTokenBlock + t];
}

void AmxWriteTileTransposed(const float* tile, float* Y, size_t ldy, size_t rows, size_t cols) {
  cpu::amx_write_tile_transposed_avx512(tile, Y, ldy, rows, cols);
}

void AmxDecodeMxfp4GroupRef(const Mxfp4PackedView& w, size_t g, uint16_t* dst, size_t ld) {
  std::vector<float> row(w.in);
  for (size_t r = 0; r < kMxfp4PackRows; ++r) {
    const size_t o = g * kMxfp4PackRows + r;
    if (o >= w.out) {
      std::fill(dst + r * ld, dst + r * ld + w.in, uint16_t{0});
      continue;
    }
    DecodePackedRow(w, o, 0, w.in / 32, row.data(), 1);
    for (size_t k = 0; k < w.in; ++k) {
      uint32_t u;
      std::memcpy(&u, &row[k], 4);
      dst[r * ld + k] = static_cast<uint16_t>(u >> 16);  // exact: at most 3 significant bits
    }
  }
}

void AmxDecodeMxfp4Group(const Mxfp4PackedView& w, size_t g, uint16_t* dst, size_t ld) {
  cpu::amx_decode_mxfp4_group_avx512bf16(w, g, dst, ld);
}

void MatMulBf16Bf16ActOnTileModel(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                                  bool avx512_helpers) {
  if (out == 0 || n == 0) return;
  std::vector<uint16_t> packed;
  cpu::AmxProduct<AmxTileModel>(
      out, in, X, n, Y, [&] { return cpu::AmxBf16WeightRows(W, out, in); },
      avx512_helpers ? AmxPackActivations : AmxPackActivationsRef,
      avx512_helpers ? AmxWriteTileTransposed : AmxWriteTileTransposedRef, packed);
}

void MatMulMxfp4Bf16ActOnTileModel(const Mxfp4PackedView& w, const float* X, size_t n, float* Y,
                                   bool avx512_helpers) {
  if (w.out == 0 || n == 0) return;
  std::vector<uint16_t> packed;
  cpu::AmxProduct<AmxTileModel>(
      w.out, w.in, X, n, Y,
      [&] { return cpu::AmxMxfp4WeightRows(w, avx512_helpers ? AmxDecodeMxfp4Group : AmxDecodeMxfp4GroupRef); },
      avx512_helpers ? AmxPackActivations : AmxPackActivationsRef,
      avx512_helpers ? AmxWriteTileTransposed : AmxWriteTileTransposedRef, packed);
}

namespace cpu {

void matmul_bf16_bf16act_amx_model(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
  AmxMatMulBf16Bf16Act<AmxTileModel>(W, out, in, X, n, Y, kAmxAvx512Helpers);
}

void matmul_mxfp4_bf16act_amx_model(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  AmxMatMulMxfp4Bf16Act<AmxTileModel>(w, X, n, Y, kAmxAvx512Helpers);
}

}  // namespace cpu
}  // namespace moeserve::kernels
