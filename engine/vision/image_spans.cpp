// Images in prompts: content hashes, spans of placeholder tokens and their
// checks (model-format section 14.6).
#include <algorithm>

#include "moeserve/common/sha256.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::engine {

std::string ImageContentHash(uint32_t width, uint32_t height, std::span<const uint8_t> rgb) {
  uint8_t header[8];
  for (int i = 0; i < 4; ++i) {
    header[i] = static_cast<uint8_t>(width >> (8 * i));
    header[4 + i] = static_cast<uint8_t>(height >> (8 * i));
  }
  Sha256 h;
  h.Update(header, sizeof(header));
  h.Update(rgb.data(), rgb.size());
  return h.HexDigest();
}

Result<ImageInput> MakeImageInput(uint32_t width, uint32_t height, std::vector<uint8_t> rgb) {
  if (width == 0 || height == 0 || width > kMaxImageSide || height > kMaxImageSide)
    return Fail(Error::InvalidArgument("image size " + std::to_string(width) + "x" + std::to_string(height) +
                                       " must have sides in [1, " + std::to_string(kMaxImageSide) + "]"));
  if (rgb.size() != static_cast<size_t>(width) * height * 3)
    return Fail(Error::InvalidArgument("image of " + std::to_string(width) + "x" + std::to_string(height) + " has " +
                                       std::to_string(rgb.size()) + " RGB bytes, expected " +
                                       std::to_string(static_cast<size_t>(width) * height * 3)));
  ImageInput in;
  in.width = width;
  in.height = height;
  in.content_hash = ImageContentHash(width, height, rgb);
  in.rgb = std::make_shared<const std::vector<uint8_t>>(std::move(rgb));
  return in;
}

Status AppendImage(const VisionConfig& v, ImageInput image, std::vector<int>& prompt, std::vector<ImageSpan>& spans) {
  MOE_ASSIGN_OR_RETURN(int64_t n, ImageTokenCount(v, image.width, image.height));
  prompt.push_back(v.image_start_token_id);
  ImageSpan span;
  span.offset = static_cast<int64_t>(prompt.size());
  span.tokens = n;
  span.image = std::move(image);
  prompt.insert(prompt.end(), static_cast<size_t>(n), v.image_token_id);
  prompt.push_back(v.image_end_token_id);
  spans.push_back(std::move(span));
  return Ok();
}

Status ValidateImageSpans(const VisionConfig& v, std::span<const int> prompt, std::span<const ImageSpan> spans) {
  const int64_t size = static_cast<int64_t>(prompt.size());
  int64_t covered_to = 0;  // prompt index past the previous span's end token
  for (size_t i = 0; i < spans.size(); ++i) {
    const ImageSpan& s = spans[i];
    auto bad = [&](const std::string& what) {
      return Fail(Error::InvalidArgument("image " + std::to_string(i) + ": " + what));
    };
    const ImageInput& im = s.image;
    if (!im.rgb) return bad("has no pixels");
    if (im.rgb->size() != static_cast<size_t>(im.width) * im.height * 3)
      return bad("has " + std::to_string(im.rgb->size()) + " RGB bytes for " + std::to_string(im.width) + "x" +
                 std::to_string(im.height));
    MOE_ASSIGN_OR_RETURN(int64_t n, ImageTokenCount(v, im.width, im.height));
    if (s.tokens != n)
      return bad("spans " + std::to_string(s.tokens) + " placeholder tokens, but a " + std::to_string(im.width) + "x" +
                 std::to_string(im.height) + " image becomes " + std::to_string(n));
    if (s.offset < covered_to + 1 || s.offset + s.tokens + 1 > size)
      return bad("span at " + std::to_string(s.offset) + " (+" + std::to_string(s.tokens) +
                 ") overlaps the previous image or leaves the prompt of " + std::to_string(size) + " tokens");
    if (prompt[s.offset - 1] != v.image_start_token_id || prompt[s.offset + s.tokens] != v.image_end_token_id)
      return bad("span is not framed by <|image_start|> and <|image_end|>");
    if (ImageContentHash(im.width, im.height, *im.rgb) != im.content_hash)
      return bad("content_hash does not match its pixels");
    // Everything from the previous span's end to this start token is text.
    for (int64_t p = covered_to; p < s.offset - 1; ++p) {
      int t = prompt[p];
      if (t == v.image_token_id || t == v.image_start_token_id || t == v.image_end_token_id)
        return Fail(Error::InvalidArgument("prompt token " + std::to_string(p) + ": image token " + std::to_string(t) +
                                           " outside an image span"));
    }
    for (int64_t p = s.offset; p < s.offset + s.tokens; ++p)
      if (prompt[p] != v.image_token_id) return bad("span holds token " + std::to_string(prompt[p]) + " at " + std::to_string(p));
    covered_to = s.offset + s.tokens + 1;
  }
  for (int64_t p = covered_to; p < size; ++p) {
    int t = prompt[p];
    if (t == v.image_token_id || t == v.image_start_token_id || t == v.image_end_token_id)
      return Fail(Error::InvalidArgument("prompt token " + std::to_string(p) + ": image token " + std::to_string(t) +
                                         " outside an image span"));
  }
  return Ok();
}

}  // namespace moeserve::engine
