// Qwen3-Next's loader and forward pass (model.hpp). The published tensor
// names and layouts are mapped once, at load, onto the engine's pieces:
//  * in_proj_qkvz / in_proj_ba group their rows by key head ([q k v z] and
//    [b a] of each key head's value heads); they are split into the
//    per-kind projections GatedDeltaNet reads, and q/k (and their conv
//    channels) repeated for each value head of the group, as the modeling
//    code's repeat_interleave does after the conv (the conv is depthwise and
//    the L2 norm per head, so repeating before them gives the same values).
//  * q_proj holds [q | gate] per head; it is split into q and the gate.
//  * Zero-centred RMSNorm weights w are stored as 1 + w (fp32, exact as the
//    modeling code computes it); the DeltaNet output norm is a plain weight.
#include "families/qwen3_next/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "layers.hpp"
#include "scratch_heap.hpp"
#include "weights.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/engine/dtype.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4_activation_bits.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::engine::qwen3_next {

struct AttentionWeights {
  Matrix q, gate, k, v, o;          // q, gate: [H * hd, D]; k, v: [Hkv * hd, D]; o: [D, H * hd]
  std::vector<float> q_norm, k_norm;  // [hd], stored as 1 + w
};

namespace {

std::vector<float> ToF32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kF32) {
    std::memcpy(out.data(), t.data, out.size() * 4);
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t b;
      std::memcpy(&b, t.data + 2 * i, 2);
      out[i] = Bf16ToF32(b);
    }
  }
  return out;
}

// Reads published tensors, checking each one's dtype and shape; every error
// names the tensor.
class Reader {
 public:
  Reader(const Checkpoint& ck, kernels::WeightArena& arena) : ck_(ck), arena_(arena) {}

  Result<const TensorView*> Get(const std::string& name, std::vector<int64_t> shape) {
    const TensorView* t = ck_.Find(name);
    if (!t) return Fail(Error::NotFound("tensor '" + name + "' is missing"));
    if (t->dtype != DType::kBF16 && t->dtype != DType::kF32)
      return Fail(Error::InvalidArgument("tensor '" + name + "': dtype must be BF16 or F32"));
    if (t->shape != shape) {
      std::string want = "[";
      for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
      return Fail(Error::InvalidArgument("tensor '" + name + "': shape " + t->ShapeString() + ", expected " + want + "]"));
    }
    return t;
  }
  Result<std::vector<float>> Vec(const std::string& name, int64_t n) {
    MOE_ASSIGN_OR_RETURN(const TensorView* t, Get(name, {n}));
    return ToF32(*t);
  }
  // A zero-centred RMSNorm weight, as the 1 + w it multiplies by.
  Result<std::vector<float>> Norm(const std::string& name, int64_t n) {
    MOE_ASSIGN_OR_RETURN(std::vector<float> w, Vec(name, n));
    for (float& x : w) x = 1.0f + x;
    return w;
  }
  // Rows `rows` of a [R, C] matrix, in that order, kept in the file's dtype
  // (BF16 matrices go to the arena for the BF16 kernels).
  Result<Matrix> Rows(const std::string& name, int64_t R, int64_t C, const std::vector<int>& rows, bool fp32 = false) {
    MOE_ASSIGN_OR_RETURN(const TensorView* t, Get(name, {R, C}));
    return Gather(*t, C, rows, fp32);
  }
  Result<Matrix> Mat(const std::string& name, int64_t R, int64_t C, bool fp32 = false) {
    std::vector<int> all(static_cast<size_t>(R));
    for (int i = 0; i < R; ++i) all[static_cast<size_t>(i)] = i;
    return Rows(name, R, C, all, fp32);
  }
  Result<Matrix> Gather(const TensorView& t, int64_t C, const std::vector<int>& rows, bool fp32) {
    Matrix m;
    m.rows = static_cast<int>(rows.size());
    m.cols = static_cast<int>(C);
    const size_t es = t.dtype == DType::kBF16 ? 2 : 4;
    if (t.dtype == DType::kBF16 && !fp32) {
      auto* dst = static_cast<uint16_t*>(arena_.Allocate(rows.size() * static_cast<size_t>(C) * 2));
      for (size_t r = 0; r < rows.size(); ++r)
        std::memcpy(dst + r * C, t.data + static_cast<size_t>(rows[r]) * C * es, static_cast<size_t>(C) * es);
      m.bf16 = dst;
      return m;
    }
    const std::vector<float> all = ToF32(t);
    m.w.resize(rows.size() * static_cast<size_t>(C));
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(&all[static_cast<size_t>(rows[r]) * C], C, &m.w[r * C]);
    return m;
  }
  // Experts e = 0..E-1 of `base`.experts.e.{names}, stacked BF16 [E, rows, cols]
  // (w13: gate_proj's rows then up_proj's, as the engine's experts hold them).
  Result<ExpertStack> Experts(const std::string& base, int E, const std::vector<std::string>& names, int64_t rows,
                              int64_t cols) {
    ExpertStack s;
    s.format = ExpertFormat::kBf16;
    s.experts = E;
    s.rows = static_cast<int>(rows * static_cast<int64_t>(names.size()));
    s.cols = static_cast<int>(cols);
    const size_t part = static_cast<size_t>(rows) * static_cast<size_t>(cols);
    s.bf16.resize(part * names.size() * static_cast<size_t>(E));
    for (int e = 0; e < E; ++e)
      for (size_t k = 0; k < names.size(); ++k) {
        const std::string name = base + ".experts." + std::to_string(e) + "." + names[k] + ".weight";
        MOE_ASSIGN_OR_RETURN(const TensorView* t, Get(name, {rows, cols}));
        if (t->dtype != DType::kBF16) return Fail(Error::InvalidArgument("tensor '" + name + "': experts must be BF16"));
        std::memcpy(s.bf16.data() + (static_cast<size_t>(e) * names.size() + k) * part, t->data, part * 2);
      }
    return s;
  }

