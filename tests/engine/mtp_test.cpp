// Multi-token prediction (model.md 15): the MTP module's logits against an
// fp32 reference written here in plain loops, ProposeDrafts' greedy chain
// against the reference's, rollback, chunked prefill and a prefix shared
// from another sequence, and the load errors of a malformed module.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "moeserve/engine/dtype.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tokenizer.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using testing_util::TempPath;

// The tiny preset with an MTP module; RoPE without YaRN so that the
// reference's rotary is the plain one (the module shares the trunk's
// frequencies, which the trunk's own tests cover with YaRN).
ModelConfig MtpConfig() {
  ModelConfig c = *PresetConfig("tiny");
  c.rope.yarn = false;
  c.num_nextn_predict_layers = 1;
  return c;
}

const std::string& MtpModel() {
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = TempPath("mtp_tiny");
  std::filesystem::remove_all(dir);
  ModelGenOptions o;
  o.config = MtpConfig();
  o.seed = 7;
  auto st = GenerateModel(o, dir);
  if (!st) ADD_FAILURE() << st.error().ToString();
  return dir;
}

std::unique_ptr<Model> LoadMtp(const std::string& dir, ModelOptions options) {
  auto md = OpenModelDir(dir);
  EXPECT_TRUE(md.has_value()) << md.error().ToString();
  options.mtp = true;
  auto m = Model::Load(*md, options);
  EXPECT_TRUE(m.has_value()) << m.error().ToString();
  return m.has_value() ? std::move(*m) : nullptr;
}

ModelOptions Deterministic() {
  ModelOptions o;
  o.deterministic = true;
  return o;
}

// ---- The reference: fp32, plain loops, from the checkpoint's tensors ----

class Reference {
 public:
  explicit Reference(const std::string& dir) {
    auto md = OpenModelDir(dir);
    EXPECT_TRUE(md.has_value());
    c_ = md->config;
    for (const TensorView* t : md->checkpoint.AllTensors()) {
      if (t->name.rfind("layers.", 0) == 0) continue;  // the trunk is not needed
      std::vector<float> v(static_cast<size_t>(t->numel()));
      for (size_t i = 0; i < v.size(); ++i) {
        if (t->dtype == DType::kF32) {
          std::memcpy(&v[i], t->data + 4 * i, 4);
        } else {
          uint16_t b;
          std::memcpy(&b, t->data + 2 * i, 2);
          v[i] = Bf16ToF32(b);
        }
      }
      w_[t->name] = std::move(v);
    }
  }

  // MTP at position i = keys_.size(): input hidden h_i and the token after
  // it. Appends the module's key/value row for i and returns its logits;
  // *out gets the block's output hidden (the next position's input).
  std::vector<float> Step(const std::vector<float>& h, int token, std::vector<float>* out) {
    const int D = c_.hidden_size;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    std::vector<float> cat = Rms(Row("embed.weight", token, D), W("mtp.0.enorm.weight"), eps);
    const std::vector<float> hn = Rms(h, W("mtp.0.hnorm.weight"), eps);
    cat.insert(cat.end(), hn.begin(), hn.end());
    std::vector<float> x = MatVec("mtp.0.eh_proj.weight", cat);
    const std::vector<float> a = Attention(Rms(x, W("mtp.0.attn_norm.weight"), eps));
    for (int j = 0; j < D; ++j) x[j] += a[j];
    const std::vector<float> f = Ffn(Rms(x, W("mtp.0.ffn_norm.weight"), eps));
    for (int j = 0; j < D; ++j) x[j] += f[j];
    *out = x;
    return MatVec("head.weight", Rms(x, W("mtp.0.norm.weight"), eps));
  }

  const ModelConfig& config() const { return c_; }

