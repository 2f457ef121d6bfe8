// Decoding images from requests: PNG (libpng), JPEG (libjpeg-turbo) and WebP
// (libwebp) into RGB8 pixels, and the image_url forms a request may carry.
//
// Every limit is checked before the work it bounds: the encoded size before
// anything is read, the declared width x height (from the header alone)
// before a pixel buffer is allocated. A truncated or corrupt file is an error
// value, never an abort: libpng's longjmp and libjpeg's error_exit are caught
// inside this module. A JPEG with more than 100 progressive scans is refused
// while it is read (each scan is a pass over the whole image: a small file
// could otherwise cost minutes of CPU). Errors name the image ("image 0: ...") and the setting
// that refused it, so a 400 built from them tells the client what to change.
//
// Serving images also needs a model with a vision tower; this module only
// turns bytes into pixels.
//
// Thread safety: all functions are reentrant; they share no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve {

struct ImageLimits {
  size_t max_bytes = 20u << 20;      // image_max_bytes: encoded (decoded-from-base64) size
  uint64_t max_pixels = 1u << 24;    // image_max_pixels: declared width x height
};

enum class ImageFormat { kPng, kJpeg, kWebp };
std::string_view ImageFormatMediaType(ImageFormat format);  // "image/png", "image/jpeg", "image/webp"

// The format the leading magic bytes announce, or an error when they match
// none that is decoded.
Result<ImageFormat> SniffImageFormat(std::string_view bytes, size_t index);

struct DecodedImage {
  uint32_t width = 0;
  uint32_t height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3 bytes, rows top to bottom
};

// Decodes PNG, JPEG or WebP (chosen by magic bytes) into RGB8. Gray is
// expanded to RGB, alpha is dropped, 16-bit samples are reduced to 8, CMYK
// JPEGs are converted; animated WebP is refused. `index` is the
// image's position in the request, used in error messages.
Result<DecodedImage> DecodeImage(std::string_view bytes, const ImageLimits& limits, size_t index);

// The image settings of the daemon's config (docs/http-api.md).
struct ImageUrlPolicy {
  ImageLimits limits;
  int max_per_request = 8;  // image_max_per_request: image parts in one request; 0 refuses all
  // image_url_allowed_hosts: hosts (lower case, no port) whose http(s) URLs
  // may be fetched. Empty: only data: URLs are accepted.
  std::vector<std::string> allowed_hosts;
  // image_url_allow_private_addresses: as a hook's allowPrivateAddresses,
  // lets a fetch connect to loopback, link-local and private addresses.
  bool allow_private_addresses = false;
  double fetch_timeout_seconds = 10;  // image_fetch_timeout_seconds
  // image_fetch_request_timeout_seconds: every fetch of one request together.
  double fetch_request_timeout_seconds = 20;
};

// Parses image_url_allowed_hosts: comma-separated host names or IP literals
// (IPv6 in brackets), no scheme, port, path or wildcard; lower-cased.
Result<std::vector<std::string>> ParseImageHostList(std::string_view value);

// What an image_url names: the encoded bytes of a data: URL, or an http(s)
// URL on an allowed host, left for the caller to fetch under the same
// address guard as hooks.
struct ImageUrlSource {
  std::string bytes;       // set for data: URLs
  ImageFormat format = ImageFormat::kPng;
  std::string remote_url;  // set for allowed http(s) URLs
};

// Parses data:image/{png,jpeg,webp};base64,... (the media
// type must match the magic bytes; the size limit is checked on the base64
// length before decoding), and checks http(s) URLs against allowed_hosts.
Result<ImageUrlSource> ParseImageUrl(std::string_view url, const ImageUrlPolicy& policy, size_t index);

// GETs an allowed http(s) image URL (ParseImageUrl's remote_url) under
// http_client's address guard, as hooks are (address_guard.hpp): the host as
// libcurl parses it must be in allowed_hosts, every address connected to
// must be public (loopback, link-local and private ones only with
// allow_private_addresses), no redirects, no proxy, at most
// limits.max_bytes, within fetch_timeout_seconds, answered 200. Blocks the
// calling thread for up to the timeout. `timeout_seconds` > 0 replaces the
// timeout (what is left of a request's image_fetch_request_timeout_seconds),
// and `timeout_setting` is then the setting its error names.
Result<std::string> FetchImageUrl(const std::string& url, const ImageUrlPolicy& policy, size_t index,
                                  double timeout_seconds = 0,
                                  const char* timeout_setting = "image_fetch_timeout_seconds");

}  // namespace moeserve
