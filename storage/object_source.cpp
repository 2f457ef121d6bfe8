#include "moeserve/storage/object_source.hpp"

#include "source_factories.hpp"

namespace moeserve::storage {

Result<std::unique_ptr<ObjectSource>> OpenObjectSource(const SourceUri& uri, const SourceOptions& options) {
  switch (uri.kind) {
    case SourceUri::Kind::kFile:
      return MakeFileSource(uri.path);
    case SourceUri::Kind::kHttp:
      return MakeHttpSource(uri.base_url, std::nullopt, options);
    case SourceUri::Kind::kS3: {
      S3Target target;
      MOE_ASSIGN_OR_RETURN(target.endpoint, MakeS3Endpoint(options.endpoint_url, options.region, options.addressing));
      if (options.credentials) {
        target.credentials = *options.credentials;
      } else {
        MOE_ASSIGN_OR_RETURN(target.credentials, LoadAwsCredentials(options.credentials_file));
      }
      target.bucket = uri.bucket;
      target.prefix = uri.prefix;
      return MakeHttpSource("", std::move(target), options);
    }
  }
  return Fail(Error::Internal("unknown source kind"));
}

Result<std::string> ReadWholeObject(ObjectConnection& conn, const std::string& key) {
  std::string out;
  constexpr size_t kMax = 64 << 20;
  auto got = conn.Get(key, 0, kToEnd, [&](const char* d, size_t n) -> Status {
    if (out.size() + n > kMax) return Fail(Error::ResourceExhausted("object '" + key + "' is larger than 64 MiB"));
    out.append(d, n);
    return Ok();
  });
  if (!got) return Fail(got.error());
  return out;
}

}  // namespace moeserve::storage
