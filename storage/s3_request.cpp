#include "moeserve/storage/s3_request.hpp"

#include <cstdlib>

namespace moeserve::storage {

// Hashes of an empty body: every request we sign is a GET or HEAD.
static constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

Result<S3Endpoint> MakeS3Endpoint(const std::string& endpoint_url, const std::string& region_in,
                                  S3AddressingStyle style) {
  S3Endpoint e;
  e.region = region_in;
  if (e.region.empty()) {
    for (const char* var : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
      const char* v = std::getenv(var);
      if (v && *v) {
        e.region = v;
        break;
      }
    }
  }
  if (e.region.empty()) e.region = "us-east-1";
  if (endpoint_url.empty()) {
    e.scheme = "https";
    e.host = "s3." + e.region + ".amazonaws.com";
    e.path_style = style == S3AddressingStyle::kPath;
    return e;
  }
  size_t sep = endpoint_url.find("://");
  if (sep == std::string::npos)
    return Fail(Error::InvalidArgument("endpoint '" + endpoint_url + "': expected http://host[:port] or https://host[:port]"));
  e.scheme = endpoint_url.substr(0, sep);
  if (e.scheme != "http" && e.scheme != "https")
    return Fail(Error::InvalidArgument("endpoint '" + endpoint_url + "': scheme must be http or https"));
  e.host = endpoint_url.substr(sep + 3);
  while (!e.host.empty() && e.host.back() == '/') e.host.pop_back();
  if (e.host.empty() || e.host.find('/') != std::string::npos)
    return Fail(Error::InvalidArgument("endpoint '" + endpoint_url + "': expected scheme://host[:port] without a path"));
  // Default ports are not part of the Host header (as HTTP clients send it).
  if (e.scheme == "https" && e.host.ends_with(":443")) e.host.resize(e.host.size() - 4);
  if (e.scheme == "http" && e.host.ends_with(":80")) e.host.resize(e.host.size() - 3);
  e.path_style = style != S3AddressingStyle::kVirtualHost;
  return e;
}

HttpRequestSpec BuildS3Request(const S3Endpoint& endpoint, const AwsCredentials& credentials,
                               const std::string& method, const std::string& bucket, const std::string& key,
                               const KeyValues& query, const KeyValues& extra_headers,
                               std::chrono::system_clock::time_point now, const std::string& payload_sha256) {
  std::string host = endpoint.path_style ? endpoint.host : bucket + "." + endpoint.host;
  std::string path = endpoint.path_style ? "/" + AwsUriEncode(bucket, true) + "/" + AwsUriEncode(key, false)
                                         : "/" + AwsUriEncode(key, false);
  if (endpoint.path_style && key.empty()) path = "/" + AwsUriEncode(bucket, true);
  std::string url = endpoint.scheme + "://" + host + path;
  std::string qs;
  for (const auto& [k, v] : query) {
    qs += qs.empty() ? "?" : "&";
    qs += AwsUriEncode(k, true) + "=" + AwsUriEncode(v, true);
  }
  url += qs;

  HttpRequestSpec spec;
  spec.method = method;
  spec.url = url;
  spec.headers = extra_headers;
  if (credentials.empty()) return spec;

  std::string amz_date = AmzDate(now);
  const std::string body_sha256 = payload_sha256.empty() ? std::string(kEmptySha256) : payload_sha256;
  SigV4Request sr;
  sr.method = method;
  sr.canonical_uri = path;
  sr.query = query;
  sr.payload_sha256 = body_sha256;
  sr.headers = extra_headers;
  sr.headers.emplace_back("host", host);
  sr.headers.emplace_back("x-amz-content-sha256", body_sha256);
  sr.headers.emplace_back("x-amz-date", amz_date);
  if (!credentials.session_token.empty()) sr.headers.emplace_back("x-amz-security-token", credentials.session_token);
  std::string auth = AuthorizationHeader(sr, credentials, SigV4Scope{endpoint.region, "s3"}, amz_date);
  spec.headers.emplace_back("x-amz-content-sha256", body_sha256);
  spec.headers.emplace_back("x-amz-date", amz_date);
  if (!credentials.session_token.empty()) spec.headers.emplace_back("x-amz-security-token", credentials.session_token);
  spec.headers.emplace_back("Authorization", auth);
  return spec;
}

}  // namespace moeserve::storage
