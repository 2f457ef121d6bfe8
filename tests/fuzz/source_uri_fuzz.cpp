// Model source URIs (ParseSourceUri), as given on the command line and in
// MoEDeployment specs. An accepted URI has the shape source_uri.hpp states:
// file paths absolute, http(s) base URLs ending in '/', S3 buckets non-empty
// with a prefix that is empty or ends in '/'.
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "moeserve/storage/source_uri.hpp"

using namespace moeserve;
using namespace moeserve::storage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view uri(reinterpret_cast<const char*>(data), size);
  auto parsed = ParseSourceUri(uri);
  if (!parsed) {
    FUZZ_CHECK(!parsed.error().message().empty(), "a refusal says why");
    return 0;
  }
  FUZZ_CHECK(parsed->original == uri, "original is the URI as given");
  switch (parsed->kind) {
    case SourceUri::Kind::kFile:
      FUZZ_CHECK(parsed->path.starts_with("/"), "file path not absolute: " + parsed->path);
      break;
    case SourceUri::Kind::kHttp:
      FUZZ_CHECK(parsed->base_url.starts_with("http://") || parsed->base_url.starts_with("https://"), parsed->base_url);
      FUZZ_CHECK(parsed->base_url.ends_with("/"), "base URL without a final '/': " + parsed->base_url);
      break;
    case SourceUri::Kind::kS3:
      FUZZ_CHECK(!parsed->bucket.empty(), "empty bucket");
      FUZZ_CHECK(parsed->bucket.find('/') == std::string::npos, "bucket with a '/': " + parsed->bucket);
      FUZZ_CHECK(parsed->prefix.empty() || parsed->prefix.ends_with("/"), "prefix: " + parsed->prefix);
      break;
  }
  return 0;
}
