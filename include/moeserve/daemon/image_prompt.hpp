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
// Thread safety: free functions over values; FetchImageUrl may block for up
// to image_fetch_timeout_seconds per remote part.
#pragma once

#include <cstdint>
#include <vector>

#include "moeserve/daemon/api_error.hpp"
#include "moeserve/daemon/chat_request.hpp"
#include "moeserve/daemon/image_decode.hpp"
#include "moeserve/daemon/stored_images.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon {

struct PreparedImage {
  size_t message = 0;      // ImagePart::message
  size_t text_offset = 0;  // ImagePart::text_offset
  engine::ImageInput input;
  int64_t span_tokens = 0;  // ImageSpanTokens: what the image costs in the context and in usage
};

// `vision` null: the model reads text only. `stored`: the pixels of a kept
// conversation's images (stored_images.hpp), which parts name by
// StoredImageUrl; they are neither fetched nor decoded again and do not
// count against image_max_per_request (they did in the request that sent
// them), but their tokens count against the context. Without it, or for a
// hash it lacks, such a URL is refused like any unknown scheme.
ApiResult<std::vector<PreparedImage>> PrepareImages(const std::vector<ImagePart>& parts, const ImageUrlPolicy& policy,
                                                    const engine::VisionConfig* vision, int max_context,
                                                    const StoredImages* stored = nullptr);

// Adds each image to its message (engine::ChatImage), for
// RenderChatWithImages to render as its span in place.
void PlaceImages(const std::vector<PreparedImage>& images, std::vector<engine::ChatMessage>& messages);

}  // namespace moeserve::daemon
