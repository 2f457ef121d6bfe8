#include "tls_context.hpp"

#include <sys/stat.h>

#include "moeserve/beast_setup/server_setup.hpp"
#include "moeserve/common/log.hpp"

namespace moeserve::daemon {

namespace ssl = boost::asio::ssl;

ReloadingTlsContext::FileStamp ReloadingTlsContext::Stamp(const std::string& path) {
  struct stat st {};
  // stat follows the ..data symlink of a Secret mount: a swap changes the inode.
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

Result<std::shared_ptr<ssl::context>> ReloadingTlsContext::Load() const {
  return beast_setup::ServerTlsContext(beast_setup::PemInput::File(cert_file_), "TLS certificate " + cert_file_,
                                       beast_setup::PemInput::File(key_file_), "TLS key " + key_file_);
}

Result<std::unique_ptr<ReloadingTlsContext>> ReloadingTlsContext::Create(std::string cert_file, std::string key_file,
                                                                         std::chrono::milliseconds check_interval) {
  std::unique_ptr<ReloadingTlsContext> t(
      new ReloadingTlsContext(std::move(cert_file), std::move(key_file), check_interval));
  t->cert_stamp_ = Stamp(t->cert_file_);
  t->key_stamp_ = Stamp(t->key_file_);
  MOE_ASSIGN_OR_RETURN(t->current_, t->Load());
  t->last_check_ = std::chrono::steady_clock::now();
  return t;
}

std::shared_ptr<ssl::context> ReloadingTlsContext::Current() {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_check_ < check_interval_) return current_;
  last_check_ = now;
  FileStamp cert = Stamp(cert_file_), key = Stamp(key_file_);
  if (cert == cert_stamp_ && key == key_stamp_) return current_;
  auto loaded = Load();
  if (!loaded) {
    // Keep serving with the old pair; the stamps stay old so the next check retries.
    log::Warn("tls: keeping the previous certificate: " + loaded.error().message());
    return current_;
  }
  current_ = std::move(*loaded);
  cert_stamp_ = cert;
  key_stamp_ = key;
  ++reloads_;
  log::Info("tls: certificate reloaded from " + cert_file_);
  return current_;
}

uint64_t ReloadingTlsContext::reloads() const {
  std::lock_guard lock(mu_);
  return reloads_;
}

}  // namespace moeserve::daemon
