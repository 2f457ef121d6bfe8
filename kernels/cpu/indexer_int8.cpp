// The int8 indexer scores (indexer_int8.hpp): the quantisers, the reference,
// and the portable threaded variant (the scalar set's entry), which
// computes the reference's expression key by key.
#include "moeserve/kernels/indexer_int8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels {

namespace {

// Symmetric int8 codes of x [dim] and their scale max|x| / 127 (0 for a zero
// vector, whose codes are then 0).
float QuantizeSymmetric(const float* x, int dim, int8_t* codes) {
  float amax = 0.0f;
  for (int d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(x[d]));
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    std::fill(codes, codes + dim, int8_t{0});
    return 0.0f;
  }
  const float s = amax / 127.0f;
  for (int d = 0; d < dim; ++d)
    codes[d] = static_cast<int8_t>(std::clamp(std::nearbyint(x[d] / s), -127.0f, 127.0f));
  return s;
}

// Key s of a row-form cache: its byte d and its scale.
struct RowKeys {
  const float* const* rows;
  size_t offset;
  int dim;
  uint8_t Byte(int s, int d) const { return reinterpret_cast<const uint8_t*>(rows[s] + offset)[d]; }
  float Scale(int s) const {
    float scale;
    std::memcpy(&scale, rows[s] + offset + dim / 4, sizeof scale);
    return scale;
  }
};

// Key s of a cache by blocks (the layout in indexer_int8.hpp).
struct BlockedKeys {
  const float* const* blocks;
  int block_keys;
  int dim;
  uint8_t Byte(int s, int d) const {
    const auto* base = reinterpret_cast<const uint8_t*>(blocks[s / block_keys]);
    return base[(static_cast<size_t>(d / 4) * block_keys + s % block_keys) * 4 + d % 4];
  }
  float Scale(int s) const {
    float scale;
    std::memcpy(&scale, blocks[s / block_keys] + static_cast<size_t>(dim / 4) * block_keys + s % block_keys, sizeof scale);
    return scale;
  }
};

int32_t Dot(const int8_t* codes, int32_t off, const uint8_t* key, int dim) {
  int32_t acc = -off;
  for (int d = 0; d < dim; ++d) acc += static_cast<int32_t>(key[d]) * static_cast<int32_t>(codes[d]);
  return acc;
}

// One query's score over key s: the expression every variant computes.
template <class Keys>
float Score(const IndexerInt8Query& q, int b, int heads, int dim, const Keys& keys, int s) {
  uint8_t key[1024];
  for (int d = 0; d < dim; ++d) key[d] = keys.Byte(s, d);
  const size_t qh = static_cast<size_t>(b) * heads;
  float I = 0.0f;
  for (int h = 0; h < heads; ++h) {
    const int32_t dot = Dot(q.codes + (qh + h) * dim, q.offset[qh + h], key, dim);
    I = std::fma(q.wt[qh + h], static_cast<float>(std::max(dot, 0)), I);
  }
  return I * keys.Scale(s);
}

template <class Keys>
void ScoresRef(const IndexerInt8Query& query, int queries, int heads, int dim, const Keys& keys, const int* n,
               float* scores, size_t ld) {
  for (int b = 0; b < queries; ++b)
    for (int s = 0; s < n[b]; ++s) scores[static_cast<size_t>(b) * ld + s] = Score(query, b, heads, dim, keys, s);
}

// The reference's expression on the pool's threads, in chunks of keys.
template <class Keys>
void ScoresThreaded(const IndexerInt8Query& query, int queries, int heads, int dim, const Keys& keys, const int* n,
                    float* scores, size_t ld) {
  int n_max = 0;
  for (int b = 0; b < queries; ++b) n_max = std::max(n_max, n[b]);
  ThreadPool& pool = DefaultThreadPool();
  const int chunk = std::max(256, (n_max + pool.size() * 4 - 1) / (pool.size() * 4));
  const int chunks = (n_max + chunk - 1) / chunk;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int k0 = static_cast<int>(c) * chunk, k1 = std::min(n_max, k0 + chunk);
    for (int b = 0; b < queries; ++b)
      for (int s = k0; s < std::min(k1, n[b]); ++s)
        scores[static_cast<size_t>(b) * ld + s] = Score(query, b, heads, dim, keys, s);
  });
}

}  // namespace

