// Qwen3-Next's checkpoint mapped onto the shared layer graph (graph.hpp).
#include "families/qwen3_next/graph.hpp"

#include "families/converted_dir.hpp"

#include <cstring>
#include <functional>
#include <map>
#include <optional>

#include "moeserve/common/log.hpp"
#include "moeserve/engine/dtype.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tensor_source.hpp"
#include "moeserve/engine/tokenizer.hpp"
#include "moeserve/kernels/mxfp4.hpp"

namespace moeserve::engine::qwen3_next {

namespace {

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

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The published tensors under the engine's names. Each engine name has a
// recipe that checks its published tensors (dtype, shape; errors name them)
// and makes the engine's tensor: a view where the layout is the same, a
// gather of rows, 1 + w for a zero-centred norm, or a stack of experts.
class PublishedSource final : public TensorSource {
 public:
  PublishedSource(const Config& c, Checkpoint checkpoint, ExpertFormat experts, bool mtp)
      : ck_(std::move(checkpoint)), experts_(experts) {
    Plan(c, mtp);
  }

  Result<HeldTensor> Get(const std::string& name) override {
    const auto it = recipes_.find(name);
    if (it == recipes_.end()) return Fail(Error::NotFound("tensor '" + name + "' is missing"));
    return it->second();
  }
  // Every engine tensor the mapping makes (a converted directory's contents).
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& [name, recipe] : recipes_) names.push_back(name);
    return names;
  }

 private:
  using Recipe = std::function<Result<HeldTensor>()>;

  Result<const TensorView*> Find(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorView* t = ck_.Find(name);
    if (!t) return Fail(Error::NotFound("tensor '" + name + "' is missing"));
    if (t->dtype != DType::kBF16 && t->dtype != DType::kF32)
      return Fail(Error::InvalidArgument("tensor '" + name + "': dtype must be BF16 or F32"));
    if (t->shape != shape)
      return Fail(Error::InvalidArgument("tensor '" + name + "': shape " + t->ShapeString() + ", expected " +
                                         ShapeText(shape)));
    return t;
  }
  static HeldTensor Made(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    HeldTensor h;
    h.bytes = std::move(bytes);
    h.view.name = name;
    h.view.dtype = dtype;
    h.view.shape = std::move(shape);
    h.view.data = h.bytes.data();
    h.view.nbytes = h.bytes.size();
    return h;
  }
  // The published tensor as it is.
  Recipe Same(std::string name, std::vector<int64_t> shape) const {
    return [this, name, shape]() -> Result<HeldTensor> {
      MOE_ASSIGN_OR_RETURN(const TensorView* t, Find(name, shape));
      HeldTensor h;
      h.view = *t;
      return h;
    };
  }
  // A zero-centred RMSNorm weight, as the 1 + w it multiplies by (F32).
  Recipe Norm(std::string name, int64_t n) const {
    return [this, name, n]() -> Result<HeldTensor> {
      MOE_ASSIGN_OR_RETURN(const TensorView* t, Find(name, {n}));
      std::vector<uint8_t> bytes(static_cast<size_t>(n) * 4);
      for (int64_t i = 0; i < n; ++i) {
        float x;
        if (t->dtype == DType::kF32) {
          std::memcpy(&x, t->data + 4 * i, 4);
        } else {
          uint16_t b;
          std::memcpy(&b, t->data + 2 * i, 2);
          x = Bf16ToF32(b);
        }
        x = 1.0f + x;
        std::memcpy(bytes.data() + 4 * i, &x, 4);
      }
      return Made(name, DType::kF32, {n}, std::move(bytes));
    };
  }
  // Rows `rows` of a [R, C] tensor (shape `full`, its last dimension C), in
  // that order, in the file's dtype.
  Recipe Rows(std::string name, std::vector<int64_t> full, std::vector<int> rows) const {
    return [this, name, full, rows]() -> Result<HeldTensor> {
      MOE_ASSIGN_OR_RETURN(const TensorView* t, Find(name, full));
      const size_t row_bytes = static_cast<size_t>(full.back()) * DTypeSize(t->dtype);
      std::vector<uint8_t> bytes(rows.size() * row_bytes);
      for (size_t r = 0; r < rows.size(); ++r)
        std::memcpy(bytes.data() + r * row_bytes, t->data + static_cast<size_t>(rows[r]) * row_bytes, row_bytes);
      return Made(name, t->dtype, {static_cast<int64_t>(rows.size()), full.back()}, std::move(bytes));
    };
  }
  // Experts e = 0..E-1 of `base`.experts.e.{names}, stacked BF16 [E, rows, cols]
  // (w13: gate_proj's rows then up_proj's, as the graph's experts hold them).
  Recipe Experts(std::string base, int E, std::vector<std::string> names, int64_t rows, int64_t cols) const {
    return [this, base, E, names, rows, cols]() -> Result<HeldTensor> {
      const size_t part = static_cast<size_t>(rows) * static_cast<size_t>(cols) * 2;
      std::vector<uint8_t> bytes(part * names.size() * static_cast<size_t>(E));
      for (int e = 0; e < E; ++e)
        for (size_t k = 0; k < names.size(); ++k) {
          const std::string name = base + ".experts." + std::to_string(e) + "." + names[k] + ".weight";
          MOE_ASSIGN_OR_RETURN(const TensorView* t, Find(name, {rows, cols}));
          if (t->dtype != DType::kBF16) return Fail(Error::InvalidArgument("tensor '" + name + "': experts must be BF16"));
          std::memcpy(bytes.data() + (static_cast<size_t>(e) * names.size() + k) * part, t->data, part);
        }
      return Made(base + ".experts", DType::kBF16,
                  {E, rows * static_cast<int64_t>(names.size()), cols}, std::move(bytes));
    };
  }

