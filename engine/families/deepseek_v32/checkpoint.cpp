// DeepSeek-V3.2's published checkpoint (Hugging Face names, FP8 e4m3 linear
// weights with 128x128 weight_scale_inv blocks) converted into the engine's
// tensor names and dtypes (model.md 1.1 and 1.2), in memory.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "moeserve/engine/families/deepseek_v32.hpp"
#include "moeserve/engine/tensor_layout.hpp"

namespace moeserve::engine::deepseek_v32 {
namespace {

constexpr int64_t kBlock = 128;

// e4m3fn code -> value; NaN for 0x7f / 0xff.
float DecodeE4m3(uint8_t code) {
  const int e = (code >> 3) & 0xF, m = code & 0x7;
  if ((code & 0x7F) == 0x7F) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (code & 0x80) ? -mag : mag;
}

std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Reads the published tensors, remembering which were used.
class Source {
 public:
  explicit Source(const Checkpoint& ck) : ck_(ck) {}

  Result<const TensorView*> Get(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView* t = ck_.Find(name);
    if (!t) return Fail(Error::NotFound("DeepSeek-V3.2 checkpoint: tensor '" + name + "' is missing"));
    if (t->shape != shape)
      return Fail(Error::Corruption(*t->file, "tensor '" + name + "' has shape " + t->ShapeString() + ", expected " + Shape(shape)));
    used_.insert(name);
    return t;
  }

  // A vector (norm, bias) as F32.
  Result<std::vector<float>> Vec(const std::string& name, int64_t n) {
    MOE_ASSIGN_OR_RETURN(const TensorView* t, Get(name, {n}));
    std::vector<float> out(static_cast<size_t>(n));
    if (t->dtype == DType::kF32) {
      std::memcpy(out.data(), t->data, out.size() * 4);
    } else if (t->dtype == DType::kBF16) {
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, t->data + 2 * i, 2);
        out[i] = Bf16ToF32(b);
      }
    } else {
      return Fail(Error::Corruption(*t->file, "tensor '" + name + "' is " + std::string(DTypeName(t->dtype)) + ", expected BF16 or F32"));
    }
    return out;
  }

  // A matrix [rows, cols]: FP8 with its block scales dequantised to BF16 (the
  // fp32 product rounded to nearest even, as DeepSeek's weight_dequant), BF16
  // as stored, F32 rounded to BF16 (the engine's linear weights are BF16).
  Result<std::vector<uint16_t>> Matrix(const std::string& name, int64_t rows, int64_t cols) {
    MOE_ASSIGN_OR_RETURN(const TensorView* t, Get(name, {rows, cols}));
    const size_t n = static_cast<size_t>(rows * cols);
    std::vector<uint16_t> out(n);
    if (t->dtype == DType::kBF16) {
      std::memcpy(out.data(), t->data, n * 2);
      return out;
    }
    if (t->dtype == DType::kF32) {
      for (size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, t->data + 4 * i, 4);
        out[i] = F32ToBf16(f);
      }
      return out;
    }
    if (t->dtype != DType::kF8E4M3)
      return Fail(Error::Corruption(*t->file, "tensor '" + name + "' is " + std::string(DTypeName(t->dtype)) +
                                                  ", expected F8_E4M3 (with weight_scale_inv) or BF16"));
    const std::string sname = name.substr(0, name.size() - std::string("weight").size()) + "weight_scale_inv";
    const int64_t br = (rows + kBlock - 1) / kBlock, bc = (cols + kBlock - 1) / kBlock;
    MOE_ASSIGN_OR_RETURN(const TensorView* s, Get(sname, {br, bc}));
    if (s->dtype != DType::kF32)
      return Fail(Error::Corruption(*s->file, "tensor '" + sname + "' is " + std::string(DTypeName(s->dtype)) + ", expected F32"));
    std::vector<float> scale(static_cast<size_t>(br * bc));
    std::memcpy(scale.data(), s->data, scale.size() * 4);
    for (size_t i = 0; i < scale.size(); ++i)
      if (!std::isfinite(scale[i]) || scale[i] <= 0)
        return Fail(Error::Corruption(*s->file, "tensor '" + sname + "': block " + std::to_string(i) + " scale " +
                                                    std::to_string(scale[i]) + " is not a positive finite number"));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t code = t->data[r * cols + c];
        if ((code & 0x7F) == 0x7F)
          return Fail(Error::Corruption(*t->file, "tensor '" + name + "': element [" + std::to_string(r) + ", " +
                                                      std::to_string(c) + "] is an FP8 NaN"));
        out[static_cast<size_t>(r * cols + c)] = F32ToBf16(DecodeE4m3(code) * scale[static_cast<size_t>((r / kBlock) * bc + c / kBlock)]);
      }
    ++dequantised_;
    return out;
  }

  const std::set<std::string>& used() const { return used_; }
  int dequantised() const { return dequantised_; }

 private:
  const Checkpoint& ck_;
  std::set<std::string> used_;
  int dequantised_ = 0;
};

