// The tower's config checks and the resize rule's patch grid
// (model-format section 14.1, 14.2).
#include <cmath>

#include "moeserve/engine/vision.hpp"

namespace moeserve::engine {

VisionConfig TinyVisionConfig() {
  VisionConfig v;
  v.hidden_size = 64;
  v.num_layers = 2;
  v.num_heads = 4;
  v.intermediate_size = 128;
  v.patch_size = 8;
  v.merge_size = 2;
  v.max_patches = 256;
  v.projector_hidden_size = 256;
  return v;
}

Status ValidateVisionConfig(const VisionConfig& v, int vocab_size, const std::string& source) {
  auto bad = [&](const std::string& field, const std::string& what) {
    return Fail(Error::InvalidArgument(source + ": vision." + field + ": " + what));
  };
  auto s = [](auto x) { return std::to_string(x); };
  // Bounds keep every product below (patches x hidden sizes) far from int
  // overflow and a hostile config from asking for absurd buffers.
  auto in_range = [&](const char* field, int x, int lo, int hi) -> Status {
    if (x < lo || x > hi) return bad(field, s(x) + " must be in [" + s(lo) + ", " + s(hi) + "]");
    return Ok();
  };
  MOE_TRY(in_range("hidden_size", v.hidden_size, 1, 16384));
  MOE_TRY(in_range("num_layers", v.num_layers, 1, 256));
  MOE_TRY(in_range("num_heads", v.num_heads, 1, 256));
  MOE_TRY(in_range("intermediate_size", v.intermediate_size, 1, 65536));
  MOE_TRY(in_range("patch_size", v.patch_size, 1, 64));
  MOE_TRY(in_range("max_patches", v.max_patches, 1, 1 << 16));
  MOE_TRY(in_range("projector_hidden_size", v.projector_hidden_size, 1, 65536));
  if (v.merge_size != 1 && v.merge_size != 2) return bad("merge_size", s(v.merge_size) + " must be 1 or 2");
  if (v.hidden_size % v.num_heads)
    return bad("num_heads", s(v.num_heads) + " must divide hidden_size (" + s(v.hidden_size) + ")");
  if (v.head_dim() % 4)
    return bad("num_heads", "the head size hidden_size / num_heads = " + s(v.head_dim()) +
                                " must be a multiple of 4 (2D RoPE splits it into row and column halves)");
  if (v.max_patches < v.merge_size * v.merge_size)
    return bad("max_patches", s(v.max_patches) + " must be >= merge_size^2 (" + s(v.merge_size * v.merge_size) + ")");
  if (!(v.norm_eps > 0) || !std::isfinite(v.norm_eps)) return bad("norm_eps", "must be a finite number > 0");
  if (!(v.rope_theta > 1) || !std::isfinite(v.rope_theta)) return bad("rope_theta", "must be a finite number > 1");
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(v.image_mean[c])) return bad("image_mean[" + s(c) + "]", "must be finite");
    if (!(v.image_std[c] > 0) || !std::isfinite(v.image_std[c]))
      return bad("image_std[" + s(c) + "]", "must be a finite number > 0");
  }
  const int ids[3] = {v.image_token_id, v.image_start_token_id, v.image_end_token_id};
  const char* names[3] = {"image_token_id", "image_start_token_id", "image_end_token_id"};
  for (int i = 0; i < 3; ++i) {
    // Ids 0-267 are bytes and the text specials (section 8): an image token
    // there would make typed text read as an image.
    if (ids[i] < 268 || ids[i] >= vocab_size)
      return bad(names[i], s(ids[i]) + " must be a padding id in [268, vocab_size " + s(vocab_size) + ")");
    for (int j = 0; j < i; ++j)
      if (ids[i] == ids[j]) return bad(names[i], s(ids[i]) + " is also " + names[j]);
  }
  return Ok();
}

Result<ImageGrid> ImageGridFor(const VisionConfig& v, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0 || width > kMaxImageSide || height > kMaxImageSide)
    return Fail(Error::InvalidArgument("image size " + std::to_string(width) + "x" + std::to_string(height) +
                                       " must have sides in [1, " + std::to_string(kMaxImageSide) + "]"));
  const int m = v.merge_size;
  const int64_t unit = int64_t{v.patch_size} * m;  // pixels of one merged token's side
  const int64_t max_units = v.max_patches / (m * m);
  // The expressions below are evaluated in this order, in IEEE doubles, by
  // tools/reference/vision.py too: sqrt and the divisions are correctly
  // rounded, so both sides pick the same grid.
  const double hu = static_cast<double>(height) / static_cast<double>(unit);
  const double wu = static_cast<double>(width) / static_cast<double>(unit);
  int64_t gh = std::max<int64_t>(1, static_cast<int64_t>(std::floor(hu + 0.5)));
  int64_t gw = std::max<int64_t>(1, static_cast<int64_t>(std::floor(wu + 0.5)));
  if (gh * gw > max_units) {
    const double scale = std::sqrt(static_cast<double>(max_units) / (hu * wu));
    gh = std::max<int64_t>(1, static_cast<int64_t>(std::floor(hu * scale)));
    gw = std::max<int64_t>(1, static_cast<int64_t>(std::floor(wu * scale)));
    while (gh * gw > max_units) {  // only extreme aspect ratios (a side clamped to 1) get here
      if (gh >= gw) --gh;
      else --gw;
    }
  }
  return ImageGrid{static_cast<int>(gh * m), static_cast<int>(gw * m)};
}

Result<int64_t> ImageTokenCount(const VisionConfig& v, int64_t width, int64_t height) {
  MOE_ASSIGN_OR_RETURN(ImageGrid g, ImageGridFor(v, width, height));
  return static_cast<int64_t>(g.patches()) / (v.merge_size * v.merge_size);
}

Result<int64_t> ImageSpanTokens(const VisionConfig& v, int64_t width, int64_t height) {
  MOE_ASSIGN_OR_RETURN(int64_t n, ImageTokenCount(v, width, height));
  return n + 2;
}

}  // namespace moeserve::engine
