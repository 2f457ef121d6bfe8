// Builds signed S3 requests: the URL (path-style or virtual-host style) and
// the headers, Authorization included. The one place that knows how an S3
// bucket and key map to HTTP.
#pragma once

#include <chrono>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/sigv4.hpp"

namespace moeserve::storage {

struct S3Endpoint {
  std::string scheme = "https";
  std::string host;        // host[:port] of the service, without the bucket
  std::string region = "us-east-1";
  bool path_style = false; // true: scheme://host/bucket/key; false: scheme://bucket.host/key
};

enum class S3AddressingStyle { kAuto, kPath, kVirtualHost };

// endpoint_url empty: AWS (https://s3.<region>.amazonaws.com, virtual-host
// style). A custom endpoint defaults to path style (most S3-compatible stores
// and anything on an IP address need it).
Result<S3Endpoint> MakeS3Endpoint(const std::string& endpoint_url, const std::string& region,
                                  S3AddressingStyle style);

struct HttpRequestSpec {
  std::string method;
  std::string url;
  KeyValues headers;  // to send as given
};

// extra_headers (e.g. range) are sent and signed. Anonymous when credentials are empty.
// payload_sha256: hex sha256 of the body to send (uploads); empty means no body. S3
// rejects a body whose hash differs, so a signed upload cannot store other bytes.
HttpRequestSpec BuildS3Request(const S3Endpoint& endpoint, const AwsCredentials& credentials,
                               const std::string& method, const std::string& bucket, const std::string& key,
                               const KeyValues& query, const KeyValues& extra_headers,
                               std::chrono::system_clock::time_point now, const std::string& payload_sha256 = "");

}  // namespace moeserve::storage
