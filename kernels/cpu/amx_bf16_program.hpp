// The tile program of the AMX BF16 product (amx_tiles.hpp), over any tile
// backend: the hardware (matmul_amx.cpp) or AmxTileModel (amx_tile_model.cpp).
// Plain C++: no intrinsics, so it builds for every target; the backend's
// operations and the output writer are the only machine-specific parts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moeserve/kernels/amx_tiles.hpp"

namespace moeserve::kernels::cpu {

inline constexpr size_t kAmxStripOutputs = 32;  // two A tiles
inline constexpr size_t kAmxTokenBlock = 16;    // one B tile's tokens
inline constexpr size_t kAmxKStep = 32;         // one A tile's k

inline size_t AmxRoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

using AmxTileWriter = void (*)(const float* tile, float* Y, size_t ldy, size_t rows, size_t cols);

// One call's operands. `packed` holds AmxRoundUp(n, 32) tokens.
struct AmxBf16Operands {
  const uint16_t* W;  // [out, in] BF16
  size_t out, in;
  const uint16_t* packed;  // AmxPackActivations' layout
  size_t n;
  float* Y;  // [n, out]
};

// Strips [s_begin, s_end) of 32 outputs: Y's columns [32 s, 32 s + 32).
// Configures the tiles and releases them: one call per thread's share.
template <class Tiles>
void AmxBf16Strips(Tiles& tiles, const AmxBf16Operands& p, size_t s_begin, size_t s_end, AmxTileWriter write) {
  const size_t in_pad = AmxRoundUp(p.in, kAmxKStep), ksteps = in_pad / kAmxKStep;
  const size_t token_blocks = AmxRoundUp(p.n, 2 * kAmxTokenBlock) / kAmxTokenBlock;  // even
  const size_t b_tile = kAmxTileRows * kAmxTileRowBytes / sizeof(uint16_t);          // 512 elements
  std::vector<uint16_t> padded;  // a strip's rows, zero-padded, where W itself cannot be read
  alignas(64) float acc[kAmxTileRows * kAmxTokenBlock];
  const AmxTileConfig config = AmxBf16ProductConfig();
  tiles.Configure(config);
  for (size_t s = s_begin; s < s_end; ++s) {
    const size_t o0 = s * kAmxStripOutputs;
    const size_t rows = std::min(kAmxStripOutputs, p.out - o0);
    const uint16_t* a = p.W + o0 * p.in;
    size_t lda = p.in;
    // A full strip of rows whose length is a whole number of k steps is
    // read in place; otherwise from a copy: the loads read 32 rows of
    // in_pad elements.
    if (rows < kAmxStripOutputs || p.in != in_pad) {
      padded.assign(kAmxStripOutputs * in_pad, 0);
      for (size_t r = 0; r < rows; ++r) std::memcpy(&padded[r * in_pad], a + r * p.in, p.in * sizeof(uint16_t));
      a = padded.data();
      lda = in_pad;
    }
    const size_t lda_bytes = lda * sizeof(uint16_t);
    for (size_t tb = 0; tb < token_blocks; tb += 2) {
      tiles.template Zero<0>();
      tiles.template Zero<1>();
      tiles.template Zero<2>();
      tiles.template Zero<3>();
      const uint16_t* b0 = p.packed + tb * ksteps * b_tile;
      const uint16_t* b1 = b0 + ksteps * b_tile;
      for (size_t ks = 0; ks < ksteps; ++ks) {
        tiles.template Load<4>(a + ks * kAmxKStep, lda_bytes);
        tiles.template Load<5>(a + kAmxTileRows * lda + ks * kAmxKStep, lda_bytes);
        tiles.template Load<6>(b0 + ks * b_tile, kAmxTileRowBytes);
        tiles.template Load<7>(b1 + ks * b_tile, kAmxTileRowBytes);
        tiles.template DotBf16<0, 4, 6>();  // outputs 0-15, tokens 0-15
        tiles.template DotBf16<1, 4, 7>();  // outputs 0-15, tokens 16-31
        tiles.template DotBf16<2, 5, 6>();  // outputs 16-31, tokens 0-15
        tiles.template DotBf16<3, 5, 7>();  // outputs 16-31, tokens 16-31
      }
      // Tile c holds outputs 16 (c / 2) + m and tokens 16 (tb + c % 2) + t.
      auto flush = [&](auto store, size_t c) {
        const size_t om = 16 * (c / 2), t0 = kAmxTokenBlock * (tb + c % 2);
        if (om >= rows || t0 >= p.n) return;
        store();
        write(acc, p.Y + t0 * p.out + o0 + om, p.out, std::min<size_t>(16, rows - om),
              std::min(kAmxTokenBlock, p.n - t0));
      };
      flush([&] { tiles.template Store<0>(acc, kAmxTileRowBytes); }, 0);
      flush([&] { tiles.template Store<1>(acc, kAmxTileRowBytes); }, 1);
      flush([&] { tiles.template Store<2>(acc, kAmxTileRowBytes); }, 2);
      flush([&] { tiles.template Store<3>(acc, kAmxTileRowBytes); }, 3);
    }
  }
  tiles.Release();
}

}  // namespace moeserve::kernels::cpu