 private:
  const std::vector<float>& W(const std::string& name) const {
    auto it = w_.find(name);
    EXPECT_NE(it, w_.end()) << name;
    return it->second;
  }
  std::vector<float> Row(const std::string& name, int r, int cols) const {
    const std::vector<float>& m = W(name);
    return {m.begin() + static_cast<ptrdiff_t>(r) * cols, m.begin() + static_cast<ptrdiff_t>(r + 1) * cols};
  }
  static std::vector<float> Rms(const std::vector<float>& x, const std::vector<float>& w, float eps) {
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps));
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
    return y;
  }
  std::vector<float> MatVec(const std::string& name, const std::vector<float>& x) const {
    const std::vector<float>& m = W(name);
    const size_t cols = x.size(), rows = m.size() / cols;
    EXPECT_EQ(rows * cols, m.size()) << name;
    std::vector<float> y(rows);
    for (size_t r = 0; r < rows; ++r) {
      double s = 0;
      for (size_t k = 0; k < cols; ++k) s += static_cast<double>(m[r * cols + k]) * x[k];
      y[r] = static_cast<float>(s);
    }
    return y;
  }
  // Interleaved pairs, theta^(-2j/d) (no YaRN: see MtpConfig).
  void Rope(float* v, int64_t pos) const {
    const int d = c_.mla.qk_rope_head_dim;
    for (int j = 0; j < d / 2; ++j) {
      const double angle = static_cast<double>(pos) / std::pow(c_.rope.theta, 2.0 * j / d);
      const double a = v[2 * j], b = v[2 * j + 1];
      v[2 * j] = static_cast<float>(a * std::cos(angle) - b * std::sin(angle));
      v[2 * j + 1] = static_cast<float>(a * std::sin(angle) + b * std::cos(angle));
    }
  }
  // Gated MLA (model.md 5.1) in its expanded form over the module's own rows.
  std::vector<float> Attention(const std::vector<float>& x) {
    const MlaConfig& m = c_.mla;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    const int H = m.num_heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, vd = m.v_head_dim;
    const int kvl = m.kv_lora_rank, qk = nope + rope;
    const int64_t pos = static_cast<int64_t>(keys_.size());
    const std::vector<float> qr = Rms(MatVec("mtp.0.attn.wq_a.weight", x), W("mtp.0.attn.q_norm.weight"), eps);
    std::vector<float> q = MatVec("mtp.0.attn.wq_b.weight", qr);
    for (int h = 0; h < H; ++h) Rope(&q[static_cast<size_t>(h) * qk + nope], pos);
    const std::vector<float> kv = MatVec("mtp.0.attn.wkv_a.weight", x);
    std::vector<float> lat(kv.begin(), kv.begin() + kvl);
    lat = Rms(lat, W("mtp.0.attn.kv_norm.weight"), eps);
    std::vector<float> pe(kv.begin() + kvl, kv.end());
    Rope(pe.data(), pos);
    // The cached key row: per head its nope keys and values from wkv_b.
    const std::vector<float>& wb = W("mtp.0.attn.wkv_b.weight");
    std::vector<float> k(static_cast<size_t>(H) * nope), v(static_cast<size_t>(H) * vd);
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < nope + vd; ++i) {
        double s = 0;
        for (int l = 0; l < kvl; ++l) s += static_cast<double>(wb[(static_cast<size_t>(h) * (nope + vd) + i) * kvl + l]) * lat[l];
        if (i < nope) k[static_cast<size_t>(h) * nope + i] = static_cast<float>(s);
        else v[static_cast<size_t>(h) * vd + (i - nope)] = static_cast<float>(s);
      }
    }
    keys_.push_back({k, pe, v});
    const double scale = 1.0 / std::sqrt(static_cast<double>(qk));
    std::vector<float> o(static_cast<size_t>(H) * vd, 0.0f);
    for (int h = 0; h < H; ++h) {
      std::vector<double> p(keys_.size());
      double mx = -1e300;
      for (size_t s = 0; s < keys_.size(); ++s) {
        double d = 0;
        for (int i = 0; i < nope; ++i) d += static_cast<double>(q[static_cast<size_t>(h) * qk + i]) * keys_[s].k[static_cast<size_t>(h) * nope + i];
        for (int i = 0; i < rope; ++i) d += static_cast<double>(q[static_cast<size_t>(h) * qk + nope + i]) * keys_[s].pe[i];
        p[s] = d * scale;
        mx = std::max(mx, p[s]);
      }
      double z = 0;
      for (double& e : p) z += (e = std::exp(e - mx));
      for (size_t s = 0; s < keys_.size(); ++s)
        for (int j = 0; j < vd; ++j) o[static_cast<size_t>(h) * vd + j] += static_cast<float>(p[s] / z) * keys_[s].v[static_cast<size_t>(h) * vd + j];
    }
    if (m.output_gate) {
      const std::vector<float> g = MatVec("mtp.0.attn.wg.weight", x);
      for (size_t i = 0; i < o.size(); ++i) o[i] *= static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(g[i]))));
    }
    return MatVec("mtp.0.attn.wo.weight", o);
  }
  std::vector<float> Ffn(const std::vector<float>& x) const {
    std::vector<float> a = MatVec("mtp.0.ffn.w1.weight", x);
    const std::vector<float> b = MatVec("mtp.0.ffn.w3.weight", x);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(a[i] / (1.0 + std::exp(-static_cast<double>(a[i])))) * b[i];
    return MatVec("mtp.0.ffn.w2.weight", a);
  }

  struct KeyRow {
    std::vector<float> k, pe, v;
  };
  ModelConfig c_;
  std::map<std::string, std::vector<float>> w_;
  std::vector<KeyRow> keys_;
};

