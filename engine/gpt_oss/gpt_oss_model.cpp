// The gpt-oss forward pass on CPU in fp32, one token at a time against the
// sequence's cache: RMSNorm, GQA attention with q/k/v/o biases and per-head
// sinks (banded or full by layer), YaRN RoPE, the biased top-k router with a
// softmax over the chosen logits, MXFP4 experts with biases and the clamped
// SwiGLU over interleaved gate/up rows.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/safetensors.hpp"

namespace moeserve::engine {

struct GptOssModel::Weights {
  struct Layer {
    std::vector<float> in_norm, post_norm;
    std::vector<float> wq, bq, wk, bk, wv, bv, wo, bo, sinks;
    std::vector<float> router_w, router_b;
    std::vector<float> gate_up, gate_up_b;  // [E, 2I, hidden] (row 2i gate, 2i+1 up), [E, 2I]
    std::vector<float> down, down_b;        // [E, hidden, I], [E, hidden]
  };
  std::vector<float> embed, head, norm;
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

// E2M1 values by code: bit 3 the sign, bits 0-2 the magnitude.
constexpr float kFp4[16] = {0.0f, 0.5f, 1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// MXFP4 experts NAME_blocks [E, rows, cols/32, 16] and NAME_scales [E, rows,
// cols/32] (E8M0, bias 127) -> fp32 [E, rows, cols]. Byte j of a block holds
// element 2j in its low nibble and 2j+1 in its high nibble.
Result<std::vector<float>> Mxfp4(const Checkpoint& ck, const std::string& name, int64_t e, int64_t rows, int64_t cols) {
  Error err = Error::Internal("");
  const TensorView* b = FindShaped(ck, name + "_blocks", {e, rows, cols / 32, 16}, &err);
  if (!b) return Fail(err);
  const TensorView* s = FindShaped(ck, name + "_scales", {e, rows, cols / 32}, &err);
  if (!s) return Fail(err);
  if (b->dtype != DType::kU8 || s->dtype != DType::kU8)
    return Fail(Error::InvalidArgument("gpt-oss checkpoint: '" + name + "_blocks' and '_scales' must be U8"));
  std::vector<float> out(static_cast<size_t>(e * rows * cols));
  const size_t groups = static_cast<size_t>(e * rows * (cols / 32));
  for (size_t g = 0; g < groups; ++g)
    if (s->data[g] == 255)
      return Fail(Error::InvalidArgument("gpt-oss checkpoint: '" + name + "_scales' holds 255 (E8M0 NaN) at group " +
                                         std::to_string(g)));
  for (size_t g = 0; g < groups; ++g) {
    const float scale = std::ldexp(1.0f, static_cast<int>(s->data[g]) - 127);
    const uint8_t* blk = b->data + 16 * g;
    float* o = out.data() + 32 * g;
    for (int j = 0; j < 16; ++j) {
      o[2 * j] = kFp4[blk[j] & 0x0F] * scale;
      o[2 * j + 1] = kFp4[blk[j] >> 4] * scale;
    }
  }
  return out;
}

// y[r] = W[r, :] . x + b[r] for W [rows, cols].
void MatVec(const float* w, const float* b, const float* x, int rows, int cols, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* wr = w + static_cast<size_t>(r) * cols;
    double acc = 0;
    for (int c = 0; c < cols; ++c) acc += static_cast<double>(wr[c]) * x[c];
    y[r] = static_cast<float>(acc) + (b ? b[r] : 0.0f);
  }
}

void RmsNorm(const float* x, const float* w, int n, float eps, float* y) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

// Half-split rotation of one head vector at position pos, cos/sin scaled by
// the YaRN concentration.
void Rope(float* v, int d, int pos, const GptOssConfig& c) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const double ang = static_cast<double>(pos) * c.inv_freq[i];
    const float co = static_cast<float>(std::cos(ang) * c.rope_concentration);
    const float si = static_cast<float>(std::sin(ang) * c.rope_concentration);
    const float x1 = v[i], x2 = v[i + half];
    v[i] = x1 * co - x2 * si;
    v[i + half] = x2 * co + x1 * si;
  }
}

}  // namespace

GptOssModel::~GptOssModel() = default;

