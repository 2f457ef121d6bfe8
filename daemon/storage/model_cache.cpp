#include "moeserve/daemon/storage/model_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/log.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/common/durable_file.hpp"

namespace moeserve::daemon::storage {
namespace fs = std::filesystem;

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    Release();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() { Release(); }

void FileLock::Release() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
  fd_ = -1;
}

Result<FileLock> LockFile(const std::string& path, LockMode mode, bool try_only) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Fail(Error::Io("lock '" + path + "': open: " + std::strerror(errno)));
  int op = (mode == LockMode::kShared ? LOCK_SH : LOCK_EX) | (try_only ? LOCK_NB : 0);
  while (::flock(fd, op) != 0) {
    int err = errno;
    if (err == EINTR) continue;
    ::close(fd);
    if (err == EWOULDBLOCK && try_only) return FileLock();
    return Fail(Error::Io("lock '" + path + "': flock: " + std::strerror(err)));
  }
  return FileLock(fd);
}

Result<ModelCache> ModelCache::Open(const CacheConfig& config) {
  if (config.root.empty()) return Fail(Error::InvalidArgument("cache directory is empty"));
  for (const char* sub : {"models", "partial", "meta", "locks", "trash"}) {
    std::error_code ec;
    fs::create_directories(fs::path(config.root) / sub, ec);
    if (ec) return Fail(Error::Io("cache '" + config.root + "': creating " + sub + ": " + ec.message()));
  }
  return ModelCache(config);
}

std::string ModelCache::Key(const std::string& uri, const std::string& revision) {
  return Sha256Hex(uri + "\n" + revision).substr(0, 32);
}

std::string ModelCache::ModelPath(const std::string& key) const { return config_.root + "/models/" + key; }
std::string ModelCache::PartialPath(const std::string& key) const { return config_.root + "/partial/" + key; }

Result<FileLock> ModelCache::LockForPull(const std::string& key) const {
  return LockFile(config_.root + "/locks/" + key + ".pull", LockMode::kExclusive);
}

bool ModelCache::IsComplete(const std::string& key) const {
  std::error_code ec;
  return fs::is_directory(ModelPath(key), ec);
}

Result<FileLock> ModelCache::Lease(const std::string& key) const {
  MOE_ASSIGN_OR_RETURN(FileLock lock, LockFile(config_.root + "/locks/" + key + ".use", LockMode::kShared));
  // Checked after locking: an evictor holds the lock exclusively while it removes.
  if (!IsComplete(key)) return Fail(Error::NotFound("cache: model " + key + " is not in " + config_.root));
  std::string meta = config_.root + "/meta/" + key + ".json";
  ::utimensat(AT_FDCWD, meta.c_str(), nullptr, 0);  // last use, for LRU
  return lock;
}

Status ModelCache::Publish(const std::string& key, const std::string& uri, const std::string& revision,
                           uint64_t bytes) const {
  nlohmann::json meta = {{"uri", uri}, {"revision", revision}, {"bytes", bytes}};
  std::string meta_path = config_.root + "/meta/" + key + ".json";
  // Meta first: a model without meta would be invisible to the size limit.
  MOE_TRY(WriteFileDurably(meta_path, meta.dump()));
  MOE_TRY(FsyncPath(PartialPath(key)));
  if (::rename(PartialPath(key).c_str(), ModelPath(key).c_str()) != 0)
    return Fail(Error::Io("cache: rename '" + PartialPath(key) + "' -> '" + ModelPath(key) + "': " + std::strerror(errno)));
  MOE_TRY(FsyncPath(config_.root + "/models"));
  MOE_TRY(FsyncPath(config_.root + "/partial"));
  return Ok();
}

namespace {
struct CachedEntry {
  std::string key;
  uint64_t bytes = 0;
  fs::file_time_type last_used;
};

std::vector<CachedEntry> ListEntries(const std::string& root) {
  std::vector<CachedEntry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root + "/meta", ec)) {
    if (e.path().extension() != ".json") continue;
    std::string key = e.path().stem().string();
    if (!fs::is_directory(root + "/models/" + key, ec)) continue;
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded()) continue;
    out.push_back({key, j.value("bytes", uint64_t{0}), fs::last_write_time(e.path(), ec)});
  }
  return out;
}
}  // namespace

uint64_t ModelCache::ModelBytes(const std::string& key) const {
  for (const auto& e : ListEntries(config_.root))
    if (e.key == key) return e.bytes;
  return 0;
}

uint64_t ModelCache::UsedBytes() const {
  uint64_t total = 0;
  for (const auto& e : ListEntries(config_.root)) total += e.bytes;
  return total;
}

