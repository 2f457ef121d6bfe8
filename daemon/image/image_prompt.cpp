#include "moeserve/daemon/image/image_prompt.hpp"

#include <algorithm>
#include <string>

namespace moeserve::daemon {

bool ImagePlan::needs_work() const {
  return std::any_of(kept.begin(), kept.end(), [](const auto& k) { return !k.has_value(); });
}

ApiResult<ImagePlan> PlanImages(const std::vector<ImagePart>& parts, const ImageUrlPolicy& policy,
                                const engine::VisionConfig* vision, const StoredImages* stored) {
  ImagePlan plan;
  if (parts.empty()) return plan;
  plan.parts = parts;
  // A kept conversation's images were counted in the request that sent them.
  plan.kept.resize(parts.size());
  if (stored) {
    for (size_t i = 0; i < parts.size(); ++i) {
      auto hash = StoredImageHash(parts[i].url);
      if (!hash) continue;
      auto it = stored->find(*hash);
      if (it != stored->end()) plan.kept[i] = it->second;
    }
  }
  const size_t fresh = static_cast<size_t>(
      std::count_if(plan.kept.begin(), plan.kept.end(), [](const auto& k) { return !k.has_value(); }));
  if (fresh > static_cast<size_t>(policy.max_per_request)) {
    size_t over = 0;
    for (size_t i = 0, n = 0; i < parts.size(); ++i)
      if (!plan.kept[i] && n++ == static_cast<size_t>(policy.max_per_request)) over = i;
    return ApiFail(ApiError::InvalidRequest(
        "the messages hold " + std::to_string(fresh) + " images, over the limit of " +
            std::to_string(policy.max_per_request) + " a request (image_max_per_request)",
        parts[over].param));
  }
  plan.sources.resize(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (plan.kept[i]) continue;
    // A stored-image URL the caller did not hand over is refused here as
    // any other unknown scheme.
    auto source = ParseImageUrl(parts[i].url, policy, i);
    if (!source) return ApiFail(ApiError::InvalidRequest(source.error().message(), parts[i].param));
    plan.sources[i] = std::move(*source);
  }
  if (!vision)
    return ApiFail(ApiError::InvalidRequest(
        "'" + parts[0].param + "': this model reads text only (it has no vision tower); send text parts", parts[0].param));
  return plan;
}

Result<LoadedImage> LoadImageSource(ImageUrlSource source, const ImageUrlPolicy& policy, size_t index,
                                    std::chrono::steady_clock::time_point fetch_deadline, ImageWork* work) {
  LoadedImage out;
  out.bytes = std::move(source.bytes);
  if (!source.remote_url.empty()) {
    // Each fetch within its own timeout and what is left of the request's.
    const double left = std::chrono::duration<double>(fetch_deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0)
      return Fail(Error::InvalidArgument("image " + std::to_string(index) +
                                         ": not fetched: the request's image fetches took their whole " +
                                         std::to_string(policy.fetch_request_timeout_seconds) +
                                         " s (image_fetch_request_timeout_seconds)"));
    if (work) work->CountFetch();
    auto fetched = left < policy.fetch_timeout_seconds
                       ? FetchImageUrl(source.remote_url, policy, index, left, "image_fetch_request_timeout_seconds")
                       : FetchImageUrl(source.remote_url, policy, index);
    if (!fetched) return std::unexpected(fetched.error());
    out.bytes = std::move(*fetched);
  }
  if (work) work->CountDecode();
  MOE_ASSIGN_OR_RETURN(out.decoded, DecodeImage(out.bytes, policy.limits, index));
  return out;
}

ApiResult<std::vector<PreparedImage>> LoadImages(ImagePlan plan, const ImageUrlPolicy& policy,
                                                 const engine::VisionConfig* vision, int max_context,
                                                 ImageWork* work) {
  std::vector<PreparedImage> out;
  const auto& parts = plan.parts;
  if (parts.empty()) return out;
  if (!vision) return ApiFail(ApiError::Internal("images planned for a model without a vision tower"));
  const auto fetch_deadline = std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(policy.fetch_request_timeout_seconds));
  int64_t image_tokens = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (plan.kept[i]) {
      auto tokens = engine::ImageSpanTokens(*vision, plan.kept[i]->width, plan.kept[i]->height);
      if (!tokens)
        return ApiFail(ApiError::InvalidRequest("image " + std::to_string(i) + ": " + tokens.error().message(),
                                                parts[i].param));
      image_tokens += *tokens;
      out.push_back({parts[i].message, parts[i].text_offset, std::move(*plan.kept[i]), *tokens});
      continue;
    }
    auto loaded = LoadImageSource(std::move(plan.sources[i]), policy, i, fetch_deadline, work);
    if (!loaded) return ApiFail(ApiError::InvalidRequest(loaded.error().message(), parts[i].param));
    DecodedImage& decoded = loaded->decoded;
    auto tokens = engine::ImageSpanTokens(*vision, decoded.width, decoded.height);
    if (!tokens)
      return ApiFail(ApiError::InvalidRequest("image " + std::to_string(i) + ": " + tokens.error().message(),
                                              parts[i].param));
    image_tokens += *tokens;
    auto input = engine::MakeImageInput(decoded.width, decoded.height, std::move(decoded.rgb));
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

ApiResult<std::vector<PreparedImage>> PrepareImages(const std::vector<ImagePart>& parts, const ImageUrlPolicy& policy,
                                                    const engine::VisionConfig* vision, int max_context,
                                                    const StoredImages* stored) {
  auto plan = PlanImages(parts, policy, vision, stored);
  if (!plan) return ApiFail(plan.error());
  return LoadImages(std::move(*plan), policy, vision, max_context);
}

void PlaceImages(const std::vector<PreparedImage>& images, std::vector<engine::ChatMessage>& messages) {
  for (const PreparedImage& image : images) messages[image.message].images.push_back({image.text_offset, image.input});
}

}  // namespace moeserve::daemon
