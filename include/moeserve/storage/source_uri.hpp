// Where a model's objects live: s3://bucket/prefix/, http(s)://host/path/ or
// file:///dir. Object keys in manifest.json are relative to that root.
#pragma once

#include <string>
#include <string_view>

#include "moeserve/common/status.hpp"

namespace moeserve::storage {

struct SourceUri {
  enum class Kind { kFile, kHttp, kS3 };
  Kind kind = Kind::kFile;
  std::string original;  // as given, used in cache keys and messages
  std::string path;      // kFile: absolute directory
  std::string base_url;  // kHttp: scheme://host[:port]/path/ (always ends in '/')
  std::string bucket;    // kS3
  std::string prefix;    // kS3: key prefix, empty or ending in '/'
};

// Rejects unknown schemes, empty buckets and relative file paths.
Result<SourceUri> ParseSourceUri(std::string_view uri);

}  // namespace moeserve::storage
