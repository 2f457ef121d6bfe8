#include "moeserve/storage/model_cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/common/model_cache_key.hpp"

namespace moeserve::storage {

// The cache's own folders, opened once; everything below them goes through openat.
struct ModelCache::Dirs {
  UniqueFd root, models, partial, meta, locks, trash;
};

namespace {

// A meta file is a few hundred bytes; anything much larger was not written by us.
constexpr size_t kMaxMetaBytes = 64 << 10;

Result<FileLock> LockFd(UniqueFd file, const std::string& path, LockMode mode, bool try_only) {
  int op = (mode == LockMode::kShared ? LOCK_SH : LOCK_EX) | (try_only ? LOCK_NB : 0);
  while (::flock(file.get(), op) != 0) {
    int err = errno;
    if (err == EINTR) continue;
    if (err == EWOULDBLOCK && try_only) return FileLock();
    return Fail(Error::Io("lock '" + path + "': flock: " + std::strerror(err)));
  }
  return FileLock(file.release());
}

std::vector<std::string> Names(int dirfd) {
  std::vector<std::string> out;
  int dup = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup < 0) return out;
  DIR* dir = ::fdopendir(dup);
  if (!dir) {
    ::close(dup);
    return out;
  }
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(std::move(name));
  }
  ::closedir(dir);
  return out;
}

}  // namespace

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
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP)
      return Fail(Error::PermissionDenied("lock '" + path + "' is a symbolic link; refusing to follow it"));
    return Fail(Error::Io("lock '" + path + "': open: " + std::strerror(err)));
  }
  return LockFd(UniqueFd(fd), path, mode, try_only);
}

Result<ModelCache> ModelCache::Open(const CacheConfig& config) {
  if (config.root.empty()) return Fail(Error::InvalidArgument("cache directory is empty"));
  auto dirs = std::make_shared<Dirs>();
  Result<UniqueFd> root = OpenDirectory(config.root, true);
  if (!root) return Fail(root.error().WithContext("cache '" + config.root + "'"));
  dirs->root = std::move(*root);
  for (auto [name, fd] : {std::pair{"models", &dirs->models}, std::pair{"partial", &dirs->partial},
                          std::pair{"meta", &dirs->meta}, std::pair{"locks", &dirs->locks},
                          std::pair{"trash", &dirs->trash}}) {
    Result<UniqueFd> sub = OpenDirectoryAt(dirs->root.get(), name, true, config.root);
    if (!sub) return Fail(sub.error().WithContext("cache '" + config.root + "'"));
    *fd = std::move(*sub);
  }
  return ModelCache(config, std::move(dirs));
}

std::string ModelCache::Key(const std::string& uri, const std::string& revision, bool verified) {
  return ModelCacheKey(uri, revision, verified);
}

std::string ModelCache::ModelPath(const std::string& key) const { return config_.root + "/models/" + key; }
std::string ModelCache::PartialPath(const std::string& key) const { return config_.root + "/partial/" + key; }

Result<FileLock> ModelCache::LockAt(const std::string& name, LockMode mode, bool try_only) const {
  MOE_ASSIGN_OR_RETURN(UniqueFd file,
                       OpenFileAt(dirs_->locks.get(), name, O_RDWR | O_CREAT, config_.root + "/locks"));
  return LockFd(std::move(file), config_.root + "/locks/" + name, mode, try_only);
}

Result<FileLock> ModelCache::LockForPull(const std::string& key) const {
  return LockAt(key + ".pull", LockMode::kExclusive, false);
}

