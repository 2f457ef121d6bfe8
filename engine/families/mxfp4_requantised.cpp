#include "families/mxfp4_requantised.hpp"

#include <algorithm>
#include <cstring>

#include "moeserve/engine/dtype.hpp"
#include "moeserve/kernels/mxfp4.hpp"

namespace moeserve::engine::families {

namespace {

HeldTensor Made(const std::string& name, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  HeldTensor h;
  h.bytes = std::move(bytes);
  h.view.name = name;
  h.view.dtype = DType::kU8;
  h.view.shape = std::move(shape);
  h.view.data = h.bytes.data();
  h.view.nbytes = h.bytes.size();
  return h;
}

}  // namespace

Mxfp4RequantisedSource::Mxfp4RequantisedSource(std::shared_ptr<const Checkpoint> checkpoint,
                                               std::vector<std::string> experts)
    : ck_(std::move(checkpoint)), experts_(std::move(experts)) {}

Status Mxfp4RequantisedSource::Encode(const std::string& base) {
  const std::string name = base + ".weight";
  const TensorView* t = ck_->Find(name);
  if (!t) return Fail(Error::NotFound("tensor '" + name + "' is missing"));
  if (t->dtype != DType::kBF16 || t->shape.size() != 3)
    return Fail(Error::InvalidArgument("tensor '" + name + "': BF16 experts [E, rows, cols] expected, got " +
                                       std::string(DTypeName(t->dtype)) + " " + t->ShapeString()));
  const size_t E = static_cast<size_t>(t->shape[0]), rows = static_cast<size_t>(t->shape[1]);
  const size_t cols = static_cast<size_t>(t->shape[2]), n = rows * cols;
  if (cols % 32)
    return Fail(Error::InvalidArgument("tensor '" + name + "': " + std::to_string(cols) +
                                       " columns is not a multiple of 32 (MXFP4 blocks)"));
  std::vector<uint8_t> blocks(E * n / 2), scales(E * n / 32);
  std::vector<float> f32(n);
  for (size_t e = 0; e < E; ++e) {
    const uint8_t* src = t->data + e * n * 2;
    for (size_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      f32[i] = Bf16ToF32(b);
    }
    const long long bad = kernels::Mxfp4EncodeMatrix(f32.data(), rows, cols, blocks.data() + e * n / 2,
                                                     scales.data() + e * n / 32);
    if (bad >= 0) {
      const size_t at = static_cast<size_t>(bad);
      return Fail(Error::Corruption(*t->file, "tensor '" + name + "': expert " + std::to_string(e) + ", element " +
                                                  std::to_string(e * n + at) + " (row " + std::to_string(at / cols) +
                                                  ", column " + std::to_string(at % cols) +
                                                  ") is not finite; cannot requantise to MXFP4"));
    }
  }
  const int64_t R = static_cast<int64_t>(rows), B = static_cast<int64_t>(cols / 32);
  blocks_ = Made(base + ".blocks", {t->shape[0], R, B, 16}, std::move(blocks));
  scales_ = Made(base + ".scales", {t->shape[0], R, B}, std::move(scales));
  encoded_ = base;
  return Ok();
}

Result<HeldTensor> Mxfp4RequantisedSource::Get(const std::string& name) {
  for (const std::string& base : experts_) {
    if (name.size() <= base.size() || name.compare(0, base.size(), base) != 0) continue;
    const std::string suffix = name.substr(base.size());
    if (suffix == ".weight")
      return Fail(Error::NotFound("tensor '" + name + "' is requantised to MXFP4 (" + base + ".blocks/.scales)"));
    if (suffix != ".blocks" && suffix != ".scales") continue;
    if (encoded_ != base) MOE_TRY(Encode(base));
    // Each half is handed over once; the next request of either encodes anew.
    HeldTensor out = std::move(suffix == ".blocks" ? blocks_ : scales_);
    out.view.data = out.bytes.data();
    if (out.bytes.empty()) {
      MOE_TRY(Encode(base));
      out = std::move(suffix == ".blocks" ? blocks_ : scales_);
      out.view.data = out.bytes.data();
    }
    return out;
  }
  const TensorView* t = ck_->Find(name);
  if (!t) return Fail(Error::NotFound("tensor '" + name + "' is missing"));
  HeldTensor h;
  h.view = *t;
  return h;
}

std::vector<std::string> RoutedExpertBases(const std::vector<std::string>& names) {
  std::vector<std::string> bases;
  for (const std::string& n : names)
    for (const char* tail : {".ffn.experts.w13.weight", ".ffn.experts.w2.weight"})
      if (n.ends_with(tail)) bases.push_back(n.substr(0, n.size() - 7));
  return bases;
}

}  // namespace moeserve::engine::families
