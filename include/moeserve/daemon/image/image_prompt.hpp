// From a chat request's image parts to what the prompt carries: each part's
// URL parsed (data:, or an allowed http(s) host fetched under the hooks'
// address policy), decoded within the limits, counted in the model's tokens
// (vision.hpp ImageSpanTokens), and placed into its message, where the
// renderer makes it a span of placeholder tokens the engine fills with the
// tower's output.
//
// Order of refusals, each a 400 naming the part's `param` and the limit:
//   1. more parts than image_max_per_request;
//   2. a URL that is not an accepted data: URL or an allowed http(s) host
//      (malformed base64, media type against magic bytes, image_max_bytes);
//   3. a model without a vision tower ("this model reads text only"): only
//      once the parts are valid, before anything is fetched or decoded;
//   4. fetch and decode (image_max_pixels from the header, corrupt files);
//   5. the images' tokens alone filling the context window
//      (context_length_exceeded); the whole prompt is checked later, as for text.
//
// Thread safety: free functions over values; LoadImages may block for up to
// image_fetch_request_timeout_seconds (its fetches) plus its decodes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/image/image_decode.hpp"
#include "moeserve/daemon/image/image_work.hpp"
#include "moeserve/daemon/image/stored_images.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon {

struct PreparedImage {
  size_t message = 0;      // ImagePart::message
  size_t text_offset = 0;  // ImagePart::text_offset
  engine::ImageInput input;
  int64_t span_tokens = 0;  // ImageSpanTokens: what the image costs in the context and in usage
};

// A request's image parts checked (steps 1-3 above), nothing fetched or
// decoded yet: what admission sees before any of that work is done.
struct ImagePlan {
  std::vector<ImagePart> parts;
  // Per part: a kept conversation's pixels (`stored`), or what its URL names.
  std::vector<std::optional<engine::ImageInput>> kept;
  std::vector<ImageUrlSource> sources;
  // Some part must be fetched or decoded (it is not a kept image).
  bool needs_work() const;
};

// `vision` null: the model reads text only. `stored`: the pixels of a kept
// conversation's images (stored_images.hpp), which parts name by
// StoredImageUrl; they are neither fetched nor decoded again and do not
// count against image_max_per_request (they did in the request that sent
// them), but their tokens count against the context. Without it, or for a
// hash it lacks, such a URL is refused like any unknown scheme.
ApiResult<ImagePlan> PlanImages(const std::vector<ImagePart>& parts, const ImageUrlPolicy& policy,
                                const engine::VisionConfig* vision, const StoredImages* stored = nullptr);

// Steps 4 and 5: the plan's URLs fetched (each within
// image_fetch_timeout_seconds, all of them within
// image_fetch_request_timeout_seconds) and its files decoded. Blocks for as
// long: the daemon runs it on an image worker (image_work.hpp), which
// `work` (may be null) counts the fetches and decodes of.
ApiResult<std::vector<PreparedImage>> LoadImages(ImagePlan plan, const ImageUrlPolicy& policy,
                                                 const engine::VisionConfig* vision, int max_context,
                                                 ImageWork* work = nullptr);

// PlanImages, then LoadImages.
ApiResult<std::vector<PreparedImage>> PrepareImages(const std::vector<ImagePart>& parts, const ImageUrlPolicy& policy,
                                                    const engine::VisionConfig* vision, int max_context,
                                                    const StoredImages* stored = nullptr);

// Fetches (when remote) and decodes one image part's file within the
// request's fetch deadline: the bytes as fetched, and their pixels.
struct LoadedImage {
  std::string bytes;
  DecodedImage decoded;
};
Result<LoadedImage> LoadImageSource(ImageUrlSource source, const ImageUrlPolicy& policy, size_t index,
                                    std::chrono::steady_clock::time_point fetch_deadline, ImageWork* work);

// Adds each image to its message (engine::ChatImage), for
// RenderChatWithImages to render as its span in place.
void PlaceImages(const std::vector<PreparedImage>& images, std::vector<engine::ChatMessage>& messages);

}  // namespace moeserve::daemon
