#include "moeserve/engine/tensor_layout.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "moeserve/kernels/mxfp4.hpp"

namespace moeserve::engine {

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  std::vector<TensorSpec> out;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  auto dense = [&](std::string name, std::vector<int64_t> shape, int layer) {
    int64_t fan_in = shape.size() == 2 ? shape[1] : 0;
    out.push_back({std::move(name), std::move(shape), TensorClass::kBf16, layer, false, fan_in});
  };
  auto f32 = [&](std::string name, std::vector<int64_t> shape, int layer) {
    out.push_back({std::move(name), std::move(shape), TensorClass::kFloat32, layer, false, 0});
  };

  dense("embed.weight", {V, D}, -1);
  // One decoder block's tensors under prefix p: attention of `kind`, then a
  // dense SwiGLU or the MoE.
  const auto block = [&](const std::string& p, LayerKind kind, bool moe, int i) {
    f32(p + "attn_norm.weight", {D}, i);
    f32(p + "ffn_norm.weight", {D}, i);
    if (kind == LayerKind::kMla || kind == LayerKind::kDsa) {
      const MlaConfig& m = c.mla;
      const int64_t H = m.num_heads;
      dense(p + "attn.wq_a.weight", {m.q_lora_rank, D}, i);
      f32(p + "attn.q_norm.weight", {m.q_lora_rank}, i);
      dense(p + "attn.wq_b.weight", {H * m.qk_head_dim(), m.q_lora_rank}, i);
      dense(p + "attn.wkv_a.weight", {m.kv_lora_rank + m.qk_rope_head_dim, D}, i);
      f32(p + "attn.kv_norm.weight", {m.kv_lora_rank}, i);
      dense(p + "attn.wkv_b.weight", {H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank}, i);
      dense(p + "attn.wo.weight", {D, H * m.v_head_dim}, i);
      if (m.output_gate) dense(p + "attn.wg.weight", {H * m.v_head_dim, D}, i);
      if (kind == LayerKind::kDsa) {
        const DsaConfig& d = c.dsa;
        dense(p + "attn.indexer.wq_b.weight", {int64_t{d.index_n_heads} * d.index_head_dim, m.q_lora_rank}, i);
        dense(p + "attn.indexer.wk.weight", {d.index_head_dim, D}, i);
        f32(p + "attn.indexer.k_norm.weight", {d.index_head_dim}, i);
        f32(p + "attn.indexer.k_norm.bias", {d.index_head_dim}, i);
        dense(p + "attn.indexer.weights_proj.weight", {d.index_n_heads, D}, i);
      }
    } else if (kind == LayerKind::kGqa) {
      const GqaConfig& g = c.gqa;
      const int64_t qd = int64_t{g.num_heads} * g.head_dim, kvd = int64_t{g.num_kv_heads} * g.head_dim;
      dense(p + "attn.wq.weight", {qd, D}, i);
      dense(p + "attn.wg.weight", {qd, D}, i);
      dense(p + "attn.wk.weight", {kvd, D}, i);
      dense(p + "attn.wv.weight", {kvd, D}, i);
      dense(p + "attn.wo.weight", {D, qd}, i);
      f32(p + "attn.q_norm.weight", {g.head_dim}, i);
      f32(p + "attn.k_norm.weight", {g.head_dim}, i);
    } else {
      const DeltaConfig& d = c.delta;
      const int64_t Hd = d.num_heads, dk = d.head_k_dim, dv = d.head_v_dim;
      dense(p + "attn.q_proj.weight", {Hd * dk, D}, i);
      dense(p + "attn.k_proj.weight", {Hd * dk, D}, i);
      dense(p + "attn.v_proj.weight", {Hd * dv, D}, i);
      dense(p + "attn.a_proj.weight", {Hd, D}, i);
      dense(p + "attn.b_proj.weight", {Hd, D}, i);
      dense(p + "attn.g_proj.weight", {Hd * dv, D}, i);
      dense(p + "attn.o_proj.weight", {D, Hd * dv}, i);
      dense(p + "attn.q_conv1d.weight", {Hd * dk, d.conv_size}, i);
      dense(p + "attn.k_conv1d.weight", {Hd * dk, d.conv_size}, i);
      dense(p + "attn.v_conv1d.weight", {Hd * dv, d.conv_size}, i);
      f32(p + "attn.A_log", {Hd}, i);
      f32(p + "attn.dt_bias", {Hd}, i);
      f32(p + "attn.o_norm.weight", {dv}, i);
    }
    if (!moe) {
      const int64_t F = c.intermediate_size;
      dense(p + "ffn.w1.weight", {F, D}, i);
      dense(p + "ffn.w3.weight", {F, D}, i);
      dense(p + "ffn.w2.weight", {D, F}, i);
    } else {
      const MoeConfig& m = c.moe;
      const int64_t E = m.num_experts, I = m.moe_intermediate_size, S = int64_t{m.num_shared_experts} * I;
      dense(p + "ffn.gate.weight", {E, D}, i);
      f32(p + "ffn.gate.bias", {E}, i);
      if (c.expert_format == ExpertFormat::kBf16) {
        out.push_back({p + "ffn.experts.w13.weight", {E, 2 * I, D}, TensorClass::kBf16Experts, i, true, D});
        out.push_back({p + "ffn.experts.w2.weight", {E, D, I}, TensorClass::kBf16Experts, i, true, I});
      } else {
        out.push_back({p + "ffn.experts.w13.blocks", {E, 2 * I, D / 32, 16}, TensorClass::kMxfp4Blocks, i, true, D});
        out.push_back({p + "ffn.experts.w13.scales", {E, 2 * I, D / 32}, TensorClass::kMxfp4Scales, i, true, D});
        out.push_back({p + "ffn.experts.w2.blocks", {E, D, I / 32, 16}, TensorClass::kMxfp4Blocks, i, true, I});
        out.push_back({p + "ffn.experts.w2.scales", {E, D, I / 32}, TensorClass::kMxfp4Scales, i, true, I});
      }
      if (S > 0) {
        dense(p + "ffn.shared.w1.weight", {S, D}, i);
        dense(p + "ffn.shared.w3.weight", {S, D}, i);
        dense(p + "ffn.shared.w2.weight", {D, S}, i);
      }
    }
  };
  for (int i = 0; i < c.num_layers; ++i) block("layers." + std::to_string(i) + ".", c.layer_types[i], c.IsMoeLayer(i), i);
  f32("norm.weight", {D}, -1);
  dense("head.weight", {V, D}, -1);
  if (c.num_nextn_predict_layers > 0) {
    // The multi-token-prediction module (model.md 15), layer num_layers:
    // its input norms and projection, one decoder block, its final norm.
    const size_t first = out.size();
    const int i = c.num_layers;
    f32("mtp.0.enorm.weight", {D}, i);
    f32("mtp.0.hnorm.weight", {D}, i);
    dense("mtp.0.eh_proj.weight", {D, 2 * D}, i);
    block("mtp.0.", c.mtp_kind, c.mtp_moe, i);
    f32("mtp.0.norm.weight", {D}, i);
    for (size_t k = first; k < out.size(); ++k) out[k].mtp = true;
  }
  if (c.vision) {
    // The vision tower (model.md section 14.3); layer -1 like the embedding.
    const VisionConfig& v = *c.vision;
    const int64_t Dv = v.hidden_size, Iv = v.intermediate_size, P = v.projector_hidden_size;
    dense("vision.patch_embed.weight", {Dv, v.patch_dim()}, -1);
    f32("vision.patch_embed.bias", {Dv}, -1);
    for (int i = 0; i < v.num_layers; ++i) {
      const std::string p = "vision.blocks." + std::to_string(i) + ".";
      f32(p + "norm1.weight", {Dv}, -1);
      dense(p + "attn.qkv.weight", {3 * Dv, Dv}, -1);
      f32(p + "attn.qkv.bias", {3 * Dv}, -1);
      dense(p + "attn.proj.weight", {Dv, Dv}, -1);
      f32(p + "attn.proj.bias", {Dv}, -1);
      f32(p + "norm2.weight", {Dv}, -1);
      dense(p + "mlp.w1.weight", {Iv, Dv}, -1);
      dense(p + "mlp.w3.weight", {Iv, Dv}, -1);
      dense(p + "mlp.w2.weight", {Dv, Iv}, -1);
    }
    f32("vision.norm.weight", {Dv}, -1);
    dense("vision.projector.w1.weight", {P, v.merged_dim()}, -1);
    f32("vision.projector.w1.bias", {P}, -1);
    dense("vision.projector.w2.weight", {D, P}, -1);
    f32("vision.projector.w2.bias", {D}, -1);
  }
  return out;
}

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool DTypeAllowed(TensorClass cls, DType t) {
  switch (cls) {
    case TensorClass::kFloat32: return t == DType::kF32;
    case TensorClass::kBf16: return t == DType::kBF16 || t == DType::kF32 || t == DType::kF8E4M3;
    case TensorClass::kMxfp4Blocks:
    case TensorClass::kMxfp4Scales: return t == DType::kU8;
    case TensorClass::kBf16Experts: return t == DType::kBF16;
  }
  return false;
}

