#include "resume_record.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/storage/nofollow.hpp"

namespace moeserve::storage {
namespace {

constexpr const char* kStateDir = ".pull";
// plan.json is two fields; anything larger was not written by us.
constexpr size_t kMaxPlanBytes = 4096;

// The part size of a plan made for manifest_sha256, or 0 when the plan is
// missing, unreadable or made for another manifest.
uint64_t ReusablePartSize(int dir_fd, const std::string& dir, const std::string& manifest_sha256) {
  auto text = ReadFileAt(dir_fd, std::string(kStateDir) + "/plan.json", kMaxPlanBytes, dir);
  if (!text) return 0;
  auto parsed = ParseJsonBounded<nlohmann::json>(*text, {.max_bytes = kMaxPlanBytes, .max_depth = kMaxJsonDepth},
                                                 dir + "/.pull/plan.json");
  if (!parsed || !parsed->is_object()) return 0;  // not ours to trust: start a new plan
  const nlohmann::json& j = *parsed;
  auto sha = j.find("manifest_sha256"), size = j.find("part_size");
  if (sha == j.end() || !sha->is_string() || *sha != manifest_sha256) return 0;
  if (size == j.end() || !size->is_number_unsigned()) return 0;
  return size->get<uint64_t>();
}

}  // namespace

Result<std::unique_ptr<ResumeRecord>> ResumeRecord::OpenOrCreate(int dir_fd, const std::string& dir,
                                                                 const engine::Manifest& manifest,
                                                                 const std::string& manifest_sha256,
                                                                 uint64_t part_size) {
  std::unique_ptr<ResumeRecord> r(new ResumeRecord());
  r->dir_fd_ = dir_fd;
  r->state_dir_ = dir + "/" + kStateDir;
  uint64_t reused_part_size = ReusablePartSize(dir_fd, dir, manifest_sha256);
  bool reuse = reused_part_size > 0;
  if (reuse) {
    part_size = reused_part_size;
  } else {
    // A different manifest (new revision content) or no record: start clean.
    MOE_TRY(ClearDirectory(dir_fd, dir));
  }
  MOE_ASSIGN_OR_RETURN(UniqueFd state, OpenDirectoryAt(dir_fd, kStateDir, true, dir));
  r->part_size_ = part_size;
  for (size_t f = 0; f < manifest.files.size(); ++f) {
    uint64_t size = manifest.files[f].size;
    for (uint64_t off = 0; off < size; off += part_size) r->parts_.push_back({f, off, std::min(part_size, size - off)});
  }
  r->done_ = std::make_unique<std::atomic<uint64_t>[]>(r->parts_.size());
  MOE_ASSIGN_OR_RETURN(UniqueFd progress, OpenFileAt(state.get(), "progress.bin", O_RDWR | O_CREAT, r->state_dir_));
  r->fd_ = progress.release();
  if (reuse) {
    std::vector<uint64_t> counts(r->parts_.size(), 0);
    ssize_t n = ::pread(r->fd_, counts.data(), counts.size() * sizeof(uint64_t), 0);
    for (size_t i = 0; i < r->parts_.size(); ++i) {
      uint64_t v = (n >= 0 && static_cast<size_t>(n) >= (i + 1) * sizeof(uint64_t)) ? counts[i] : 0;
      r->done_[i] = std::min(v, r->parts_[i].length);
    }
  } else {
    if (::ftruncate(r->fd_, static_cast<off_t>(r->parts_.size() * sizeof(uint64_t))) != 0)
      return Fail(Error::Io("cache: sizing '" + r->state_dir_ + "/progress.bin': " + std::strerror(errno)));
    nlohmann::json plan = {{"manifest_sha256", manifest_sha256}, {"part_size", part_size}};
    // The plan is written after progress.bin exists, so a plan on disk always has its counts.
    MOE_TRY(WriteFileAt(state.get(), "plan.json", plan.dump(), r->state_dir_));
  }
  return r;
}

ResumeRecord::~ResumeRecord() {
  if (fd_ >= 0) ::close(fd_);
}

Status ResumeRecord::SetDone(size_t part, uint64_t bytes) {
  done_[part].store(bytes, std::memory_order_relaxed);
  // One aligned 8-byte pwrite per call: cheap next to the data it counts.
  if (::pwrite(fd_, &bytes, sizeof(bytes), static_cast<off_t>(part * sizeof(uint64_t))) != sizeof(bytes))
    return Fail(Error::Io("cache: writing resume record in '" + state_dir_ + "': " + std::strerror(errno)));
  return Ok();
}

uint64_t ResumeRecord::TotalDone() const {
  uint64_t total = 0;
  for (size_t i = 0; i < parts_.size(); ++i) total += Done(i);
  return total;
}

Status ResumeRecord::Remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::string dir = state_dir_.substr(0, state_dir_.size() - std::string(kStateDir).size() - 1);
  return RemoveTreeAt(dir_fd_, kStateDir, dir);
}

}  // namespace moeserve::storage