Result<std::unique_ptr<GptOssModel>> GptOssModel::Load(const std::string& dir) {
  namespace fs = std::filesystem;
  std::ifstream in(fs::path(dir) / "config.json", std::ios::binary);
  if (!in) return Fail(Error::NotFound(dir + "/config.json: cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  std::unique_ptr<GptOssModel> m(new GptOssModel());
  MOE_ASSIGN_OR_RETURN(m->cfg_, ParseGptOssConfig(text.str()));
  const GptOssConfig& c = m->cfg_;
  // Every weight becomes 4 bytes here: refuse up front what the machine cannot hold.
  const double weights = 2.0 * c.vocab * c.hidden +
                         static_cast<double>(c.layers) *
                             (2.0 * c.hidden * (c.heads + c.kv_heads) * c.head_dim +
                              3.0 * static_cast<double>(c.experts) * c.hidden * c.intermediate);
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (ram > 0 && 4.0 * weights > ram)
    return Fail(Error::ResourceExhausted("gpt-oss: the fp32 CPU path needs about " +
                                         std::to_string(static_cast<long long>(4.0 * weights / 1e9)) +
                                         " GB for this config, more than this machine's " +
                                         std::to_string(static_cast<long long>(ram / 1e9)) + " GB of memory"));
  MOE_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::Open(dir));
  const int64_t hd = c.hidden, qd = int64_t{c.heads} * c.head_dim, kvd = int64_t{c.kv_heads} * c.head_dim;
  const int64_t E = c.experts, I = c.intermediate;
  auto w = std::make_unique<Weights>();
  MOE_ASSIGN_OR_RETURN(w->embed, Dense(ck, "model.embed_tokens.weight", {c.vocab, hd}));
  MOE_ASSIGN_OR_RETURN(w->norm, Dense(ck, "model.norm.weight", {hd}));
  if (!c.tie_embeddings) {
    MOE_ASSIGN_OR_RETURN(w->head, Dense(ck, "lm_head.weight", {c.vocab, hd}));
  }
  w->layers.resize(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Weights::Layer& L = w->layers[i];
    MOE_ASSIGN_OR_RETURN(L.in_norm, Dense(ck, p + "input_layernorm.weight", {hd}));
    MOE_ASSIGN_OR_RETURN(L.post_norm, Dense(ck, p + "post_attention_layernorm.weight", {hd}));
    MOE_ASSIGN_OR_RETURN(L.wq, Dense(ck, p + "self_attn.q_proj.weight", {qd, hd}));
    MOE_ASSIGN_OR_RETURN(L.bq, Dense(ck, p + "self_attn.q_proj.bias", {qd}));
    MOE_ASSIGN_OR_RETURN(L.wk, Dense(ck, p + "self_attn.k_proj.weight", {kvd, hd}));
    MOE_ASSIGN_OR_RETURN(L.bk, Dense(ck, p + "self_attn.k_proj.bias", {kvd}));
    MOE_ASSIGN_OR_RETURN(L.wv, Dense(ck, p + "self_attn.v_proj.weight", {kvd, hd}));
    MOE_ASSIGN_OR_RETURN(L.bv, Dense(ck, p + "self_attn.v_proj.bias", {kvd}));
    MOE_ASSIGN_OR_RETURN(L.wo, Dense(ck, p + "self_attn.o_proj.weight", {hd, qd}));
    MOE_ASSIGN_OR_RETURN(L.bo, Dense(ck, p + "self_attn.o_proj.bias", {hd}));
    MOE_ASSIGN_OR_RETURN(L.sinks, Dense(ck, p + "self_attn.sinks", {c.heads}));
    MOE_ASSIGN_OR_RETURN(L.router_w, Dense(ck, p + "mlp.router.weight", {E, hd}));
    MOE_ASSIGN_OR_RETURN(L.router_b, Dense(ck, p + "mlp.router.bias", {E}));
    MOE_ASSIGN_OR_RETURN(L.gate_up, Mxfp4(ck, p + "mlp.experts.gate_up_proj", E, 2 * I, hd));
    MOE_ASSIGN_OR_RETURN(L.gate_up_b, Dense(ck, p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}));
    MOE_ASSIGN_OR_RETURN(L.down, Mxfp4(ck, p + "mlp.experts.down_proj", E, hd, I));
    MOE_ASSIGN_OR_RETURN(L.down_b, Dense(ck, p + "mlp.experts.down_proj_bias", {E, hd}));
  }
  m->w_ = std::move(w);
  return m;
}

GptOssModel::State GptOssModel::NewState() const {
  State s;
  s.k.resize(cfg_.layers);
  s.v.resize(cfg_.layers);
  s.dropped.assign(cfg_.layers, 0);
  return s;
}

