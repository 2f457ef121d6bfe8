// The tile program of the AMX BF16-activation products (amx_tiles.hpp), over
// any tile backend (the hardware, matmul_amx.cpp, or AmxTileModel,
// amx_tile_model.cpp) and any source of the weights' rows as BF16 (BF16
// weights in place, packed MXFP4 decoded a strip at a time).
// Plain C++: no intrinsics, so it builds for every target; the backend's
// operations and the output writer are the only machine-specific parts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moeserve/kernels/amx_tiles.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {

inline constexpr size_t kAmxStripOutputs = 32;  // two A tiles
inline constexpr size_t kAmxTokenBlock = 16;    // one B tile's tokens
inline constexpr size_t kAmxKStep = 32;         // one A tile's k

inline size_t AmxRoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

using AmxTileWriter = void (*)(const float* tile, float* Y, size_t ldy, size_t rows, size_t cols);

// One call's operands besides the weights. `packed` holds AmxRoundUp(n, 32)
// tokens (AmxPackActivations' layout).
struct AmxOperands {
  size_t out, in;
  const uint16_t* packed;
  size_t n;
  float* Y;  // [n, out]
};

// A strip's weights as the A tiles read them: 32 rows of BF16, row r at
// rows + r * ld, each readable for AmxRoundUp(in, 32) elements (zeros past
// in and past the last output).
struct AmxStripRows {
  const uint16_t* rows;
  size_t ld;
};

// BF16 weights [out, in]: a full strip whose rows are a whole number of k
// steps is read in place; otherwise from a zero-padded copy.
class AmxBf16WeightRows {
 public:
  AmxBf16WeightRows(const uint16_t* W, size_t out, size_t in) : W_(W), out_(out), in_(in) {}
  AmxStripRows operator()(size_t o0) {
    const size_t rows = std::min(kAmxStripOutputs, out_ - o0), in_pad = AmxRoundUp(in_, kAmxKStep);
    if (rows == kAmxStripOutputs && in_ == in_pad) return {W_ + o0 * in_, in_};
    padded_.assign(kAmxStripOutputs * in_pad, 0);
    for (size_t r = 0; r < rows; ++r) std::memcpy(&padded_[r * in_pad], W_ + (o0 + r) * in_, in_ * sizeof(uint16_t));
    return {padded_.data(), in_pad};
  }

 private:
  const uint16_t* W_;
  size_t out_, in_;
  std::vector<uint16_t> padded_;
};

// Packed MXFP4 weights (in a multiple of 32): the strip's two 16-row
// groups decoded to BF16 (exact: E2M1 values times a power of two) by
// `decode` (AmxDecodeMxfp4Group's signature), a group past the last zero.
class AmxMxfp4WeightRows {
 public:
  using Decode = void (*)(const Mxfp4PackedView& w, size_t g, uint16_t* dst, size_t ld);
  AmxMxfp4WeightRows(const Mxfp4PackedView& w, Decode decode) : w_(w), decode_(decode) {}
  AmxStripRows operator()(size_t o0) {
    rows_.resize(kAmxStripOutputs * w_.in);
    const size_t groups = Mxfp4PackedGroups(w_.out);
    for (size_t h = 0; h < 2; ++h) {
      uint16_t* dst = rows_.data() + h * kMxfp4PackRows * w_.in;
      const size_t g = o0 / kMxfp4PackRows + h;
      if (g < groups) decode_(w_, g, dst, w_.in);
      else std::fill(dst, dst + kMxfp4PackRows * w_.in, uint16_t{0});
    }
    return {rows_.data(), w_.in};
  }

 private:
  Mxfp4PackedView w_;
  Decode decode_;
  std::vector<uint16_t> rows_;
};