std::vector<uint8_t> Bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

Status Convert(Source& src, const Config& cfg, SafetensorsWriter& out) {
  const ModelConfig& c = cfg.model;
  const int64_t D = c.hidden_size, V = c.vocab_size, H = c.mla.num_heads, ql = c.mla.q_lora_rank;
  const int64_t kvl = c.mla.kv_lora_rank, nope = c.mla.qk_nope_head_dim, rope = c.mla.qk_rope_head_dim;
  const int64_t vd = c.mla.v_head_dim, IH = c.dsa.index_n_heads, ID = c.dsa.index_head_dim;
  const int64_t E = c.moe.num_experts, I = c.moe.moe_intermediate_size, S = c.moe.num_shared_experts * I;
  const auto vec = [&](const std::string& from, const std::string& to, int64_t n) -> Status {
    MOE_ASSIGN_OR_RETURN(std::vector<float> v, src.Vec(from, n));
    return out.Add(to, DType::kF32, {n}, Bytes(v.data(), v.size() * 4));
  };
  const auto mat = [&](const std::string& from, const std::string& to, int64_t rows, int64_t cols) -> Status {
    MOE_ASSIGN_OR_RETURN(std::vector<uint16_t> m, src.Matrix(from, rows, cols));
    return out.Add(to, DType::kBF16, {rows, cols}, Bytes(m.data(), m.size() * 2));
  };
  // The embedding is indexed by rows: the engine keeps it fp32.
  {
    MOE_ASSIGN_OR_RETURN(std::vector<uint16_t> m, src.Matrix("model.embed_tokens.weight", V, D));
    MOE_TRY(out.Add("embed.weight", DType::kBF16, {V, D}, Bytes(m.data(), m.size() * 2)));
  }
  MOE_TRY(mat("lm_head.weight", "head.weight", V, D));
  MOE_TRY(vec("model.norm.weight", "norm.weight", D));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".", a = p + "self_attn.", m = p + "mlp.";
    const std::string q = "layers." + std::to_string(i) + ".";
    MOE_TRY(vec(p + "input_layernorm.weight", q + "attn_norm.weight", D));
    MOE_TRY(vec(p + "post_attention_layernorm.weight", q + "ffn_norm.weight", D));
    MOE_TRY(mat(a + "q_a_proj.weight", q + "attn.wq_a.weight", ql, D));
    MOE_TRY(vec(a + "q_a_layernorm.weight", q + "attn.q_norm.weight", ql));
    MOE_TRY(mat(a + "q_b_proj.weight", q + "attn.wq_b.weight", H * (nope + rope), ql));
    MOE_TRY(mat(a + "kv_a_proj_with_mqa.weight", q + "attn.wkv_a.weight", kvl + rope, D));
    MOE_TRY(vec(a + "kv_a_layernorm.weight", q + "attn.kv_norm.weight", kvl));
    MOE_TRY(mat(a + "kv_b_proj.weight", q + "attn.wkv_b.weight", H * (nope + vd), kvl));
    MOE_TRY(mat(a + "o_proj.weight", q + "attn.wo.weight", D, H * vd));
    MOE_TRY(mat(a + "indexer.wq_b.weight", q + "attn.indexer.wq_b.weight", IH * ID, ql));
    MOE_TRY(mat(a + "indexer.wk.weight", q + "attn.indexer.wk.weight", ID, D));
    MOE_TRY(vec(a + "indexer.k_norm.weight", q + "attn.indexer.k_norm.weight", ID));
    MOE_TRY(vec(a + "indexer.k_norm.bias", q + "attn.indexer.k_norm.bias", ID));
    MOE_TRY(mat(a + "indexer.weights_proj.weight", q + "attn.indexer.weights_proj.weight", IH, D));
    if (!c.IsMoeLayer(i)) {
      const int64_t F = c.intermediate_size;
      MOE_TRY(mat(m + "gate_proj.weight", q + "ffn.w1.weight", F, D));
      MOE_TRY(mat(m + "up_proj.weight", q + "ffn.w3.weight", F, D));
      MOE_TRY(mat(m + "down_proj.weight", q + "ffn.w2.weight", D, F));
      continue;
    }
    MOE_TRY(mat(m + "gate.weight", q + "ffn.gate.weight", E, D));
    MOE_TRY(vec(m + "gate.e_score_correction_bias", q + "ffn.gate.bias", E));
    // Routed experts stacked: w13 [E, 2I, D] (rows of w1 then of w3), w2 [E, D, I].
    std::vector<uint8_t> w13, w2;
    w13.reserve(static_cast<size_t>(E * 2 * I * D * 2));
    w2.reserve(static_cast<size_t>(E * D * I * 2));
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      for (const char* part : {"gate_proj", "up_proj"}) {
        MOE_ASSIGN_OR_RETURN(std::vector<uint16_t> wp, src.Matrix(x + part + ".weight", I, D));
        const auto b = Bytes(wp.data(), wp.size() * 2);
        w13.insert(w13.end(), b.begin(), b.end());
      }
      MOE_ASSIGN_OR_RETURN(std::vector<uint16_t> wd, src.Matrix(x + "down_proj.weight", D, I));
      const auto b = Bytes(wd.data(), wd.size() * 2);
      w2.insert(w2.end(), b.begin(), b.end());
    }
    MOE_TRY(out.Add(q + "ffn.experts.w13.weight", DType::kBF16, {E, 2 * I, D}, std::move(w13)));
    MOE_TRY(out.Add(q + "ffn.experts.w2.weight", DType::kBF16, {E, D, I}, std::move(w2)));
    if (S > 0) {
      MOE_TRY(mat(m + "shared_experts.gate_proj.weight", q + "ffn.shared.w1.weight", S, D));
      MOE_TRY(mat(m + "shared_experts.up_proj.weight", q + "ffn.shared.w3.weight", S, D));
      MOE_TRY(mat(m + "shared_experts.down_proj.weight", q + "ffn.shared.w2.weight", D, S));
    }
  }
  return Ok();
}

