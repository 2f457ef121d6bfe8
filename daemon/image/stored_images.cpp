#include "moeserve/daemon/image/stored_images.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>

#include "moeserve/daemon/image/image_prompt.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kScheme = "moe-stored-image:sha256:";
constexpr size_t kHashChars = 64;

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) || (c >= 'a' && c <= 'f'); });
}

// The URL string of a well-formed image_url part, or null.
template <typename Json>
Json* PartUrl(Json& part) {
  if (!part.is_object()) return nullptr;
  auto type = part.find("type");
  if (type == part.end() || *type != "image_url") return nullptr;
  auto iu = part.find("image_url");
  if (iu == part.end() || !iu->is_object()) return nullptr;
  auto url = iu->find("url");
  if (url == iu->end() || !url->is_string()) return nullptr;
  return &*url;
}

}  // namespace

std::string StoredImageUrl(std::string_view content_hash) { return std::string(kScheme) + std::string(content_hash); }

std::optional<std::string> StoredImageHash(std::string_view url) {
  if (!url.starts_with(kScheme)) return std::nullopt;
  const std::string_view hash = url.substr(kScheme.size());
  if (hash.size() != kHashChars || !IsLowerHex(hash)) return std::nullopt;
  return std::string(hash);
}

ApiResult<ImagePartPlan> PlanImageParts(const ojson& messages, size_t first_new, const ImageUrlPolicy& policy,
                                        const engine::VisionConfig* vision, const ParamMapper& param_of) {
  ImagePartPlan plan;
  std::vector<const ojson*> urls;
  for (size_t i = first_new; i < messages.size(); ++i) {
    auto content = messages[i].find("content");
    if (content == messages[i].end() || !content->is_array()) continue;
    size_t text = 0;
    for (size_t k = 0; k < content->size(); ++k) {
      const ojson& part = (*content)[k];
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string())
        text += part["text"].get_ref<const std::string&>().size();
      if (const ojson* url = PartUrl(part)) {
        plan.found.push_back(
            {i, k, text, param_of("messages[" + std::to_string(i) + "].content[" + std::to_string(k) + "].image_url.url"), {}});
        urls.push_back(url);
      }
    }
  }
  auto& found = plan.found;
  if (found.empty()) return plan;
  if (found.size() > static_cast<size_t>(policy.max_per_request))
    return ApiFail(ApiError::InvalidRequest(
        "the new messages hold " + std::to_string(found.size()) + " images, over the limit of " +
            std::to_string(policy.max_per_request) + " a request (image_max_per_request; images kept from earlier "
            "turns do not count)",
        found[policy.max_per_request].param));
  // Every URL checked before anything is fetched or decoded, as for the chat endpoint.
  for (size_t i = 0; i < found.size(); ++i) {
    auto source = ParseImageUrl(urls[i]->get_ref<const std::string&>(), policy, i);
    if (!source) return ApiFail(ApiError::InvalidRequest(source.error().message(), found[i].param));
    found[i].source = std::move(*source);
  }
  if (!vision)
    return ApiFail(ApiError::InvalidRequest(
        "'" + found[0].param + "': this model reads text only (it has no vision tower); send text parts",
        found[0].param));
  return plan;
}

ApiResult<std::vector<InternedImage>> InternImageParts(ojson& messages, ImagePartPlan plan, const ImageUrlPolicy& policy,
                                                       const engine::VisionConfig* vision, ImageWork* work,
                                                       const std::string& tenant) {
  std::vector<InternedImage> out;
  auto& found = plan.found;
  if (found.empty()) return out;
  if (!vision) return ApiFail(ApiError::Internal("images planned for a model without a vision tower"));
  const auto fetch_deadline = std::chrono::steady_clock::now() +
                              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(policy.fetch_request_timeout_seconds));
  for (size_t i = 0; i < found.size(); ++i) {
    auto loaded = LoadImageSource(std::move(found[i].source), policy, i, fetch_deadline, work);
    if (!loaded) return ApiFail(ApiError::InvalidRequest(loaded.error().message(), found[i].param));
    DecodedImage& decoded = loaded->decoded;
    auto tokens = engine::ImageSpanTokens(*vision, decoded.width, decoded.height);
    if (!tokens)
      return ApiFail(
          ApiError::InvalidRequest("image " + std::to_string(i) + ": " + tokens.error().message(), found[i].param));
    InternedImage image;
    image.file.width = decoded.width;
    image.file.height = decoded.height;
    auto input = engine::MakeImageInput(decoded.width, decoded.height, std::move(decoded.rgb));
    if (!input) return ApiFail(ApiError::Internal("image " + std::to_string(i) + ": " + input.error().message()));
    image.file.hash = input->content_hash;
    image.file.bytes = std::move(loaded->bytes);
    image.file.span_tokens = *tokens;
    image.input = std::move(*input);
    image.message = found[i].message;
    image.text_offset = found[i].text_offset;
    messages[found[i].message]["content"][found[i].part]["image_url"]["url"] = StoredImageUrl(image.file.hash);
    if (work) work->Keep(tenant, image.input);
    out.push_back(std::move(image));
  }
  return out;
}

std::vector<std::string> StoredImageHashesIn(const ojson& messages) {
  std::vector<std::string> out;
  if (!messages.is_array()) return out;
  for (const ojson& m : messages) {
    if (!m.is_object()) continue;
    auto content = m.find("content");
    if (content == m.end() || !content->is_array()) continue;
    for (const ojson& part : *content) {
      const ojson* url = PartUrl(part);
      if (!url) continue;
      if (auto hash = StoredImageHash(url->get_ref<const std::string&>());
          hash && std::find(out.begin(), out.end(), *hash) == out.end())
        out.push_back(std::move(*hash));
    }
  }
  return out;
}

Result<engine::ImageInput> DecodeStoredImage(const StoredImageFile& file, const ImageLimits& limits) {
  auto decoded = DecodeImage(file.bytes, limits, 0);
  if (!decoded)
    return Fail(Error::Internal("stored image " + file.hash.substr(0, 16) + " no longer decodes: " +
                                decoded.error().message()));
  return engine::MakeImageInput(decoded->width, decoded->height, std::move(decoded->rgb));
}

Result<engine::ImageInput> ReplayStoredImage(const StoredImageFile& file, const std::string& tenant,
                                             const ImageLimits& limits, ImageWork* work) {
  if (work) {
    if (auto cached = work->Cached(tenant, file.hash)) return std::move(*cached);
    work->CountDecode();
  }
  MOE_ASSIGN_OR_RETURN(engine::ImageInput input, DecodeStoredImage(file, limits));
  if (input.content_hash != file.hash)
    return Fail(Error::Internal("stored image " + file.hash.substr(0, 16) + " decodes to other pixels"));
  if (work) work->Keep(tenant, input);
  return input;
}

}  // namespace moeserve::daemon
