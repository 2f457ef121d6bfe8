#include "weights.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <utility>

#include "moeserve/engine/tensor_layout.hpp"

namespace moeserve::engine {
namespace {

// Tensors were validated (presence, dtype, shape) by ValidateCheckpoint;
// these helpers only convert.

// An FP8 matrix's block scales (model.md 1.1): "x.weight" -> "x.weight_scale_inv".
std::string Fp8ScaleName(const std::string& name) { return name + "_scale_inv"; }
// Memory about to be written for the first time (a reserved vector's) on
// 2 MiB pages where the system allows it: each first touch of a 4 KiB page
// is a fault, and under a hypervisor a fault costs far more than the page's
// bytes (the embedding's 470 MB at the real shapes: about 115,000 of them).
// Only the 2 MiB-aligned interior is advised; advice only.
void AdviseHugePages(const void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// F32 or BF16 to fp32, written once (a sized vector would zero its pages
// first: the embedding is hundreds of MB).
std::vector<float> ToF32(const TensorView& t) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out;
  out.reserve(n);
  AdviseHugePages(out.data(), n * sizeof(float));
  if (t.dtype == DType::kF32) {
    const auto* p = reinterpret_cast<const float*>(t.data);
    if (reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
      out.assign(p, p + n);
      return out;
    }
  }
  constexpr size_t kPiece = 4096;
  float piece[kPiece];
  for (size_t i0 = 0; i0 < n; i0 += kPiece) {
    const size_t m = std::min(kPiece, n - i0);
    if (t.dtype == DType::kF32) {
      std::memcpy(piece, t.data + 4 * i0, m * 4);
    } else {
      for (size_t i = 0; i < m; ++i) {
        uint16_t b;
        std::memcpy(&b, t.data + 2 * (i0 + i), 2);
        piece[i] = Bf16ToF32(b);
      }
    }
    out.insert(out.end(), piece, piece + m);
  }
  return out;
}

// Each tensor is dropped as soon as it is copied or converted: with a
// converting source (tensor_source.hpp) one converted tensor is alive at a time.
class Loader {
 public:
  Loader(TensorSource& src, kernels::WeightArena& arena) : src_(src), arena_(arena) {}
  Result<std::vector<float>> Vec(const std::string& name) {
    MOE_ASSIGN_OR_RETURN(HeldTensor h, src_.Get(name));
    return ToF32(h.view);
  }
  // A matrix whose elements the layers index: fp32 (FP8 converted exactly,
  // code * scale rounded once).
  Result<Matrix> Mat(const std::string& name) {
    MOE_ASSIGN_OR_RETURN(HeldTensor h, src_.Get(name));
    return MatOfHeld(name, h);
  }
  // Mat, and beside it the matrix as stored when it is BF16 (copied into
  // the arena; else an empty one), read and converted once: wkv_b, whose
  // BF16 copy the absorbed MLA form reads when the checkpoint holds BF16.
  Result<std::pair<Matrix, Matrix>> MatAndBf16IfStored(const std::string& name) {
    MOE_ASSIGN_OR_RETURN(HeldTensor h, src_.Get(name));
    MOE_ASSIGN_OR_RETURN(Matrix m, MatOfHeld(name, h));
    Matrix bf16;
    if (h.view.dtype == DType::kBF16 && h.view.shape.size() == 2) {
      bf16.bf16 = reinterpret_cast<const uint16_t*>(KeepOrCopy(h, h.view.nbytes));
      bf16.rows = static_cast<int>(h.view.shape[0]);
      bf16.cols = static_cast<int>(h.view.shape[1]);
    }
    return std::make_pair(std::move(m), std::move(bf16));
  }
  Result<Matrix> MatOfHeld(const std::string& name, const HeldTensor& h) {
    if (h.view.dtype == DType::kF8E4M3) {
      if (h.view.shape.size() != 2) return Fail(Error::NotFound("matrix '" + name + "' is missing"));
      MOE_ASSIGN_OR_RETURN(HeldTensor hs, src_.Get(Fp8ScaleName(name)));
      std::vector<float> scales(ScaleCount(h.view));
      MOE_ASSIGN_OR_RETURN(kernels::Fp8BlockView v, Fp8View(name, h.view, hs.view, scales));
      Matrix m{std::vector<float>(v.rows * v.cols), {}, nullptr, nullptr, static_cast<int>(v.rows), static_cast<int>(v.cols)};
      kernels::Fp8BlockToF32(v, 0, v.rows, m.w.data());
      return m;
    }
    return MatOf(name, h.view);
  }
  // A matrix only multiplied through Linear(): BF16 stays BF16, FP8 stays
  // FP8 with its block scales (both in weight memory as stored: KeepOrCopy).
  Result<Matrix> Linear(const std::string& name) {
    MOE_ASSIGN_OR_RETURN(HeldTensor h, src_.Get(name));
    const TensorView* t = &h.view;
    if (t->dtype == DType::kF8E4M3) {
      if (t->shape.size() != 2) return Fail(Error::NotFound("matrix '" + name + "' is missing"));
      MOE_ASSIGN_OR_RETURN(HeldTensor hs, src_.Get(Fp8ScaleName(name)));
      const size_t count = ScaleCount(*t);
      float* scales = static_cast<float*>(arena_.Allocate(count * sizeof(float)));
      MOE_ASSIGN_OR_RETURN(kernels::Fp8BlockView v, Fp8View(name, *t, hs.view, std::span<float>(scales, count)));
      Matrix m;
      m.fp8 = KeepOrCopy(h, v.rows * v.cols);
      m.fp8_scales = scales;
      m.rows = static_cast<int>(v.rows);
      m.cols = static_cast<int>(v.cols);
      return m;
    }
    if (t->dtype != DType::kBF16) return MatOf(name, *t);
    if (t->shape.size() != 2) return Fail(Error::NotFound("matrix '" + name + "' is missing"));
    Matrix m;
    m.bf16 = reinterpret_cast<const uint16_t*>(KeepOrCopy(h, t->nbytes));
    m.rows = static_cast<int>(t->shape[0]);
    m.cols = static_cast<int>(t->shape[1]);
    return m;
  }
  // Experts [first, first + count) only: the checkpoint is mapped, so the
  // pages of other ranks' experts are never read.
  Result<ExpertStack> Experts(const std::string& base, ExpertFormat format, int first, int count) {
    if (format == ExpertFormat::kBf16) return Bf16Experts(base, first, count);
    MOE_ASSIGN_OR_RETURN(HeldTensor hb, src_.Get(base + ".blocks"));
    MOE_ASSIGN_OR_RETURN(HeldTensor hs, src_.Get(base + ".scales"));
    const TensorView* b = &hb.view;
    const TensorView* s = &hs.view;
    if (b->shape.size() != 4 || s->shape.size() != 3)
      return Fail(Error::NotFound("MXFP4 weight '" + base + "' is missing"));
    MOE_TRY(CheckExpertRange(base, b->shape[0], first, count));
    ExpertStack m;
    m.format = ExpertFormat::kMxfp4;
    m.experts = count;
    m.rows = static_cast<int>(b->shape[1]);
    m.cols = static_cast<int>(b->shape[2] * 32);
    const size_t block_bytes = static_cast<size_t>(m.rows) * static_cast<size_t>(m.cols) / 2;
    const size_t scale_bytes = static_cast<size_t>(m.rows) * static_cast<size_t>(m.cols) / 32;
    m.packed = kernels::Mxfp4PackedStack(b->data + static_cast<size_t>(first) * block_bytes,
                                         s->data + static_cast<size_t>(first) * scale_bytes, static_cast<size_t>(count),
                                         static_cast<size_t>(m.rows), static_cast<size_t>(m.cols));
    return m;
  }