// "layers.3.ffn.experts.w13" for "layers.3.ffn.experts.w13.blocks" (.scales,
// .weight): the weight a routed-expert tensor of either format belongs to.
std::string ExpertWeightBase(const std::string& name) {
  for (const char* suffix : {".blocks", ".scales", ".weight"}) {
    const size_t n = std::char_traits<char>::length(suffix);
    if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) return name.substr(0, name.size() - n);
  }
  return name;
}

std::string_view AllowedText(TensorClass cls) {
  switch (cls) {
    case TensorClass::kFloat32: return "F32";
    case TensorClass::kBf16: return "BF16, F32, or F8_E4M3 with its weight_scale_inv";
    case TensorClass::kBf16Experts: return "BF16, as quantization.format \"bf16\" says";
    default: return "U8 (MXFP4)";
  }
}

// An FP8 matrix's block scales (model.md 1.1): F32 [ceil(rows/128),
// ceil(cols/128)] under the matrix's name + "_scale_inv", every one a
// positive finite number.
Status CheckFp8Scales(const Checkpoint& ck, const TensorSpec& spec, const TensorView& t) {
  const std::string name = spec.name + "_scale_inv";
  const TensorView* s = ck.Find(name);
  if (spec.shape.size() != 2)
    return Fail(Error::Corruption(*t.file, "tensor '" + spec.name + "': F8_E4M3 is allowed for matrices only"));
  const std::vector<int64_t> want = {(spec.shape[0] + 127) / 128, (spec.shape[1] + 127) / 128};
  if (!s)
    return Fail(Error::Corruption(*t.file, "tensor '" + spec.name + "' is F8_E4M3 but its block scales '" + name +
                                               "' (F32 " + ShapeString(want) + ") are missing"));
  if (s->dtype != DType::kF32 || s->shape != want)
    return Fail(Error::Corruption(*s->file, "tensor '" + name + "': " + std::string(DTypeName(s->dtype)) + " " +
                                                s->ShapeString() + ", expected F32 " + ShapeString(want)));
  for (size_t i = 0; i < static_cast<size_t>(want[0] * want[1]); ++i) {
    float v;
    std::memcpy(&v, s->data + 4 * i, 4);
    if (!std::isfinite(v) || v <= 0.0f)
      return Fail(Error::Corruption(*s->file, "tensor '" + name + "': block " + std::to_string(i) + " scale " +
                                                  std::to_string(v) + " is not a positive finite number"));
  }
  return Ok();
}

}  // namespace