  // The same experts requantised to MXFP4 (model.md section 7's encoder,
  // from the BF16 values, one expert's fp32 values at a time): `base_out`
  // .blocks [E, rows, cols / 32, 16] and .scales [E, rows, cols / 32]. The
  // loader asks for the blocks, then the scales: one encoding makes both,
  // the scales kept for that second request.
  Recipe Mxfp4Experts(std::string base_out, std::string base, int E, std::vector<std::string> names, int64_t rows,
                      int64_t cols, bool scales) {
    return [this, base_out, base, E, names, rows, cols, scales]() -> Result<HeldTensor> {
      const int64_t R = rows * static_cast<int64_t>(names.size()), B = cols / 32;
      if (scales && pending_scales_name_ == base_out) {
        pending_scales_name_.clear();
        return Made(base_out + ".scales", DType::kU8, {E, R, B}, std::move(pending_scales_));
      }
      const size_t n = static_cast<size_t>(R) * static_cast<size_t>(cols);
      std::vector<uint8_t> blocks(static_cast<size_t>(E) * n / 2), scale_bytes(static_cast<size_t>(E) * n / 32);
      std::vector<float> f32(n);
      const size_t part = static_cast<size_t>(rows) * static_cast<size_t>(cols);
      for (int e = 0; e < E; ++e) {
        for (size_t k = 0; k < names.size(); ++k) {
          const std::string name = base + ".experts." + std::to_string(e) + "." + names[k] + ".weight";
          MOE_ASSIGN_OR_RETURN(const TensorView* t, Find(name, {rows, cols}));
          if (t->dtype != DType::kBF16) return Fail(Error::InvalidArgument("tensor '" + name + "': experts must be BF16"));
          for (size_t i = 0; i < part; ++i) {
            uint16_t b;
            std::memcpy(&b, t->data + 2 * i, 2);
            f32[k * part + i] = Bf16ToF32(b);
          }
        }
        const long long bad = kernels::Mxfp4EncodeMatrix(f32.data(), static_cast<size_t>(R), static_cast<size_t>(cols),
                                                         blocks.data() + static_cast<size_t>(e) * (n / 2),
                                                         scale_bytes.data() + static_cast<size_t>(e) * (n / 32));
        if (bad >= 0) {
          // Name the published tensor and its element (row, column).
          const size_t k = static_cast<size_t>(bad) / part, at = static_cast<size_t>(bad) % part;
          const std::string name = base + ".experts." + std::to_string(e) + "." + names[k] + ".weight";
          return Fail(Error::Corruption(name, "element " + std::to_string(at) + " (row " +
                                                  std::to_string(at / static_cast<size_t>(cols)) + ", column " +
                                                  std::to_string(at % static_cast<size_t>(cols)) +
                                                  ") is not finite; cannot requantise to MXFP4"));
        }
      }
      if (scales) return Made(base_out + ".scales", DType::kU8, {E, R, B}, std::move(scale_bytes));
      pending_scales_name_ = base_out;
      pending_scales_ = std::move(scale_bytes);
      return Made(base_out + ".blocks", DType::kU8, {E, R, B, 16}, std::move(blocks));
    };
  }
  // The routed experts of one projection in the format asked for.
  void AddExperts(const std::string& out, const std::string& base, int E, const std::vector<std::string>& names,
                  int64_t rows, int64_t cols) {
    if (experts_ == ExpertFormat::kMxfp4) {
      recipes_[out + ".blocks"] = Mxfp4Experts(out, base, E, names, rows, cols, false);
      recipes_[out + ".scales"] = Mxfp4Experts(out, base, E, names, rows, cols, true);
    } else {
      recipes_[out + ".weight"] = Experts(base, E, names, rows, cols);
    }
  }