 private:
  // The tensor's bytes as the weight: a file mapping the source handed out
  // (HeldTensor::mapping: a published shard's bytes, read in place, the
  // mapping kept for the weights' life), a buffer the source made for it
  // (HeldTensor::storage, huge-page memory never zeroed) kept as it is, else
  // a copy into the arena.
  const uint8_t* KeepOrCopy(HeldTensor& h, size_t nbytes) {
    if (h.mapping && h.view.nbytes == nbytes) {
      arena_.KeepMapped(std::move(h.mapping), nbytes);
      return h.view.data;
    }
    if (h.storage.data() != nullptr && h.storage.data() == h.view.data && h.storage.size() == nbytes)
      return arena_.Adopt(std::move(h.storage));
    void* dst = arena_.Allocate(nbytes);
    std::memcpy(dst, h.view.data, nbytes);
    return static_cast<const uint8_t*>(dst);
  }
  static Result<Matrix> MatOf(const std::string& name, const TensorView& t) {
    if (t.shape.size() != 2) return Fail(Error::NotFound("matrix '" + name + "' is missing"));
    return Matrix{ToF32(t), {}, nullptr, nullptr, static_cast<int>(t.shape[0]), static_cast<int>(t.shape[1])};
  }
  // An FP8 matrix and its block scales, checked (a source need not have been
  // validated as a whole): shapes, dtypes, no NaN code, every scale a
  // positive finite number. The view's scales are a copy (`scales`: a mapped
  // F32 tensor need not be 4-byte aligned).
  static Result<kernels::Fp8BlockView> Fp8View(const std::string& name, const TensorView& t, const TensorView& s,
                                               std::span<float> scales) {
    const size_t rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
    const kernels::Fp8BlockView v{t.data, scales.data(), rows, cols};
    const std::vector<int64_t> want = {static_cast<int64_t>(v.scale_rows()), static_cast<int64_t>(v.scale_cols())};
    if (s.dtype != DType::kF32 || s.shape != want || scales.size() != v.scale_rows() * v.scale_cols())
      return Fail(Error::Corruption(*s.file, "tensor '" + Fp8ScaleName(name) + "': " + std::string(DTypeName(s.dtype)) +
                                                 " " + s.ShapeString() + ", expected F32 [" + std::to_string(want[0]) +
                                                 ", " + std::to_string(want[1]) + "] (the 128 x 128 block scales of '" +
                                                 name + "')"));
    std::memcpy(scales.data(), s.data, scales.size() * sizeof(float));
    for (size_t i = 0; i < scales.size(); ++i)
      if (!std::isfinite(scales[i]) || scales[i] <= 0.0f)
        return Fail(Error::Corruption(*s.file, "tensor '" + Fp8ScaleName(name) + "': block " + std::to_string(i) +
                                                   " scale " + std::to_string(scales[i]) +
                                                   " is not a positive finite number"));
    if (const long long bad = kernels::Fp8FindNan(t.data, rows * cols); bad >= 0)
      return Fail(Error::Corruption(*t.file, "tensor '" + name + "': element [" + std::to_string(bad / static_cast<long long>(cols)) +
                                                 ", " + std::to_string(bad % static_cast<long long>(cols)) + "] is an FP8 NaN"));
    return v;
  }
  static size_t ScaleCount(const TensorView& t) {
    return kernels::Fp8BlockScaleCount(static_cast<size_t>(t.shape[0]), static_cast<size_t>(t.shape[1]));
  }
  // BF16 experts (model.md 1.2): this rank's slice copied as stored, each
  // expert a BF16 [rows, cols] matrix for the BF16 kernels.
  Result<ExpertStack> Bf16Experts(const std::string& base, int first, int count) {
    MOE_ASSIGN_OR_RETURN(HeldTensor h, src_.Get(base + ".weight"));
    const TensorView* t = &h.view;
    if (t->shape.size() != 3 || t->dtype != DType::kBF16)
      return Fail(Error::NotFound("BF16 expert weight '" + base + ".weight' is missing"));
    MOE_TRY(CheckExpertRange(base + ".weight", t->shape[0], first, count));
    ExpertStack m;
    m.format = ExpertFormat::kBf16;
    m.experts = count;
    m.rows = static_cast<int>(t->shape[1]);
    m.cols = static_cast<int>(t->shape[2]);
    const size_t per_expert = static_cast<size_t>(m.rows) * static_cast<size_t>(m.cols) * sizeof(uint16_t);
    const size_t n = per_expert * static_cast<size_t>(count);
    // The whole stack made for this load (a converting source's buffer) is
    // kept as it is; a slice, or a mapped checkpoint's, is copied.
    if (h.storage.data() != nullptr && h.storage.data() == t->data && h.storage.size() == n) {
      m.bf16 = std::move(h.storage);
      return m;
    }
    m.bf16 = kernels::WeightBuffer(n);
    std::memcpy(m.bf16.data(), t->data + static_cast<size_t>(first) * per_expert, n);
    return m;
  }
  static Status CheckExpertRange(const std::string& name, int64_t stored, int first, int count) {
    if (first < 0 || count < 1 || first + count > stored)
      return Fail(Error::InvalidArgument("expert weight '" + name + "': experts [" + std::to_string(first) + ", " +
                                         std::to_string(first + count) + ") outside the " + std::to_string(stored) +
                                         " stored"));
    return Ok();
  }