bool ModelCache::IsComplete(const std::string& key) const {
  struct stat st{};
  return ::fstatat(dirs_->models.get(), key.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

Result<bool> ModelCache::FindModel(const std::string& key) const {
  struct stat st{};
  if (::fstatat(dirs_->models.get(), key.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    return Fail(Error::Io("cache: stat '" + ModelPath(key) + "': " + std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) return true;
  // OpenModel says what is there, in the same words as every other refusal.
  MOE_ASSIGN_OR_RETURN(UniqueFd dir, OpenModel(key));
  return true;
}

Result<UniqueFd> ModelCache::OpenModel(const std::string& key) const {
  return OpenDirectoryAt(dirs_->models.get(), key, false, config_.root + "/models");
}

Result<UniqueFd> ModelCache::OpenPartial(const std::string& key) const {
  return OpenDirectoryAt(dirs_->partial.get(), key, true, config_.root + "/partial");
}

Result<FileLock> ModelCache::Lease(const std::string& key) const {
  MOE_ASSIGN_OR_RETURN(FileLock lock, LockAt(key + ".use", LockMode::kShared, false));
  // Checked after locking: an evictor holds the lock exclusively while it removes.
  if (!IsComplete(key)) return Fail(Error::NotFound("cache: model " + key + " is not in " + config_.root));
  std::string meta = key + ".json";
  ::utimensat(dirs_->meta.get(), meta.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);  // last use, for LRU
  return lock;
}

Result<CachedModelMeta> ModelCache::ReadMeta(const std::string& key) const {
  std::string shown = config_.root + "/meta";
  MOE_ASSIGN_OR_RETURN(std::string text, ReadFileAt(dirs_->meta.get(), key + ".json", kMaxMetaBytes, shown));
  std::string path = shown + "/" + key + ".json";
  // Others may write this folder: the shared bounded parser, never a bare parse.
  auto parsed = ParseJsonBounded<nlohmann::json>(text, {.max_bytes = kMaxMetaBytes, .max_depth = kMaxJsonDepth}, path);
  if (!parsed) return Fail(Error::Corruption(path, parsed.error().message()));
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return Fail(Error::Corruption(path, "not a JSON object"));
  CachedModelMeta meta;
  auto uri = j.find("uri"), revision = j.find("revision"), bytes = j.find("bytes"), verified = j.find("verified");
  if (uri == j.end() || !uri->is_string() || revision == j.end() || !revision->is_string() || bytes == j.end() ||
      !bytes->is_number_unsigned())
    return Fail(Error::Corruption(path, "needs string 'uri', string 'revision' and non-negative integer 'bytes'"));
  meta.uri = uri->get<std::string>();
  meta.revision = revision->get<std::string>();
  meta.bytes = bytes->get<uint64_t>();
  // Written by every puller that knows the flag; absent means an older one: not verified.
  meta.verified = verified != j.end() && verified->is_boolean() && verified->get<bool>();
  return meta;
}

Status ModelCache::WriteMeta(const std::string& key, const CachedModelMeta& meta) const {
  nlohmann::json j = {{"uri", meta.uri}, {"revision", meta.revision}, {"bytes", meta.bytes}, {"verified", meta.verified}};
  return WriteFileAt(dirs_->meta.get(), key + ".json", j.dump(), config_.root + "/meta");
}

Status ModelCache::Publish(const std::string& key, const CachedModelMeta& meta) const {
  // Meta first: a model without meta would be invisible to the size limit.
  MOE_TRY(WriteMeta(key, meta));
  {
    MOE_ASSIGN_OR_RETURN(UniqueFd partial, OpenPartial(key));
    MOE_TRY(FsyncFd(partial.get(), PartialPath(key)));
  }
  if (::renameat(dirs_->partial.get(), key.c_str(), dirs_->models.get(), key.c_str()) != 0)
    return Fail(Error::Io("cache: rename '" + PartialPath(key) + "' -> '" + ModelPath(key) + "': " + std::strerror(errno)));
  MOE_TRY(FsyncFd(dirs_->models.get(), config_.root + "/models"));
  MOE_TRY(FsyncFd(dirs_->partial.get(), config_.root + "/partial"));
  return Ok();
}

namespace {
struct CachedEntry {
  std::string key;
  uint64_t bytes = 0;
  struct timespec last_used{};
};

bool Earlier(const timespec& a, const timespec& b) {
  return a.tv_sec != b.tv_sec ? a.tv_sec < b.tv_sec : a.tv_nsec < b.tv_nsec;
}

// Complete models with readable meta files.
std::vector<CachedEntry> ListEntries(const ModelCache& cache, int meta_fd) {
  std::vector<CachedEntry> out;
  for (const std::string& name : Names(meta_fd)) {
    if (!name.ends_with(".json")) continue;
    std::string key = name.substr(0, name.size() - 5);
    if (!cache.IsComplete(key)) continue;
    auto meta = cache.ReadMeta(key);
    if (!meta) continue;
    struct stat st{};
    if (::fstatat(meta_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    out.push_back({key, meta->bytes, st.st_mtim});
  }
  return out;
}
}  // namespace

uint64_t ModelCache::ModelBytes(const std::string& key) const {
  auto meta = ReadMeta(key);
  return meta ? meta->bytes : 0;
}

uint64_t ModelCache::UsedBytes() const {
  uint64_t total = 0;
  for (const auto& e : ListEntries(*this, dirs_->meta.get())) total += e.bytes;
  return total;
}

Result<bool> ModelCache::TryEvict(const std::string& key) const {
  // Never block: a pull in progress or a process using the model wins.
  MOE_ASSIGN_OR_RETURN(FileLock pull, LockAt(key + ".pull", LockMode::kExclusive, true));
  if (!pull.held()) return false;
  return EvictUnused(key);
}

Result<bool> ModelCache::TryEvictWhilePulling(const std::string& key) const { return EvictUnused(key); }

Result<bool> ModelCache::EvictUnused(const std::string& key) const {
  MOE_ASSIGN_OR_RETURN(FileLock use, LockAt(key + ".use", LockMode::kExclusive, true));
  if (!use.held()) return false;
  if (!IsComplete(key)) return true;
  // Rename first so the model disappears atomically, then delete at leisure.
  std::string trash = key + "." + std::to_string(::getpid()) + "." + std::to_string(std::random_device{}());
  if (::renameat(dirs_->models.get(), key.c_str(), dirs_->trash.get(), trash.c_str()) != 0)
    return Fail(Error::Io("cache: evicting '" + ModelPath(key) + "': " + std::strerror(errno)));
  ::unlinkat(dirs_->meta.get(), (key + ".json").c_str(), 0);
  Status removed = RemoveTreeAt(dirs_->trash.get(), trash, config_.root + "/trash");
  if (!removed) log::Warn("cache: " + removed.error().message());
  log::Info("cache: evicted model " + key + " from " + config_.root);
  return true;
}

Status ModelCache::MakeRoom(uint64_t incoming_bytes, const std::string& keep_key) const {
  if (config_.size_limit_bytes == 0) return Ok();
  // Partial downloads nobody is pulling (their puller failed or died) go
  // before any complete model: they are worth less, and resuming them later
  // only saves bandwidth. Files are pre-sized, so a partial counts in full.
  std::vector<std::pair<std::string, uint64_t>> partials;
  uint64_t partial_bytes = 0;
  for (const std::string& key : Names(dirs_->partial.get())) {
    if (key == keep_key) continue;
    uint64_t bytes = TreeBytesAt(dirs_->partial.get(), key);
    partials.emplace_back(key, bytes);
    partial_bytes += bytes;
  }
  if (incoming_bytes > config_.size_limit_bytes)
    return Fail(Error::ResourceExhausted("cache '" + config_.root + "': model needs " + std::to_string(incoming_bytes) +
                                         " bytes, more than the cache limit of " +
                                         std::to_string(config_.size_limit_bytes)));
  auto entries = ListEntries(*this, dirs_->meta.get());
  std::sort(entries.begin(), entries.end(),
            [](const CachedEntry& a, const CachedEntry& b) { return Earlier(a.last_used, b.last_used); });
  uint64_t used = partial_bytes;
  for (const auto& e : entries)
    if (e.key != keep_key) used += e.bytes;
  for (const auto& [key, bytes] : partials) {
    if (used + incoming_bytes <= config_.size_limit_bytes) break;
    MOE_ASSIGN_OR_RETURN(FileLock pull, LockAt(key + ".pull", LockMode::kExclusive, true));
    if (!pull.held()) continue;  // someone is pulling it right now
    Status removed = RemoveTreeAt(dirs_->partial.get(), key, config_.root + "/partial");
    if (!removed) return Fail(removed.error().WithContext("cache: removing an abandoned partial download"));
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
  if (::fstatvfs(dirs_->root.get(), &st) != 0)
    return Fail(Error::Io("cache '" + config_.root + "': statvfs: " + std::strerror(errno)));
  uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  if (free_bytes < needed)
    return Fail(Error::ResourceExhausted("cache '" + config_.root + "': needs " + std::to_string(needed) +
                                         " bytes free, the filesystem has " + std::to_string(free_bytes)));
  return Ok();
}

}  // namespace moeserve::storage
