// The optional vision tower of a moe-dsa-v1 model (docs/model-format.md
// section 14): its config (the "vision" object of config.json), how many
// prompt tokens an image becomes, and how a prompt carries images.
//
// An image enters a prompt as a span of placeholder tokens
//   <|image_start|> <|image|> x ImageTokenCount(...) <|image_end|>
// plus an ImageInput (its pixels and a content hash). During prefill the
// engine runs the tower on the pixels and puts the tower's embeddings where
// the placeholders' embedding rows would be; the start and end tokens embed
// like any other token. The prefix cache mixes the content hash into the keys
// of the blocks that hold an image's tokens, so two different images never
// share a cached entry and the same image in a later turn hits.
//
// Thread safety: pure functions and plain values.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::engine {

// config.json "vision" (model-format section 14.1). Absent: no tower.
struct VisionConfig {
  int hidden_size = 0;          // Dv
  int num_layers = 0;
  int num_heads = 0;            // head size Dv / num_heads, a multiple of 4 (2D RoPE)
  int intermediate_size = 0;    // the blocks' SwiGLU width
  int patch_size = 14;          // p: square patches of p x p pixels
  int merge_size = 2;           // m: 1 (no merge) or 2 (2x2 patches become one token)
  int max_patches = 1024;       // patches per image after the resize (before the merge)
  int projector_hidden_size = 0;  // 0 in the file: m * m * Dv
  double norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::array<double, 3> image_mean = {0.5, 0.5, 0.5};
  std::array<double, 3> image_std = {0.5, 0.5, 0.5};
  int image_token_id = 268;        // <|image|>, the placeholder
  int image_start_token_id = 269;  // <|image_start|>
  int image_end_token_id = 270;    // <|image_end|>

  int head_dim() const { return hidden_size / num_heads; }
  int patch_dim() const { return 3 * patch_size * patch_size; }
  int merged_dim() const { return merge_size * merge_size * hidden_size; }
};

// The small tower `moe-model-gen --vision` adds (model-format 14.1): Dv 64,
// 2 blocks of 4 heads, SwiGLU 128, 8-pixel patches merged 2x2, at most 256
// patches (64 tokens) an image.
VisionConfig TinyVisionConfig();

// Checks a parsed or generated VisionConfig against itself and the language
// model's vocabulary; errors name the field ("config.json: vision.num_heads: ...").
Status ValidateVisionConfig(const VisionConfig& v, int vocab_size, const std::string& source = "config.json");

// The patch grid an image of width x height pixels is resized to
// (model-format 14.2): grid_h x grid_w patches, each a multiple of
// merge_size, aspect ratio kept as nearly as whole units allow,
// grid_h * grid_w <= max_patches. The resized image is
// (grid_w * patch_size) x (grid_h * patch_size) pixels.
struct ImageGrid {
  int grid_h = 0, grid_w = 0;
  int patches() const { return grid_h * grid_w; }
};
Result<ImageGrid> ImageGridFor(const VisionConfig& v, int64_t width, int64_t height);

// How many placeholder tokens (<|image|>) an image of this size becomes:
// patches / merge_size^2. The span it occupies in a prompt is two tokens
// more (ImageSpanTokens). Errors: a zero or negative side, a side over
// kMaxImageSide.
inline constexpr int64_t kMaxImageSide = 1 << 16;
Result<int64_t> ImageTokenCount(const VisionConfig& v, int64_t width, int64_t height);
// ImageTokenCount + 2 (the start and end tokens): what the image costs in
// the context and in usage.prompt_tokens.
Result<int64_t> ImageSpanTokens(const VisionConfig& v, int64_t width, int64_t height);

// SHA-256 (lowercase hex) over width and height (each 4 bytes,
// little-endian) followed by the RGB bytes: what identifies an image for the
// prefix cache and for storing it once.
std::string ImageContentHash(uint32_t width, uint32_t height, std::span<const uint8_t> rgb);

// An image of a prompt: RGB8 pixels, rows top to bottom (the daemon's
// DecodedImage), shared so that a session's turns and the engine hold one copy.
struct ImageInput {
  uint32_t width = 0, height = 0;
  std::shared_ptr<const std::vector<uint8_t>> rgb;  // width * height * 3 bytes
  std::string content_hash;                         // ImageContentHash of the above
};
// Builds an ImageInput and its hash; refuses a size that does not match.
Result<ImageInput> MakeImageInput(uint32_t width, uint32_t height, std::vector<uint8_t> rgb);

// Where an image sits in GenerationRequest::prompt: `offset` indexes its
// first <|image|> token, `tokens` placeholders follow (the <|image_start|>
// before and the <|image_end|> after are ordinary prompt tokens).
struct ImageSpan {
  int64_t offset = 0;
  int64_t tokens = 0;
  ImageInput image;
};

// Appends <|image_start|>, the placeholders and <|image_end|> to `prompt` and
// records the span in `spans`.
Status AppendImage(const VisionConfig& v, ImageInput image, std::vector<int>& prompt, std::vector<ImageSpan>& spans);

// Checks spans against a prompt: in order, not overlapping, inside it, each
// exactly ImageTokenCount placeholders long, framed by the start and end
// tokens, its hash the pixels' hash; and no placeholder, start or end token
// anywhere outside a span (a client cannot make the model read a token it
// did not send as an image). Errors name the image ("image 1: ...").
Status ValidateImageSpans(const VisionConfig& v, std::span<const int> prompt, std::span<const ImageSpan> spans);

}  // namespace moeserve::engine
