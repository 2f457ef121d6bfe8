// Gated DeltaNet (model.md 5.3): causal depthwise convs, then per head the
// gated delta rule over a [head_k_dim, head_v_dim] state, in two equal forms:
// the recurrent step (decode) and the chunked WY form (prefill).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "layers.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/delta_rule.hpp"

namespace moeserve::engine {

namespace {

// Makes trail[0, tokens) hold this layer's state slots (other layers' entries
// stay as they are: empty for attention layers).
void SizeTrail(std::vector<std::vector<DeltaLayerState>>& trail, int tokens, int layers, int layer, int tail_floats,
               int state_floats) {
  if (static_cast<int>(trail.size()) < tokens) trail.resize(static_cast<size_t>(tokens));
  for (int t = 0; t < tokens; ++t) {
    std::vector<DeltaLayerState>& at = trail[static_cast<size_t>(t)];
    if (static_cast<int>(at.size()) < layers) at.resize(static_cast<size_t>(layers));
    at[static_cast<size_t>(layer)].conv_tail.resize(static_cast<size_t>(tail_floats));
    at[static_cast<size_t>(layer)].S.resize(static_cast<size_t>(state_floats));
  }
}

}  // namespace

// Qwen3-Next's DeltaNet has fewer key heads than value heads (16 and 32 at
// 80B): each key head's q and k serve nv / nk value heads, and the graph
// gives every value head its own copy of those rows (q_proj, k_proj and
// their conv rows), as the engine's delta layer holds one q and k per head.
// Projected as held, a quarter of the layer's input projection (4096 of
// 16,448 rows at 80B) recomputed what another head already had. Here each
// set of heads whose q_proj, k_proj, q_conv and k_conv rows are equal bit for
// bit is projected once (BF16 copies of the distinct heads' rows, made
// when the model loads); every head still runs its own conv, state and
// norms over its set's columns. The copies cost 2 x distinct dk x D BF16 per
// layer (16 MiB at 80B) beside the held rows.
struct DeltaDistinctHeads {
  std::vector<int> column;  // per head: its distinct head (its q and k columns / dk)
  int distinct = 0;
  std::vector<uint16_t> q_rows, k_rows;  // [distinct dk, D] BF16
  Matrix q, k;                           // views of q_rows and k_rows
};

namespace {

// Whether head h's rows [h dk, (h + 1) dk) equal head j's in every matrix.
bool SameHeadRows(const LayerWeights& w, int dk, int h, int j) {
  const auto same_bf16 = [&](const Matrix& m) {
    const size_t n = static_cast<size_t>(dk) * m.cols;
    return std::memcmp(m.bf16 + h * n, m.bf16 + j * n, n * 2) == 0;
  };
  const auto same_f32 = [&](const Matrix& m) {
    const size_t n = static_cast<size_t>(dk) * m.cols;
    return std::memcmp(m.w.data() + h * n, m.w.data() + j * n, n * 4) == 0;
  };
  return same_bf16(w.q_proj) && same_bf16(w.k_proj) && same_f32(w.q_conv) && same_f32(w.k_conv);
}

std::mutex distinct_mu;  // guards LayerWeights::delta_distinct

// Sets w.delta_distinct unless it is set (holding distinct_mu).
void FindDistinctHeadsLocked(const LayerWeights& w, int Hd, int dk) {
  auto d = std::make_shared<DeltaDistinctHeads>();
  const bool checkable = w.q_proj.bf16 && w.k_proj.bf16 && w.q_proj.rows == Hd * dk && w.k_proj.rows == Hd * dk &&
                         w.q_conv.rows == Hd * dk && w.k_conv.rows == Hd * dk && !w.q_conv.w.empty() &&
                         !w.k_conv.w.empty();
  std::vector<int> first;  // the first head of each distinct set
  for (int h = 0; h < Hd && checkable; ++h) {
    int c = 0;
    while (c < static_cast<int>(first.size()) && !SameHeadRows(w, dk, h, first[static_cast<size_t>(c)])) ++c;
    if (c == static_cast<int>(first.size())) first.push_back(h);
    d->column.push_back(c);
  }
  d->distinct = static_cast<int>(first.size());
  if (checkable && d->distinct < Hd) {
    const size_t D = static_cast<size_t>(w.q_proj.cols), head = static_cast<size_t>(dk) * D;
    d->q_rows.resize(first.size() * head);
    d->k_rows.resize(first.size() * head);
    for (size_t c = 0; c < first.size(); ++c) {
      std::memcpy(&d->q_rows[c * head], w.q_proj.bf16 + first[c] * head, head * 2);
      std::memcpy(&d->k_rows[c * head], w.k_proj.bf16 + first[c] * head, head * 2);
    }
    for (Matrix* m : {&d->q, &d->k}) {
      m->rows = d->distinct * dk;
      m->cols = w.q_proj.cols;
    }
    d->q.bf16 = d->q_rows.data();
    d->k.bf16 = d->k_rows.data();
  } else {
    d->column.clear();  // none repeat: the held projections as they are
  }
  w.delta_distinct = std::move(d);
}

// The layer's distinct heads (found at load, or here on its first pass);
// null when every head is its own (or q / k are not BF16): the full
// projections run.
const DeltaDistinctHeads* DistinctHeads(const LayerWeights& w, int Hd, int dk) {
  std::lock_guard<std::mutex> lock(distinct_mu);
  if (!w.delta_distinct) FindDistinctHeadsLocked(w, Hd, dk);
  return w.delta_distinct->column.empty() ? nullptr : w.delta_distinct.get();
}

}  // namespace

void FindDeltaDistinctHeads(const LayerWeights& w, int heads, int head_k_dim) {
  std::lock_guard<std::mutex> lock(distinct_mu);
  if (!w.delta_distinct) FindDistinctHeadsLocked(w, heads, head_k_dim);
}

void GatedDeltaNet(const LayerContext& ctx, const LayerWeights& w, const float* x, int n, float* out) {
  const DeltaConfig& d = ctx.config.delta;
  const int Hd = d.num_heads, dk = d.head_k_dim, dv = d.head_v_dim, K = d.conv_size;
  const int Cq = Hd * dk, Cv = Hd * dv, C = 2 * Cq + Cv;  // conv channels: q | k | v

  // 1. Projections for the whole batch: q, k, v (pre-conv), a, b, g; q and k
  // once per distinct head (Cqk columns: head h's are column[h] dk onwards).
  const DeltaDistinctHeads* distinct = DistinctHeads(w, Hd, dk);
  const Matrix& q_proj = distinct ? distinct->q : w.q_proj;
  const Matrix& k_proj = distinct ? distinct->k : w.k_proj;
  const int Cqk = q_proj.rows;
  const auto qk_column = [&](int h) { return (distinct ? distinct->column[static_cast<size_t>(h)] : h) * dk; };
  ScratchFloats pq(static_cast<size_t>(n) * Cqk), pk(pq.size()), pv(static_cast<size_t>(n) * Cv),
      a(static_cast<size_t>(n) * Hd), b(a.size()), gp(static_cast<size_t>(n) * Cv);
  LinearMany({{&q_proj, x, pq.data()},
              {&k_proj, x, pk.data()},
              {&w.v_proj, x, pv.data()},
              {&w.a_proj, x, a.data()},
              {&w.b_proj, x, b.data()},
              {&w.g_proj, x, gp.data()}},
             n, ctx.kernels);
  PartClock& clock = ctx.clock;
  clock.Mark(ProfilePart::kProjections,
             LinearFlops({&q_proj, &k_proj, &w.v_proj, &w.a_proj, &w.b_proj, &w.g_proj}, n));

  ScratchFloats o(static_cast<size_t>(n) * Cv);
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  // The L2 norm's weights as an RMSNorm (step 3): dk^-0.5, and for q the
  // scale dk^-0.5 on top.
  const std::vector<float> k_norm_w(static_cast<size_t>(dk), qscale), q_norm_w(static_cast<size_t>(dk), qscale * qscale);
  // Per sequence: its state, its form, its gates.
  struct SegmentWork {
    const SegmentRows* seg;
    bool chunked;
    std::vector<float> beta, g;  // [Hd, T]
  };
  std::vector<SegmentWork> work;
  work.reserve(ctx.segments.size());
  bool all_single = true;
  for (const SegmentRows& seg : ctx.segments) {
    // Deterministic: recurrent always (the chunked form sums in another
    // order, and its chunks depend on how the prompt was split).
    // A kept trail (a draft's verification) runs token by token, as decode does.
    const bool chunked = !ctx.options.deterministic && !seg.state_trail &&
                         (ctx.options.delta_form == DeltaForm::kChunked ||
                          (ctx.options.delta_form == DeltaForm::kAuto && seg.n > 1));
    if (seg.state_trail) SizeTrail(*seg.state_trail, seg.n, ctx.config.num_layers, ctx.layer, (K - 1) * C, Hd * dk * dv);
    work.push_back({&seg, chunked, std::vector<float>(static_cast<size_t>(seg.n) * Hd),
                    std::vector<float>(static_cast<size_t>(seg.n) * Hd)});
    all_single = all_single && seg.n == 1;
  }
  // Steps 2-4 touch only the head's own channels (q and k: dk each, v: dv)
  // and state, so each head of each sequence runs them whole, in parallel
  // with the others: a decode step then has no serial stretch between the
  // projections and the output norm.
  auto head = [&](SegmentWork& sw, size_t hs) {
      const SegmentRows& seg = *sw.seg;
      DeltaLayerState& st = seg.cache->delta[static_cast<size_t>(ctx.layer)];
      const int T = seg.n;
      const bool chunked = sw.chunked;
      std::vector<float>& beta = sw.beta;
      std::vector<float>& g = sw.g;
      const int h = static_cast<int>(hs);
      // The head's q | k | v after the conv, [T, Wh]: its own rows, so the
      // conv writes and the delta rule reads a buffer that stays in cache
      // (rows of all heads' channels would be C floats apart).
      const int Wh = 2 * dk + dv;
      const auto qkv = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(T) * Wh);
      // 2. Causal depthwise conv over [tail (K-1 rows) ; new rows], then silu;
      // the tail keeps the last K-1 inputs.
      // Channels [ch0, ch0 + count) of q|k|v (columns [col, col + count) of
      // qkv) are columns [p0, p0 + count) of the projection `proj` (width
      // `width`) and channels [c0, c0 + count) of its conv W.
      const auto conv_channels = [&](int ch0, int col, int count, const Matrix& W, const ScratchFloats& proj,
                                     int width, int p0, int c0) {
        const float* x = &proj[static_cast<size_t>(seg.row0) * width + p0];
        ctx.kernels.causal_conv_silu(&st.conv_tail[ch0], C, x, width, T, count, &W.w[static_cast<size_t>(c0) * K], K,
                                     &qkv[col], Wh);
        // The trail's tails: after token t, rows t+1 .. t+K-1 of [tail ; new
        // rows], read before the tail below is overwritten.
        if (seg.state_trail)
          for (int t = 0; t < T; ++t) {
            std::vector<float>& tail = (*seg.state_trail)[static_cast<size_t>(t)][static_cast<size_t>(ctx.layer)].conv_tail;
            for (int u = 0; u < K - 1; ++u) {
              const int from = t + 1 + u;
              const float* in = from < K - 1 ? &st.conv_tail[static_cast<size_t>(from) * C + ch0]
                                             : x + static_cast<size_t>(from - (K - 1)) * width;
              std::copy(in, in + count, &tail[static_cast<size_t>(u) * C + ch0]);
            }
          }
        // In place, ascending: slot u takes row T + u of [tail ; new rows],
        // a later slot (T + u > u), not yet overwritten.
        for (int u = 0; u < K - 1; ++u) {
          const int from = T + u;
          const float* in = from < K - 1 ? &st.conv_tail[static_cast<size_t>(from) * C + ch0]
                                         : x + static_cast<size_t>(from - (K - 1)) * width;
          std::copy(in, in + count, &st.conv_tail[static_cast<size_t>(u) * C + ch0]);
        }
      };
      conv_channels(h * dk, 0, dk, w.q_conv, pq, Cqk, qk_column(h), h * dk);
      conv_channels(Cq + h * dk, dk, dk, w.k_conv, pk, Cqk, qk_column(h), h * dk);
      conv_channels(2 * Cq + h * dv, 2 * dk, dv, w.v_conv, pv, Cv, h * dv, h * dv);
      // 3. L2-normalise q and k (q also scaled by dk^-0.5); beta and g.
      // x / sqrt(|x|^2 + eps) is the set's RMSNorm with eps / dk and weight
      // dk^-0.5: w x / sqrt(|x|^2 / dk + eps / dk).
      for (int t = 0; t < T; ++t)
        for (int part = 0; part < 2; ++part) {
          float* vec = &qkv[static_cast<size_t>(t) * Wh + static_cast<size_t>(part * dk)];
          ctx.kernels.rms_norm(vec, (part == 0 ? q_norm_w : k_norm_w).data(), 1e-6f / static_cast<float>(dk),
                               static_cast<size_t>(dk), vec);
        }
      float* beta_h = &beta[static_cast<size_t>(h) * T];
      float* g_h = &g[static_cast<size_t>(h) * T];
      for (int t = 0; t < T; ++t) {
        const size_t r = static_cast<size_t>(seg.row0 + t) * Hd + h;
        beta_h[t] = kernels::Sigmoid(b[r]);
        g_h[t] = -std::exp(w.A_log[h]) * kernels::Softplus(a[r] + w.dt_bias[h]);
      }
      // 4. The delta rule.
      const float* qh = &qkv[0];
      const float* kh = &qkv[static_cast<size_t>(dk)];
      const float* vh = &qkv[static_cast<size_t>(2 * dk)];
      float* S = &st.S[static_cast<size_t>(h) * dk * dv];
      float* oh = &o[static_cast<size_t>(seg.row0) * Cv + static_cast<size_t>(h) * dv];
      if (chunked) {
        ctx.kernels.delta_rule_chunked(qh, kh, vh, beta_h, g_h, T, dk, dv, Wh, Wh, S, oh, Cv,
                                       std::max(1, ctx.options.delta_chunk));
      } else if (seg.state_trail) {  // one token at a time, keeping the head's S after each
        const size_t head_state = static_cast<size_t>(dk) * dv;
        for (int t = 0; t < T; ++t) {
          const size_t r = static_cast<size_t>(t) * Wh;
          ctx.kernels.delta_rule_recurrent(qh + r, kh + r, vh + r, beta_h + t, g_h + t, 1, dk, dv, Wh, Wh, S,
                                           oh + static_cast<size_t>(t) * Cv, Cv);
          float* kept = &(*seg.state_trail)[static_cast<size_t>(t)][static_cast<size_t>(ctx.layer)].S[h * head_state];
          std::copy(S, S + head_state, kept);
        }
      } else {
        ctx.kernels.delta_rule_recurrent(qh, kh, vh, beta_h, g_h, T, dk, dv, Wh, Wh, S, oh, Cv);
      }
  };
  // Heads and sequences share nothing, so the result does not depend on how
  // they are spread over the threads. A decode step (one token a sequence)
  // runs every (sequence, head) pair in one parallel pass: one hand-off per
  // layer, not one per sequence.
  kernels::ThreadPool& pool = kernels::DefaultThreadPool();
  const size_t heads = static_cast<size_t>(Hd);
  if (all_single && work.size() > 1) {
    pool.ParallelFor(work.size() * heads, [&](size_t j) { head(work[j / heads], j % heads); });
  } else {
    for (SegmentWork& sw : work) pool.ParallelFor(heads, [&](size_t h) { head(sw, h); });
  }
  // Logical work, as the recurrent form does it per token and head: the
  // decay (dk dv), k^T S, the rank-1 update and q^T S (2 dk dv each), plus
  // the convs (2 K per channel).
  clock.Mark(ProfilePart::kDeltaRule, static_cast<double>(n) * (7.0 * Hd * dk * dv + 2.0 * K * C));

  // 5. Gated RMSNorm per head, then the output projection.
  const float eps = static_cast<float>(d.norm_eps);
  ForRows(n, [&](int t) {
    for (int h = 0; h < Hd; ++h) {  // in place: oh = silu(g) * RMSNorm(oh)
      float* oh = &o[static_cast<size_t>(t) * Cv + static_cast<size_t>(h) * dv];
      ctx.kernels.rms_norm(oh, w.o_norm.data(), eps, static_cast<size_t>(dv), oh);
      ctx.kernels.silu_mul(&gp[static_cast<size_t>(t) * Cv + static_cast<size_t>(h) * dv], oh, oh, static_cast<size_t>(dv));
    }
  });
  clock.Mark(ProfilePart::kGlue);
  Linear(w.o_proj, o.data(), n, out, ctx.kernels);
  clock.Mark(ProfilePart::kProjections, LinearFlops({&w.o_proj}, n));
}

}  // namespace moeserve::engine