void QuantizeIndexerKeyInt8(const float* k, int dim, float* dst) {
  int8_t codes[1024];
  const float s = QuantizeSymmetric(k, dim, codes);
  uint8_t* bytes = reinterpret_cast<uint8_t*>(dst);
  for (int d = 0; d < dim; ++d) bytes[d] = static_cast<uint8_t>(codes[d] + 128);
  std::memcpy(dst + dim / 4, &s, sizeof s);
}

void DequantizeIndexerKeyInt8(const float* src, int dim, float* k) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(src);
  float s;
  std::memcpy(&s, src + dim / 4, sizeof s);
  for (int d = 0; d < dim; ++d) k[d] = static_cast<float>(static_cast<int>(bytes[d]) - 128) * s;
}

void QuantizeIndexerQueryInt8(const float* q, const float* w, int heads, int dim, int8_t* codes, float* wt,
                              int32_t* offset) {
  for (int h = 0; h < heads; ++h) {
    int8_t* c = codes + static_cast<size_t>(h) * dim;
    const float t = QuantizeSymmetric(q + static_cast<size_t>(h) * dim, dim, c);
    int32_t sum = 0;
    for (int d = 0; d < dim; ++d) sum += c[d];
    wt[h] = w[h] * t;
    offset[h] = 128 * sum;
  }
}

int32_t IndexerInt8Dot(const int8_t* codes, int32_t offset, const float* key_row, int dim) {
  return Dot(codes, offset, reinterpret_cast<const uint8_t*>(key_row), dim);
}

void IndexerScoresInt8Ref(const IndexerInt8Query& query, int queries, int heads, int dim, const float* const* rows,
                          size_t offset, const int* n, float* scores, size_t ld) {
  ScoresRef(query, queries, heads, dim, RowKeys{rows, offset, dim}, n, scores, ld);
}

void StoreIndexerKeyInt8Blocked(const float* k, int dim, float* block, int block_keys, int slot) {
  float row[1024 / 4 + 1];
  QuantizeIndexerKeyInt8(k, dim, row);
  const int d4n = dim / 4;
  // Byte copies: the code dwords are not floats (a copy through a float
  // register could, in principle, change a NaN's bits).
  for (int d4 = 0; d4 <= d4n; ++d4) std::memcpy(&block[static_cast<size_t>(d4) * block_keys + slot], &row[d4], 4);
}

void LoadIndexerKeyInt8Blocked(const float* block, int dim, int block_keys, int slot, float* row) {
  const int d4n = dim / 4;
  for (int d4 = 0; d4 <= d4n; ++d4) std::memcpy(&row[d4], &block[static_cast<size_t>(d4) * block_keys + slot], 4);
}

void PrefetchBlockedKeys(const float* const* blocks, int block_keys, int dim, int j0, int j1) {
  const int d4n = dim / 4;
  while (j0 < j1) {
    const int g = j0 / block_keys, first = j0 % block_keys, last = std::min(j1 - 1, (g + 1) * block_keys - 1) % block_keys;
    const auto base = reinterpret_cast<uintptr_t>(blocks[g]);
    for (int d4 = 0; d4 <= d4n; ++d4) {
      const uintptr_t a = base + (static_cast<uintptr_t>(d4) * block_keys + first) * 4,
                      e = base + (static_cast<uintptr_t>(d4) * block_keys + last) * 4;
      for (uintptr_t line = a & ~uintptr_t{63}; line <= e; line += 64)
        __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 3);
    }
    j0 = (g + 1) * block_keys;
  }
}

void IndexerScoresInt8BlockedRef(const IndexerInt8Query& query, int queries, int heads, int dim,
                                 const float* const* blocks, int block_keys, const int* n, float* scores, size_t ld) {
  ScoresRef(query, queries, heads, dim, BlockedKeys{blocks, block_keys, dim}, n, scores, ld);
}

namespace cpu {

void indexer_scores_int8_scalar(const IndexerInt8Query& query, int queries, int heads, int dim,
                                const float* const* rows, size_t offset, const int* n, float* scores, size_t ld) {
  ScoresThreaded(query, queries, heads, dim, RowKeys{rows, offset, dim}, n, scores, ld);
}

void indexer_scores_int8_blocked_scalar(const IndexerInt8Query& query, int queries, int heads, int dim,
                                        const float* const* blocks, int block_keys, const int* n, float* scores,
                                        size_t ld) {
  ScoresThreaded(query, queries, heads, dim, BlockedKeys{blocks, block_keys, dim}, n, scores, ld);
}

}  // namespace cpu

}  // namespace moeserve::kernels