 private:
  const Checkpoint& ck_;
  kernels::WeightArena& arena_;
};

// The rows of the Gated DeltaNet projections, per value head h (of nv,
// key head h / r): qkvz's per-key-head block is [q (dk) | k (dk) | v (r dv) | z (r dv)].
struct DeltaRows {
  std::vector<int> q, k, v, z, b, a, conv_q, conv_k, conv_v;
};
DeltaRows DeltaRowMap(const Config& c) {
  const int nk = c.linear_k_heads, nv = c.linear_v_heads, dk = c.linear_k_dim, dv = c.linear_v_dim, r = nv / nk;
  const int block = 2 * dk + 2 * r * dv;
  DeltaRows m;
  for (int h = 0; h < nv; ++h) {
    const int g = h / r, j = h % r;
    for (int i = 0; i < dk; ++i) {
      m.q.push_back(g * block + i);
      m.k.push_back(g * block + dk + i);
      m.conv_q.push_back(g * dk + i);
      m.conv_k.push_back(nk * dk + g * dk + i);
    }
    for (int i = 0; i < dv; ++i) {
      m.v.push_back(g * block + 2 * dk + j * dv + i);
      m.z.push_back(g * block + 2 * dk + r * dv + j * dv + i);
      m.conv_v.push_back(2 * nk * dk + h * dv + i);
    }
    m.b.push_back(g * 2 * r + j);
    m.a.push_back(g * 2 * r + r + j);
  }
  return m;
}

}  // namespace

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::Load(const std::string& dir, const ModelOptions& options) {
  KeepScratchInHeap();
  std::unique_ptr<Model> m(new Model());
  MOE_ASSIGN_OR_RETURN(m->config_, LoadConfig(dir));
  const Config& c = m->config_;
  if (options.comm || options.ep_world > 1)
    return Fail(Error::InvalidArgument("qwen3_next: expert parallelism is not supported for this family"));
  m->options_ = options;
  const bool reference = options.kernels == KernelChoice::kReference;
  const kernels::Isa isa = reference ? kernels::Isa::kReference : kernels::BestIsa();
  m->kernels_ = options.deterministic ? &kernels::KernelsBatchInvariant(isa)
                : reference           ? &kernels::Kernels(isa)
                                      : &kernels::KernelsWithDecodeActivationBits(isa, options.decode_activation_bits,
                                                                                  options.bf16_activations);

  ModelConfig& sc = m->shared_config_;
  sc.architecture = "qwen3_next";
  sc.vocab_size = c.vocab_size;
  sc.hidden_size = c.hidden_size;
  sc.num_layers = c.num_layers;
  sc.rms_norm_eps = c.rms_norm_eps;
  sc.delta.num_heads = c.linear_v_heads;
  sc.delta.head_k_dim = c.linear_k_dim;
  sc.delta.head_v_dim = c.linear_v_dim;
  sc.delta.conv_size = c.conv_kernel;
  sc.delta.norm_eps = c.rms_norm_eps;
  sc.moe.num_experts = c.num_experts;
  sc.moe.experts_per_token = c.experts_per_token;
  sc.moe.num_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
  sc.moe.moe_intermediate_size = c.moe_intermediate_size;
  sc.moe.score_func = "softmax";
  sc.moe.norm_topk_prob = c.norm_topk_prob;
  sc.expert_format = ExpertFormat::kBf16;
  for (int i = 0; i < c.num_layers; ++i) sc.layer_types.push_back(c.full_attention[i] ? LayerKind::kMla : LayerKind::kDelta);

  MOE_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::Open(dir));
  bool has_mtp = false;
  for (const TensorView* t : ck.AllTensors()) has_mtp = has_mtp || t->name.rfind("mtp.", 0) == 0;
  if (has_mtp) log::Info("qwen3_next: the multi-token-prediction weights (mtp.*) are not used");
  auto w = std::make_unique<ModelWeights>();
  Reader R(ck, *w->arena);
  const int64_t D = c.hidden_size, V = c.vocab_size;
  MOE_ASSIGN_OR_RETURN(w->embed, R.Mat("model.embed_tokens.weight", V, D, /*fp32=*/true));
  MOE_ASSIGN_OR_RETURN(w->head, R.Mat(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", V, D));
  MOE_ASSIGN_OR_RETURN(w->norm, R.Norm("model.norm.weight", D));
  const DeltaRows rows = DeltaRowMap(c);
  const int64_t nk = c.linear_k_heads, nv = c.linear_v_heads, dk = c.linear_k_dim, dv = c.linear_v_dim;
  const int64_t H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim;
  size_t off = 0;
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights lw;
    lw.kind = sc.layer_types[static_cast<size_t>(i)];
    MOE_ASSIGN_OR_RETURN(lw.attn_norm, R.Norm(p + "input_layernorm.weight", D));
    MOE_ASSIGN_OR_RETURN(lw.ffn_norm, R.Norm(p + "post_attention_layernorm.weight", D));
    m->layer_offset_.push_back(off);
    if (c.full_attention[static_cast<size_t>(i)]) {
      auto aw = std::make_unique<AttentionWeights>();
      std::vector<int> qr, gr;
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < hd; ++j) {
          qr.push_back(static_cast<int>(h * 2 * hd + j));
          gr.push_back(static_cast<int>(h * 2 * hd + hd + j));
        }
      const std::string a = p + "self_attn.";
      MOE_ASSIGN_OR_RETURN(aw->q, R.Rows(a + "q_proj.weight", 2 * H * hd, D, qr));
      MOE_ASSIGN_OR_RETURN(aw->gate, R.Rows(a + "q_proj.weight", 2 * H * hd, D, gr));
      MOE_ASSIGN_OR_RETURN(aw->k, R.Mat(a + "k_proj.weight", Hkv * hd, D));
      MOE_ASSIGN_OR_RETURN(aw->v, R.Mat(a + "v_proj.weight", Hkv * hd, D));
      MOE_ASSIGN_OR_RETURN(aw->o, R.Mat(a + "o_proj.weight", D, H * hd));
      MOE_ASSIGN_OR_RETURN(aw->q_norm, R.Norm(a + "q_norm.weight", hd));
      MOE_ASSIGN_OR_RETURN(aw->k_norm, R.Norm(a + "k_norm.weight", hd));
      m->attention_.push_back(std::move(aw));
      off += static_cast<size_t>(2 * Hkv * hd);  // this layer's k | v per token
    } else {
      m->attention_.push_back(nullptr);
      const std::string a = p + "linear_attn.";
      const int64_t qkvz = 2 * nk * dk + 2 * nv * dv, conv = 2 * nk * dk + nv * dv;
      MOE_ASSIGN_OR_RETURN(lw.q_proj, R.Rows(a + "in_proj_qkvz.weight", qkvz, D, rows.q));
      MOE_ASSIGN_OR_RETURN(lw.k_proj, R.Rows(a + "in_proj_qkvz.weight", qkvz, D, rows.k));
      MOE_ASSIGN_OR_RETURN(lw.v_proj, R.Rows(a + "in_proj_qkvz.weight", qkvz, D, rows.v));
      MOE_ASSIGN_OR_RETURN(lw.g_proj, R.Rows(a + "in_proj_qkvz.weight", qkvz, D, rows.z));
      MOE_ASSIGN_OR_RETURN(lw.b_proj, R.Rows(a + "in_proj_ba.weight", 2 * nv, D, rows.b));
      MOE_ASSIGN_OR_RETURN(lw.a_proj, R.Rows(a + "in_proj_ba.weight", 2 * nv, D, rows.a));
      // conv1d.weight is [channels, 1, K]: read as [channels, K].
      const TensorView* cw = ck.Find(a + "conv1d.weight");
      if (!cw) return Fail(Error::NotFound("tensor '" + a + "conv1d.weight' is missing"));
      if (cw->shape != std::vector<int64_t>{conv, 1, c.conv_kernel})
        return Fail(Error::InvalidArgument("tensor '" + a + "conv1d.weight': shape " + cw->ShapeString() + ", expected [" +
                                           std::to_string(conv) + ", 1, " + std::to_string(c.conv_kernel) + "]"));
      if (cw->dtype != DType::kBF16 && cw->dtype != DType::kF32)
        return Fail(Error::InvalidArgument("tensor '" + a + "conv1d.weight': dtype must be BF16 or F32"));
      MOE_ASSIGN_OR_RETURN(lw.q_conv, R.Gather(*cw, c.conv_kernel, rows.conv_q, true));
      MOE_ASSIGN_OR_RETURN(lw.k_conv, R.Gather(*cw, c.conv_kernel, rows.conv_k, true));
      MOE_ASSIGN_OR_RETURN(lw.v_conv, R.Gather(*cw, c.conv_kernel, rows.conv_v, true));
      MOE_ASSIGN_OR_RETURN(lw.A_log, R.Vec(a + "A_log", nv));
      MOE_ASSIGN_OR_RETURN(lw.dt_bias, R.Vec(a + "dt_bias", nv));
      MOE_ASSIGN_OR_RETURN(lw.o_norm, R.Vec(a + "norm.weight", dv));
      MOE_ASSIGN_OR_RETURN(lw.o_proj, R.Mat(a + "out_proj.weight", D, nv * dv));
    }
    if (c.sparse[static_cast<size_t>(i)]) {
      lw.moe = true;
      const int64_t E = c.num_experts, I = c.moe_intermediate_size, S = c.shared_expert_intermediate_size;
      MOE_ASSIGN_OR_RETURN(lw.gate, R.Mat(p + "mlp.gate.weight", E, D));
      MOE_ASSIGN_OR_RETURN(lw.w13, R.Experts(p + "mlp", c.num_experts, {"gate_proj", "up_proj"}, I, D));
      MOE_ASSIGN_OR_RETURN(lw.w2e, R.Experts(p + "mlp", c.num_experts, {"down_proj"}, D, I));
      if (S > 0) {
        MOE_ASSIGN_OR_RETURN(lw.shared_w1, R.Mat(p + "mlp.shared_expert.gate_proj.weight", S, D));
        MOE_ASSIGN_OR_RETURN(lw.shared_w3, R.Mat(p + "mlp.shared_expert.up_proj.weight", S, D));
        MOE_ASSIGN_OR_RETURN(lw.shared_w2, R.Mat(p + "mlp.shared_expert.down_proj.weight", D, S));
        MOE_ASSIGN_OR_RETURN(lw.shared_gate, R.Mat(p + "mlp.shared_expert_gate.weight", 1, D));
      }
    } else {
      const int64_t I = c.intermediate_size;
      MOE_ASSIGN_OR_RETURN(lw.w1, R.Mat(p + "mlp.gate_proj.weight", I, D));
      MOE_ASSIGN_OR_RETURN(lw.w3, R.Mat(p + "mlp.up_proj.weight", I, D));
      MOE_ASSIGN_OR_RETURN(lw.w2, R.Mat(p + "mlp.down_proj.weight", D, I));
    }
    w->layers.push_back(std::move(lw));
  }
  m->floats_per_token_ = std::max<size_t>(off, 1);
  m->weights_ = std::move(w);
  // inv_freq_j = theta^(-2j / rotary_dim), j < rotary_dim / 2.
  for (int j = 0; j < c.rotary_dim / 2; ++j)
    m->rope_freqs_.push_back(static_cast<float>(1.0 / std::pow(c.rope_theta, (2.0 * j) / c.rotary_dim)));
  return m;
}

