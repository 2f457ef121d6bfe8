#include "moeserve/daemon/image_prompt.hpp"

#include <algorithm>
#include <string>

namespace moeserve::daemon {

ApiResult<std::vector<PreparedImage>> PrepareImages(const std::vector<ImagePart>& parts, const ImageUrlPolicy& policy,
                                                    const engine::VisionConfig* vision, int max_context,
                                                    const StoredImages* stored) {
  std::vector<PreparedImage> out;
  if (parts.empty()) return out;
  // A kept conversation's images were counted in the request that sent them.
  std::vector<const engine::ImageInput*> kept(parts.size(), nullptr);
  if (stored) {
    for (size_t i = 0; i < parts.size(); ++i) {
      auto hash = StoredImageHash(parts[i].url);
      if (!hash) continue;
      auto it = stored->find(*hash);
      if (it != stored->end()) kept[i] = &it->second;
    }
  }
  const size_t fresh = static_cast<size_t>(std::count(kept.begin(), kept.end(), nullptr));
  if (fresh > static_cast<size_t>(policy.max_per_request)) {
    size_t over = 0;
    for (size_t i = 0, n = 0; i < parts.size(); ++i)
      if (!kept[i] && n++ == static_cast<size_t>(policy.max_per_request)) over = i;
    return ApiFail(ApiError::InvalidRequest(
        "the messages hold " + std::to_string(fresh) + " images, over the limit of " +
            std::to_string(policy.max_per_request) + " a request (image_max_per_request)",
        parts[over].param));
  }
  std::vector<ImageUrlSource> sources(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (kept[i]) continue;
    // A stored-image URL the caller did not hand over is refused here as
    // any other unknown scheme.
    auto source = ParseImageUrl(parts[i].url, policy, i);
    if (!source) return ApiFail(ApiError::InvalidRequest(source.error().message(), parts[i].param));
    sources[i] = std::move(*source);
  }
  if (!vision)
    return ApiFail(ApiError::InvalidRequest(
        "'" + parts[0].param + "': this model reads text only (it has no vision tower); send text parts", parts[0].param));
  int64_t image_tokens = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (kept[i]) {
      auto tokens = engine::ImageSpanTokens(*vision, kept[i]->width, kept[i]->height);
      if (!tokens)
        return ApiFail(ApiError::InvalidRequest("image " + std::to_string(i) + ": " + tokens.error().message(),
                                                parts[i].param));
      image_tokens += *tokens;
      out.push_back({parts[i].message, parts[i].text_offset, *kept[i], *tokens});
      continue;
    }
    std::string bytes = std::move(sources[i].bytes);
    if (!sources[i].remote_url.empty()) {
      auto fetched = FetchImageUrl(sources[i].remote_url, policy, i);
      if (!fetched) return ApiFail(ApiError::InvalidRequest(fetched.error().message(), parts[i].param));
      bytes = std::move(*fetched);
    }
    auto decoded = DecodeImage(bytes, policy.limits, i);
    if (!decoded) return ApiFail(ApiError::InvalidRequest(decoded.error().message(), parts[i].param));
    auto tokens = engine::ImageSpanTokens(*vision, decoded->width, decoded->height);
    if (!tokens)
      return ApiFail(ApiError::InvalidRequest("image " + std::to_string(i) + ": " + tokens.error().message(),
                                              parts[i].param));
    image_tokens += *tokens;
    auto input = engine::MakeImageInput(decoded->width, decoded->height, std::move(decoded->rgb));
    if (!input) return ApiFail(ApiError::Internal("image " + std::to_string(i) + ": " + input.error().message()));
    out.push_back({parts[i].message, parts[i].text_offset, std::move(*input), *tokens});
  }
  if (image_tokens >= max_context)
    return ApiFail(ApiError::ContextLengthExceeded(
        "The " + std::to_string(parts.size()) + " images become " + std::to_string(image_tokens) +
        " prompt tokens, but this model's context window is " + std::to_string(max_context) +
        " tokens (including the text and the answer); send fewer or smaller images"));
  return out;
}

void PlaceImages(const std::vector<PreparedImage>& images, std::vector<engine::ChatMessage>& messages) {
  for (const PreparedImage& image : images) messages[image.message].images.push_back({image.text_offset, image.input});
}

}  // namespace moeserve::daemon
