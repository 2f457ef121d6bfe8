#include "moeserve/storage/source_uri.hpp"

namespace moeserve::storage {

Result<SourceUri> ParseSourceUri(std::string_view uri) {
  SourceUri out;
  out.original = std::string(uri);
  auto starts = [&](std::string_view p) { return uri.substr(0, p.size()) == p; };
  if (starts("file://")) {
    out.kind = SourceUri::Kind::kFile;
    out.path = std::string(uri.substr(7));
    if (out.path.empty() || out.path[0] != '/')
      return Fail(Error::InvalidArgument("source '" + out.original + "': file:// needs an absolute path (file:///dir)"));
    while (out.path.size() > 1 && out.path.back() == '/') out.path.pop_back();
    return out;
  }
  if (starts("s3://")) {
    out.kind = SourceUri::Kind::kS3;
    std::string_view rest = uri.substr(5);
    size_t slash = rest.find('/');
    out.bucket = std::string(rest.substr(0, slash));
    if (slash != std::string_view::npos) out.prefix = std::string(rest.substr(slash + 1));
    if (out.bucket.empty())
      return Fail(Error::InvalidArgument("source '" + out.original + "': s3:// needs a bucket (s3://bucket/prefix/)"));
    if (!out.prefix.empty() && out.prefix.back() != '/') out.prefix += '/';
    return out;
  }
  if (starts("http://") || starts("https://")) {
    out.kind = SourceUri::Kind::kHttp;
    size_t host_start = uri.find("://") + 3;
    if (host_start >= uri.size() || uri[host_start] == '/')
      return Fail(Error::InvalidArgument("source '" + out.original + "': missing host"));
    out.base_url = std::string(uri);
    if (out.base_url.find('/', host_start) == std::string::npos) out.base_url += '/';
    if (out.base_url.back() != '/') out.base_url += '/';
    return out;
  }
  return Fail(Error::InvalidArgument("source '" + out.original +
                                     "': unsupported scheme (expected s3://, https://, http:// or file://)"));
}

}  // namespace moeserve::storage
