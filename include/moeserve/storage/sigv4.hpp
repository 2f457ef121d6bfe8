// AWS Signature Version 4 (header form) as the published signing process
// describes it: canonical request -> string to sign -> HMAC-SHA256 chain.
// Pure functions over strings; the clock is an argument so that tests can
// compare against other signers with a frozen time.
//
// Thread safety: all functions are reentrant.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::storage {

using KeyValues = std::vector<std::pair<std::string, std::string>>;

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
  bool empty() const { return access_key_id.empty(); }
};

struct SigV4Request {
  std::string method;         // "GET", "HEAD", ...
  std::string canonical_uri;  // the path exactly as sent (already URI-encoded), e.g. "/bucket/a%20b"
  KeyValues query;            // decoded names and values; encoded and sorted while signing
  KeyValues headers;          // every header to sign, including host; names in any case
  std::string payload_sha256; // hex, or "UNSIGNED-PAYLOAD"
};

struct SigV4Scope {
  std::string region = "us-east-1";
  std::string service = "s3";
};

// RFC 3986 unreserved characters pass; everything else becomes %XX (uppercase).
std::string AwsUriEncode(std::string_view s, bool encode_slash);
// "20150830T123600Z"
std::string AmzDate(std::chrono::system_clock::time_point t);

std::string CanonicalRequest(const SigV4Request& request);
std::string StringToSign(const SigV4Request& request, const SigV4Scope& scope, std::string_view amz_date);
// The Authorization header value: "AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...".
std::string AuthorizationHeader(const SigV4Request& request, const AwsCredentials& credentials,
                                const SigV4Scope& scope, std::string_view amz_date);

// Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN,
// else from a shared-credentials INI file (credentials_file, else
// AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) under profile
// AWS_PROFILE or "default". Returns empty credentials (anonymous access)
// when none are configured; an unreadable or malformed explicit file is an error.
Result<AwsCredentials> LoadAwsCredentials(const std::string& credentials_file = "");

}  // namespace moeserve::storage