  void Plan(const Config& c, bool mtp) {
    const int64_t D = c.hidden_size, V = c.vocab_size;
    auto& R = recipes_;
    R["embed.weight"] = Same("model.embed_tokens.weight", {V, D});
    R["head.weight"] = Same(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", {V, D});
    R["norm.weight"] = Norm("model.norm.weight", D);
    const DeltaRows rows = DeltaRowMap(c);
    const int64_t nk = c.linear_k_heads, nv = c.linear_v_heads, dk = c.linear_k_dim, dv = c.linear_v_dim;
    const int64_t H = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim;
    // One decoder layer: published prefix p, engine prefix e.
    const auto layer = [&](const std::string& p, const std::string& e, bool full, bool sparse) {
      R[e + "attn_norm.weight"] = Norm(p + "input_layernorm.weight", D);
      R[e + "ffn_norm.weight"] = Norm(p + "post_attention_layernorm.weight", D);
      if (full) {
        std::vector<int> qr, gr;
        for (int h = 0; h < H; ++h)
          for (int j = 0; j < hd; ++j) {
            qr.push_back(static_cast<int>(h * 2 * hd + j));
            gr.push_back(static_cast<int>(h * 2 * hd + hd + j));
          }
        const std::string a = p + "self_attn.";
        R[e + "attn.wq.weight"] = Rows(a + "q_proj.weight", {2 * H * hd, D}, qr);
        R[e + "attn.wg.weight"] = Rows(a + "q_proj.weight", {2 * H * hd, D}, gr);
        R[e + "attn.wk.weight"] = Same(a + "k_proj.weight", {Hkv * hd, D});
        R[e + "attn.wv.weight"] = Same(a + "v_proj.weight", {Hkv * hd, D});
        R[e + "attn.wo.weight"] = Same(a + "o_proj.weight", {D, H * hd});
        R[e + "attn.q_norm.weight"] = Norm(a + "q_norm.weight", hd);
        R[e + "attn.k_norm.weight"] = Norm(a + "k_norm.weight", hd);
      } else {
        const std::string a = p + "linear_attn.";
        const int64_t qkvz = 2 * nk * dk + 2 * nv * dv, conv = 2 * nk * dk + nv * dv;
        R[e + "attn.q_proj.weight"] = Rows(a + "in_proj_qkvz.weight", {qkvz, D}, rows.q);
        R[e + "attn.k_proj.weight"] = Rows(a + "in_proj_qkvz.weight", {qkvz, D}, rows.k);
        R[e + "attn.v_proj.weight"] = Rows(a + "in_proj_qkvz.weight", {qkvz, D}, rows.v);
        R[e + "attn.g_proj.weight"] = Rows(a + "in_proj_qkvz.weight", {qkvz, D}, rows.z);
        R[e + "attn.b_proj.weight"] = Rows(a + "in_proj_ba.weight", {2 * nv, D}, rows.b);
        R[e + "attn.a_proj.weight"] = Rows(a + "in_proj_ba.weight", {2 * nv, D}, rows.a);
        // conv1d.weight is [channels, 1, K]: its rows read as [channels, K].
        R[e + "attn.q_conv1d.weight"] = Rows(a + "conv1d.weight", {conv, 1, c.conv_kernel}, rows.conv_q);
        R[e + "attn.k_conv1d.weight"] = Rows(a + "conv1d.weight", {conv, 1, c.conv_kernel}, rows.conv_k);
        R[e + "attn.v_conv1d.weight"] = Rows(a + "conv1d.weight", {conv, 1, c.conv_kernel}, rows.conv_v);
        R[e + "attn.A_log"] = Same(a + "A_log", {nv});
        R[e + "attn.dt_bias"] = Same(a + "dt_bias", {nv});
        R[e + "attn.o_norm.weight"] = Same(a + "norm.weight", {dv});
        R[e + "attn.o_proj.weight"] = Same(a + "out_proj.weight", {D, nv * dv});
      }
      if (sparse) {
        const int64_t E = c.num_experts, I = c.moe_intermediate_size, S = c.shared_expert_intermediate_size;
        R[e + "ffn.gate.weight"] = Same(p + "mlp.gate.weight", {E, D});
        AddExperts(e + "ffn.experts.w13", p + "mlp", c.num_experts, {"gate_proj", "up_proj"}, I, D);
        AddExperts(e + "ffn.experts.w2", p + "mlp", c.num_experts, {"down_proj"}, D, I);
        if (S > 0) {
          R[e + "ffn.shared.w1.weight"] = Same(p + "mlp.shared_expert.gate_proj.weight", {S, D});
          R[e + "ffn.shared.w3.weight"] = Same(p + "mlp.shared_expert.up_proj.weight", {S, D});
          R[e + "ffn.shared.w2.weight"] = Same(p + "mlp.shared_expert.down_proj.weight", {D, S});
          R[e + "ffn.shared.gate.weight"] = Same(p + "mlp.shared_expert_gate.weight", {1, D});
        }
      } else {
        const int64_t I = c.intermediate_size;
        R[e + "ffn.w1.weight"] = Same(p + "mlp.gate_proj.weight", {I, D});
        R[e + "ffn.w3.weight"] = Same(p + "mlp.up_proj.weight", {I, D});
        R[e + "ffn.w2.weight"] = Same(p + "mlp.down_proj.weight", {D, I});
      }
    };
    for (int i = 0; i < c.num_layers; ++i)
      layer("model.layers." + std::to_string(i) + ".", "layers." + std::to_string(i) + ".",
            c.full_attention[static_cast<size_t>(i)], c.sparse[static_cast<size_t>(i)]);
    // The multi-token-prediction layer (model.md 15), when asked for and
    // present: pre_fc_norm_embedding and pre_fc_norm_hidden (zero-centred)
    // before fc, the concatenation's embedding half first; mtp.layers.0, a
    // full-attention layer with the MoE; mtp.norm before the shared head.
    if (mtp) {
      R["mtp.0.enorm.weight"] = Norm("mtp.pre_fc_norm_embedding.weight", D);
      R["mtp.0.hnorm.weight"] = Norm("mtp.pre_fc_norm_hidden.weight", D);
      R["mtp.0.eh_proj.weight"] = Same("mtp.fc.weight", {D, 2 * D});
      layer("mtp.layers.0.", "mtp.0.", true, c.num_experts > 0);
      R["mtp.0.norm.weight"] = Norm("mtp.norm.weight", D);
    }
  }

  Checkpoint ck_;
  ExpertFormat experts_;
  std::map<std::string, Recipe> recipes_;
  std::string pending_scales_name_;  // MXFP4: the scales made with the last blocks, for their request
  std::vector<uint8_t> pending_scales_;
};

}  // namespace