int Argmax(const float* l, int n) {
  int best = 0;
  for (int v = 1; v < n; ++v)
    if (l[v] > l[best]) best = v;
  return best;
}

std::vector<int> Prompt(int n, int salt) {
  std::vector<int> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + (i * 37 + salt * 11 + i * i) % 250);
  return p;
}

// Prefills `tokens` into a new sequence in chunks of the given sizes.
SequenceCache Prefill(const Model& m, KvPool& pool, const std::vector<int>& tokens, const std::vector<int>& chunks,
                      std::vector<float>* last_logits = nullptr) {
  SequenceCache c = m.NewSequence();
  size_t at = 0;
  for (int n : chunks) {
    EXPECT_TRUE(EnsureBlocks(pool, c, static_cast<int64_t>(at) + n).has_value());
    std::vector<ForwardSegment> seg{{&c, std::span<const int>(tokens.data() + at, static_cast<size_t>(n)), false}};
    std::vector<float> logits;
    auto st = m.Forward(pool, seg, &logits);
    EXPECT_TRUE(st.has_value()) << st.error().ToString();
    if (last_logits) *last_logits = logits;
    at += static_cast<size_t>(n);
  }
  EXPECT_EQ(at, tokens.size());
  return c;
}

std::vector<int> Drafts(const Model& m, KvPool& pool, SequenceCache& c, int next, int k, int sampled_ids = 0) {
  EXPECT_TRUE(EnsureBlocks(pool, c, c.length + k + 1).has_value());
  std::vector<int> out;
  DraftSlot slot{&c, next, k, &out};
  slot.sampled_ids = sampled_ids;
  auto st = m.ProposeDrafts(pool, std::span<DraftSlot>(&slot, 1));
  EXPECT_TRUE(st.has_value()) << st.error().ToString();
  return out;
}

