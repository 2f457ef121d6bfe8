// Reads objects from a model's source (file, http(s), S3) by key and byte
// range. A source is shared by all download workers; each worker opens its own
// ObjectConnection (one keep-alive HTTP connection, one curl handle).
//
// Errors: kNotFound / kPermissionDenied name the bucket (or host) and key and
// quote what the server said; they are final. kUnavailable and kTimeout are
// transient (resets, short bodies, 5xx, 429, stalls) and worth retrying;
// RetryAfter() then holds the server's Retry-After, if any.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/s3_request.hpp"
#include "moeserve/storage/source_uri.hpp"

namespace moeserve::storage {

struct ObjectInfo {
  std::string key;  // relative to the source root
  uint64_t size = 0;
};

// Receives body bytes in order; an error aborts the transfer.
using ByteSink = std::function<Status(const char* data, size_t size)>;

inline constexpr uint64_t kToEnd = UINT64_MAX;

class ObjectConnection {
 public:
  virtual ~ObjectConnection() = default;
  // Streams bytes [offset, offset + length) of key into sink (length kToEnd:
  // to the end). Returns the byte count delivered, which equals length unless
  // length is kToEnd; a body that ends early is a kUnavailable error after the
  // delivered bytes were passed to sink.
  virtual Result<uint64_t> Get(const std::string& key, uint64_t offset, uint64_t length, const ByteSink& sink) = 0;
  // The last response's Retry-After, when it sent one.
  virtual std::optional<std::chrono::milliseconds> RetryAfter() const = 0;
};

class ObjectSource {
 public:
  virtual ~ObjectSource() = default;
  virtual std::unique_ptr<ObjectConnection> Connect() = 0;
  // Every object under the root (for pulls without a manifest). http(s) cannot list.
  virtual Result<std::vector<ObjectInfo>> List() = 0;
  // "s3://bucket/prefix/key", for messages.
  virtual std::string Describe(const std::string& key) const = 0;
};

struct SourceOptions {
  // S3 only.
  std::string endpoint_url;  // empty: AWS
  std::string region;        // empty: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1
  S3AddressingStyle addressing = S3AddressingStyle::kAuto;
  std::string credentials_file;
  std::optional<AwsCredentials> credentials;  // overrides the environment when set
  // http(s) and S3.
  std::string ca_file;  // PEM bundle to trust instead of the system's (private CAs, tests)
  std::chrono::milliseconds connect_timeout{10000};
  // A transfer that moves no byte for this long is abandoned (then retried).
  std::chrono::seconds stall_timeout{30};
};

Result<std::unique_ptr<ObjectSource>> OpenObjectSource(const SourceUri& uri, const SourceOptions& options);

// Reads a whole small object (manifest.json) through conn.
Result<std::string> ReadWholeObject(ObjectConnection& conn, const std::string& key);

}  // namespace moeserve::storage
