// Private factories behind OpenObjectSource.
#pragma once

#include <memory>
#include <string>

#include "moeserve/storage/object_source.hpp"

namespace moeserve::storage {

std::unique_ptr<ObjectSource> MakeFileSource(const std::string& root);
// http(s) when s3 is null; S3 (signed, listable) otherwise.
struct S3Target {
  S3Endpoint endpoint;
  AwsCredentials credentials;
  std::string bucket;
  std::string prefix;
};
std::unique_ptr<ObjectSource> MakeHttpSource(const std::string& base_url, std::optional<S3Target> s3,
                                             const SourceOptions& options);

}  // namespace moeserve::storage
