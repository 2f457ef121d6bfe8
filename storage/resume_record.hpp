// The resume record of a partial download: how many bytes of each part are on
// disk. It lives in partial/<key>/.pull/ beside the files being written, and
// is reached through partial/<key>'s descriptor without following links:
//   plan.json     {"manifest_sha256", "part_size"}: the plan the counts refer to
//   progress.bin  one little-endian uint64 per part: bytes written from the part's start
// A worker writes data with pwrite before it records the count, so after a
// crash (kill -9 included: the page cache survives the process) every counted
// byte is on disk; a power cut may lose some, which the sha256 check catches.
//
// Thread safety: SetDone for different parts may run concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/manifest.hpp"

namespace moeserve::storage {

struct PartSpan {
  size_t file = 0;  // index into the manifest's files
  uint64_t offset = 0;
  uint64_t length = 0;
};

class ResumeRecord {
 public:
  // Reuses the record in dir_fd (partial/<key>, shown as `dir` in messages)
  // when it was made for the same manifest (keeping its part size); otherwise
  // clears the folder and starts a new plan with part_size.
  static Result<std::unique_ptr<ResumeRecord>> OpenOrCreate(int dir_fd, const std::string& dir,
                                                            const engine::Manifest& manifest,
                                                            const std::string& manifest_sha256, uint64_t part_size);
  ~ResumeRecord();

  const std::vector<PartSpan>& parts() const { return parts_; }
  uint64_t part_size() const { return part_size_; }
  uint64_t Done(size_t part) const { return done_[part].load(std::memory_order_relaxed); }
  Status SetDone(size_t part, uint64_t bytes);
  // Sum of Done over all parts.
  uint64_t TotalDone() const;
  // Drops the state folder once the model is verified.
  Status Remove();

 private:
  ResumeRecord() = default;
  int dir_fd_ = -1;  // partial/<key>, owned by the caller
  std::string state_dir_;
  uint64_t part_size_ = 0;
  std::vector<PartSpan> parts_;
  std::unique_ptr<std::atomic<uint64_t>[]> done_;
  int fd_ = -1;
};

}  // namespace moeserve::storage
