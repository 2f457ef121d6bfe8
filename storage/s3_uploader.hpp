// The S3 write calls the publisher needs, over libcurl with the puller's
// signer (BuildS3Request): HEAD, PUT from a file, and multipart upload
// (create, part, complete, abort). Each call retries transient faults (5xx,
// 429, resets) with the RetryPolicy's backoff; 403 and a missing bucket are
// final errors that quote what the server said.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/retry_policy.hpp"
#include "moeserve/storage/s3_request.hpp"
#include "moeserve/http_client/curl_easy.hpp"

namespace moeserve::storage {

struct S3ObjectHead {
  uint64_t size = 0;
  std::string sha256;  // x-amz-meta-sha256 as the publisher stored it; empty if absent
};

struct S3CompletedPart {
  int number = 0;
  std::string etag;
};

class S3Uploader {
 public:
  S3Uploader(S3Endpoint endpoint, AwsCredentials credentials, std::string bucket, std::string ca_file,
             RetryPolicy retry);
  ~S3Uploader();
  S3Uploader(const S3Uploader&) = delete;
  S3Uploader& operator=(const S3Uploader&) = delete;

  // Fails early and clearly on a missing bucket or refused credentials
  // (probe_key may or may not exist).
  Status CheckBucket(const std::string& probe_key);
  // nullopt when the object does not exist.
  Result<std::optional<S3ObjectHead>> Head(const std::string& key);
  // A single PUT of a whole file; sha256 is its hash (signed, and kept as metadata).
  Status PutFile(const std::string& key, const std::string& path, uint64_t size, const std::string& sha256);
  Status PutBytes(const std::string& key, std::string_view data, const std::string& content_type);
  Result<std::string> CreateMultipartUpload(const std::string& key, const std::string& sha256);
  // Returns the part's ETag.
  Result<std::string> UploadPart(const std::string& key, const std::string& upload_id, int number,
                                 std::string_view data);
  Status CompleteMultipartUpload(const std::string& key, const std::string& upload_id,
                                 const std::vector<S3CompletedPart>& parts);
  Status AbortMultipartUpload(const std::string& key, const std::string& upload_id);

  std::string Describe(const std::string& key) const { return "s3://" + bucket_ + "/" + key; }

 private:
  struct Response;
  struct Body;
  Result<Response> Send(const std::string& method, const std::string& key, const KeyValues& query,
                        const KeyValues& headers, const Body& body, const std::string& payload_sha256);
  Result<Response> SendWithRetry(const std::string& what, const std::string& method, const std::string& key,
                                 const KeyValues& query, const KeyValues& headers, const Body& body,
                                 const std::string& payload_sha256);

  S3Endpoint endpoint_;
  AwsCredentials credentials_;
  std::string bucket_;
  std::string ca_file_;
  RetryPolicy retry_;
  http_client::CurlEasy curl_;  // reused for keep-alive
};

}  // namespace moeserve::storage