SequenceCache Model::NewSequence() const {
  SequenceCache cache;
  cache.delta.resize(static_cast<size_t>(config_.num_layers));
  const DeltaConfig& d = shared_config_.delta;
  const size_t channels = static_cast<size_t>(2 * d.num_heads * d.head_k_dim + d.num_heads * d.head_v_dim);
  for (int i = 0; i < config_.num_layers; ++i) {
    if (config_.full_attention[static_cast<size_t>(i)]) continue;
    cache.delta[static_cast<size_t>(i)].conv_tail.assign(static_cast<size_t>(d.conv_size - 1) * channels, 0.0f);
    cache.delta[static_cast<size_t>(i)].S.assign(static_cast<size_t>(d.num_heads) * d.head_k_dim * d.head_v_dim, 0.0f);
  }
  return cache;
}

DecodeWeightBytes Model::decode_weight_bytes() const {
  DecodeWeightBytes d = DecodeReadBytes(*weights_, shared_config_.moe.experts_per_token);
  for (const auto& a : attention_) {
    if (!a) continue;
    for (const Matrix* m : {&a->q, &a->gate, &a->k, &a->v, &a->o}) AddMatrix(*m, &d.dense, &d.dense_weights);
    d.dense += static_cast<double>((a->q_norm.size() + a->k_norm.size()) * sizeof(float));
  }
  return d;
}

