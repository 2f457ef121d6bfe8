// WeightPuller: object storage -> verified, node-local model directory.
//
//   WeightPuller puller({.root = "/var/cache/moeserve", .size_limit_bytes = 0});
//   PullOptions opts;
//   opts.revision = "v1";
//   opts.source.endpoint_url = "http://minio:9000";    // empty for AWS
//   // /readyz stays 503 with the pull's state until Pull returns:
//   opts.on_progress = [&](const PullProgress& p) { readiness.Set("pulling", p.ToLogLine()); };
//   PullStatus status;                                   // or poll status.Snapshot().ToJson()
//   MOE_ASSIGN_OR_RETURN(PulledModel m, puller.Pull("s3://b/models/tiny/", opts, &status));
//   OpenModelDir(m.dir);                                 // keep m (its lease) while serving
//
// Guarantees: manifest.json lists every file with size and sha256, and each is
// checked before the model becomes visible (a missing manifest is an error
// unless options.verify is false). Whether a model was verified is part of its
// cache key, so an unverified pull never satisfies a verified request (a
// verified copy does satisfy an unverified one). In every mode, a key or
// manifest path that would leave the model's folder is refused before any
// byte is fetched (object_key.hpp), links found in the cache are refused, not
// followed (nofollow.hpp), and an https source is never redirected to http.
// Downloads run as parallel ranged GETs; an interrupted pull (error, crash,
// kill -9) resumes from the last byte each stream wrote, never fetching
// completed bytes again. Several processes may
// pull the same model into one cache: one downloads, the others wait and reuse.
//
// Thread safety: Pull may be called concurrently from several threads/processes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/model_cache.hpp"
#include "moeserve/storage/object_source.hpp"
#include "moeserve/storage/pull_status.hpp"
#include "moeserve/storage/retry_policy.hpp"

namespace moeserve::storage {

struct PullOptions {
  std::string revision;       // with the URI, the cache key
  bool verify = true;         // false: no manifest needed (s3:// and file:// are listed instead)
  // Hash every file of a cached verified model again before reusing it (reads
  // the whole model); otherwise reuse checks its files' kinds and sizes only.
  bool reverify_cached = false;
  int connections = 8;        // parallel ranged GETs
  uint64_t part_size = 8ull << 20;
  RetryPolicy retry;
  SourceOptions source;
  // Called from a background thread about every progress_interval while downloading.
  std::function<void(const PullProgress&)> on_progress;
  std::chrono::milliseconds progress_interval{1000};
  bool log_progress = true;   // log lines with bytes, rate and ETA
};

struct PullStats {
  bool reused = false;         // already in the cache (or pulled by another process meanwhile)
  uint64_t bytes_total = 0;
  uint64_t bytes_fetched = 0;  // over the network by this call
  uint64_t bytes_resumed = 0;  // found in a partial download and kept
  int files_refetched = 0;     // after a sha256 mismatch
  double seconds = 0;
};

struct PulledModel {
  std::string dir;  // models/<key>: complete and verified
  PullStats stats;
  FileLock lease;   // keeps the model from eviction while held
};

class WeightPuller {
 public:
  explicit WeightPuller(CacheConfig cache) : cache_config_(std::move(cache)) {}
  Result<PulledModel> Pull(const std::string& uri, const PullOptions& options, PullStatus* status = nullptr) const;

 private:
  CacheConfig cache_config_;
};

}  // namespace moeserve::storage