ModelConfig ToModelConfig(const Config& c) {
  ModelConfig sc;
  sc.architecture = "qwen3_next";
  sc.vocab_size = c.vocab_size;
  sc.hidden_size = c.hidden_size;
  sc.num_layers = c.num_layers;
  sc.intermediate_size = c.intermediate_size;
  sc.rms_norm_eps = c.rms_norm_eps;
  sc.max_position_embeddings = c.max_position_embeddings;
  sc.delta.num_heads = c.linear_v_heads;
  sc.delta.head_k_dim = c.linear_k_dim;
  sc.delta.head_v_dim = c.linear_v_dim;
  sc.delta.conv_size = c.conv_kernel;
  sc.delta.norm_eps = c.rms_norm_eps;
  sc.gqa.num_heads = c.num_heads;
  sc.gqa.num_kv_heads = c.num_kv_heads;
  sc.gqa.head_dim = c.head_dim;
  sc.gqa.rotary_dim = c.rotary_dim;
  sc.gqa.rope_theta = c.rope_theta;
  sc.moe.num_experts = c.num_experts;
  sc.moe.experts_per_token = c.experts_per_token;
  sc.moe.num_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
  sc.moe.shared_expert_gate = c.shared_expert_intermediate_size > 0;
  sc.moe.moe_intermediate_size = c.moe_intermediate_size;
  sc.moe.score_func = "softmax";
  sc.moe.norm_topk_prob = c.norm_topk_prob;
  sc.expert_format = ExpertFormat::kBf16;
  sc.moe_layers = c.sparse;
  for (int i = 0; i < c.num_layers; ++i)
    sc.layer_types.push_back(c.full_attention[static_cast<size_t>(i)] ? LayerKind::kGqa : LayerKind::kDelta);
  return sc;
}