Result<bool> ModelCache::TryEvict(const std::string& key) const {
  // Never block: a pull in progress or a process using the model wins.
  MOE_ASSIGN_OR_RETURN(FileLock pull, LockFile(config_.root + "/locks/" + key + ".pull", LockMode::kExclusive, true));
  if (!pull.held()) return false;
  MOE_ASSIGN_OR_RETURN(FileLock use, LockFile(config_.root + "/locks/" + key + ".use", LockMode::kExclusive, true));
  if (!use.held()) return false;
  if (!IsComplete(key)) return true;
  // Rename first so the model disappears atomically, then delete at leisure.
  std::string trash = config_.root + "/trash/" + key + "." + std::to_string(::getpid()) + "." +
                      std::to_string(std::random_device{}());
  if (::rename(ModelPath(key).c_str(), trash.c_str()) != 0)
    return Fail(Error::Io("cache: evicting '" + ModelPath(key) + "': " + std::strerror(errno)));
  std::error_code ec;
  fs::remove(config_.root + "/meta/" + key + ".json", ec);
  fs::remove_all(trash, ec);
  log::Info("cache: evicted model " + key + " from " + config_.root);
  return true;
}

namespace {
// Apparent size of a folder (files are pre-sized, so a partial counts in full).
uint64_t FolderBytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; it != end; it.increment(ec)) {
    if (ec) break;
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  return total;
}
}  // namespace

Status ModelCache::MakeRoom(uint64_t incoming_bytes, const std::string& keep_key) const {
  if (config_.size_limit_bytes == 0) return Ok();
  // Partial downloads nobody is pulling (their puller failed or died) go
  // before any complete model: they are worth less, and resuming them later
  // only saves bandwidth.
  std::vector<std::pair<std::string, uint64_t>> partials;
  uint64_t partial_bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(config_.root + "/partial", ec)) {
    std::string key = e.path().filename().string();
    if (key == keep_key) continue;
    uint64_t bytes = FolderBytes(e.path());
    partials.emplace_back(key, bytes);
    partial_bytes += bytes;
  }
  if (incoming_bytes > config_.size_limit_bytes)
    return Fail(Error::ResourceExhausted("cache '" + config_.root + "': model needs " + std::to_string(incoming_bytes) +
                                         " bytes, more than the cache limit of " +
                                         std::to_string(config_.size_limit_bytes)));
  auto entries = ListEntries(config_.root);
  std::sort(entries.begin(), entries.end(),
            [](const CachedEntry& a, const CachedEntry& b) { return a.last_used < b.last_used; });
  uint64_t used = partial_bytes;
  for (const auto& e : entries)
    if (e.key != keep_key) used += e.bytes;
  for (const auto& [key, bytes] : partials) {
    if (used + incoming_bytes <= config_.size_limit_bytes) break;
    MOE_ASSIGN_OR_RETURN(FileLock pull, LockFile(config_.root + "/locks/" + key + ".pull", LockMode::kExclusive, true));
    if (!pull.held()) continue;  // someone is pulling it right now
    fs::remove_all(PartialPath(key), ec);
    if (ec) return Fail(Error::Io("cache: removing abandoned '" + PartialPath(key) + "': " + ec.message()));
    log::Info("cache: removed abandoned partial download " + key + " from " + config_.root);
    used -= bytes;
  }
  for (const auto& e : entries) {
    if (used + incoming_bytes <= config_.size_limit_bytes) break;
    if (e.key == keep_key) continue;
    MOE_ASSIGN_OR_RETURN(bool evicted, TryEvict(e.key));
    if (evicted) used -= e.bytes;
  }
  if (used + incoming_bytes > config_.size_limit_bytes)
    return Fail(Error::ResourceExhausted("cache '" + config_.root + "': " + std::to_string(used) +
                                         " bytes are held by models in use; " + std::to_string(incoming_bytes) +
                                         " more would pass the limit of " + std::to_string(config_.size_limit_bytes)));
  return Ok();
}

Status ModelCache::CheckFreeSpace(uint64_t needed) const {
  struct statvfs st{};
  if (::statvfs(config_.root.c_str(), &st) != 0)
    return Fail(Error::Io("cache '" + config_.root + "': statvfs: " + std::strerror(errno)));
  uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  if (free_bytes < needed)
    return Fail(Error::ResourceExhausted("cache '" + config_.root + "': needs " + std::to_string(needed) +
                                         " bytes free, the filesystem has " + std::to_string(free_bytes)));
  return Ok();
}

}  // namespace moeserve::daemon::storage
