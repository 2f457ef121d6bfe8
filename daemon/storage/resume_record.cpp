#include "resume_record.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "moeserve/common/durable_file.hpp"

namespace moeserve::daemon::storage {
namespace fs = std::filesystem;

Result<std::unique_ptr<ResumeRecord>> ResumeRecord::OpenOrCreate(const std::string& dir,
                                                                 const engine::Manifest& manifest,
                                                                 const std::string& manifest_sha256,
                                                                 uint64_t part_size) {
  std::unique_ptr<ResumeRecord> r(new ResumeRecord());
  r->state_dir_ = dir + "/.pull";
  std::error_code ec;
  bool reuse = false;
  {
    std::ifstream in(r->state_dir_ + "/plan.json");
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      auto j = nlohmann::json::parse(ss.str(), nullptr, false);
      if (!j.is_discarded() && j.value("manifest_sha256", "") == manifest_sha256 && j.value("part_size", 0ull) > 0) {
        reuse = true;
        part_size = j["part_size"].get<uint64_t>();
      }
    }
  }
  if (!reuse) {
    // A different manifest (new revision content) or no record: start clean.
    fs::remove_all(dir, ec);
    fs::create_directories(r->state_dir_, ec);
    if (ec) return Fail(Error::Io("cache: creating '" + r->state_dir_ + "': " + ec.message()));
  }
  r->part_size_ = part_size;
  for (size_t f = 0; f < manifest.files.size(); ++f) {
    uint64_t size = manifest.files[f].size;
    for (uint64_t off = 0; off < size; off += part_size) r->parts_.push_back({f, off, std::min(part_size, size - off)});
  }
  r->done_ = std::make_unique<std::atomic<uint64_t>[]>(r->parts_.size());
  std::string progress = r->state_dir_ + "/progress.bin";
  r->fd_ = ::open(progress.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (r->fd_ < 0) return Fail(Error::Io("cache: open '" + progress + "': " + std::strerror(errno)));
  if (reuse) {
    std::vector<uint64_t> counts(r->parts_.size(), 0);
    ssize_t n = ::pread(r->fd_, counts.data(), counts.size() * sizeof(uint64_t), 0);
    for (size_t i = 0; i < r->parts_.size(); ++i) {
      uint64_t v = (n >= 0 && static_cast<size_t>(n) >= (i + 1) * sizeof(uint64_t)) ? counts[i] : 0;
      r->done_[i] = std::min(v, r->parts_[i].length);
    }
  } else {
    if (::ftruncate(r->fd_, static_cast<off_t>(r->parts_.size() * sizeof(uint64_t))) != 0)
      return Fail(Error::Io("cache: sizing '" + progress + "': " + std::strerror(errno)));
    nlohmann::json plan = {{"manifest_sha256", manifest_sha256}, {"part_size", part_size}};
    // The plan is written after progress.bin exists, so a plan on disk always has its counts.
    MOE_TRY(WriteFileDurably(r->state_dir_ + "/plan.json", plan.dump()));
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
  std::error_code ec;
  fs::remove_all(state_dir_, ec);
  if (ec) return Fail(Error::Io("cache: removing '" + state_dir_ + "': " + ec.message()));
  return Ok();
}

}  // namespace moeserve::daemon::storage