// The module's logits at the sequence's last position with `next` after it.
std::vector<float> MtpLogitsAtEnd(const Model& m, KvPool& pool, SequenceCache& c, int next) {
  const int D = m.config().hidden_size;
  const int64_t last = c.length - 1;
  EXPECT_GE(last, c.mtp_hidden_pos0);
  EXPECT_LT(last, c.mtp_hidden_pos0 + static_cast<int64_t>(c.mtp_hidden.size() / D));
  Model::MtpInput in{&c, &c.mtp_hidden[static_cast<size_t>(last - c.mtp_hidden_pos0) * D], next, last};
  std::vector<float> logits;
  auto st = m.MtpStep(pool, std::span<const Model::MtpInput>(&in, 1), &logits, nullptr);
  EXPECT_TRUE(st.has_value()) << st.error().ToString();
  return logits;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

TEST(Mtp, ConfigAndLayout) {
  const std::string& dir = MtpModel();
  auto md = OpenModelDir(dir);
  ASSERT_TRUE(md.has_value()) << md.error().ToString();
  EXPECT_EQ(md->config.num_nextn_predict_layers, 1);
  EXPECT_TRUE(md->warnings.empty()) << md->warnings.front();
  ModelOptions on, off;
  on.mtp = true;
  auto with = Model::Load(*md, on);
  auto without = Model::Load(*md, off);
  ASSERT_TRUE(with.has_value() && without.has_value());
  EXPECT_EQ((*with)->draft_depth(), Model::kMaxDraftChain);
  EXPECT_EQ((*without)->draft_depth(), 0);
  // One more MLA slot per token: c and k_pe of the module's attention.
  const MlaConfig& mla = md->config.mla;
  EXPECT_EQ((*with)->cache_floats_per_token(),
            (*without)->cache_floats_per_token() + static_cast<size_t>(mla.kv_lora_rank + mla.qk_rope_head_dim));
  EXPECT_GT((*with)->resident_weight_bytes(), (*without)->resident_weight_bytes());

  // The config round-trips and bounds the field.
  auto again = ParseModelConfig(md->config.ToJson());
  ASSERT_TRUE(again.has_value()) << again.error().ToString();
  EXPECT_EQ(again->num_nextn_predict_layers, 1);
  std::string text = md->config.ToJson();
  const std::string field = "\"num_nextn_predict_layers\": 1";
  ASSERT_NE(text.find(field), std::string::npos);
  text.replace(text.find(field), field.size(), "\"num_nextn_predict_layers\": 2");
  auto two = ParseModelConfig(text);
  ASSERT_FALSE(two.has_value());
  EXPECT_NE(two.error().message().find("num_nextn_predict_layers"), std::string::npos) << two.error().ToString();
}

TEST(Mtp, NoModuleInCheckpointMeansNoDrafts) {
  // The plain tiny model (no num_nextn_predict_layers) and a config that
  // names a module the checkpoint lacks: both load, without drafts.
  for (bool config_names_it : {false, true}) {
    std::string dir = testing_util::TinyModel(1);
    if (config_names_it) {
      dir = TempPath("mtp_named_absent");
      std::filesystem::remove_all(dir);
      std::filesystem::copy(testing_util::TinyModel(1), dir, std::filesystem::copy_options::recursive);
      ModelConfig c = *PresetConfig("tiny");
      c.num_nextn_predict_layers = 1;
      std::ofstream(dir + "/config.json") << c.ToJson();
    }
    auto md = OpenModelDir(dir);
    ASSERT_TRUE(md.has_value()) << md.error().ToString();
    ModelOptions o;
    o.mtp = true;
    auto m = Model::Load(*md, o);
    ASSERT_TRUE(m.has_value()) << m.error().ToString();
    EXPECT_EQ((*m)->draft_depth(), 0);
    KvPool pool(8, 16, (*m)->cache_floats_per_token());
    SequenceCache c = (*m)->NewSequence();
    std::vector<int> out;
    DraftSlot slot{&c, 5, 2, &out};
    EXPECT_FALSE((*m)->ProposeDrafts(pool, std::span<DraftSlot>(&slot, 1)).has_value());
  }
}

// The module's logits after a prefill against the reference, for the fast
// kernels, the reference kernels and deterministic mode; then the draft
// chain against the reference's greedy chain.
TEST(Mtp, MatchesReference) {
  const std::string& dir = MtpModel();
  const std::vector<int> prompt = Prompt(12, 1);
  const int next = 77;
  ModelOptions fast, reference, deterministic = Deterministic();
  reference.kernels = KernelChoice::kReference;
  for (const ModelOptions& options : {fast, reference, deterministic}) {
    auto m = LoadMtp(dir, options);
    ASSERT_TRUE(m);
    const int D = m->config().hidden_size, V = m->vocab_size();
    KvPool pool(8, 16, m->cache_floats_per_token());
    // Prefilled in two chunks of 6 (each kept whole: at most 8 rows are),
    // the trunk's rows of every position collected.
    std::vector<float> trunk_logits, hidden;
    SequenceCache c = m->NewSequence();
    for (int at = 0; at < 12; at += 6) {
      ASSERT_TRUE(EnsureBlocks(pool, c, at + 6).has_value());
      std::vector<ForwardSegment> seg{{&c, std::span<const int>(prompt.data() + at, 6), false}};
      ASSERT_TRUE(m->Forward(pool, seg, &trunk_logits).has_value());
      ASSERT_EQ(c.mtp_hidden.size(), 6u * static_cast<size_t>(D));
      ASSERT_EQ(c.mtp_hidden_pos0, at);
      hidden.insert(hidden.end(), c.mtp_hidden.begin(), c.mtp_hidden.end());
    }
    // The kept rows are the trunk's hidden before the final norm: the head
    // of RMSNorm(last row; norm) gives the Forward's logits.
    {
      auto md = OpenModelDir(dir);
      const TensorView* norm = md->checkpoint.Find("norm.weight");
      const TensorView* head = md->checkpoint.Find("head.weight");
      ASSERT_TRUE(norm && head);
      const float* h = &hidden[static_cast<size_t>(11) * D];
      double ss = 0;
      for (int j = 0; j < D; ++j) ss += static_cast<double>(h[j]) * h[j];
      const double inv = 1.0 / std::sqrt(ss / D + m->config().rms_norm_eps);
      std::vector<float> logits(static_cast<size_t>(V));
      for (int v = 0; v < V; ++v) {
        double s = 0;
        for (int j = 0; j < D; ++j) {
          float nw;
          uint16_t hb;
          std::memcpy(&nw, norm->data + 4 * j, 4);
          std::memcpy(&hb, head->data + 2 * (static_cast<size_t>(v) * D + j), 2);
          s += static_cast<double>(h[j]) * inv * nw * Bf16ToF32(hb);
        }
        logits[static_cast<size_t>(v)] = static_cast<float>(s);
      }
      EXPECT_LT(MaxDiff(logits, trunk_logits), 1e-3 * std::max(1.0, MaxAbs(logits)));
    }

    // The reference over every position: h_i and t_{i+1}, the last with `next`.
    Reference ref(dir);
    std::vector<float> ref_logits, out;
    for (size_t i = 0; i < prompt.size(); ++i) {
      const std::vector<float> h(hidden.begin() + static_cast<ptrdiff_t>(i * D),
                                 hidden.begin() + static_cast<ptrdiff_t>((i + 1) * D));
      ref_logits = ref.Step(h, i + 1 < prompt.size() ? prompt[i + 1] : next, &out);
    }
    EXPECT_TRUE(EnsureBlocks(pool, c, c.length + 4).has_value());
    const std::vector<float> got = MtpLogitsAtEnd(*m, pool, c, next);
    const double scale = std::max(1.0, MaxAbs(ref_logits));
    EXPECT_LT(MaxDiff(got, ref_logits), 2e-3 * scale) << "max |logit| " << scale;
    std::printf("MTP logits vs the fp32 reference: max |diff| %.3g of max |logit| %.3g\n", MaxDiff(got, ref_logits), scale);

    // The greedy chain: the reference's own argmax fed back with its output hidden.
    std::vector<int> want;
    std::vector<float> step_logits = ref_logits;
    for (int k = 0; k < 3; ++k) {
      const int d = Argmax(step_logits.data(), V);
      want.push_back(d);
      if (k < 2) {
        std::vector<float> h = out;
        step_logits = ref.Step(h, d, &out);
      }
    }
    EXPECT_EQ(Drafts(*m, pool, c, next, 3), want);
    // Never beyond the sampled ids: with the limit below the reference's
    // first choice, the first draft token is the argmax under it.
    const int limit = std::max(1, want[0]);
    const std::vector<int> limited = Drafts(*m, pool, c, next, 1, limit);
    ASSERT_EQ(limited.size(), 1u);
    EXPECT_LT(limited[0], limit);
    EXPECT_EQ(limited[0], Argmax(ref_logits.data(), limit));
    ReleaseBlocks(pool, c);
  }
}

// A verified draft cut short: the cache shrinks; the next proposal matches
// a fresh sequence fed the accepted tokens (deterministic mode: bit for bit).
TEST(Mtp, RollbackMatchesFreshSequence) {
  auto m = LoadMtp(MtpModel(), Deterministic());
  ASSERT_TRUE(m);
  KvPool pool(32, 16, m->cache_floats_per_token());
  const std::vector<int> prompt = Prompt(21, 2);
  const std::vector<int> verify = {40, 41, 42, 43, 44};  // the sampled token and four drafts
  SequenceCache a = Prefill(*m, pool, prompt, {21});
  ASSERT_TRUE(EnsureBlocks(pool, a, a.length + 5).has_value());
  std::vector<ForwardSegment> seg{{&a, verify, true}};
  std::vector<float> logits;
  ASSERT_TRUE(m->Forward(pool, seg, &logits).has_value());
  a.length -= 3;  // 40 and 41 accepted
  const int next = 90;
  const std::vector<float> la = MtpLogitsAtEnd(*m, pool, a, next);
  const std::vector<int> da = Drafts(*m, pool, a, next, 4);

  std::vector<int> fed = prompt;
  fed.insert(fed.end(), verify.begin(), verify.begin() + 2);
  SequenceCache b = Prefill(*m, pool, fed, {23});
  const std::vector<float> lb = MtpLogitsAtEnd(*m, pool, b, next);
  const std::vector<int> db = Drafts(*m, pool, b, next, 4);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(da, db);
  EXPECT_EQ(da.size(), 4u);

  // A rollback past the kept rows gets no draft (and no error).
  SequenceCache far = Prefill(*m, pool, Prompt(40, 3), {40});
  far.length = 10;
  EXPECT_TRUE(Drafts(*m, pool, far, next, 2).empty());
  for (SequenceCache* c : {&a, &b, &far}) ReleaseBlocks(pool, *c);
}

// Chunked prefill writes the same MTP rows as one chunk: the same logits and
// drafts (deterministic: bit for bit; the fast kernels: within float noise).
TEST(Mtp, ChunkedPrefillMatchesOneChunk) {
  const std::vector<int> prompt = Prompt(40, 4);
  const int next = 123;
  for (bool deterministic : {true, false}) {
    auto m = LoadMtp(MtpModel(), deterministic ? Deterministic() : ModelOptions{});
    ASSERT_TRUE(m);
    KvPool pool(32, 16, m->cache_floats_per_token());
    SequenceCache one = Prefill(*m, pool, prompt, {40});
    SequenceCache chunks = Prefill(*m, pool, prompt, {13, 1, 12, 14});
    ASSERT_TRUE(EnsureBlocks(pool, one, 45).has_value() && EnsureBlocks(pool, chunks, 45).has_value());
    const std::vector<float> l1 = MtpLogitsAtEnd(*m, pool, one, next);
    const std::vector<float> l2 = MtpLogitsAtEnd(*m, pool, chunks, next);
    if (deterministic) {
      EXPECT_EQ(l1, l2);
      EXPECT_EQ(Drafts(*m, pool, one, next, 3), Drafts(*m, pool, chunks, next, 3));
    } else {
      EXPECT_LT(MaxDiff(l1, l2), 1e-3 * std::max(1.0, MaxAbs(l1)));
    }
    // Every MTP cache row but the last position's (written by the step
    // above in both) was written by the prefills: the same rows.
    // The MTP block's latent part is the last of a token's floats.
    const size_t part = static_cast<size_t>(m->config().mla.kv_lora_rank + m->config().mla.qk_rope_head_dim);
    const size_t off = m->cache_floats_per_token() - part;
    double worst = 0;
    for (int64_t p = 0; p < 39; ++p) {
      const float* r1 = pool.PartRow(one.blocks[static_cast<size_t>(p / 16)], static_cast<int>(p % 16), off, part);
      const float* r2 = pool.PartRow(chunks.blocks[static_cast<size_t>(p / 16)], static_cast<int>(p % 16), off, part);
      for (size_t j = 0; j < part; ++j) worst = std::max(worst, static_cast<double>(std::fabs(r1[j] - r2[j])));
    }
    if (deterministic) EXPECT_EQ(worst, 0.0);
    else EXPECT_LT(worst, 1e-3);
    ReleaseBlocks(pool, one);
    ReleaseBlocks(pool, chunks);
  }
}

// A sequence that starts from another's full blocks (as a prefix-cache hit
// does: the blocks, the recurrent state, no kept hidden rows) skips the MTP
// row before its first segment; the row its donor wrote there serves it, and
// its drafts match a sequence fed everything.
TEST(Mtp, SharedPrefixBlocks) {
  auto m = LoadMtp(MtpModel(), Deterministic());
  ASSERT_TRUE(m);
  KvPool pool(32, 16, m->cache_floats_per_token());
  const std::vector<int> prompt = Prompt(32, 5);
  const std::vector<int> more = {60, 61, 62};
  const int next = 63;
  SequenceCache donor = Prefill(*m, pool, prompt, {32});
  SequenceCache hit = m->NewSequence();
  hit.delta = donor.delta;  // the snapshot at 32 tokens
  for (int b : {donor.blocks[0], donor.blocks[1]}) {
    pool.Ref(b);
    hit.blocks.push_back(b);
  }
  hit.length = 32;
  // The donor goes on with the same tokens (writing the MTP row at 31).
  ASSERT_TRUE(EnsureBlocks(pool, donor, 35).has_value());
  std::vector<ForwardSegment> seg{{&donor, more, false}};
  ASSERT_TRUE(m->Forward(pool, seg, nullptr).has_value());
  ASSERT_TRUE(EnsureBlocks(pool, hit, 35).has_value());
  seg = {{&hit, more, false}};
  ASSERT_TRUE(m->Forward(pool, seg, nullptr).has_value());

  std::vector<int> all = prompt;
  all.insert(all.end(), more.begin(), more.end());
  SequenceCache fresh = Prefill(*m, pool, all, {35});
  ASSERT_TRUE(EnsureBlocks(pool, hit, 40).has_value() && EnsureBlocks(pool, fresh, 40).has_value());
  EXPECT_EQ(MtpLogitsAtEnd(*m, pool, hit, next), MtpLogitsAtEnd(*m, pool, fresh, next));
  EXPECT_EQ(Drafts(*m, pool, hit, next, 3), Drafts(*m, pool, fresh, next, 3));
  for (SequenceCache* c : {&donor, &hit, &fresh}) ReleaseBlocks(pool, *c);
}

// Batched slots: each slot's draft is the one it gets alone.
TEST(Mtp, BatchedSlotsMatchSingle) {
  auto m = LoadMtp(MtpModel(), Deterministic());
  ASSERT_TRUE(m);
  KvPool pool(32, 16, m->cache_floats_per_token());
  SequenceCache a = Prefill(*m, pool, Prompt(9, 6), {9});
  SequenceCache b = Prefill(*m, pool, Prompt(17, 7), {17});
  const std::vector<int> alone_a = Drafts(*m, pool, a, 11, 3);
  const std::vector<int> alone_b = Drafts(*m, pool, b, 12, 2);
  std::vector<int> out_a, out_b;
  std::vector<DraftSlot> slots{{&a, 11, 3, &out_a}, {&b, 12, 2, &out_b}};
  ASSERT_TRUE(m->ProposeDrafts(pool, slots).has_value());
  EXPECT_EQ(out_a, alone_a);
  EXPECT_EQ(out_b, alone_b);
  EXPECT_EQ(out_a.size(), 3u);
  EXPECT_EQ(out_b.size(), 2u);
  ReleaseBlocks(pool, a);
  ReleaseBlocks(pool, b);
}

// Rewrites the MTP model's checkpoint with one tensor changed (or dropped).
std::string Altered(const std::string& tag, const std::string& name, bool drop) {
  const std::string& src = MtpModel();
  const std::string dir = TempPath("mtp_" + tag);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/config.json", dir + "/config.json");
  std::filesystem::copy_file(src + "/tokenizer.json", dir + "/tokenizer.json");
  auto ck = Checkpoint::Open(src);
  EXPECT_TRUE(ck.has_value());
  SafetensorsWriter w;
  for (const TensorView* t : ck->AllTensors()) {
    if (t->name == name && drop) continue;
    if (t->name == name) {
      // [D, D] instead of [D, 2D]: half the input.
      std::vector<int64_t> shape = {t->shape[0], t->shape[1] / 2};
      EXPECT_TRUE(w.Add(t->name, t->dtype, shape, std::vector<uint8_t>(t->data, t->data + t->nbytes / 2)).has_value());
      continue;
    }
    EXPECT_TRUE(w.Add(t->name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)).has_value());
  }
  EXPECT_TRUE(w.WriteFile(dir + "/model.safetensors").has_value());
  return dir;
}

