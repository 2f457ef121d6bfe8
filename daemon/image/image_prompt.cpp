#include "moeserve/daemon/image_prompt.hpp"

#include <string>

namespace moeserve::daemon {

ApiResult<std::vector<PreparedImage>> PrepareImages(const std::vector<ImagePart>& parts, const ImageUrlPolicy& policy,
                                                    const engine::VisionConfig* vision, int max_context) {
  std::vector<PreparedImage> out;
  if (parts.empty()) return out;
  if (parts.size() > static_cast<size_t>(policy.max_per_request))
    return ApiFail(ApiError::InvalidRequest(
        "the messages hold " + std::to_string(parts.size()) + " images, over the limit of " +
            std::to_string(policy.max_per_request) + " a request (image_max_per_request)",
        parts[policy.max_per_request].param));
  std::vector<ImageUrlSource> sources;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto source = ParseImageUrl(parts[i].url, policy, i);
    if (!source) return ApiFail(ApiError::InvalidRequest(source.error().message(), parts[i].param));
    sources.push_back(std::move(*source));
  }
  if (!vision)
    return ApiFail(ApiError::InvalidRequest(
        "'" + parts[0].param + "': this model reads text only (it has no vision tower); send text parts", parts[0].param));
  int64_t image_tokens = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
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
