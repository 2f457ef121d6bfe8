// The gpt-oss forward pass on CPU, a batch of segments against the engine's
// KvPool, through the model's KernelSet (BF16 dense matrices read as
// stored, MXFP4 experts repacked for the integer dot-product kernels): RMSNorm, GQA attention with q/k/v/o biases and per-head
// sinks (banded or full by layer), YaRN RoPE, the biased top-k router with a
// softmax over the chosen logits, MXFP4 experts with biases and the clamped
// SwiGLU over interleaved gate/up rows.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <unistd.h>

#include "moeserve/engine/dtype.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "layers.hpp"
#include "scratch_heap.hpp"

namespace moeserve::engine {

// A dense [rows, cols] matrix as the checkpoint holds it: BF16 read in place
// from the mapped shard (2-byte aligned, as safetensors lays it out; copied
// otherwise), or F32 owned. Products go through the model's KernelSet.
struct DenseMatrix {
  const uint16_t* bf16 = nullptr;
  std::vector<uint16_t> bf16_copy;
  std::vector<float> f32;
  size_t rows = 0, cols = 0;

  void Apply(const kernels::KernelSet& k, const float* X, size_t n, float* Y) const {
    if (bf16)
      k.matmul_bf16(bf16, rows, cols, X, n, Y);
    else
      k.matmul_f32(f32.data(), rows, cols, X, n, Y);
  }
  void Row(size_t r, float* out) const {
    if (bf16)
      for (size_t c = 0; c < cols; ++c) out[c] = Bf16ToF32(bf16[r * cols + c]);
    else
      std::copy_n(f32.data() + r * cols, cols, out);
  }
  size_t bytes() const { return rows * cols * (bf16 ? 2 : 4); }
};

struct GptOssModel::Weights {
  struct Layer {
    std::vector<float> in_norm, post_norm;
    DenseMatrix wq, wk, wv, wo, router;
    std::vector<float> bq, bk, bv, bo, sinks, router_b;
    kernels::Mxfp4PackedStack gate_up, down;  // E x [2I, hidden] (row 2i gate, 2i+1 up), E x [hidden, I]
    std::vector<float> gate_up_b, down_b;     // [E, 2I], [E, hidden]
  };
  Checkpoint checkpoint;  // keeps the mapped BF16 matrices alive
  DenseMatrix embed, head;
  std::vector<float> norm;
  std::vector<Layer> layers;
};

namespace {

std::string Shape(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

const TensorView* FindShaped(const Checkpoint& ck, const std::string& name, const std::vector<int64_t>& shape,
                             Error* err) {
  const TensorView* t = ck.Find(name);
  if (!t) {
    *err = Error::NotFound("gpt-oss checkpoint: missing tensor '" + name + "'");
    return nullptr;
  }
  if (t->shape != shape) {
    *err = Error::InvalidArgument("gpt-oss checkpoint: tensor '" + name + "' has shape " + t->ShapeString() +
                                  ", expected " + Shape(shape));
    return nullptr;
  }
  return t;
}

// A dense tensor (BF16, F16 not accepted, F32) widened to fp32.
Result<std::vector<float>> Dense(const Checkpoint& ck, const std::string& name, std::vector<int64_t> shape) {
  Error err = Error::Internal("");
  const TensorView* t = FindShaped(ck, name, shape, &err);
  if (!t) return Fail(err);
  std::vector<float> out(static_cast<size_t>(t->numel()));
  if (t->dtype == DType::kBF16) {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t b;
      std::memcpy(&b, t->data + 2 * i, 2);
      out[i] = Bf16ToF32(b);
    }
  } else if (t->dtype == DType::kF32) {
    std::memcpy(out.data(), t->data, out.size() * 4);
  } else {
    return Fail(Error::InvalidArgument("gpt-oss checkpoint: tensor '" + name + "' has dtype " +
                                       std::string(DTypeName(t->dtype)) + ", expected BF16 or F32"));
  }
  return out;
}

// A dense matrix, BF16 kept as stored (see DenseMatrix) or F32.
Result<DenseMatrix> DenseMat(const Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols) {
  Error err = Error::Internal("");
  const TensorView* t = FindShaped(ck, name, {rows, cols}, &err);
  if (!t) return Fail(err);
  DenseMatrix m;
  m.rows = static_cast<size_t>(rows);
  m.cols = static_cast<size_t>(cols);
  if (t->dtype == DType::kBF16) {
    if (reinterpret_cast<uintptr_t>(t->data) % alignof(uint16_t) == 0) {
      m.bf16 = reinterpret_cast<const uint16_t*>(t->data);
    } else {
      m.bf16_copy.resize(m.rows * m.cols);
      std::memcpy(m.bf16_copy.data(), t->data, m.bf16_copy.size() * 2);
      m.bf16 = m.bf16_copy.data();
    }
    return m;
  }
  MOE_ASSIGN_OR_RETURN(m.f32, Dense(ck, name, {rows, cols}));
  return m;
}

// Drops the whole pages inside [p, p + n) of a read-only file mapping from
// this process (a later read would fault them in again from the file).
void ReleaseMappedPages(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// MXFP4 experts NAME_blocks [E, rows, cols/32, 16] and NAME_scales [E, rows,
// cols/32] (E8M0, bias 127): the OCP layout our kernels read, repacked for
// them (lossless). Byte j of a block holds element 2j in its low nibble and
// 2j+1 in its high nibble.
Result<kernels::Mxfp4PackedStack> Mxfp4(const Checkpoint& ck, const std::string& name, int64_t e, int64_t rows,
                                        int64_t cols) {
  Error err = Error::Internal("");
  const TensorView* b = FindShaped(ck, name + "_blocks", {e, rows, cols / 32, 16}, &err);
  if (!b) return Fail(err);
  const TensorView* s = FindShaped(ck, name + "_scales", {e, rows, cols / 32}, &err);
  if (!s) return Fail(err);
  if (b->dtype != DType::kU8 || s->dtype != DType::kU8)
    return Fail(Error::InvalidArgument("gpt-oss checkpoint: '" + name + "_blocks' and '_scales' must be U8"));
  const size_t groups = static_cast<size_t>(e * rows * (cols / 32));
  const long long nan_at = kernels::Mxfp4FindNanScale(s->data, groups);
  if (nan_at >= 0)
    return Fail(Error::InvalidArgument("gpt-oss checkpoint: '" + name + "_scales' holds 255 (E8M0 NaN) at group " +
                                       std::to_string(nan_at)));
  kernels::Mxfp4PackedStack packed(b->data, s->data, static_cast<size_t>(e), static_cast<size_t>(rows),
                                   static_cast<size_t>(cols));
  // The mapped file pages are not read again: drop them, or they stay
  // resident beside the packed copy (11 GB of gpt-oss-20b) and crowd out the
  // BF16 matrices that every token reads in place.
  ReleaseMappedPages(b->data, b->nbytes);
  ReleaseMappedPages(s->data, s->nbytes);
  return packed;
}

// cos and sin of each RoPE frequency at each position (scaled by the YaRN
// concentration), computed once per call and shared by every head and layer.
struct RopeTable {
  std::vector<float> cos, sin;  // [rows, d/2]
  RopeTable(const GptOssConfig& c, const std::vector<int>& positions)
      : cos(positions.size() * c.inv_freq.size()), sin(cos.size()) {
    const size_t half = c.inv_freq.size();
    for (size_t t = 0; t < positions.size(); ++t)
      for (size_t i = 0; i < half; ++i) {
        const double ang = static_cast<double>(positions[t]) * c.inv_freq[i];
        cos[t * half + i] = static_cast<float>(std::cos(ang) * c.rope_concentration);
        sin[t * half + i] = static_cast<float>(std::sin(ang) * c.rope_concentration);
      }
  }
};

// Half-split rotation of one head vector (d = 2 * half) with the token's row of the table.
void Rope(float* v, const float* co, const float* si, size_t half) {
  for (size_t i = 0; i < half; ++i) {
    const float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * co[i] - x2 * si[i];
    v[i + half] = x2 * co[i] + x1 * si[i];
  }
}

void AddBias(float* y, const float* b, size_t n, size_t width) {
  for (size_t t = 0; t < n; ++t)
    for (size_t i = 0; i < width; ++i) y[t * width + i] += b[i];
}

}  // namespace

GptOssModel::~GptOssModel() = default;

ModelConfig GptOssModel::Describe() const {
  ModelConfig c;
  c.architecture = "gpt-oss";
  c.vocab_size = cfg_.vocab;
  c.hidden_size = cfg_.hidden;
  c.num_layers = cfg_.layers;
  c.rms_norm_eps = cfg_.rms_eps;
  c.max_position_embeddings = cfg_.max_position;
  c.moe.num_experts = cfg_.experts;
  c.moe.experts_per_token = cfg_.experts_per_token;
  c.moe.moe_intermediate_size = cfg_.intermediate;
  c.moe.score_func = "softmax";  // over the picked experts' logits
  c.expert_format = ExpertFormat::kMxfp4;
  return c;  // every layer MoE (first_dense_layers 0)
}

Result<std::unique_ptr<GptOssModel>> GptOssModel::Load(const std::string& dir, kernels::Isa isa, bool bf16_activations) {
  KeepScratchInHeap();
  namespace fs = std::filesystem;
  std::ifstream in(fs::path(dir) / "config.json", std::ios::binary);
  if (!in) return Fail(Error::NotFound(dir + "/config.json: cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  std::unique_ptr<GptOssModel> m(new GptOssModel());
  m->kernels_ = bf16_activations ? &kernels::KernelsWithBf16Activations(isa) : &kernels::Kernels(isa);
  MOE_ASSIGN_OR_RETURN(m->cfg_, ParseGptOssConfig(text.str()));
  const GptOssConfig& c = m->cfg_;
  // Experts stay MXFP4 (4.25 bits a weight), dense matrices BF16 as stored:
  // refuse up front what the machine cannot hold.
  const double dense = 2.0 * (c.tie_embeddings ? 1.0 : 2.0) * c.vocab * c.hidden +
                       2.0 * c.layers * (2.0 * c.hidden * (c.heads + c.kv_heads) * c.head_dim);
  const double experts = static_cast<double>(c.layers) * 3.0 * c.experts * c.hidden * c.intermediate * 17.0 / 32.0;
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (ram > 0 && dense + experts > ram)
    return Fail(Error::ResourceExhausted("gpt-oss: this config needs about " +
                                         std::to_string(static_cast<long long>((dense + experts) / 1e9)) +
                                         " GB of weights in memory, more than this machine's " +
                                         std::to_string(static_cast<long long>(ram / 1e9)) + " GB"));
  auto w = std::make_unique<Weights>();
  MOE_ASSIGN_OR_RETURN(w->checkpoint, Checkpoint::Open(dir));
  const Checkpoint& ck = w->checkpoint;
  const int64_t hd = c.hidden, qd = int64_t{c.heads} * c.head_dim, kvd = int64_t{c.kv_heads} * c.head_dim;
  const int64_t E = c.experts, I = c.intermediate;
  MOE_ASSIGN_OR_RETURN(w->embed, DenseMat(ck, "model.embed_tokens.weight", c.vocab, hd));
  MOE_ASSIGN_OR_RETURN(w->norm, Dense(ck, "model.norm.weight", {hd}));
  if (!c.tie_embeddings) {
    MOE_ASSIGN_OR_RETURN(w->head, DenseMat(ck, "lm_head.weight", c.vocab, hd));
  }
  w->layers.resize(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Weights::Layer& L = w->layers[i];
    MOE_ASSIGN_OR_RETURN(L.in_norm, Dense(ck, p + "input_layernorm.weight", {hd}));
    MOE_ASSIGN_OR_RETURN(L.post_norm, Dense(ck, p + "post_attention_layernorm.weight", {hd}));
    MOE_ASSIGN_OR_RETURN(L.wq, DenseMat(ck, p + "self_attn.q_proj.weight", qd, hd));
    MOE_ASSIGN_OR_RETURN(L.bq, Dense(ck, p + "self_attn.q_proj.bias", {qd}));
    MOE_ASSIGN_OR_RETURN(L.wk, DenseMat(ck, p + "self_attn.k_proj.weight", kvd, hd));
    MOE_ASSIGN_OR_RETURN(L.bk, Dense(ck, p + "self_attn.k_proj.bias", {kvd}));
    MOE_ASSIGN_OR_RETURN(L.wv, DenseMat(ck, p + "self_attn.v_proj.weight", kvd, hd));
    MOE_ASSIGN_OR_RETURN(L.bv, Dense(ck, p + "self_attn.v_proj.bias", {kvd}));
    MOE_ASSIGN_OR_RETURN(L.wo, DenseMat(ck, p + "self_attn.o_proj.weight", hd, qd));
    MOE_ASSIGN_OR_RETURN(L.bo, Dense(ck, p + "self_attn.o_proj.bias", {hd}));
    MOE_ASSIGN_OR_RETURN(L.sinks, Dense(ck, p + "self_attn.sinks", {c.heads}));
    MOE_ASSIGN_OR_RETURN(L.router, DenseMat(ck, p + "mlp.router.weight", E, hd));
    MOE_ASSIGN_OR_RETURN(L.router_b, Dense(ck, p + "mlp.router.bias", {E}));
    MOE_ASSIGN_OR_RETURN(L.gate_up, Mxfp4(ck, p + "mlp.experts.gate_up_proj", E, 2 * I, hd));
    MOE_ASSIGN_OR_RETURN(L.gate_up_b, Dense(ck, p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}));
    MOE_ASSIGN_OR_RETURN(L.down, Mxfp4(ck, p + "mlp.experts.down_proj", E, hd, I));
    MOE_ASSIGN_OR_RETURN(L.down_b, Dense(ck, p + "mlp.experts.down_proj_bias", {E, hd}));
  }
  m->w_ = std::move(w);
  return m;
}

size_t GptOssModel::weight_bytes() const {
  size_t n = w_->embed.bytes() + (cfg_.tie_embeddings ? 0 : w_->head.bytes());
  for (const auto& L : w_->layers)
    n += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.router.bytes() + L.gate_up.bytes() +
         L.down.bytes();
  return n;
}

size_t GptOssModel::active_weight_bytes_per_token() const {
  size_t n = (cfg_.tie_embeddings ? w_->embed : w_->head).bytes();
  for (const auto& L : w_->layers)
    n += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.router.bytes() +
         (L.gate_up.bytes() + L.down.bytes()) / static_cast<size_t>(cfg_.experts) * cfg_.experts_per_token;
  return n;
}

DecodeWeightBytes GptOssModel::decode_weight_bytes() const {
  const auto vec = [](const std::vector<float>& v) { return static_cast<double>(v.size() * sizeof(float)); };
  const auto mat = [](const DenseMatrix& m, double* bytes, double* weights) {
    *bytes += static_cast<double>(m.bytes());
    *weights += static_cast<double>(m.rows) * static_cast<double>(m.cols);
  };
  DecodeWeightBytes d;
  d.experts_per_token = cfg_.experts_per_token;
  d.moe_layers = cfg_.layers;
  d.embed_row = w_->embed.rows > 0 ? static_cast<double>(w_->embed.bytes()) / w_->embed.rows : 0.0;
  mat(cfg_.tie_embeddings ? w_->embed : w_->head, &d.dense, &d.dense_weights);
  d.dense += vec(w_->norm);
  const double E = static_cast<double>(cfg_.experts);
  for (const auto& L : w_->layers) {
    for (const DenseMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.router}) mat(*m, &d.dense, &d.dense_weights);
    d.dense += vec(L.in_norm) + vec(L.post_norm) + vec(L.bq) + vec(L.bk) + vec(L.bv) + vec(L.bo) + vec(L.sinks) +
               vec(L.router_b);
    d.expert += (static_cast<double>(L.gate_up.bytes() + L.down.bytes()) + vec(L.gate_up_b) + vec(L.down_b)) / E;
  }
  if (cfg_.layers > 0) d.expert /= cfg_.layers;
  d.expert_weights = 3.0 * cfg_.intermediate * static_cast<double>(cfg_.hidden);  // gate_up [2I, D], down [D, I]
  return d;
}

size_t GptOssModel::cache_floats_per_token() const {
  return static_cast<size_t>(cfg_.layers) * 2 * static_cast<size_t>(cfg_.kv_heads) * static_cast<size_t>(cfg_.head_dim);
}

std::vector<int> GptOssModel::ExpertCounts() const { return std::vector<int>(static_cast<size_t>(cfg_.layers), cfg_.experts); }

// The forward over every segment's new tokens, layer by layer: every
// projection is one product over all rows (matrix-vector kernels for one
// row, GEMMs for more), keys and values go to each row's slot of its
// sequence's blocks, attention runs per (row, head) in parallel against the
// row's own sequence (kernels::GqaSinkAttention: per segment, its queries in
// blocks against each key/value head), and each expert takes the rows routed
// to it in one product. A prefill chunk is a segment of many rows; a decode
// step one row. trace->profile, when given, gets the time of each part
// (layers in row 0, the head in row 3: ForwardProfile's mla and model rows).
Status GptOssModel::Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits,
                            ForwardTrace* trace, std::vector<std::vector<uint64_t>>* expert_tokens) const {
  PartClock clock(trace ? trace->profile : nullptr, 0);
  const GptOssConfig& c = cfg_;
  const kernels::KernelSet& k = *kernels_;
  logits->clear();
  if (pool.floats_per_token() != cache_floats_per_token())
    return Fail(Error::InvalidArgument("gpt-oss forward: the KV pool's rows hold " + std::to_string(pool.floats_per_token()) +
                                       " floats, this model needs " + std::to_string(cache_floats_per_token())));
  // Whole token rows (TokenRow) are only where a pool of one stripe has them.
  if (pool.num_stripes() != 1)
    return Fail(Error::InvalidArgument("gpt-oss forward: the KV pool is cut in " + std::to_string(pool.num_stripes()) +
                                       " stripes; this family keeps whole token rows (one stripe)"));
  const size_t bt = static_cast<size_t>(pool.block_tokens());
  size_t n = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const ForwardSegment& seg = segments[s];
    if (!seg.cache || seg.tokens.empty()) return Fail(Error::InvalidArgument("gpt-oss forward: an empty segment"));
    for (size_t j = 0; j < s; ++j)
      if (segments[j].cache == seg.cache) return Fail(Error::InvalidArgument("gpt-oss forward: a sequence appears twice"));
    const size_t end = static_cast<size_t>(seg.cache->length) + seg.tokens.size();
    if (seg.cache->blocks.size() * bt < end)
      return Fail(Error::InvalidArgument("gpt-oss forward: the sequence's blocks do not cover its new tokens"));
    for (int t : seg.tokens)
      if (t < 0 || t >= c.vocab)
        return Fail(Error::OutOfRange("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                      std::to_string(c.vocab) + ")"));
    n += seg.tokens.size();
  }
  if (n == 0) return Ok();
  const size_t hd = c.hidden, d = c.head_dim, H = c.heads, KV = c.kv_heads, I = c.intermediate;
  const size_t kvd = KV * d, qd = H * d, E = c.experts, K = c.experts_per_token;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // Each row's position and its key/value row in the pool.
  std::vector<int> position(n);
  std::vector<int> tokens(n);
  std::vector<float*> row_of(n);
  for (size_t s = 0, r = 0; s < segments.size(); ++s)
    for (size_t i = 0; i < segments[s].tokens.size(); ++i, ++r) {
      const SequenceCache& cache = *segments[s].cache;
      position[r] = static_cast<int>(cache.length) + static_cast<int>(i);
      tokens[r] = segments[s].tokens[i];
      const size_t p = static_cast<size_t>(position[r]);
      row_of[r] = pool.TokenRow(cache.blocks[p / bt], static_cast<int>(p % bt));
    }
  // Each segment's first row in the batch, and its cache rows by position
  // (the attention's keys and values).
  std::vector<size_t> seg_row0(segments.size() + 1, 0);
  std::vector<std::vector<const float*>> seg_rows(segments.size());
  for (size_t s = 0; s < segments.size(); ++s) {
    seg_row0[s + 1] = seg_row0[s] + segments[s].tokens.size();
    const SequenceCache& cache = *segments[s].cache;
    const size_t len = static_cast<size_t>(cache.length) + segments[s].tokens.size();
    seg_rows[s].resize(len);
    for (size_t p = 0; p < len; ++p)
      seg_rows[s][p] = pool.TokenRow(cache.blocks[p / bt], static_cast<int>(p % bt));
  }
  std::vector<int> first_full(n, 0), first_banded(n);
  for (size_t i = 0; i < n; ++i) first_banded[i] = std::max(0, position[i] - c.sliding_window + 1);
  const RopeTable rope(c, position);
  const size_t half = d / 2;
  std::vector<float> x(n * hd), t(n * hd), q(n * qd), kk(n * kvd), vv(n * kvd), o(n * qd), a(n * hd);
  std::vector<float> router(n * E), moe(n * hd);
  for (size_t i = 0; i < n; ++i) w_->embed.Row(static_cast<size_t>(tokens[i]), x.data() + i * hd);
  auto norm_rows = [&](const std::vector<float>& w) {
    for (size_t i = 0; i < n; ++i) k.rms_norm(x.data() + i * hd, w.data(), c.rms_eps, hd, t.data() + i * hd);
  };
  for (int li = 0; li < c.layers; ++li) {
    const Weights::Layer& L = w_->layers[li];
    const size_t layer_off = static_cast<size_t>(li) * 2 * kvd;  // keys, then values
    norm_rows(L.in_norm);
    clock.Mark(ProfilePart::kGlue);
    L.wq.Apply(k, t.data(), n, q.data());
    L.wk.Apply(k, t.data(), n, kk.data());
    L.wv.Apply(k, t.data(), n, vv.data());
    clock.Mark(ProfilePart::kProjections, 2.0 * static_cast<double>(n) * hd * (qd + 2 * kvd));
    AddBias(q.data(), L.bq.data(), n, qd);
    AddBias(kk.data(), L.bk.data(), n, kvd);
    AddBias(vv.data(), L.bv.data(), n, kvd);
    for (size_t i = 0; i < n; ++i) {
      const float* co = rope.cos.data() + i * half;
      const float* si = rope.sin.data() + i * half;
      for (size_t h = 0; h < H; ++h) Rope(q.data() + i * qd + h * d, co, si, half);
      for (size_t h = 0; h < KV; ++h) Rope(kk.data() + i * kvd + h * d, co, si, half);
      std::copy_n(kk.data() + i * kvd, kvd, row_of[i] + layer_off);
      std::copy_n(vv.data() + i * kvd, kvd, row_of[i] + layer_off + kvd);
    }
    clock.Mark(ProfilePart::kGlue);
    // Banded layers see the last sliding_window positions, the query's own included.
    const bool banded = c.sliding[li];
    const kernels::GqaSinkShape shape{c.heads, c.kv_heads, c.head_dim, scale, L.sinks.data(), layer_off,
                                      layer_off + kvd};
    double keys_read = 0;
    for (size_t s = 0; s < segments.size(); ++s) {
      const size_t r0 = seg_row0[s], rn = seg_row0[s + 1] - r0;
      const int* first = (banded ? first_banded : first_full).data() + r0;
      kernels::GqaSinkAttention(shape, static_cast<int>(rn), q.data() + r0 * qd, seg_rows[s].data(), first,
                                position.data() + r0, o.data() + r0 * qd, k.isa);
      if (clock.on())
        for (size_t i = r0; i < r0 + rn; ++i) keys_read += position[i] + 1 - first[i - r0];
    }
    clock.Mark(ProfilePart::kAttention, 4.0 * static_cast<double>(qd) * keys_read);
    L.wo.Apply(k, o.data(), n, a.data());
    clock.Mark(ProfilePart::kProjections, 2.0 * static_cast<double>(n) * qd * hd);
    AddBias(a.data(), L.bo.data(), n, hd);
    for (size_t i = 0; i < n * hd; ++i) x[i] += a[i];
    // MoE: top-k of the biased router logits (ties to the lower index, as
    // torch.topk), softmax over the chosen logits only; each expert then takes
    // the rows routed to it.
    norm_rows(L.post_norm);
    clock.Mark(ProfilePart::kGlue);
    L.router.Apply(k, t.data(), n, router.data());
    clock.Mark(ProfilePart::kProjections, 2.0 * static_cast<double>(n) * hd * E);
    AddBias(router.data(), L.router_b.data(), n, E);
    std::vector<std::vector<size_t>> rows_of(E);
    std::vector<std::vector<float>> weight_of(E);
    std::vector<int> idx(E);
    for (size_t i = 0; i < n; ++i) {
      const float* r = router.data() + i * E;
      for (size_t e = 0; e < E; ++e) idx[e] = static_cast<int>(e);
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(K), idx.end(),
                        [&](int l, int rr) { return r[l] > r[rr] || (r[l] == r[rr] && l < rr); });
      const float top = r[idx[0]];
      double wsum = 0;
      std::vector<double> wts(K);
      for (size_t j = 0; j < K; ++j) wsum += (wts[j] = std::exp(static_cast<double>(r[idx[j]]) - top));
      for (size_t j = 0; j < K; ++j) {
        if (expert_tokens && static_cast<size_t>(li) < expert_tokens->size() &&
            static_cast<size_t>(idx[j]) < (*expert_tokens)[li].size())
          ++(*expert_tokens)[li][idx[j]];
        rows_of[idx[j]].push_back(i);
        weight_of[idx[j]].push_back(static_cast<float>(wts[j] / wsum));
      }
    }
    clock.Mark(ProfilePart::kGlue);
    // Per expert: its rows gathered, gate_up (+ bias), the clamped SwiGLU over
    // interleaved gate/up columns, down (+ bias). Experts with up to
    // kSmallBatchMaxRows rows (a decode step) share one parallel pass of the
    // row-tiled products per projection.
    std::vector<std::vector<float>> xin(E), gu(E), act(E), y(E);
    std::vector<kernels::Mxfp4MatVecJob> jobs;
    for (size_t e = 0; e < E; ++e) {
      const size_t ne = rows_of[e].size();
      if (!ne) continue;
      xin[e].resize(ne * hd);
      for (size_t r = 0; r < ne; ++r) std::copy_n(t.data() + rows_of[e][r] * hd, hd, xin[e].data() + r * hd);
      gu[e].resize(ne * 2 * I);
      if (ne <= kernels::kSmallBatchMaxRows)
        jobs.push_back({L.gate_up.matrix(e), xin[e].data(), ne, gu[e].data()});
      else
        k.matmul_mxfp4(L.gate_up.matrix(e), xin[e].data(), ne, gu[e].data());
    }
    if (!jobs.empty()) k.matvec_mxfp4_many(jobs);
    jobs.clear();
    for (size_t e = 0; e < E; ++e) {
      const size_t ne = rows_of[e].size();
      if (!ne) continue;
      AddBias(gu[e].data(), L.gate_up_b.data() + e * 2 * I, ne, 2 * I);
      act[e].resize(ne * I);
      for (size_t r = 0; r < ne; ++r)
        for (size_t i = 0; i < I; ++i) {
          const float g = std::min(gu[e][r * 2 * I + 2 * i], c.swiglu_limit);
          const float u = std::clamp(gu[e][r * 2 * I + 2 * i + 1], -c.swiglu_limit, c.swiglu_limit);
          act[e][r * I + i] = g / (1.0f + std::exp(-c.swiglu_alpha * g)) * (u + 1.0f);
        }
      y[e].resize(ne * hd);
      if (ne <= kernels::kSmallBatchMaxRows)
        jobs.push_back({L.down.matrix(e), act[e].data(), ne, y[e].data()});
      else
        k.matmul_mxfp4(L.down.matrix(e), act[e].data(), ne, y[e].data());
    }
    if (!jobs.empty()) k.matvec_mxfp4_many(jobs);
    clock.Mark(ProfilePart::kExperts, 2.0 * static_cast<double>(n) * K * 3 * hd * I);
    std::fill(moe.begin(), moe.end(), 0.0f);
    for (size_t e = 0; e < E; ++e)
      for (size_t r = 0; r < rows_of[e].size(); ++r) {
        const float wj = weight_of[e][r];
        float* dst = moe.data() + rows_of[e][r] * hd;
        const float* src = y[e].data() + r * hd;
        const float* bias = L.down_b.data() + e * hd;
        for (size_t i = 0; i < hd; ++i) dst[i] += wj * (src[i] + bias[i]);
      }
    for (size_t i = 0; i < n * hd; ++i) x[i] += moe[i];
    clock.Mark(ProfilePart::kGlue);
  }
  PartClock head_clock(trace ? trace->profile : nullptr, kProfileModelRow);
  for (ForwardSegment& seg : segments) seg.cache->length += static_cast<int64_t>(seg.tokens.size());
  // Logits: every row of an all_logits segment, else its last.
  std::vector<size_t> out_rows;
  for (size_t s = 0, r = 0; s < segments.size(); ++s) {
    const size_t len = segments[s].tokens.size();
    for (size_t i = segments[s].all_logits ? 0 : len - 1; i < len; ++i) out_rows.push_back(r + i);
    r += len;
  }
  std::vector<float> normed(out_rows.size() * hd);
  for (size_t i = 0; i < out_rows.size(); ++i)
    k.rms_norm(x.data() + out_rows[i] * hd, w_->norm.data(), c.rms_eps, hd, normed.data() + i * hd);
  logits->resize(out_rows.size() * static_cast<size_t>(c.vocab));
  (c.tie_embeddings ? w_->embed : w_->head).Apply(k, normed.data(), out_rows.size(), logits->data());
  head_clock.Mark(ProfilePart::kProjections, 2.0 * static_cast<double>(out_rows.size()) * hd * c.vocab);
  return Ok();
}

}  // namespace moeserve::engine