std::vector<int> Model::ExpertCounts() const {
  std::vector<int> counts(static_cast<size_t>(config_.num_layers), 0);
  for (int i = 0; i < config_.num_layers; ++i)
    if (config_.sparse[static_cast<size_t>(i)]) counts[static_cast<size_t>(i)] = config_.num_experts;
  return counts;
}

namespace {

float* CacheRow(KvPool& pool, const SequenceCache& cache, int64_t pos, size_t offset) {
  const int bt = pool.block_tokens();
  return pool.TokenRow(cache.blocks[static_cast<size_t>(pos / bt)], static_cast<int>(pos % bt)) + offset;
}

// Gated full attention: q, k per-head zero-centred RMSNorm, rotary on the
// first rotary_dim dims of each head (half-split pairs), causal softmax
// attention over the cached k, v (GQA: head h reads kv head h / (H / Hkv)),
// o *= sigmoid(gate), then o_proj.
void GatedAttention(const Config& c, const AttentionWeights& a, KvPool& pool, std::span<const SegmentRows> segs,
                    size_t offset, const std::vector<float>& freqs, const kernels::KernelSet& k, const float* x, int n,
                    float* out, PartClock& clock) {
  const int H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim, group = H / Hkv;
  const size_t qd = static_cast<size_t>(H) * hd, kd = static_cast<size_t>(Hkv) * hd;
  ScratchFloats q(static_cast<size_t>(n) * qd), gate(q.size()), kk(static_cast<size_t>(n) * kd), vv(kk.size());
  LinearMany({{&a.q, x, q.data()}, {&a.gate, x, gate.data()}, {&a.k, x, kk.data()}, {&a.v, x, vv.data()}}, n, k);
  clock.Mark(ProfilePart::kProjections, LinearFlops({&a.q, &a.gate, &a.k, &a.v}, n));
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (const SegmentRows& s : segs) {
    ForRows(s.n, [&](int j) {
      const int t = s.row0 + j;
      const int64_t pos = s.pos0 + j;
      for (int h = 0; h < H; ++h) {
        float* qh = &q[static_cast<size_t>(t) * qd + static_cast<size_t>(h) * hd];
        k.rms_norm(qh, a.q_norm.data(), eps, static_cast<size_t>(hd), qh);
        RopeHalfSplit(qh, c.rotary_dim, pos, freqs);
      }
      float* row = CacheRow(pool, *s.cache, pos, offset);
      for (int h = 0; h < Hkv; ++h) {
        float* kh = &kk[static_cast<size_t>(t) * kd + static_cast<size_t>(h) * hd];
        k.rms_norm(kh, a.k_norm.data(), eps, static_cast<size_t>(hd), kh);
        RopeHalfSplit(kh, c.rotary_dim, pos, freqs);
      }
      std::copy_n(&kk[static_cast<size_t>(t) * kd], kd, row);
      std::copy_n(&vv[static_cast<size_t>(t) * kd], kd, row + kd);
    });
  }
  // Attention per (row, head), rows of a segment seeing positions 0 .. pos.
  ScratchFloats o(q.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  double flops = 0;
  // Every (row, head) of every segment in one parallel pass: a decode step
  // of many sequences hands off once per layer, not once per sequence. Each
  // job's result does not depend on where it runs.
  std::vector<std::vector<const float*>> seg_rows(segs.size());
  std::vector<size_t> first_job(segs.size() + 1, 0);
  for (size_t si = 0; si < segs.size(); ++si) {
    const SegmentRows& s = segs[si];
    const int64_t last = s.pos0 + s.n;
    seg_rows[si].resize(static_cast<size_t>(last));
    for (int64_t p = 0; p < last; ++p) seg_rows[si][static_cast<size_t>(p)] = CacheRow(pool, *s.cache, p, offset);
    first_job[si + 1] = first_job[si] + static_cast<size_t>(s.n) * H;
    for (int j = 0; j < s.n; ++j) flops += 4.0 * H * hd * static_cast<double>(s.pos0 + j + 1);
  }
  kernels::DefaultThreadPool().ParallelFor(first_job.back(), [&](size_t all_job) {
      const size_t si = static_cast<size_t>(std::upper_bound(first_job.begin(), first_job.end(), all_job) -
                                            first_job.begin()) - 1;
      const SegmentRows& s = segs[si];
      const std::vector<const float*>& rows = seg_rows[si];
      const size_t job = all_job - first_job[si];
      const int j = static_cast<int>(job / H), h = static_cast<int>(job % H);
      const int t = s.row0 + j, kvh = h / group;
      const int64_t visible = s.pos0 + j + 1;
      const float* qh = &q[static_cast<size_t>(t) * qd + static_cast<size_t>(h) * hd];
      std::vector<float> sc(static_cast<size_t>(visible));
      float mx = -INFINITY;
      for (int64_t p = 0; p < visible; ++p) {
        const float* kp = rows[static_cast<size_t>(p)] + static_cast<size_t>(kvh) * hd;
        float d = 0;
        for (int i = 0; i < hd; ++i) d += qh[i] * kp[i];
        sc[static_cast<size_t>(p)] = d * scale;
        mx = std::max(mx, sc[static_cast<size_t>(p)]);
      }
      float sum = 0;
      for (float& v : sc) sum += (v = std::exp(v - mx));
      float* oh = &o[static_cast<size_t>(t) * qd + static_cast<size_t>(h) * hd];
      std::fill(oh, oh + hd, 0.0f);
      for (int64_t p = 0; p < visible; ++p) {
        const float* vp = rows[static_cast<size_t>(p)] + kd + static_cast<size_t>(kvh) * hd;
        const float wgt = sc[static_cast<size_t>(p)] / sum;
        for (int i = 0; i < hd; ++i) oh[i] += wgt * vp[i];
      }
      const float* gh = &gate[static_cast<size_t>(t) * qd + static_cast<size_t>(h) * hd];
      for (int i = 0; i < hd; ++i) oh[i] *= kernels::Sigmoid(gh[i]);
  });
  clock.Mark(ProfilePart::kAttention, flops);
  Linear(a.o, o.data(), n, out, k);
  clock.Mark(ProfilePart::kProjections, LinearFlops({&a.o}, n));
}

}  // namespace

Status Model::Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits, ForwardTrace* trace,
                      std::vector<std::vector<uint64_t>>* expert_tokens) const {
  const Config& c = config_;
  const int D = c.hidden_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<SegmentRows> rows;
  int N = 0;
  for (auto& s : segments) {
    if (s.tokens.empty()) return Fail(Error::InvalidArgument("forward: empty segment"));
    if (static_cast<int64_t>(s.cache->blocks.size()) * pool.block_tokens() < s.cache->length + static_cast<int64_t>(s.tokens.size()))
      return Fail(Error::Internal("forward: cache blocks do not cover the new tokens (call EnsureBlocks)"));
    rows.push_back({s.cache, N, static_cast<int>(s.tokens.size()), s.cache->length});
    N += static_cast<int>(s.tokens.size());
  }
  std::vector<float> x(static_cast<size_t>(N) * D), normed(x.size()), branch(x.size());
  int r = 0;
  for (auto& s : segments)
    for (int tok : s.tokens) {
      if (tok < 0 || tok >= V) return Fail(Error::InvalidArgument("forward: token id " + std::to_string(tok) + " out of range"));
      std::copy_n(&weights_->embed.w[static_cast<size_t>(tok) * D], D, &x[static_cast<size_t>(r++) * D]);
    }
  ForwardProfile* profile = trace ? trace->profile : nullptr;
  const kernels::KernelSet& ks = *kernels_;
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& w = weights_->layers[static_cast<size_t>(i)];
    PartClock clock(profile, c.full_attention[static_cast<size_t>(i)] ? static_cast<int>(LayerKind::kMla)
                                                                      : static_cast<int>(LayerKind::kDelta));
    const auto norm_rows = [&](const std::vector<float>& weight) {
      ForRows(N, [&](int t) {
        ks.rms_norm(&x[static_cast<size_t>(t) * D], weight.data(), eps, static_cast<size_t>(D), &normed[static_cast<size_t>(t) * D]);
      });
    };
    const auto add_branch = [&] {
      ForRows(N, [&](int t) {
        for (size_t j = static_cast<size_t>(t) * D; j < static_cast<size_t>(t + 1) * D; ++j) x[j] += branch[j];
      });
    };
    norm_rows(w.attn_norm);
    clock.Mark(ProfilePart::kGlue);
    if (const AttentionWeights* a = attention_[static_cast<size_t>(i)].get()) {
      GatedAttention(c, *a, pool, rows, layer_offset_[static_cast<size_t>(i)], rope_freqs_, ks, normed.data(), N,
                     branch.data(), clock);
    } else {
      LayerContext ctx{shared_config_, options_, ks, false, pool, rows, i, layer_offset_[static_cast<size_t>(i)],
                       rope_freqs_, 1.0f, trace, clock};
      GatedDeltaNet(ctx, w, normed.data(), N, branch.data());
    }
    add_branch();
    norm_rows(w.ffn_norm);
    clock.Mark(ProfilePart::kGlue);
    std::vector<uint64_t>* layer_tokens = expert_tokens ? &(*expert_tokens)[static_cast<size_t>(i)] : nullptr;
    if (w.moe) MoeFfn(shared_config_, w, normed.data(), N, branch.data(), layer_tokens, ks, &clock);
    else DenseFfn(w, normed.data(), N, branch.data(), ks, &clock);
    add_branch();
    clock.Mark(ProfilePart::kGlue);
  }
  for (auto& s : segments) s.cache->length += static_cast<int64_t>(s.tokens.size());
  if (logits) {
    std::vector<int> want;
    for (size_t k = 0; k < segments.size(); ++k) {
      if (segments[k].all_logits)
        for (int t = 0; t < rows[k].n; ++t) want.push_back(rows[k].row0 + t);
      else
        want.push_back(rows[k].row0 + rows[k].n - 1);
    }
    std::vector<float> final_norm(want.size() * static_cast<size_t>(D));
    for (size_t k = 0; k < want.size(); ++k)
      ks.rms_norm(&x[static_cast<size_t>(want[k]) * D], weights_->norm.data(), eps, static_cast<size_t>(D), &final_norm[k * D]);
    logits->resize(want.size() * static_cast<size_t>(V));
    Linear(weights_->head, final_norm.data(), static_cast<int>(want.size()), logits->data(), ks);
  }
  return Ok();
}

}  // namespace moeserve::engine::qwen3_next