namespace {

// A directory WriteConverted made: the engine's tensors, mapped as they are.
Result<std::unique_ptr<Model>> LoadConverted(const std::string& dir, const Config& config, ExpertFormat held,
                                             const ModelOptions& options) {
  if (options.experts && *options.experts != held)
    return Fail(Error::InvalidArgument("experts: " + std::string(ExpertFormatName(*options.experts)) + " requested, but " +
                                       dir + " holds its routed experts converted to " +
                                       std::string(ExpertFormatName(held)) + " (publish the published directory again)"));
  MOE_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::Open(dir));
  ModelConfig mc = ToModelConfig(config);
  mc.expert_format = held;
  if (ck.Find("mtp.0.eh_proj.weight")) {
    mc.num_nextn_predict_layers = 1;
    mc.mtp_kind = LayerKind::kGqa;
    mc.mtp_moe = config.num_experts > 0;
  }
  log::Info("qwen3_next: " + dir + " was converted before (routed experts " + std::string(ExpertFormatName(held)) +
            "): loaded as it is");
  ModelDir opened{.path = dir,
                  .config = mc,
                  .checkpoint = std::move(ck),
                  .tokenizer = Tokenizer::Builtin(mc.vocab_size),
                  .warnings = {},
                  .family = "qwen3_next",
                  .source = nullptr};
  return Model::Load(opened, options);
}

