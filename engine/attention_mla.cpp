// Gated MLA (model.md 5.1) and gated DSA (5.2): MLA whose keys are restricted
// per query by the lightning indexer.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>

#include "layers.hpp"
#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/topk_stream.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::engine {

namespace {

float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Queries per call of the latent-attention kernel in prefill: their heads run
// side by side (MlaDecodeShape::visible keeps each causal), so every cached
// row is read once per tile of head-queries rather than once per query; a
// call of up to 1024 head-queries gives each thread several 32-lane tiles.
constexpr int kMaxHeadsPerCall = 1024;
// Rows from which AbsorbedRows runs its per-head products as GEMMs.
constexpr int kHeadGemmRows = 16;
// Causal rows per block however many heads: DeepSeek-V3.2's 128 heads made
// kMaxHeadsPerCall blocks of 8 rows, too few to run the per-head products
// as GEMMs (kHeadGemmRows) or to reuse a head's matrices across rows.
// 128, not 64: the fp32 products take their GEMM only past
// kSmallBatchMaxRows (64) rows, and at 64 ran the matrix-vector tiles (a
// horizontal sum per output, after only 128 products for W_uk): at 64, the
// attention's largest symbol under perf in a 512-token prefill.
constexpr int kMinRowsPerBlock = 128;
// Keys a decode step's indexer scores per call within its range
// (select_ranges): 256 KB of scores, pushed to the range's top-k from L2.
// A range seeds its top-k's threshold from its first call's scores, so
// smaller calls let more scores in: four ranges' top-k over 1M scores took
// 1.1-1.2 ms with calls of 16K against 0.87-1.05 ms with 64K (one stream
// over them all: 0.33 ms). Contexts of at least two such calls take that
// path.
constexpr int kRangeCallKeys = 65536;

// The absorbed form (model.md 5.1's decode form) for rows [r0, r0 + nr) of
// one segment, row j at position pos0 + j: q_abs = W_uk^T q_nope per head,
// attention over the latent cache, o = W_uv lat per head. row_keys: each
// row's own key list (DSA's sparse rows: one mla_rows call for all nr rows);
// null: row j sees positions 0 .. pos0 + j (one mla_decode call for all rows,
// MlaDecodeShape::visible keeping each causal).
void AbsorbedRows(const LayerContext& ctx, const LayerWeights& w, const float* q, const float* const* rows, size_t off_c,
                  int r0, int nr, int64_t pos0, const std::vector<std::vector<int>>* row_keys, float* o) {
  const MlaConfig& m = ctx.config.mla;
  const int H = m.num_heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, vd = m.v_head_dim;
  const size_t qk = static_cast<size_t>(nope + rope), kv = static_cast<size_t>(m.kv_lora_rank);
  const size_t np = static_cast<size_t>(nope), v = static_cast<size_t>(vd), HR = static_cast<size_t>(nr) * H;
  const kernels::KernelSet& k = ctx.kernels;
  ScratchFloats q_abs(HR * kv), q_pe(HR * static_cast<size_t>(rope)), lat(HR * kv);
  const float* q0 = q + static_cast<size_t>(r0) * H * qk;  // [nr * H][qk]
  // BF16 or fp32 weights and a block of rows: per head, one GEMM over the
  // block's rows of that head (gathered), where one matrix-vector product per
  // head-query re-read the head's matrix for every row. (fp32 kv_b_proj:
  // DeepSeek-V3.2's FP8 kv_b_proj with block scales that are not powers of
  // two, converted exactly; at 128 heads its per-row products re-read 32 MB
  // twice a query, most of a 512-token prefill's attention time.)
  const bool head_gemms = nr >= kHeadGemmRows;
  // The heads side by side on the pool, each GEMM on one thread (a block's
  // rows make small products, for which splitting columns across the
  // threads cost more hand-offs than it saved); the same results either way.
  const auto per_head_gemm = [&](auto weight, size_t out, size_t in, auto src, auto dst) {
    kernels::DefaultThreadPool().ParallelFor(static_cast<size_t>(H), [&](size_t hs) {
      const int h = static_cast<int>(hs);
      ScratchFloats X(static_cast<size_t>(nr) * in), Y(static_cast<size_t>(nr) * out);
      for (int j = 0; j < nr; ++j) std::copy_n(src(j, h), in, &X[static_cast<size_t>(j) * in]);
      if constexpr (std::is_same_v<decltype(weight(h)), const float*>)
        k.matmul_f32(weight(h), out, in, X.data(), static_cast<size_t>(nr), Y.data());
      else
        k.matmul_bf16(weight(h), out, in, X.data(), static_cast<size_t>(nr), Y.data());
      for (int j = 0; j < nr; ++j) std::copy_n(&Y[static_cast<size_t>(j) * out], out, dst(j, h));
    });
  };
  const auto g_of = [H](int j, int h) { return static_cast<size_t>(j) * H + static_cast<size_t>(h); };
  if (w.w_uk_t_bf16 && head_gemms) {
    per_head_gemm([&](int h) { return w.w_uk_t_bf16 + static_cast<size_t>(h) * kv * np; }, kv, np,
                  [&](int j, int h) { return q0 + g_of(j, h) * qk; }, [&](int j, int h) { return &q_abs[g_of(j, h) * kv]; });
  } else if (w.w_uk_t_bf16) {
    std::vector<kernels::Bf16MatVecJob> jobs;
    for (size_t g = 0; g < HR; ++g)
      jobs.push_back({w.w_uk_t_bf16 + g % H * kv * np, kv, np, q0 + g * qk, &q_abs[g * kv]});
    k.matvec_bf16_many(jobs, 1);
  } else if (head_gemms) {
    per_head_gemm([&](int h) -> const float* { return w.w_uk_t.data() + static_cast<size_t>(h) * kv * np; }, kv, np,
                  [&](int j, int h) { return q0 + g_of(j, h) * qk; }, [&](int j, int h) { return &q_abs[g_of(j, h) * kv]; });
  } else {
    for (int j = 0; j < nr; ++j)
      k.headwise_matvec(w.w_uk_t.data(), static_cast<size_t>(H), kv, np, kv * np, q0 + static_cast<size_t>(j) * H * qk, qk,
                        &q_abs[static_cast<size_t>(j) * H * kv], kv);
  }
  for (size_t g = 0; g < HR; ++g) std::copy_n(q0 + g * qk + np, rope, &q_pe[g * static_cast<size_t>(rope)]);
  if (row_keys) {
    // Each row with its own keys, the rows side by side on the pool.
    std::vector<const int*> keys(static_cast<size_t>(nr));
    std::vector<int> n_keys(static_cast<size_t>(nr));
    for (int j = 0; j < nr; ++j) {
      keys[static_cast<size_t>(j)] = (*row_keys)[static_cast<size_t>(j)].data();
      n_keys[static_cast<size_t>(j)] = static_cast<int>((*row_keys)[static_cast<size_t>(j)].size());
    }
    const kernels::MlaDecodeShape shape{H, static_cast<int>(kv), rope, ctx.mla_scale, nullptr};
    k.mla_rows(shape, nr, q_abs.data(), q_pe.data(), rows, off_c, keys.data(), n_keys.data(), lat.data());
  } else {
    std::vector<int> visible;
    if (nr > 1)
      for (int j = 0; j < nr; ++j) visible.insert(visible.end(), static_cast<size_t>(H), static_cast<int>(pos0 + j + 1));
    const kernels::MlaDecodeShape shape{static_cast<int>(HR), static_cast<int>(kv), rope, ctx.mla_scale,
                                        visible.empty() ? nullptr : visible.data()};
    k.mla_decode(shape, q_abs.data(), q_pe.data(), rows, off_c, nullptr, static_cast<int>(pos0 + nr), lat.data());
  }
  // o = W_uv lat per head (W_uv: rows nope .. nope + vd of each head's block).
  if (ctx.clock.on()) {  // logical work: q_abs, scores over c|k_pe, the latent sum, W_uv
    double visible_sum = 0;
    for (int j = 0; j < nr; ++j)
      visible_sum += row_keys ? static_cast<double>((*row_keys)[static_cast<size_t>(j)].size()) : static_cast<double>(pos0 + j + 1);
    ctx.clock.Add(ProfilePart::kAttention,
                  2.0 * H * (nr * (static_cast<double>(np) * kv + static_cast<double>(kv) * v) +
                             visible_sum * (2.0 * kv + rope)));
  }
  float* o0 = o + static_cast<size_t>(r0) * H * v;  // [nr * H][vd]
  if (w.wkv_b_bf16 && head_gemms) {
    per_head_gemm([&](int h) { return w.wkv_b_bf16 + (static_cast<size_t>(h) * (np + v) + np) * kv; }, v, kv,
                  [&](int j, int h) { return &lat[g_of(j, h) * kv]; }, [&](int j, int h) { return o0 + g_of(j, h) * v; });
  } else if (w.wkv_b_bf16) {
    std::vector<kernels::Bf16MatVecJob> jobs;
    for (size_t g = 0; g < HR; ++g)
      jobs.push_back({w.wkv_b_bf16 + (g % H * (np + v) + np) * kv, v, kv, &lat[g * kv], o0 + g * v});
    k.matvec_bf16_many(jobs, 1);
  } else if (head_gemms) {
    per_head_gemm([&](int h) -> const float* { return w.wkv_b.w.data() + (static_cast<size_t>(h) * (np + v) + np) * kv; },
                  v, kv, [&](int j, int h) { return &lat[g_of(j, h) * kv]; },
                  [&](int j, int h) { return o0 + g_of(j, h) * v; });
  } else {
    for (int j = 0; j < nr; ++j)
      k.headwise_matvec(w.wkv_b.w.data() + np * kv, static_cast<size_t>(H), v, kv, (np + v) * kv,
                        &lat[static_cast<size_t>(j) * H * kv], kv, o0 + static_cast<size_t>(j) * H * v, v);
  }
}

}  // namespace

