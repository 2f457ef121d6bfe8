// Publishes a model directory (any layout: a downloaded Hugging Face model,
// a generated checkpoint) to where `moe-daemon pull` reads it: s3://bucket/prefix/
// or file:///dir. Writes manifest.json (engine::Manifest::ToJson, the format the
// puller verifies) and uploads it LAST, so that a puller never sees a manifest
// for an incomplete model.
//
// Guarantees:
//  - Every name is a safe object key (CheckObjectKey); symlinks that leave the
//    directory, symlinked folders and special files are refused before any upload.
//  - Files over multipart_threshold go up in parts of part_size (S3: parts of at
//    least 5 MiB but the last, at most 10,000 parts; part_size grows to fit).
//  - Resumable: a multipart upload's id and finished parts are kept in a state
//    file under state_dir; a new run checks each finished part against the local
//    file (sha256) and sends only the rest. A file already at the target with the
//    same size and sha256 (stored as object metadata) is not sent again.
//  - A file that changed since a partial upload is detected: its stale upload is
//    aborted and started afresh. A file that changes while being sent fails the
//    publish (its bytes no longer match the hash the manifest lists).
//  - Transient faults (5xx, 429, resets) are retried with backoff (RetryPolicy).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/object_source.hpp"
#include "moeserve/storage/retry_policy.hpp"
#include "moeserve/engine/manifest.hpp"

namespace moeserve::storage {

inline constexpr uint64_t kS3MinPartSize = 5ull << 20;
inline constexpr uint64_t kS3MaxParts = 10000;
inline constexpr uint64_t kS3MaxSinglePut = 5ull << 30;

struct PublishOptions {
  SourceOptions target;  // endpoint, region, addressing, credentials (as the puller takes them)
  uint64_t multipart_threshold = kS3MaxSinglePut;  // files larger than this go up in parts
  uint64_t part_size = 64ull << 20;
  // Tests use parts below S3's 5 MiB minimum against servers that allow them.
  bool allow_small_parts = false;
  std::string state_dir;  // resume state; empty: $XDG_STATE_HOME or ~/.local/state, then moeserve/publish
  bool follow_symlinks = false;  // follow links that leave the directory (a Hugging Face cache snapshot)
  bool write_local_manifest = true;  // also leave manifest.json in the model directory
  RetryPolicy retry;
  bool log_progress = true;
  // Called after each part is stored; an error stops the publish there (tests interrupt with it).
  std::function<Status(const std::string& path, int part_number)> after_part;
};

struct PublishStats {
  int files = 0;
  int files_sent = 0;
  int files_skipped = 0;   // already at the target with the same size and sha256
  int parts_sent = 0;
  int parts_resumed = 0;   // finished by an earlier run, checked and kept
  int uploads_restarted = 0;  // stale multipart uploads dropped because the file changed
  uint64_t bytes_sent = 0;
};

struct PublishResult {
  engine::Manifest manifest;
  // sha256 of the manifest.json written: names this exact content, a natural
  // MoEDeployment spec.model.revision (a changed file gives a new one).
  std::string manifest_sha256;
  PublishStats stats;
};

// The part size a file of `size` bytes goes up in: `requested`, raised so that
// no file needs more than 10,000 parts and, unless small parts are allowed,
// to S3's 5 MiB minimum.
uint64_t PlanPartSize(uint64_t size, uint64_t requested, bool allow_small_parts);

// Lists dir's files as object keys, refusing unsafe names, escaping symlinks,
// symlinked folders and special files; then hashes them (engine::Manifest, whose
// ToJson is the manifest.json the puller and the engine read).
Result<engine::Manifest> ManifestForPublish(const std::string& dir, bool follow_symlinks);

Result<PublishResult> PublishModel(const std::string& dir, const std::string& target_uri, const PublishOptions& options);

}  // namespace moeserve::storage