Status ValidateCheckpoint(const Checkpoint& ck, const ModelConfig& config, std::vector<std::string>* warnings) {
  std::set<std::string> expected, expert_weights;
  const std::vector<TensorSpec> specs = ExpectedTensors(config);
  // The MTP module is optional as a whole: absent, the model loads without drafts.
  const TensorSpec* mtp_present = nullptr;
  for (const TensorSpec& spec : specs)
    if (spec.mtp && ck.Find(spec.name)) {
      mtp_present = &spec;
      break;
    }
  for (const TensorSpec& spec : specs) {
    expected.insert(spec.name);
    if (spec.routed_expert) expert_weights.insert(ExpertWeightBase(spec.name));
    const TensorView* t = ck.Find(spec.name);
    if (!t && spec.mtp && !mtp_present) continue;
    if (!t && spec.mtp) {
      std::string where = ck.shards().size() == 1 ? ck.shards()[0]->path() : "checkpoint";
      return Fail(Error::Corruption(where, "tensor '" + spec.name + "' is missing (the config needs shape " +
                                               ShapeString(spec.shape) + "): the checkpoint holds part of the "
                                               "multi-token-prediction module ('" + mtp_present->name + "'), which needs all of it"));
    }
    if (!t) {
      std::string where = ck.shards().size() == 1 ? ck.shards()[0]->path() : "checkpoint";
      return Fail(Error::Corruption(where, "tensor '" + spec.name + "' is missing (the config needs shape " +
                                               ShapeString(spec.shape) + ")"));
    }
    if (!DTypeAllowed(spec.cls, t->dtype))
      return Fail(Error::Corruption(*t->file, "tensor '" + spec.name + "': dtype " + std::string(DTypeName(t->dtype)) +
                                                  " is not allowed here (expected " + std::string(AllowedText(spec.cls)) + ")"));
    if (t->shape != spec.shape)
      return Fail(Error::Corruption(*t->file, "tensor '" + spec.name + "': shape " + t->ShapeString() +
                                                  " but the config needs " + ShapeString(spec.shape)));
    if (t->dtype == DType::kF8E4M3) {
      MOE_TRY(CheckFp8Scales(ck, spec, *t));
      expected.insert(spec.name + "_scale_inv");
    }
    if (spec.cls == TensorClass::kMxfp4Scales) {
      long long bad = kernels::Mxfp4FindNanScale(t->data, t->nbytes);
      if (bad >= 0)
        return Fail(Error::Corruption(*t->file, "tensor '" + spec.name + "': scale byte " + std::to_string(bad) +
                                                    " is 255 (NaN in E8M0)"));
    }
  }
  for (const TensorView* t : ck.AllTensors()) {
    if (expected.count(t->name)) continue;
    if (expert_weights.count(ExpertWeightBase(t->name)))
      return Fail(Error::Corruption(*t->file, "tensor '" + t->name +
                                                  "' holds routed experts in another format than config.json's "
                                                  "quantization.format \"" +
                                                  std::string(ExpertFormatName(config.expert_format)) + "\" (model.md 1.2)"));
    if (warnings) warnings->push_back(*t->file + ": tensor '" + t->name + "' is not used by this config");
  }
  return Ok();
}