// The layer index of "model.layers.{i}....", or -1.
int LayerOf(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  size_t end = name.find('.', kPrefix.size());
  if (end == std::string::npos || end == kPrefix.size() || end - kPrefix.size() > 6) return -1;
  int i = 0;
  for (size_t k = kPrefix.size(); k < end; ++k) {
    if (name[k] < '0' || name[k] > '9') return -1;
    i = i * 10 + (name[k] - '0');
  }
  return i;
}

}  // namespace

Result<ModelDir> OpenDir(const std::string& dir) {
  namespace fs = std::filesystem;
  MOE_ASSIGN_OR_RETURN(Config cfg, LoadConfig(dir));
  MOE_ASSIGN_OR_RETURN(Checkpoint published, Checkpoint::Open(dir));
  std::vector<std::string> notes;

  Source src(published);
  SafetensorsWriter writer;
  MOE_TRY(Convert(src, cfg, writer));

  // Every published tensor is either converted or belongs to an MTP layer.
  const int L = cfg.model.num_layers;
  int mtp = 0;
  for (const TensorView* t : published.AllTensors()) {
    if (src.used().count(t->name)) continue;
    const int layer = LayerOf(t->name);
    if (layer >= L && layer < L + cfg.num_nextn_predict_layers) {
      ++mtp;
      continue;
    }
    return Fail(Error::Corruption(*t->file, "tensor '" + t->name + "' is not part of DeepSeek-V3.2 as configured (" +
                                                std::to_string(L) + " layers, " + std::to_string(cfg.num_nextn_predict_layers) +
                                                " MTP)"));
  }
  if (cfg.num_nextn_predict_layers > 0) {
    std::ostringstream note;
    note << "multi-token-prediction layer " << L;
    if (cfg.num_nextn_predict_layers > 1) note << " to " << L + cfg.num_nextn_predict_layers - 1;
    note << " skipped (" << mtp << " tensors): speculative decoding is not implemented";
    notes.push_back(note.str());
  }
  if (src.dequantised() > 0)
    notes.push_back(std::to_string(src.dequantised()) +
                    " FP8 e4m3 weights dequantised with their 128x128 weight_scale_inv blocks to BF16");

  MOE_ASSIGN_OR_RETURN(Checkpoint converted, Checkpoint::FromImage(dir + " (DeepSeek-V3.2, converted)", writer.Serialize()));
  MOE_TRY(ValidateCheckpoint(converted, cfg.model, &notes));
  ModelDir out{dir, cfg.model, std::move(converted), Tokenizer::Builtin(cfg.model.vocab_size), std::move(notes)};
  out.family = kModelType;
  return out;
}

}  // namespace moeserve::engine::deepseek_v32