void MlaAttention(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out) {
  const ModelConfig& cfg = ctx.config;
  const MlaConfig& m = cfg.mla;
  const bool dsa = w.kind == LayerKind::kDsa;
  const int H = m.num_heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, vd = m.v_head_dim;
  const int qk = nope + rope, kvl = m.kv_lora_rank, ql = m.q_lora_rank;
  const int IH = dsa ? cfg.dsa.index_n_heads : 0, ID = dsa ? cfg.dsa.index_head_dim : 0;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  // Int8 indexer scores (ModelOptions::indexer_scores): the key is written
  // to the cache quantised, each query quantised per head below.
  const bool int8_index = dsa && ctx.options.indexer_scores == IndexerScores::kInt8;
  // The layer's cache parts (KvPool::PartRow): the latent row c | k_pe, and
  // for DSA the indexer key, each part's rows of a block stored together, so
  // that the indexer streams its keys. off_c, off_pe: within a latent row.
  const size_t lat_part = ctx.cache_offset, lat_floats = static_cast<size_t>(kvl + rope);
  const size_t key_part = lat_part + lat_floats,
               key_floats = int8_index ? kernels::IndexerInt8KeyFloats(ID) : static_cast<size_t>(ID);
  const size_t off_c = 0, off_pe = static_cast<size_t>(kvl);
  const auto latent_row = [&](const SequenceCache& cache, int64_t pos) {
    return CachePart(ctx.pool, cache, pos, lat_part, lat_floats);
  };
  // fp32 keys are rows of the part; int8 keys are stored by pool block
  // (indexer_int8.hpp), so the VNNI kernel reads 16 keys as a vector.
  const auto key_row = [&](const SequenceCache& cache, int64_t pos) {
    return CachePart(ctx.pool, cache, pos, key_part, key_floats);
  };
  const int bt = ctx.pool.block_tokens();
  const auto key_block = [&](const SequenceCache& cache, int64_t pos) {
    return CachePart(ctx.pool, cache, pos / bt * bt, key_part, key_floats);
  };

  // Every projection of x first, as one pass (LinearMany); then those of qr.
  // 1. Queries: qr = RMSNorm(wq_a x) [n, q_lora]; q = wq_b qr [n, H, nope|rope].
  // 2. Latent keys/values [n, kv_lora | rope]: c = RMSNorm(c), rope on k_pe; into the cache.
  // 3. DSA: indexer queries [n, IH, ID], weights [n, IH], keys into the cache.
  // 5 (below) needs the output gate wg x.
  ScratchFloats qa(static_cast<size_t>(n) * ql), qr(qa.size()), q(static_cast<size_t>(n) * H * qk);
  ScratchFloats kv(static_cast<size_t>(n) * (kvl + rope));
  ScratchFloats iq, iw, ikraw, gate;
  // Int8 scores: the queries' codes, folded weights and offsets (indexer_int8.hpp).
  std::vector<int8_t> iq8;
  ScratchFloats iwt8;
  std::vector<int32_t> ioff8;
  if (dsa) {
    iq.resize(static_cast<size_t>(n) * IH * ID);
    iw.resize(static_cast<size_t>(n) * IH);
    ikraw.resize(static_cast<size_t>(n) * ID);
  }
  if (int8_index) {
    iq8.resize(static_cast<size_t>(n) * IH * ID);
    iwt8.resize(static_cast<size_t>(n) * IH);
    ioff8.resize(static_cast<size_t>(n) * IH);
  }
  if (m.output_gate) gate.resize(static_cast<size_t>(n) * H * vd);
  const kernels::KernelSet& kc = ctx.kernels;
  if (dsa && m.output_gate) {
    LinearMany({{&w.wq_a, x, qa.data()},
                {&w.wkv_a, x, kv.data()},
                {&w.idx_weights_proj, x, iw.data()},
                {&w.idx_wk, x, ikraw.data()},
                {&w.wg, x, gate.data()}},
               n, kc);
  } else if (dsa) {
    LinearMany({{&w.wq_a, x, qa.data()}, {&w.wkv_a, x, kv.data()}, {&w.idx_weights_proj, x, iw.data()},
                {&w.idx_wk, x, ikraw.data()}},
               n, kc);
  } else if (m.output_gate) {
    LinearMany({{&w.wq_a, x, qa.data()}, {&w.wkv_a, x, kv.data()}, {&w.wg, x, gate.data()}}, n, kc);
  } else {
    LinearMany({{&w.wq_a, x, qa.data()}, {&w.wkv_a, x, kv.data()}}, n, kc);
  }
  PartClock& clock = ctx.clock;
  if (clock.on()) {
    double f = LinearFlops({&w.wq_a, &w.wkv_a}, n);
    if (dsa) f += LinearFlops({&w.idx_weights_proj, &w.idx_wk}, n);
    if (m.output_gate) f += LinearFlops({&w.wg}, n);
    clock.Mark(ProfilePart::kProjections, f);
  }
  ForRows(n, [&](int t) { kc.rms_norm(&qa[t * ql], w.q_norm.data(), eps, static_cast<size_t>(ql), &qr[t * ql]); });
  clock.Mark(ProfilePart::kGlue);
  if (dsa) {
    LinearMany({{&w.wq_b, qr.data(), q.data()}, {&w.idx_wq_b, qr.data(), iq.data()}}, n, kc);
    clock.Mark(ProfilePart::kProjections, LinearFlops({&w.wq_b, &w.idx_wq_b}, n));
  } else {
    Linear(w.wq_b, qr.data(), n, q.data(), kc);
    clock.Mark(ProfilePart::kProjections, LinearFlops({&w.wq_b}, n));
  }
  if (dsa) {
    const float wscale = 1.0f / std::sqrt(static_cast<float>(IH)) / std::sqrt(static_cast<float>(ID));
    for (auto& v : iw) v *= wscale;
  }

  for (const SegmentRows& seg : ctx.segments) {
    ForRows(seg.n, [&](int i) {
      const int r = seg.row0 + i;
      const int64_t pos = seg.pos0 + i;
      for (int h = 0; h < H; ++h) RopeInterleaved(&q[(static_cast<size_t>(r) * H + h) * qk + nope], rope, pos, ctx.rope_freqs);
      float* row = latent_row(*seg.cache, pos);
      kc.rms_norm(&kv[static_cast<size_t>(r) * (kvl + rope)], w.kv_norm.data(), eps, static_cast<size_t>(kvl), row);
      std::copy_n(&kv[static_cast<size_t>(r) * (kvl + rope) + kvl], rope, row + kvl);
      RopeInterleaved(row + kvl, rope, pos, ctx.rope_freqs);
      if (dsa) {
        // The key in fp32: in the cache row itself, or (int8) in the row's
        // normalised indexer input, quantised into the cache row after.
        float* ik = int8_index ? &ikraw[static_cast<size_t>(r) * ID] : key_row(*seg.cache, pos);
        kernels::LayerNormRef(&ikraw[static_cast<size_t>(r) * ID], w.idx_k_norm_w.data(), w.idx_k_norm_b.data(), 1e-6f, ID, ik);
        RopeHalfSplit(ik, rope, pos, ctx.rope_freqs);
        for (int j = 0; j < IH; ++j) RopeHalfSplit(&iq[(static_cast<size_t>(r) * IH + j) * ID], rope, pos, ctx.rope_freqs);
        if (cfg.dsa.index_fp8) {
          IndexHadamardFp8(ik, ID, cfg.dsa.index_fp8_ue8m0);
          for (int j = 0; j < IH; ++j) IndexHadamardFp8(&iq[(static_cast<size_t>(r) * IH + j) * ID], ID, cfg.dsa.index_fp8_ue8m0);
        }
        if (int8_index) {
          kernels::StoreIndexerKeyInt8Blocked(ik, ID, key_block(*seg.cache, pos), bt, static_cast<int>(pos % bt));
          const size_t g = static_cast<size_t>(r) * IH;
          kernels::QuantizeIndexerQueryInt8(&iq[g * ID], &iw[g], IH, ID, &iq8[g * ID], &iwt8[g], &ioff8[g]);
        }
      }
    });
  }

  clock.Mark(ProfilePart::kGlue);
  // 4. Attention per query over its sequence's cache (causal; DSA-restricted).
  std::vector<float> o(static_cast<size_t>(n) * H * vd, 0.0f);
  const auto attend = [&](const SegmentRows& seg) {
    const int64_t ctx_len = seg.pos0 + seg.n;
    // One token: absorbed unless the expanded form was asked for; more: as
    // resolved at load (kAuto: absorbed with the fast kernels, each query
    // reading the latent cache through the parallel MLA decode kernel; the
    // expanded form below is a plain serial loop, ~70 % of a 2K-token
    // prefill when it was used there).
    // A draft's verification (state_trail kept) runs as decode does, query by
    // query, so that its rows get the bits one-token decode steps would.
    const bool as_decode = seg.n == 1 || seg.state_trail != nullptr;
    const bool absorbed = as_decode ? ctx.options.mla_form != MlaForm::kExpanded : ctx.absorbed_prefill;
    // Sparse rows a block: one indexer pass over the cached keys for all of
    // them, their top-k selections side by side, one attention call (which
    // prepares the union of their keys once: the BF16 kernels round them).
    // Deterministic: one query per attention call and indexer pass, as in
    // decode (a block's kernels split and merge their work by its size).
    // As many rows as keep the block's indexer scores within
    // kSparseScoresFloats (32 MB), between 64 and 256: each call rounds the
    // union of its rows' keys, nearly every cached row at long context, so
    // at 32K tokens blocks of 64 spent more on that than on attention.
    constexpr int kSparseBlockMin = 64, kSparseBlockMax = 256;
    constexpr int64_t kSparseScoresFloats = int64_t{8} << 20;
    const int kSparseBlock = static_cast<int>(
        std::clamp<int64_t>(kSparseScoresFloats / std::max<int64_t>(1, ctx_len), kSparseBlockMin, kSparseBlockMax));
    const int indexer_block = ctx.options.deterministic || as_decode ? 1 : kSparseBlock;
    // Expanded form: per-head keys and values for every cached position.
    std::vector<float> k_nope, vals;
    if (!absorbed) {
      k_nope.resize(static_cast<size_t>(ctx_len) * H * nope);
      vals.resize(static_cast<size_t>(ctx_len) * H * vd);
      for (int64_t s = 0; s < ctx_len; ++s) {
        const float* c = latent_row(*seg.cache, s);
        for (int h = 0; h < H; ++h) {
          const float* wb = &w.wkv_b.w[static_cast<size_t>(h) * (nope + vd) * kvl];
          for (int i = 0; i < nope; ++i) k_nope[(s * H + h) * nope + i] = Dot(wb + static_cast<size_t>(i) * kvl, c, kvl);
          for (int j = 0; j < vd; ++j) vals[(s * H + h) * vd + j] = Dot(wb + static_cast<size_t>(nope + j) * kvl, c, kvl);
        }
      }
    }
    // Row pointers of this sequence's cached tokens (the pool is paged):
    // latent rows, and once a query is sparse the indexer's keys, fp32 by
    // row or int8 by pool block (one pointer a block).
    // Built when first needed: a decode step's sparse row passes only its
    // selected rows (the whole table was 8 MB of writes a layer at 1M).
    std::vector<const float*> rows, key_rows;
    const auto latent_rows = [&]() -> const float* const* {
      if (rows.empty()) {
        rows.resize(static_cast<size_t>(ctx_len));
        CachePartRows(ctx.pool, *seg.cache, ctx_len, lat_part, lat_floats, rows.data());
      }
      return rows.data();
    };
    const auto keys_of_cache = [&]() -> const float* const* {
      if (key_rows.empty()) {
        if (int8_index) {
          key_rows.resize(static_cast<size_t>((ctx_len + bt - 1) / bt));
          for (size_t b = 0; b < key_rows.size(); ++b)
            key_rows[b] = ctx.pool.PartRow(seg.cache->blocks[b], 0, key_part, key_floats);
        } else {
          key_rows.resize(static_cast<size_t>(ctx_len));
          CachePartRows(ctx.pool, *seg.cache, ctx_len, key_part, key_floats, key_rows.data());
        }
      }
      return key_rows.data();
    };
    std::vector<float> scores;
    std::vector<int> keys;
    // The indexer's top-k of up to kSparseBlock sparse rows [block_r0,
    // block_r0 + block_n) (rows after a sparse row are sparse too), row b's
    // in block_sel[b], ascending. The keys are scored in tiles of
    // indexer_tile_keys (indexer_scores_batch over the tile, all the block's
    // rows together); each row's kernels::TopKStream keeps its best
    // index_topk candidates between tiles (ties to the lower position, as
    // TopKIndices): the same selection as one pass over every key, with
    // scratch bounded by the tile.
    ScratchFloats index_scores;  // [block_n][ld]: the tile's scores
    int block_r0 = 0, block_n = 0;
    std::vector<int> block_len, tile_n;
    std::vector<std::vector<int>> block_sel;
    std::vector<kernels::TopKStream> block_streams;
    const int topk = dsa ? cfg.dsa.index_topk : 0;
    // Int8 tiles start on pool blocks (the same selections whatever the tile).
    const int tile = int8_index ? std::max(bt, ctx.options.indexer_tile_keys / bt * bt)
                                : std::max(1, ctx.options.indexer_tile_keys);
    // One query over a long context (a decode step): its keys split in
    // ranges of whole pool blocks across the pool, each range scored a
    // sub-range at a time and kept by its own TopKStream while the scores
    // are in cache, then the ranges' best merged (TopKStream::FinishMerged):
    // the same selection as one stream over all the keys, with the scoring
    // and the top-k on every thread (the tiles' top-k ran on the calling
    // thread alone, as long as the scoring at 1M tokens). A range's scores
    // are independent of how the keys are split (each key's dot is its own).
    std::vector<kernels::TopKStream> range_streams;
    // Keys per scoring call within a range: at most a tile (int8: whole pool
    // blocks, as the tile), so a test's small tiles take this path too.
    const int sub = std::min(tile, std::max(bt, kRangeCallKeys / bt * bt));
    const auto select_ranges = [&](const auto& score_keys, int longest) {
      keys_of_cache();  // built here, not by the tasks at once
      kernels::ThreadPool& pool = kernels::DefaultThreadPool();
      // Two ranges a thread, so that a thread slowed by other work on the
      // machine leaves some of its share to the other (each range's top-k
      // costs about what one over all the keys does); each at least a call.
      const int per_range = std::max(sub, (longest + 2 * pool.size() - 1) / (2 * pool.size()) / sub * sub);
      const int ranges = (longest + per_range - 1) / per_range;
      range_streams.resize(static_cast<size_t>(ranges));
      // The best lower bound any range has found (TopKStream::LowerBound),
      // raised into the others before each push: fewer scores enter them.
      std::atomic<float> shared_bound{-std::numeric_limits<float>::infinity()};
      pool.ParallelFor(static_cast<size_t>(ranges), [&](size_t i) {
        kernels::TopKStream& stream = range_streams[i];
        stream.Reset(topk);
        // A thread's scores, kept between steps (256 KB: allocated and freed
        // a range at a time it was four heap round trips a layer and step).
        thread_local ScratchFloats scores;
        if (scores.size() < static_cast<size_t>(sub)) scores.resize(static_cast<size_t>(sub));
        const int r0 = static_cast<int>(i) * per_range, r1 = std::min(longest, r0 + per_range);
        for (int t0 = r0; t0 < r1; t0 += sub) {
          const int kn = std::min(sub, r1 - t0);
          score_keys(t0, &kn, scores.data(), static_cast<size_t>(sub));  // inline: nested in the pool's call
          stream.RaiseLowerBound(shared_bound.load(std::memory_order_relaxed));
          stream.Push(scores.data(), kn, t0);
          const float mine = stream.LowerBound();
          float seen = shared_bound.load(std::memory_order_relaxed);
          while (mine > seen && !shared_bound.compare_exchange_weak(seen, mine, std::memory_order_relaxed)) {
          }
        }
      });
      block_sel[0].resize(static_cast<size_t>(topk));
      block_sel[0].resize(static_cast<size_t>(kernels::TopKStream::FinishMerged(range_streams, block_sel[0].data())));
    };
    const auto select_block = [&](int r) {
      block_r0 = r;
      block_n = std::min(indexer_block, seg.row0 + seg.n - r);
      const size_t nb = static_cast<size_t>(block_n);
      block_len.resize(nb);
      for (int b = 0; b < block_n; ++b) block_len[static_cast<size_t>(b)] = static_cast<int>(seg.pos0 + (r + b - seg.row0) + 1);
      const int longest = block_len.back();
      const size_t g0 = static_cast<size_t>(r) * IH;
      // The block's rows' scores over the keys from t0 (int8: t0 a multiple of
      // the pool block) to each row's kn, row b's at out + b * ld_out.
      const auto score_keys = [&](int64_t t0, const int* kn, float* out, size_t ld_out) {
        if (int8_index)
          kc.indexer_scores_int8_blocked(kernels::IndexerInt8Query{&iq8[g0 * ID], &iwt8[g0], &ioff8[g0]}, block_n, IH,
                                         ID, keys_of_cache() + t0 / bt, bt, kn, out, ld_out);
        else
          kc.indexer_scores_batch(&iq[g0 * ID], &iw[g0], block_n, IH, ID, keys_of_cache() + t0, 0, kn, out, ld_out);
      };
      block_sel.resize(nb);
      if (nb == 1 && longest >= 2 * sub) {
        select_ranges(score_keys, longest);
        return;
      }
      if (longest <= tile) {  // one pass
        const size_t ld = static_cast<size_t>(longest);
        index_scores.resize(nb * ld);
        score_keys(0, block_len.data(), index_scores.data(), ld);
        kernels::DefaultThreadPool().ParallelFor(nb, [&](size_t j) {
          block_sel[j].resize(static_cast<size_t>(topk));
          kernels::TopKIndices(&index_scores[j * ld], block_len[j], topk, block_sel[j].data());
        });
        return;
      }
      // Tiles: each row's TopKStream holds its best candidates between tiles.
      const size_t ld = static_cast<size_t>(tile);
      index_scores.resize(nb * ld);
      tile_n.resize(nb);
      if (block_streams.size() < nb) block_streams.resize(nb);
      for (size_t j = 0; j < nb; ++j) block_streams[j].Reset(topk);
      for (int t0 = 0; t0 < longest; t0 += tile) {
        for (size_t j = 0; j < nb; ++j) tile_n[j] = std::clamp(block_len[j] - t0, 0, tile);
        score_keys(t0, tile_n.data(), index_scores.data(), ld);
        kernels::DefaultThreadPool().ParallelFor(nb, [&](size_t j) {
          if (tile_n[j] > 0) block_streams[j].Push(&index_scores[j * ld], tile_n[j], t0);
        });
      }
      kernels::DefaultThreadPool().ParallelFor(nb, [&](size_t j) {
        block_sel[j].resize(static_cast<size_t>(topk));
        block_sel[j].resize(static_cast<size_t>(block_streams[j].Finish(block_sel[j].data())));
      });
    };
    // Which keys the query at row r sees: all s <= pos, or the indexer's top
    // k (sparse; then `keys` holds them). Records the set when tracing.
    const auto select_keys = [&](int r, int64_t pos) {
      const bool sparse = dsa && pos + 1 > cfg.dsa.index_topk;
      if (sparse) {
        if (r < block_r0 || r >= block_r0 + block_n) select_block(r);
        keys = block_sel[static_cast<size_t>(r - block_r0)];
        // Scores: a dot of ID per head and cached row, then the head weights.
        clock.Mark(ProfilePart::kIndexer, 2.0 * IH * (ID + 1) * static_cast<double>(pos + 1));
      } else {
        keys.resize(static_cast<size_t>(pos + 1));
        for (int64_t sidx = 0; sidx <= pos; ++sidx) keys[static_cast<size_t>(sidx)] = static_cast<int>(sidx);
      }
      if (dsa && ctx.trace && ctx.trace->record_dsa) ctx.trace->dsa_selected[ctx.layer].push_back(keys);
      return sparse;
    };
    if (absorbed) {
      // Sparse rows kSparseBlock at a time (each with its own keys; every
      // row after a sparse one is sparse); runs of causal (dense) rows as blocks.
      const int block =
          ctx.options.deterministic || as_decode ? 1 : std::max(kMinRowsPerBlock, std::max(1, kMaxHeadsPerCall / H));
      std::vector<std::vector<int>> sparse_keys;
      for (int r = seg.row0; r < seg.row0 + seg.n;) {
        const int64_t pos = seg.pos0 + (r - seg.row0);
        if (dsa && pos + 1 > cfg.dsa.index_topk) {
          // The block's selections (each a pure function of its row's
          // scores), recorded in row order after.
          select_block(r);
          const int nb = block_n;
          sparse_keys.swap(block_sel);
          double indexer_flops = 0;  // a dot of ID per head and cached row, then the head weights
          for (int j = 0; j < nb; ++j) indexer_flops += 2.0 * IH * (ID + 1) * static_cast<double>(pos + 1 + j);
          clock.Mark(ProfilePart::kIndexer, indexer_flops);
          if (ctx.trace && ctx.trace->record_dsa)
            for (const std::vector<int>& kj : sparse_keys) ctx.trace->dsa_selected[ctx.layer].push_back(kj);
          if (nb == 1) {
            // Its selected rows alone, its keys renumbered in the same order:
            // the kernel sees the same rows in the same order.
            std::vector<int>& kj = sparse_keys[0];
            std::vector<const float*> selected(kj.size());
            for (size_t i = 0; i < kj.size(); ++i) {
              selected[i] = CachePart(ctx.pool, *seg.cache, kj[i], lat_part, lat_floats);
              kj[i] = static_cast<int>(i);
            }
            AbsorbedRows(ctx, w, q.data(), selected.data(), off_c, r, nb, pos, &sparse_keys, o.data());
          } else {
            AbsorbedRows(ctx, w, q.data(), latent_rows(), off_c, r, nb, pos, &sparse_keys, o.data());
          }
          clock.Mark(ProfilePart::kAttention);
          r += nb;
          continue;
        }
        // Dense rows: their key lists matter only to a DSA trace.
        const bool trace_dense = dsa && ctx.trace && ctx.trace->record_dsa;
        if (trace_dense) select_keys(r, pos);
        int nr = 1;
        while (nr < block && r + nr < seg.row0 + seg.n && !(dsa && pos + nr + 1 > cfg.dsa.index_topk)) {
          if (trace_dense) select_keys(r + nr, pos + nr);
          ++nr;
        }
        clock.Mark(ProfilePart::kGlue);
        AbsorbedRows(ctx, w, q.data(), latent_rows(), off_c, r, nr, pos, nullptr, o.data());
        clock.Mark(ProfilePart::kAttention);
        r += nr;
      }
      return;
    }
    const float* const* all_rows = latent_rows();
    for (int r = seg.row0; r < seg.row0 + seg.n; ++r) {
      const int64_t pos = seg.pos0 + (r - seg.row0);
      select_keys(r, pos);
      // Expanded form: per-head keys and values computed from c above.
      scores.resize(keys.size());
      for (int h = 0; h < H; ++h) {
        const float* qh = &q[(static_cast<size_t>(r) * H + h) * qk];
        float* oh = &o[(static_cast<size_t>(r) * H + h) * vd];
        for (size_t k = 0; k < keys.size(); ++k) {
          const int sidx = keys[k];
          const float* pe = all_rows[static_cast<size_t>(sidx)] + off_pe;
          scores[k] = ctx.mla_scale * (Dot(qh, &k_nope[(static_cast<size_t>(sidx) * H + h) * nope], nope) + Dot(qh + nope, pe, rope));
        }
        kernels::SoftmaxRef(scores.data(), scores.size());
        for (size_t k = 0; k < keys.size(); ++k) {
          const float* v = &vals[(static_cast<size_t>(keys[k]) * H + h) * vd];
          for (int j = 0; j < vd; ++j) oh[j] += scores[k] * v[j];
        }
      }
      clock.Mark(ProfilePart::kAttention, 2.0 * H * static_cast<double>(keys.size()) * (qk + vd));
    }
  };
  // A decode step (one query a sequence) attends for every sequence in one
  // parallel pass, each sequence's kernels running inline on its thread
  // (one hand-off per layer instead of one or more per sequence; a
  // sequence's result is the same bits on any thread). With a profile or a
  // DSA trace, which record in order, one sequence after another.
  bool one_query_each = ctx.segments.size() > 1 && !clock.on() && !(ctx.trace && ctx.trace->record_dsa);
  for (const SegmentRows& seg : ctx.segments) one_query_each = one_query_each && seg.n == 1;
  if (one_query_each) {
    kernels::DefaultThreadPool().ParallelFor(ctx.segments.size(), [&](size_t i) { attend(ctx.segments[i]); });
  } else {
    for (const SegmentRows& seg : ctx.segments) attend(seg);
  }

  // 5. Output gate and projection: out = wo(o * sigmoid(wg x)).
  if (m.output_gate)
    kc.sigmoid_mul(gate.data(), o.data(), o.data(), o.size());
  clock.Mark(ProfilePart::kGlue);
  Linear(w.wo, o.data(), n, out, kc);
  clock.Mark(ProfilePart::kProjections, LinearFlops({&w.wo}, n));
}

}  // namespace moeserve::engine
