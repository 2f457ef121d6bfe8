#include "moeserve/daemon/keys/api_keys_reloader.hpp"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "moeserve/common/log.hpp"
#include "moeserve/common/sha256.hpp"

namespace moeserve::daemon {

namespace {

struct LoadedFile {
  ApiKeys keys;
  std::string sha256;  // of the bytes parsed
};

// One read, so that the hash is of exactly the bytes the keys came from.
Result<LoadedFile> LoadKeysFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(Error::Io("API keys file " + path + ": cannot be opened"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Fail(Error::Io("API keys file " + path + ": read failed"));
  const std::string text = ss.str();
  MOE_ASSIGN_OR_RETURN(ApiKeys keys, ApiKeys::Parse(text, path));
  return LoadedFile{std::move(keys), Sha256Hex(std::string_view(text))};
}

}  // namespace

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
  MOE_ASSIGN_OR_RETURN(LoadedFile loaded, LoadKeysFile(r->path_));
  r->current_ = std::make_shared<const ApiKeys>(std::move(loaded.keys));
  r->status_.file_sha256 = std::move(loaded.sha256);
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
  // Unchanged since it last loaded, or since it last failed: nothing to read.
  if (status_.refusing ? stamp == failed_stamp_ : stamp == stamp_) return current_;
  auto loaded = LoadKeysFile(path_);
  if (!loaded) {
    const size_t had = status_.refusing ? 0 : current_->size();
    current_ = std::make_shared<const ApiKeys>(ApiKeys::RefuseAll());
    failed_stamp_ = stamp;
    ++status_.failures;
    status_.refusing = true;
    status_.problem = loaded.error().message();
    // Logged once per bad version of the file, not once a check.
    log::Error("api keys: refusing every API key (" + std::to_string(had) +
               " were in force) until the file loads again; the changed file does not load: " + status_.problem);
    return current_;
  }
  current_ = std::make_shared<const ApiKeys>(std::move(loaded->keys));
  stamp_ = stamp;
  failed_stamp_ = {};
  ++status_.reloads;
  if (status_.refusing) log::Info("api keys: the file loads again; keys are accepted");
  status_.refusing = false;
  status_.problem.clear();
  status_.file_sha256 = std::move(loaded->sha256);
  log::Info("api keys: reloaded " + std::to_string(current_->size()) + " keys from " + path_);
  return current_;
}

ReloadingApiKeys::KeysState ReloadingApiKeys::State() const {
  std::lock_guard lock(mu_);
  return status_;
}

}  // namespace moeserve::daemon