Status CheckMxfp4Shape(const std::string& dir, const Config& c) {
  if (c.hidden_size % 32 || c.moe_intermediate_size % 32)
    return Fail(Error::InvalidArgument("experts: mxfp4 requested, but " + dir + "/config.json has hidden_size " +
                                       std::to_string(c.hidden_size) + " and moe_intermediate_size " +
                                       std::to_string(c.moe_intermediate_size) +
                                       ": both must be multiples of 32 (MXFP4 blocks)"));
  return Ok();
}

}  // namespace

Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, const Config& config, const ModelOptions& options) {
  MOE_ASSIGN_OR_RETURN(std::optional<ExpertFormat> converted, families::ConvertedMarker(dir));
  if (converted) return LoadConverted(dir, config, *converted, options);
  MOE_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::Open(dir));
  ModelConfig mc = ToModelConfig(config);
  // The multi-token-prediction layer: the graph's MTP module (a gated-GQA
  // block with the MoE) when the checkpoint holds it (its fc and decoder
  // layer; a checkpoint with only some mtp.* tensors has none).
  const bool has_mtp = ck.Find("mtp.fc.weight") && ck.Find("mtp.layers.0.input_layernorm.weight");
  if (has_mtp) {
    mc.num_nextn_predict_layers = 1;
    mc.mtp_kind = LayerKind::kGqa;
    mc.mtp_moe = config.num_experts > 0;
    log::Info(options.mtp ? "qwen3_next: the multi-token-prediction layer (mtp.*) is loaded for speculative drafts"
                          : "qwen3_next: the multi-token-prediction layer (mtp.*) is not loaded (no MTP drafts asked for)");
  } else if (ck.Find("mtp.fc.weight")) {
    log::Info("qwen3_next: the checkpoint's mtp.* tensors hold no decoder layer (mtp.layers.0): no MTP drafts");
  }
  // experts: mxfp4 requantises the published BF16 experts at load.
  mc.expert_format = options.experts.value_or(ExpertFormat::kBf16);
  if (mc.expert_format == ExpertFormat::kMxfp4) MOE_TRY(CheckMxfp4Shape(dir, config));
  ModelDir opened{.path = dir,
                  .config = mc,
                  .checkpoint = Checkpoint(),
                  .tokenizer = Tokenizer::Builtin(mc.vocab_size),
                  .warnings = {},
                  .family = "qwen3_next",
                  .source = std::make_shared<PublishedSource>(config, std::move(ck), mc.expert_format, has_mtp)};
  return Model::Load(opened, options);
}

Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, const ModelOptions& options) {
  MOE_ASSIGN_OR_RETURN(Config config, LoadConfig(dir));
  return LoadModel(dir, config, options);
}

Status WriteConverted(const std::string& dir, const std::string& out, ExpertFormat experts, uint64_t max_shard_bytes) {
  MOE_ASSIGN_OR_RETURN(Config config, LoadConfig(dir));
  MOE_ASSIGN_OR_RETURN(std::optional<ExpertFormat> converted, families::ConvertedMarker(dir));
  if (converted)
    return Fail(Error::InvalidArgument(dir + " is already converted (routed experts " +
                                       std::string(ExpertFormatName(*converted)) + "); convert the published directory"));
  if (experts == ExpertFormat::kMxfp4) MOE_TRY(CheckMxfp4Shape(dir, config));
  MOE_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::Open(dir));
  const bool has_mtp = ck.Find("mtp.fc.weight") && ck.Find("mtp.layers.0.input_layernorm.weight");
  PublishedSource source(config, std::move(ck), experts, has_mtp);
  MOE_ASSIGN_OR_RETURN(nlohmann::ordered_json cfg, families::ConvertedConfig(dir, experts));
  families::ConvertedDirPlan plan{.names = source.Names(), .source = &source, .config_json = cfg.dump(2) + "\n",
                                  .max_shard_bytes = max_shard_bytes};
  return families::WriteConvertedDir(dir, out, plan);
}

Result<std::optional<ExpertFormat>> ConvertedExperts(const std::string& dir) { return families::ConvertedMarker(dir); }

}  // namespace moeserve::engine::qwen3_next