  TensorSource& src_;
  kernels::WeightArena& arena_;
};

// A source whose tensors named in the layout (ExpectedTensors, the MTP
// module's) must have its shape and an allowed dtype; others pass as they are.
class ShapeCheckedSource final : public TensorSource {
 public:
  ShapeCheckedSource(TensorSource& inner, const ModelConfig& c) : inner_(inner) {
    for (TensorSpec& spec : ExpectedTensors(c)) {
      // A gated shared expert is as wide as its tensors say (MoeConfig).
      if (c.moe.shared_expert_gate && spec.name.find(".ffn.shared.") != std::string::npos) continue;
      if (spec.mtp) specs_.emplace(spec.name, std::move(spec));
    }
  }
  Result<HeldTensor> Get(const std::string& name) override {
    MOE_ASSIGN_OR_RETURN(HeldTensor h, inner_.Get(name));
    const auto it = specs_.find(name);
    if (it == specs_.end()) return h;
    const TensorSpec& spec = it->second;
    const TensorView& t = h.view;
    bool dtype_ok = false;
    switch (spec.cls) {
      case TensorClass::kFloat32: dtype_ok = t.dtype == DType::kF32; break;
      case TensorClass::kBf16:
        dtype_ok = t.dtype == DType::kBF16 || t.dtype == DType::kF32 || t.dtype == DType::kF8E4M3;
        break;
      case TensorClass::kBf16Experts: dtype_ok = t.dtype == DType::kBF16; break;
      default: dtype_ok = t.dtype == DType::kU8; break;
    }
    if (!dtype_ok)
      return Fail(Error::InvalidArgument("tensor '" + name + "': dtype " + std::string(DTypeName(t.dtype)) +
                                         " is not allowed for the multi-token-prediction module"));
    if (t.shape != spec.shape) {
      std::string want = "[";
      for (size_t i = 0; i < spec.shape.size(); ++i) want += (i ? ", " : "") + std::to_string(spec.shape[i]);
      return Fail(Error::InvalidArgument("tensor '" + name + "': shape " + t.ShapeString() + " but the config needs " +
                                         want + "]"));
    }
    return h;
  }

