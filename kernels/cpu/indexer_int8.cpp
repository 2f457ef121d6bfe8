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

const uint8_t* KeyBytes(const float* const* rows, size_t offset, int s) {
  return reinterpret_cast<const uint8_t*>(rows[s] + offset);
}

float KeyScale(const float* const* rows, size_t offset, int s, int dim) {
  float scale;
  std::memcpy(&scale, rows[s] + offset + dim / 4, sizeof scale);
  return scale;
}

int32_t Dot(const int8_t* codes, int32_t off, const uint8_t* key, int dim) {
  int32_t acc = -off;
  for (int d = 0; d < dim; ++d) acc += static_cast<int32_t>(key[d]) * static_cast<int32_t>(codes[d]);
  return acc;
}

// One query's score over key s: the expression every variant computes.
float Score(const IndexerInt8Query& q, int b, int heads, int dim, const float* const* rows, size_t offset, int s) {
  const uint8_t* key = KeyBytes(rows, offset, s);
  const size_t qh = static_cast<size_t>(b) * heads;
  float I = 0.0f;
  for (int h = 0; h < heads; ++h) {
    const int32_t dot = Dot(q.codes + (qh + h) * dim, q.offset[qh + h], key, dim);
    I = std::fma(q.wt[qh + h], static_cast<float>(std::max(dot, 0)), I);
  }
  return I * KeyScale(rows, offset, s, dim);
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
  for (int b = 0; b < queries; ++b)
    for (int s = 0; s < n[b]; ++s) scores[static_cast<size_t>(b) * ld + s] = Score(query, b, heads, dim, rows, offset, s);
}

namespace cpu {

void indexer_scores_int8_scalar(const IndexerInt8Query& query, int queries, int heads, int dim,
                                const float* const* rows, size_t offset, const int* n, float* scores, size_t ld) {
  int n_max = 0;
  for (int b = 0; b < queries; ++b) n_max = std::max(n_max, n[b]);
  ThreadPool& pool = DefaultThreadPool();
  const int chunk = std::max(256, (n_max + pool.size() * 4 - 1) / (pool.size() * 4));
  const int chunks = (n_max + chunk - 1) / chunk;
  pool.ParallelFor(static_cast<size_t>(chunks), [&](size_t c) {
    const int k0 = static_cast<int>(c) * chunk, k1 = std::min(n_max, k0 + chunk);
    for (int b = 0; b < queries; ++b)
      for (int s = k0; s < std::min(k1, n[b]); ++s)
        scores[static_cast<size_t>(b) * ld + s] = Score(query, b, heads, dim, rows, offset, s);
  });
}

}  // namespace cpu

}  // namespace moeserve::kernels