TEST(Mtp, MalformedModuleRefusedByName) {
  auto bad = OpenModelDir(Altered("bad_eh", "mtp.0.eh_proj.weight", false));
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("mtp.0.eh_proj.weight"), std::string::npos) << bad.error().ToString();
  EXPECT_NE(bad.error().message().find("[256, 512]"), std::string::npos) << bad.error().ToString();

  auto part = OpenModelDir(Altered("no_norm", "mtp.0.norm.weight", true));
  ASSERT_FALSE(part.has_value());
  EXPECT_NE(part.error().message().find("mtp.0.norm.weight"), std::string::npos) << part.error().ToString();

  // Past the directory check (a ModelDir built by hand, as a family's
  // mapping may be): the loader refuses the tensor by name too.
  const std::string dir = Altered("bad_eh_loader", "mtp.0.eh_proj.weight", false);
  auto ck = Checkpoint::Open(dir);
  ASSERT_TRUE(ck.has_value());
  ModelDir md{dir, MtpConfig(), std::move(*ck), Tokenizer::Builtin(MtpConfig().vocab_size), {}};
  ModelOptions o;
  o.mtp = true;
  auto m = Model::Load(md, o);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message().find("mtp.0.eh_proj.weight"), std::string::npos) << m.error().ToString();
  // Without MTP asked for, the module is not read.
  auto plain = Model::Load(md, ModelOptions{});
  EXPECT_TRUE(plain.has_value()) << plain.error().ToString();
}

}  // namespace
}  // namespace moeserve::engine