 private:
  TensorSource& inner_;
  std::map<std::string, TensorSpec> specs_;
};

// One decoder block under prefix p ("layers.3.", "mtp.0."): attention of
// `kind`, then a dense SwiGLU or the MoE (this rank's experts).
Result<LayerWeights> LoadBlock(Loader& L, kernels::WeightArena& arena, const ModelConfig& c, const std::string& p,
                               LayerKind kind, bool moe, int first_expert, int local_experts) {
  LayerWeights lw;
  lw.kind = kind;
  MOE_ASSIGN_OR_RETURN(lw.attn_norm, L.Vec(p + "attn_norm.weight"));
  MOE_ASSIGN_OR_RETURN(lw.ffn_norm, L.Vec(p + "ffn_norm.weight"));
  if (lw.kind == LayerKind::kGqa) {
    MOE_ASSIGN_OR_RETURN(lw.wq, L.Linear(p + "attn.wq.weight"));
    MOE_ASSIGN_OR_RETURN(lw.wg, L.Linear(p + "attn.wg.weight"));
    MOE_ASSIGN_OR_RETURN(lw.wk, L.Linear(p + "attn.wk.weight"));
    MOE_ASSIGN_OR_RETURN(lw.wv, L.Linear(p + "attn.wv.weight"));
    MOE_ASSIGN_OR_RETURN(lw.wo, L.Linear(p + "attn.wo.weight"));
    MOE_ASSIGN_OR_RETURN(lw.q_norm, L.Vec(p + "attn.q_norm.weight"));
    MOE_ASSIGN_OR_RETURN(lw.k_norm, L.Vec(p + "attn.k_norm.weight"));
  } else if (lw.kind != LayerKind::kDelta) {
    MOE_ASSIGN_OR_RETURN(lw.wq_a, L.Linear(p + "attn.wq_a.weight"));
    MOE_ASSIGN_OR_RETURN(lw.q_norm, L.Vec(p + "attn.q_norm.weight"));
    MOE_ASSIGN_OR_RETURN(lw.wq_b, L.Linear(p + "attn.wq_b.weight"));
    MOE_ASSIGN_OR_RETURN(lw.wkv_a, L.Linear(p + "attn.wkv_a.weight"));
    MOE_ASSIGN_OR_RETURN(lw.kv_norm, L.Vec(p + "attn.kv_norm.weight"));
    MOE_ASSIGN_OR_RETURN(auto wkv_b, L.MatAndBf16IfStored(p + "attn.wkv_b.weight"));
    lw.wkv_b = std::move(wkv_b.first);
    {
      const size_t H = static_cast<size_t>(c.mla.num_heads), nope = static_cast<size_t>(c.mla.qk_nope_head_dim);
      const size_t vd = static_cast<size_t>(c.mla.v_head_dim), kvl = static_cast<size_t>(c.mla.kv_lora_rank);
      // W_uk^T[h][l][i] = wkv_b[h * (nope + vd) + i][l].
      const auto transpose = [&](auto* dst, const auto* src) {
        for (size_t h = 0; h < H; ++h)
          for (size_t i = 0; i < nope; ++i)
            for (size_t l = 0; l < kvl; ++l) dst[(h * kvl + l) * nope + i] = src[(h * (nope + vd) + i) * kvl + l];
      };
      const Matrix& bf16 = wkv_b.second;
      if (bf16.bf16) {
        lw.wkv_b_bf16 = bf16.bf16;
        auto* t = static_cast<uint16_t*>(arena.Allocate(H * kvl * nope * sizeof(uint16_t)));
        transpose(t, bf16.bf16);
        lw.w_uk_t_bf16 = t;
      } else {
        lw.w_uk_t.resize(H * kvl * nope);
        transpose(lw.w_uk_t.data(), lw.wkv_b.w.data());
      }
    }
    MOE_ASSIGN_OR_RETURN(lw.wo, L.Linear(p + "attn.wo.weight"));
    if (c.mla.output_gate) {
      MOE_ASSIGN_OR_RETURN(lw.wg, L.Linear(p + "attn.wg.weight"));
    }
    if (lw.kind == LayerKind::kDsa) {
      MOE_ASSIGN_OR_RETURN(lw.idx_wq_b, L.Linear(p + "attn.indexer.wq_b.weight"));
      MOE_ASSIGN_OR_RETURN(lw.idx_wk, L.Linear(p + "attn.indexer.wk.weight"));
      MOE_ASSIGN_OR_RETURN(lw.idx_weights_proj, L.Linear(p + "attn.indexer.weights_proj.weight"));
      MOE_ASSIGN_OR_RETURN(lw.idx_k_norm_w, L.Vec(p + "attn.indexer.k_norm.weight"));
      MOE_ASSIGN_OR_RETURN(lw.idx_k_norm_b, L.Vec(p + "attn.indexer.k_norm.bias"));
    }
  } else {
    MOE_ASSIGN_OR_RETURN(lw.q_proj, L.Linear(p + "attn.q_proj.weight"));
    MOE_ASSIGN_OR_RETURN(lw.k_proj, L.Linear(p + "attn.k_proj.weight"));
    MOE_ASSIGN_OR_RETURN(lw.v_proj, L.Linear(p + "attn.v_proj.weight"));
    MOE_ASSIGN_OR_RETURN(lw.a_proj, L.Linear(p + "attn.a_proj.weight"));
    MOE_ASSIGN_OR_RETURN(lw.b_proj, L.Linear(p + "attn.b_proj.weight"));
    MOE_ASSIGN_OR_RETURN(lw.g_proj, L.Linear(p + "attn.g_proj.weight"));
    MOE_ASSIGN_OR_RETURN(lw.o_proj, L.Linear(p + "attn.o_proj.weight"));
    MOE_ASSIGN_OR_RETURN(lw.q_conv, L.Mat(p + "attn.q_conv1d.weight"));
    MOE_ASSIGN_OR_RETURN(lw.k_conv, L.Mat(p + "attn.k_conv1d.weight"));
    MOE_ASSIGN_OR_RETURN(lw.v_conv, L.Mat(p + "attn.v_conv1d.weight"));
    MOE_ASSIGN_OR_RETURN(lw.A_log, L.Vec(p + "attn.A_log"));
    MOE_ASSIGN_OR_RETURN(lw.dt_bias, L.Vec(p + "attn.dt_bias"));
    MOE_ASSIGN_OR_RETURN(lw.o_norm, L.Vec(p + "attn.o_norm.weight"));
  }
  lw.moe = moe;
  if (!lw.moe) {
    MOE_ASSIGN_OR_RETURN(lw.w1, L.Linear(p + "ffn.w1.weight"));
    MOE_ASSIGN_OR_RETURN(lw.w3, L.Linear(p + "ffn.w3.weight"));
    MOE_ASSIGN_OR_RETURN(lw.w2, L.Linear(p + "ffn.w2.weight"));
  } else {
    MOE_ASSIGN_OR_RETURN(lw.gate, L.Linear(p + "ffn.gate.weight"));
    // The bias only selects experts in sigmoid routing; softmax routing has none.
    if (c.moe.score_func != "softmax") {
      MOE_ASSIGN_OR_RETURN(lw.gate_bias, L.Vec(p + "ffn.gate.bias"));
    }
    MOE_ASSIGN_OR_RETURN(lw.w13, L.Experts(p + "ffn.experts.w13", c.expert_format, first_expert, local_experts));
    MOE_ASSIGN_OR_RETURN(lw.w2e, L.Experts(p + "ffn.experts.w2", c.expert_format, first_expert, local_experts));
    lw.first_expert = first_expert;
    if (c.moe.num_shared_experts > 0) {
      MOE_ASSIGN_OR_RETURN(lw.shared_w1, L.Linear(p + "ffn.shared.w1.weight"));
      MOE_ASSIGN_OR_RETURN(lw.shared_w3, L.Linear(p + "ffn.shared.w3.weight"));
      MOE_ASSIGN_OR_RETURN(lw.shared_w2, L.Linear(p + "ffn.shared.w2.weight"));
      if (c.moe.shared_expert_gate) {
        MOE_ASSIGN_OR_RETURN(lw.shared_gate, L.Linear(p + "ffn.shared.gate.weight"));
      }
    }
  }
  return lw;
}

}  // namespace

Result<ModelWeights> LoadWeights(const Checkpoint& ck, const ModelConfig& c, int ep_rank, int ep_world, bool mtp) {
  CheckpointSource src(ck);
  return LoadWeights(src, c, ep_rank, ep_world, mtp);
}

Result<ModelWeights> LoadWeights(TensorSource& ck, const ModelConfig& c, int ep_rank, int ep_world, bool mtp) {
  MOE_TRY(ValidateWorldSize(c, ep_world));
  if (ep_rank < 0 || ep_rank >= ep_world)
    return Fail(Error::InvalidArgument("expert-parallel rank " + std::to_string(ep_rank) + " outside a world of " + std::to_string(ep_world)));
  const int local_experts = c.moe.num_experts / ep_world, first_expert = ep_rank * local_experts;
  ModelWeights w;
  Loader L(ck, *w.arena);
  MOE_ASSIGN_OR_RETURN(w.embed, L.Mat("embed.weight"));
  MOE_ASSIGN_OR_RETURN(w.head, L.Linear("head.weight"));
  MOE_ASSIGN_OR_RETURN(w.norm, L.Vec("norm.weight"));
  for (int i = 0; i < c.num_layers; ++i) {
    MOE_ASSIGN_OR_RETURN(LayerWeights lw, LoadBlock(L, *w.arena, c, "layers." + std::to_string(i) + ".", c.layer_types[i],
                                                    c.IsMoeLayer(i), first_expert, local_experts));
    w.layers.push_back(std::move(lw));
  }
  if (mtp && c.num_nextn_predict_layers > 0) {
    // Absent as a whole: no drafts. Once its first tensor is there, every
    // other one must be (the loader names a missing one).
    // Its tensors are checked against the layout as they are read: a source
    // that was not validated as a whole (a family's mapping) refuses a
    // malformed one by name too.
    ShapeCheckedSource checked(ck, c);
    Loader M(checked, *w.arena);
    Result<std::vector<float>> enorm = M.Vec("mtp.0.enorm.weight");
    if (enorm) {
      auto m = std::make_unique<MtpWeights>();
      m->enorm = std::move(*enorm);
      MOE_ASSIGN_OR_RETURN(m->hnorm, M.Vec("mtp.0.hnorm.weight"));
      MOE_ASSIGN_OR_RETURN(m->eh_proj, M.Linear("mtp.0.eh_proj.weight"));
      MOE_ASSIGN_OR_RETURN(m->block, LoadBlock(M, *w.arena, c, "mtp.0.", c.mtp_kind, c.mtp_moe, first_expert, local_experts));
      MOE_ASSIGN_OR_RETURN(m->norm, M.Vec("mtp.0.norm.weight"));
      w.mtp = std::move(m);
    } else if (enorm.error().code() != ErrorCode::kNotFound) {
      return Fail(enorm.error());
    }
  }
  if (c.vision) {
    auto v = std::make_unique<VisionWeights>();
    MOE_ASSIGN_OR_RETURN(v->patch_embed, L.Linear("vision.patch_embed.weight"));
    MOE_ASSIGN_OR_RETURN(v->patch_bias, L.Vec("vision.patch_embed.bias"));
    for (int i = 0; i < c.vision->num_layers; ++i) {
      const std::string p = "vision.blocks." + std::to_string(i) + ".";
      VisionBlockWeights b;
      MOE_ASSIGN_OR_RETURN(b.norm1, L.Vec(p + "norm1.weight"));
      MOE_ASSIGN_OR_RETURN(b.qkv, L.Linear(p + "attn.qkv.weight"));
      MOE_ASSIGN_OR_RETURN(b.qkv_bias, L.Vec(p + "attn.qkv.bias"));
      MOE_ASSIGN_OR_RETURN(b.proj, L.Linear(p + "attn.proj.weight"));
      MOE_ASSIGN_OR_RETURN(b.proj_bias, L.Vec(p + "attn.proj.bias"));
      MOE_ASSIGN_OR_RETURN(b.norm2, L.Vec(p + "norm2.weight"));
      MOE_ASSIGN_OR_RETURN(b.w1, L.Linear(p + "mlp.w1.weight"));
      MOE_ASSIGN_OR_RETURN(b.w3, L.Linear(p + "mlp.w3.weight"));
      MOE_ASSIGN_OR_RETURN(b.w2, L.Linear(p + "mlp.w2.weight"));
      v->blocks.push_back(std::move(b));
    }
    MOE_ASSIGN_OR_RETURN(v->norm, L.Vec("vision.norm.weight"));
    MOE_ASSIGN_OR_RETURN(v->proj1, L.Linear("vision.projector.w1.weight"));
    MOE_ASSIGN_OR_RETURN(v->proj1_bias, L.Vec("vision.projector.w1.bias"));
    MOE_ASSIGN_OR_RETURN(v->proj2, L.Linear("vision.projector.w2.weight"));
    MOE_ASSIGN_OR_RETURN(v->proj2_bias, L.Vec("vision.projector.w2.bias"));
    w.vision = std::move(v);
  }
  return w;
}

size_t ResidentWeightBytes(const ModelWeights& w) {
  const auto vec = [](const std::vector<float>& v) { return v.size() * sizeof(float); };
  // BF16 matrices live in the arena; fp32 matrices in their own vectors.
  size_t total = w.arena->bytes_used() + w.embed.w.size() * 4 + w.head.w.size() * 4 + vec(w.norm);
  std::vector<const LayerWeights*> blocks;
  for (const LayerWeights& l : w.layers) blocks.push_back(&l);
  if (w.mtp) {
    blocks.push_back(&w.mtp->block);
    total += vec(w.mtp->enorm) + vec(w.mtp->hnorm) + vec(w.mtp->norm) + w.mtp->eh_proj.w.size() * 4;
  }
  for (const LayerWeights* lp : blocks) {
    const LayerWeights& l = *lp;
    total += vec(l.attn_norm) + vec(l.ffn_norm) + vec(l.w_uk_t) + vec(l.q_norm) + vec(l.kv_norm) + vec(l.idx_k_norm_w) +
             vec(l.idx_k_norm_b) + vec(l.A_log) + vec(l.dt_bias) + vec(l.o_norm) + vec(l.gate_bias) + vec(l.k_norm);
    for (const Matrix* m : {&l.wq_a, &l.wq_b, &l.wkv_a, &l.wkv_b, &l.wo, &l.wg, &l.idx_wq_b, &l.idx_wk, &l.idx_weights_proj,
                            &l.q_proj, &l.k_proj, &l.v_proj, &l.a_proj, &l.b_proj, &l.g_proj, &l.o_proj, &l.q_conv,
                            &l.k_conv, &l.v_conv, &l.w1, &l.w3, &l.w2, &l.gate, &l.shared_w1, &l.shared_w3, &l.shared_w2,
                            &l.shared_gate, &l.wq, &l.wk, &l.wv})
      total += m->w.size() * 4;
    total += l.w13.bytes() + l.w2e.bytes();
  }
  if (w.vision) {
    const VisionWeights& v = *w.vision;
    total += vec(v.patch_bias) + vec(v.norm) + vec(v.proj1_bias) + vec(v.proj2_bias);
    for (const Matrix* m : {&v.patch_embed, &v.proj1, &v.proj2}) total += m->w.size() * 4;
    for (const VisionBlockWeights& b : v.blocks) {
      total += vec(b.norm1) + vec(b.norm2) + vec(b.qkv_bias) + vec(b.proj_bias);
      for (const Matrix* m : {&b.qkv, &b.proj, &b.w1, &b.w3, &b.w2}) total += m->w.size() * 4;
    }
  }
  return total;
}

size_t RoutedExpertBytes(const ModelWeights& w) {
  size_t total = 0;
  for (const LayerWeights& l : w.layers) total += l.w13.bytes() + l.w2e.bytes();
  if (w.mtp) total += w.mtp->block.w13.bytes() + w.mtp->block.w2e.bytes();
  return total;
}

void AddMatrix(const Matrix& m, double* bytes, double* weights) {
  if (m.bytes() == 0) return;
  *bytes += static_cast<double>(m.bytes());
  *weights += static_cast<double>(m.rows) * static_cast<double>(m.cols);
}

DecodeWeightBytes DecodeReadBytes(const ModelWeights& w, int experts_per_token) {
  const auto vec = [](const std::vector<float>& v) { return static_cast<double>(v.size() * sizeof(float)); };
  DecodeWeightBytes d;
  d.experts_per_token = experts_per_token;
  if (w.embed.rows > 0) d.embed_row = static_cast<double>(w.embed.bytes()) / w.embed.rows;
  AddMatrix(w.head, &d.dense, &d.dense_weights);
  d.dense += vec(w.norm);
  double routed = 0, routed_weights = 0;
  for (const LayerWeights& l : w.layers) {
    d.dense += vec(l.attn_norm) + vec(l.ffn_norm) + vec(l.q_norm) + vec(l.kv_norm) + vec(l.idx_k_norm_w) +
               vec(l.idx_k_norm_b) + vec(l.A_log) + vec(l.dt_bias) + vec(l.o_norm) + vec(l.gate_bias) + vec(l.k_norm);
    for (const Matrix* m : {&l.wq_a, &l.wq_b, &l.wkv_a, &l.wo, &l.wg, &l.idx_wq_b, &l.idx_wk, &l.idx_weights_proj,
                            &l.q_proj, &l.k_proj, &l.v_proj, &l.a_proj, &l.b_proj, &l.g_proj, &l.o_proj, &l.q_conv,
                            &l.k_conv, &l.v_conv, &l.w1, &l.w3, &l.w2, &l.gate, &l.shared_w1, &l.shared_w3, &l.shared_w2,
                            &l.shared_gate, &l.wq, &l.wk, &l.wv})
      AddMatrix(*m, &d.dense, &d.dense_weights);
    if (l.wkv_b.rows > 0) {
      const double n = static_cast<double>(l.wkv_b.rows) * l.wkv_b.cols;
      d.dense += (l.wkv_b_bf16 ? 2.0 : 4.0) * n;
      d.dense_weights += n;
    }
    if (l.moe && l.w13.experts > 0) {
      ++d.moe_layers;
      routed += static_cast<double>(l.w13.bytes() + l.w2e.bytes()) / l.w13.experts;
      routed_weights += (static_cast<double>(l.w13.rows) * l.w13.cols + static_cast<double>(l.w2e.rows) * l.w2e.cols);
    }
  }
  if (d.moe_layers > 0) {
    d.expert = routed / d.moe_layers;
    d.expert_weights = routed_weights / d.moe_layers;
  }
  return d;
}

}  // namespace moeserve::engine