ModelSummary Summarize(const Checkpoint& ck, const ModelConfig& c) {
  ModelSummary s;
  for (int i = 0; i < c.num_layers; ++i) {
    s.layers_by_kind[std::string(LayerKindName(c.layer_types[i]))]++;
    s.layers_by_kind[c.IsMoeLayer(i) ? "moe_ffn" : "dense_ffn"]++;
  }
  const double active_fraction =
      c.moe.num_experts ? static_cast<double>(c.moe.experts_per_token) / c.moe.num_experts : 0.0;
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    const TensorView* t = ck.Find(spec.name);
    if (!t) continue;
    s.bytes_by_dtype[std::string(DTypeName(t->dtype))] += t->nbytes;
    s.total_bytes += t->nbytes;
    if (const TensorView* fs = t->dtype == DType::kF8E4M3 ? ck.Find(spec.name + "_scale_inv") : nullptr) {
      s.bytes_by_dtype[std::string(DTypeName(fs->dtype))] += fs->nbytes;  // FP8 block scales: bytes, not parameters
      s.total_bytes += fs->nbytes;
    }
    if (spec.cls == TensorClass::kMxfp4Scales) continue;  // scales are not parameters (BF16 experts: one per element)
    int64_t params = t->numel();
    if (spec.cls == TensorClass::kMxfp4Blocks) params *= 2;  // two E2M1 elements per byte
    s.total_params += params;
    s.active_params += spec.routed_expert ? static_cast<int64_t>(params * active_fraction) : params;
  }
  return s;
}

