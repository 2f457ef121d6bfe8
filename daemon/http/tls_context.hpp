// A TLS server context that follows its certificate and key files: when they
// change (a Kubernetes Secret mount swaps them atomically), the next
// connection gets a context built from the new pair. A pair that fails to
// load (half-written, mismatched) keeps the previous context and is logged;
// the check repeats, so a completed swap is picked up later.
//
// Thread safety: Current() may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon {

class ReloadingTlsContext {
 public:
  // Fails when the pair does not load now (a start-up error).
  static Result<std::unique_ptr<ReloadingTlsContext>> Create(std::string cert_file, std::string key_file,
                                                              std::chrono::milliseconds check_interval);

  // The context for a new connection; reloads first when the files changed.
  std::shared_ptr<boost::asio::ssl::context> Current();
  uint64_t reloads() const;

 private:
  struct FileStamp {
    uint64_t inode = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };
  ReloadingTlsContext(std::string cert_file, std::string key_file, std::chrono::milliseconds check_interval)
      : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)), check_interval_(check_interval) {}
  static FileStamp Stamp(const std::string& path);
  Result<std::shared_ptr<boost::asio::ssl::context>> Load() const;

  const std::string cert_file_, key_file_;
  const std::chrono::milliseconds check_interval_;
  mutable std::mutex mu_;
  std::shared_ptr<boost::asio::ssl::context> current_;
  FileStamp cert_stamp_, key_stamp_;
  std::chrono::steady_clock::time_point last_check_;
  uint64_t reloads_ = 0;
};

}  // namespace moeserve::daemon
