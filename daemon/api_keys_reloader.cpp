#include "moeserve/daemon/api_keys_reloader.hpp"

#include <sys/stat.h>

#include "moeserve/common/log.hpp"

namespace moeserve::daemon {

ReloadingApiKeys::FileStamp ReloadingApiKeys::Stamp(const std::string& path) {
  struct stat st {};
  // stat follows api-keys.yaml -> ..data/api-keys.yaml -> ..<timestamp>/api-keys.yaml.
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

Result<std::unique_ptr<ReloadingApiKeys>> ReloadingApiKeys::Open(std::string path,
                                                                 std::chrono::milliseconds check_interval) {
  std::unique_ptr<ReloadingApiKeys> r(new ReloadingApiKeys(std::move(path), check_interval));
  // Stamp before reading: a swap between the two is seen as a change at the next check.
  r->stamp_ = Stamp(r->path_);
  MOE_ASSIGN_OR_RETURN(ApiKeys keys, ApiKeys::LoadFile(r->path_));
  r->current_ = std::make_shared<const ApiKeys>(std::move(keys));
  r->last_check_ = std::chrono::steady_clock::now();
  return r;
}

std::unique_ptr<ReloadingApiKeys> ReloadingApiKeys::Fixed(ApiKeys keys) {
  std::unique_ptr<ReloadingApiKeys> r(new ReloadingApiKeys("", std::chrono::milliseconds(0)));
  r->current_ = std::make_shared<const ApiKeys>(std::move(keys));
  return r;
}

std::shared_ptr<const ApiKeys> ReloadingApiKeys::Current() {
  std::lock_guard lock(mu_);
  if (path_.empty()) return current_;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_check_ < check_interval_) return current_;
  last_check_ = now;
  const FileStamp stamp = Stamp(path_);
  if (stamp == stamp_) return current_;
  auto loaded = ApiKeys::LoadFile(path_);
  if (!loaded) {
    // Logged once per bad version of the file, not once a second.
    if (!(stamp == failed_stamp_)) {
      ++failures_;
      failed_stamp_ = stamp;
      log::Warn("api keys: keeping the previous " + std::to_string(current_->size()) +
                " keys; the changed file does not load: " + loaded.error().message());
    }
    return current_;
  }
  current_ = std::make_shared<const ApiKeys>(std::move(*loaded));
  stamp_ = stamp;
  failed_stamp_ = {};
  ++reloads_;
  log::Info("api keys: reloaded " + std::to_string(current_->size()) + " keys from " + path_);
  return current_;
}

uint64_t ReloadingApiKeys::reloads() const {
  std::lock_guard lock(mu_);
  return reloads_;
}

uint64_t ReloadingApiKeys::failures() const {
  std::lock_guard lock(mu_);
  return failures_;
}

}  // namespace moeserve::daemon