Status GptOssModel::Forward(State& st, std::span<const int> tokens, bool all_logits, std::vector<float>* logits) const {
  const GptOssConfig& c = cfg_;
  for (int t : tokens)
    if (t < 0 || t >= c.vocab)
      return Fail(Error::OutOfRange("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                               std::to_string(c.vocab) + ")"));
  if (static_cast<int>(st.k.size()) != c.layers || static_cast<int>(st.dropped.size()) != c.layers)
    return Fail(Error::InvalidArgument("state does not belong to this model"));
  logits->clear();
  const int hd = c.hidden, d = c.head_dim, H = c.heads, KV = c.kv_heads, rep = H / KV, I = c.intermediate;
  const int kvd = KV * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> x(hd), t(hd), q(H * d), k(kvd), v(kvd), o(H * d), a(hd), scores, router(c.experts);
  std::vector<float> gu(2 * I), act(I), y(hd), moe(hd);
  for (size_t ti = 0; ti < tokens.size(); ++ti) {
    const int pos = st.length;
    std::copy_n(w_->embed.data() + static_cast<size_t>(tokens[ti]) * hd, hd, x.data());
    for (int li = 0; li < c.layers; ++li) {
      const Weights::Layer& L = w_->layers[li];
      RmsNorm(x.data(), L.in_norm.data(), hd, c.rms_eps, t.data());
      MatVec(L.wq.data(), L.bq.data(), t.data(), H * d, hd, q.data());
      MatVec(L.wk.data(), L.bk.data(), t.data(), kvd, hd, k.data());
      MatVec(L.wv.data(), L.bv.data(), t.data(), kvd, hd, v.data());
      for (int h = 0; h < H; ++h) Rope(q.data() + h * d, d, pos, c);
      for (int h = 0; h < KV; ++h) Rope(k.data() + h * d, d, pos, c);
      std::vector<float>& K = st.k[li];
      std::vector<float>& V = st.v[li];
      // Banded layers see the last sliding_window positions, this one
      // included; positions before that are dropped once twice the window is
      // held (one erase per window of tokens, not one per token).
      const int first = c.sliding[li] ? std::max(0, pos - c.sliding_window + 1) : 0;
      int& dropped = st.dropped[li];
      if (c.sliding[li] && first - dropped >= c.sliding_window) {
        K.erase(K.begin(), K.begin() + static_cast<std::ptrdiff_t>(first - dropped) * kvd);
        V.erase(V.begin(), V.begin() + static_cast<std::ptrdiff_t>(first - dropped) * kvd);
        dropped = first;
      }
      K.insert(K.end(), k.begin(), k.end());
      V.insert(V.end(), v.begin(), v.end());
      scores.resize(pos + 1 - first);
      for (int h = 0; h < H; ++h) {
        const float* qh = q.data() + h * d;
        const int kh = h / rep;
        float mx = L.sinks[h];
        for (int j = first; j <= pos; ++j) {
          const float* kj = K.data() + static_cast<size_t>(j - dropped) * kvd + kh * d;
          float s = 0;
          for (int e = 0; e < d; ++e) s += qh[e] * kj[e];
          scores[j - first] = s * scale;
          mx = std::max(mx, scores[j - first]);
        }
        // The sink is one more logit in the denominator, with no value.
        double denom = std::exp(static_cast<double>(L.sinks[h]) - mx);
        for (float& s : scores) denom += (s = static_cast<float>(std::exp(static_cast<double>(s) - mx)));
        float* oh = o.data() + h * d;
        std::fill_n(oh, d, 0.0f);
        for (int j = first; j <= pos; ++j) {
          const float p = static_cast<float>(scores[j - first] / denom);
          const float* vj = V.data() + static_cast<size_t>(j - dropped) * kvd + kh * d;
          for (int e = 0; e < d; ++e) oh[e] += p * vj[e];
        }
      }
      MatVec(L.wo.data(), L.bo.data(), o.data(), hd, H * d, a.data());
      for (int i = 0; i < hd; ++i) x[i] += a[i];

      // MoE: top-k of the biased router logits (ties to the lower index, as
      // torch.topk), softmax over the chosen logits only.
      RmsNorm(x.data(), L.post_norm.data(), hd, c.rms_eps, t.data());
      MatVec(L.router_w.data(), L.router_b.data(), t.data(), c.experts, hd, router.data());
      std::vector<int> idx(c.experts);
      for (int e = 0; e < c.experts; ++e) idx[e] = e;
      std::partial_sort(idx.begin(), idx.begin() + c.experts_per_token, idx.end(),
                        [&](int l, int r) { return router[l] > router[r] || (router[l] == router[r] && l < r); });
      const float top = router[idx[0]];
      double wsum = 0;
      std::vector<double> wts(c.experts_per_token);
      for (int j = 0; j < c.experts_per_token; ++j) wsum += (wts[j] = std::exp(static_cast<double>(router[idx[j]]) - top));
      std::fill(moe.begin(), moe.end(), 0.0f);
      for (int j = 0; j < c.experts_per_token; ++j) {
        const size_t e = static_cast<size_t>(idx[j]);
        MatVec(L.gate_up.data() + e * 2 * I * hd, L.gate_up_b.data() + e * 2 * I, t.data(), 2 * I, hd, gu.data());
        for (int i = 0; i < I; ++i) {
          const float g = std::min(gu[2 * i], c.swiglu_limit);
          const float u = std::clamp(gu[2 * i + 1], -c.swiglu_limit, c.swiglu_limit);
          act[i] = g / (1.0f + std::exp(-c.swiglu_alpha * g)) * (u + 1.0f);
        }
        MatVec(L.down.data() + e * hd * I, L.down_b.data() + e * hd, act.data(), hd, I, y.data());
        const float wj = static_cast<float>(wts[j] / wsum);
        for (int i = 0; i < hd; ++i) moe[i] += wj * y[i];
      }
      for (int i = 0; i < hd; ++i) x[i] += moe[i];
    }
    st.length = pos + 1;
    if (all_logits || ti + 1 == tokens.size()) {
      RmsNorm(x.data(), w_->norm.data(), hd, c.rms_eps, t.data());
      const std::vector<float>& head = c.tie_embeddings ? w_->embed : w_->head;
      const size_t at = logits->size();
      logits->resize(at + c.vocab);
      MatVec(head.data(), nullptr, t.data(), c.vocab, hd, logits->data() + at);
    }
  }
  return Ok();
}

}  // namespace moeserve::engine
