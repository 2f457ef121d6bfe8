// Images kept with a conversation (a session's turns, a stored response's
// chain) once by content hash, and replayed into later prompts.
//
// A conversation the daemon keeps refers to each of its images by the
// engine's content hash (vision.hpp ImageContentHash, SHA-256 over width,
// height and the RGB bytes), written into the chat body where the image sat
// as an image_url part whose URL is StoredImageUrl(hash). Such a URL means
// something only to ChatService::Handle when its caller hands over the
// pixels (StoredImages) for the tenant the conversation belongs to; a client
// that sends one anywhere gets the 400 of an unknown URL scheme, so no
// request can name an image it did not send itself.
//
// What is stored per image is the encoded file as the client sent it (PNG,
// JPEG or WebP), not the decoded RGB: a screenshot's PNG is typically tens
// of times smaller than its pixels, and the tenant's storage quota counts
// stored bytes. Replaying decodes the file again (milliseconds for a
// screenshot; the tower itself is skipped when the prefix cache holds the
// image's blocks), through the same decoder and limits as a new image.
//
// Thread safety: free functions over values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/image/image_decode.hpp"
#include "moeserve/daemon/image/image_work.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon {

// "moe-stored-image:sha256:<64 hex>".
std::string StoredImageUrl(std::string_view content_hash);
// The hash a StoredImageUrl names, or nothing for any other URL (malformed included).
std::optional<std::string> StoredImageHash(std::string_view url);

// The pixels a conversation's stored images decode to, by content hash as
// its chat body names them.
using StoredImages = std::map<std::string, engine::ImageInput>;

// One image of a conversation, as kept in the store.
struct StoredImageFile {
  std::string hash;     // ImageContentHash of the decoded pixels
  std::string bytes;    // the encoded file
  uint32_t width = 0, height = 0;
  int64_t span_tokens = 0;  // ImageSpanTokens: what it costs in a prompt
};

// A new image of a request, decoded and ready to store.
struct InternedImage {
  StoredImageFile file;
  engine::ImageInput input;
  size_t message = 0;      // index in the chat body's messages
  size_t text_offset = 0;  // bytes of the message's joined text parts before it
};

// Decodes every image_url part of messages[first_new...] (the request's new
// messages; the earlier ones are the kept history) through the chat
// endpoint's path: the URL parsed (data:, or an allowed http(s) host
// fetched), the file decoded within the limits, counted in the model's
// tokens. Each part's URL is then rewritten to StoredImageUrl of its hash.
// `param_of` turns a chat body path ("messages[3].content[1].image_url.url")
// into what the client sent, for errors.
//
// Refusals (400 naming the part and the limit): more new parts than
// image_max_per_request (the limit is per request: per turn); a URL that is
// not a data: or allowed http(s) URL, a StoredImageUrl included; a model
// without a vision tower; decode and fetch failures. Parts that are not well
// formed image_url parts are left for the chat request parser to refuse.
//
// The URLs are checked by PlanImageParts (nothing fetched or decoded: what a
// request is admitted on), then fetched and decoded by InternImageParts,
// which blocks (image_prompt.hpp LoadImageSource; the daemon calls it on an
// image worker) and keeps each image's pixels in `work`'s decoded-image
// cache for `tenant`, so that replaying the conversation later decodes
// nothing.
using ParamMapper = std::function<std::string(const std::string&)>;
struct ImagePartPlan {
  struct Found {
    size_t message, part, text_offset;
    std::string param;
    ImageUrlSource source;
  };
  std::vector<Found> found;
};
ApiResult<ImagePartPlan> PlanImageParts(const nlohmann::ordered_json& messages, size_t first_new,
                                        const ImageUrlPolicy& policy, const engine::VisionConfig* vision,
                                        const ParamMapper& param_of);
ApiResult<std::vector<InternedImage>> InternImageParts(nlohmann::ordered_json& messages, ImagePartPlan plan,
                                                       const ImageUrlPolicy& policy, const engine::VisionConfig* vision,
                                                       ImageWork* work, const std::string& tenant);

// Every StoredImageUrl hash in messages (in order, each once).
std::vector<std::string> StoredImageHashesIn(const nlohmann::ordered_json& messages);

// A stored file decoded again into the pixels a prompt carries. An error
// (a file that no longer decodes under the current limits) names the hash.
Result<engine::ImageInput> DecodeStoredImage(const StoredImageFile& file, const ImageLimits& limits);
// The pixels of a kept image of `tenant`: `work`'s decoded-image cache's
// when it holds them, else the file decoded again (DecodeStoredImage, counted)
// and kept there. `work` may be null (no cache).
Result<engine::ImageInput> ReplayStoredImage(const StoredImageFile& file, const std::string& tenant,
                                             const ImageLimits& limits, ImageWork* work);

}  // namespace moeserve::daemon