// Strips [s_begin, s_end) of 32 outputs: Y's columns [32 s, 32 s + 32),
// their weights from `weights(32 s)`. Configures the tiles and releases
// them: one call per thread's share.
template <class Tiles, class WeightRows>
void AmxStrips(Tiles& tiles, const AmxOperands& p, WeightRows& weights, size_t s_begin, size_t s_end,
               AmxTileWriter write) {
  const size_t ksteps = AmxRoundUp(p.in, kAmxKStep) / kAmxKStep;
  const size_t token_blocks = AmxRoundUp(p.n, 2 * kAmxTokenBlock) / kAmxTokenBlock;  // even
  const size_t b_tile = kAmxTileRows * kAmxTileRowBytes / sizeof(uint16_t);          // 512 elements
  alignas(64) float acc[kAmxTileRows * kAmxTokenBlock];
  const AmxTileConfig config = AmxBf16ProductConfig();
  tiles.Configure(config);
  for (size_t s = s_begin; s < s_end; ++s) {
    const size_t o0 = s * kAmxStripOutputs;
    const size_t rows = std::min(kAmxStripOutputs, p.out - o0);
    const AmxStripRows strip = weights(o0);
    const uint16_t* a = strip.rows;
    const size_t lda = strip.ld, lda_bytes = lda * sizeof(uint16_t);
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

using AmxPackFn = void (*)(const float* X, size_t n, size_t in, size_t tb_begin, size_t tb_end, uint16_t* packed);

// A whole product: X packed into `packed` (resized) across the pool, then
// the strips in one contiguous range per pool thread, each range with its
// own Tiles and its own make_weights() source.
template <class Tiles, class MakeWeights>
void AmxProduct(size_t out, size_t in, const float* X, size_t n, float* Y, MakeWeights make_weights, AmxPackFn pack,
                AmxTileWriter write, std::vector<uint16_t>& packed) {
  packed.resize(AmxPackedActivationsElements(n, in));
  uint16_t* const data = packed.data();  // workers must not name the caller's buffer object
  ThreadPool& pool = DefaultThreadPool();
  const size_t token_blocks = AmxRoundUp(n, 2 * kAmxTokenBlock) / kAmxTokenBlock;
  pool.ParallelFor(token_blocks / 2, [&](size_t i) { pack(X, n, in, 2 * i, 2 * i + 2, data); });
  const AmxOperands ops{out, in, data, n, Y};
  const size_t strips = AmxRoundUp(out, kAmxStripOutputs) / kAmxStripOutputs;
  const size_t threads = static_cast<size_t>(pool.size());
  const size_t per = (strips + threads - 1) / threads;
  pool.ParallelFor((strips + per - 1) / per, [&](size_t i) {
    Tiles tiles;
    auto weights = make_weights();
    AmxStrips(tiles, ops, weights, i * per, std::min(strips, (i + 1) * per), write);
  });
}

// The helpers a product runs besides the tiles (AVX-512 on the amx row).
struct AmxHelpers {
  AmxPackFn pack;
  AmxTileWriter write;
  AmxMxfp4WeightRows::Decode decode_mxfp4;
};

// The AVX-512 BF16 ones (amx_avx512.cpp), which both registry rows use.
inline constexpr AmxHelpers kAmxAvx512Helpers = {amx_pack_activations_avx512bf16, amx_write_tile_transposed_avx512,
                                                 amx_decode_mxfp4_group_avx512bf16};

// Below this many rows the registry rows' entries go to the AVX-512 row's
// product: the tiles would multiply mostly padding.
inline constexpr size_t kAmxMinRows = 16;

// The two families' entries over a tile backend: the amx row's on the
// hardware, the amx_model row's on AmxTileModel (the same code path).
template <class Tiles>
void AmxMatMulBf16Bf16Act(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y,
                          const AmxHelpers& h) {
  if (out == 0 || n == 0) return;
  if (n < kAmxMinRows || in == 0) return matmul_bf16_bf16act_avx512(W, out, in, X, n, Y);
  thread_local std::vector<uint16_t> packed;
  AmxProduct<Tiles>(out, in, X, n, Y, [&] { return AmxBf16WeightRows(W, out, in); }, h.pack, h.write, packed);
}

template <class Tiles>
void AmxMatMulMxfp4Bf16Act(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, const AmxHelpers& h) {
  if (w.out == 0 || n == 0) return;
  if (n < kAmxMinRows || w.in == 0) return matmul_mxfp4_bf16act_avx512(w, X, n, Y);
  thread_local std::vector<uint16_t> packed;
  AmxProduct<Tiles>(
      w.out, w.in, X, n, Y, [&] { return AmxMxfp4WeightRows(w, h.decode_mxfp4); }, h.pack, h.write, packed);
}

}  // namespace moeserve::kernels::cpu