std::string FormatSummary(const ModelSummary& s, const ModelConfig& c) {
  std::ostringstream o;
  auto human = [](double v) {
    char buf[32];
    if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
    else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
    else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
    else std::snprintf(buf, sizeof buf, "%.0f", v);
    return std::string(buf);
  };
  o << "architecture   " << c.architecture << "\n";
  o << "layers         " << c.num_layers << " (";
  bool first = true;
  for (const char* k : {"mla", "dsa", "delta"}) {
    auto it = s.layers_by_kind.find(k);
    if (it == s.layers_by_kind.end()) continue;
    o << (first ? "" : ", ") << k << " " << it->second;
    first = false;
  }
  o << "; ffn: dense " << (s.layers_by_kind.count("dense_ffn") ? s.layers_by_kind.at("dense_ffn") : 0) << ", moe "
    << (s.layers_by_kind.count("moe_ffn") ? s.layers_by_kind.at("moe_ffn") : 0) << ")\n";
  o << "layer kinds    ";
  for (int i = 0; i < c.num_layers; ++i)
    o << (i ? " " : "") << LayerKindName(c.layer_types[i]) << (c.IsMoeLayer(i) ? "+moe" : "+dense");
  o << "\n";
  o << "hidden         " << c.hidden_size << ", vocab " << c.vocab_size << ", experts " << c.moe.num_experts
    << " (top-" << c.moe.experts_per_token << ", " << c.moe.num_shared_experts << " shared)\n";
  o << "experts        " << ExpertFormatName(c.expert_format)
    << (c.expert_format == ExpertFormat::kBf16 ? " (routed experts BF16, model.md 1.2)" : " (routed experts MXFP4, model.md 7)")
    << "\n";
  if (c.vision) {
    const VisionConfig& v = *c.vision;
    o << "vision tower   " << v.num_layers << " blocks, hidden " << v.hidden_size << ", " << v.num_heads
      << " heads, mlp " << v.intermediate_size << "; patch " << v.patch_size << ", merge " << v.merge_size << "x"
      << v.merge_size << ", at most " << v.max_patches << " patches (" << v.max_patches / (v.merge_size * v.merge_size)
      << " image tokens); projector " << v.merged_dim() << " -> " << v.projector_hidden_size << " -> "
      << c.hidden_size << "; tokens image " << v.image_token_id << ", start " << v.image_start_token_id << ", end "
      << v.image_end_token_id << " (model.md 14)\n";
  } else {
    o << "vision tower   none (text only)\n";
  }
  o << "parameters     total " << human(static_cast<double>(s.total_params)) << " (" << s.total_params
    << "), active " << human(static_cast<double>(s.active_params)) << " (" << s.active_params << ")\n";
  o << "bytes          " << human(static_cast<double>(s.total_bytes)) << "B total";
  for (const auto& [dtype, bytes] : s.bytes_by_dtype) o << "; " << dtype << " " << bytes;
  o << "\n";
  return o.str();
}

}  // namespace moeserve::engine
