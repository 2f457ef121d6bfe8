// image_url parsing: data: URLs carry the image; http(s) URLs are accepted
// only for configured hosts (fetching them is the caller's job).
#include <algorithm>
#include <cctype>
#include <string>

#include "moeserve/common/base64.hpp"
#include "moeserve/daemon/image/image_decode.hpp"

namespace moeserve {
namespace {

std::string Prefix(size_t index) { return "image " + std::to_string(index) + ": "; }

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && Lower(s.substr(0, prefix.size())) == prefix;
}

// Strict RFC 4648 alphabet with padding only at the end: Base64Decode skips
// stray characters, which would let a malformed URL through silently.
bool IsStrictBase64(std::string_view s) {
  if (s.size() % 4 != 0) return false;
  size_t pad = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    if (c == '=') {
      ++pad;
      continue;
    }
    if (pad > 0) return false;
    if (!(std::isalnum(c) || c == '+' || c == '/')) return false;
  }
  return pad <= 2;
}

Result<ImageUrlSource> ParseDataUrl(std::string_view url, const ImageUrlPolicy& policy, size_t index) {
  const std::string_view rest = url.substr(5);  // after "data:"
  const size_t comma = rest.find(',');
  if (comma == std::string_view::npos)
    return Fail(Error::InvalidArgument(Prefix(index) + "data: URL has no ',' before its payload"));
  const std::string header = Lower(rest.substr(0, comma));
  const std::string_view payload = rest.substr(comma + 1);
  ImageFormat declared;
  if (header == "image/png;base64") {
    declared = ImageFormat::kPng;
  } else if (header == "image/jpeg;base64" || header == "image/jpg;base64") {
    declared = ImageFormat::kJpeg;
  } else if (header == "image/webp;base64") {
    declared = ImageFormat::kWebp;
  } else {
    return Fail(Error::InvalidArgument(Prefix(index) + "data: URL must be image/png, image/jpeg or image/webp with ;base64, got '" +
                                  header.substr(0, 64) + "'"));
  }
  // Refused from the length alone, before decoding allocates anything.
  const size_t decoded_bound = payload.size() / 4 * 3;
  if (payload.size() / 4 * 3 > policy.limits.max_bytes + 2)
    return Fail(Error::InvalidArgument(Prefix(index) + "about " + std::to_string(decoded_bound) +
                                  " bytes is over the limit of " + std::to_string(policy.limits.max_bytes) +
                                  " (image_max_bytes)"));
  if (!IsStrictBase64(payload)) return Fail(Error::InvalidArgument(Prefix(index) + "data: URL payload is not valid base64"));
  ImageUrlSource out;
  out.bytes = Base64Decode(payload);
  if (out.bytes.size() > policy.limits.max_bytes)
    return Fail(Error::InvalidArgument(Prefix(index) + std::to_string(out.bytes.size()) + " bytes is over the limit of " +
                                  std::to_string(policy.limits.max_bytes) + " (image_max_bytes)"));
  auto actual = SniffImageFormat(out.bytes, index);
  if (!actual) return std::unexpected(actual.error());
  if (*actual != declared)
    return Fail(Error::InvalidArgument(Prefix(index) + "data: URL declares " + std::string(ImageFormatMediaType(declared)) +
                                  " but the bytes are " + std::string(ImageFormatMediaType(*actual))));
  out.format = declared;
  return out;
}

Result<ImageUrlSource> CheckRemoteUrl(std::string_view url, const ImageUrlPolicy& policy, size_t index) {
  if (policy.allowed_hosts.empty())
    return Fail(Error::InvalidArgument(Prefix(index) +
                                  "http(s) image URLs are refused (image_url_allowed_hosts is empty); send the "
                                  "image as a data: URL"));
  const size_t start = url.find("://") + 3;
  const size_t end = url.find_first_of("/?#", start);
  std::string_view authority = url.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
  if (authority.find('@') != std::string_view::npos)
    return Fail(Error::InvalidArgument(Prefix(index) + "image URL must not carry user information"));
  std::string host;
  if (authority.starts_with('[')) {
    const size_t close = authority.find(']');
    host = Lower(authority.substr(0, close == std::string_view::npos ? authority.size() : close + 1));
  } else {
    host = Lower(authority.substr(0, authority.find(':')));
  }
  if (host.empty()) return Fail(Error::InvalidArgument(Prefix(index) + "image URL has no host"));
  if (std::find(policy.allowed_hosts.begin(), policy.allowed_hosts.end(), host) == policy.allowed_hosts.end())
    return Fail(Error::InvalidArgument(Prefix(index) + "host '" + host.substr(0, 128) +
                                  "' is not in image_url_allowed_hosts"));
  ImageUrlSource out;
  out.remote_url = std::string(url);
  return out;
}

}  // namespace

Result<std::vector<std::string>> ParseImageHostList(std::string_view value) {
  std::vector<std::string> hosts;
  size_t start = 0;
  while (start <= value.size()) {
    const size_t comma = std::min(value.find(',', start), value.size());
    std::string_view item = value.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    start = comma + 1;
    if (item.empty()) continue;
    const bool bracketed = item.size() > 2 && item.front() == '[' && item.back() == ']';
    for (size_t i = bracketed ? 1 : 0; i < item.size() - (bracketed ? 1 : 0); ++i) {
      const unsigned char c = item[i];
      const bool ok = std::isalnum(c) || c == '-' || c == '.' || (bracketed && c == ':');
      if (!ok)
        return Fail(Error::InvalidArgument("'" + std::string(item.substr(0, 128)) +
                                      "' is not a host name (no scheme, port, path or wildcard)"));
    }
    hosts.push_back(Lower(item));
  }
  return hosts;
}

Result<ImageUrlSource> ParseImageUrl(std::string_view url, const ImageUrlPolicy& policy, size_t index) {
  if (StartsWithNoCase(url, "data:")) return ParseDataUrl(url, policy, index);
  if (StartsWithNoCase(url, "https://") || StartsWithNoCase(url, "http://"))
    return CheckRemoteUrl(url, policy, index);
  return Fail(Error::InvalidArgument(Prefix(index) + "image URL must be a data: URL or an http(s) URL"));
}

}  // namespace moeserve
