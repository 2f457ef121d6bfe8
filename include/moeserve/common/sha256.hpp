// SHA-256 over memory and files (OpenSSL EVP), as lowercase hex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "moeserve/common/status.hpp"

namespace moeserve {

// Incremental hasher for streaming data (downloads, generated shards).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t size);
  std::string HexDigest();  // finishes the hash; call once

 private:
  void* ctx_;  // EVP_MD_CTX*
};

std::string Sha256Hex(std::span<const uint8_t> data);
std::string Sha256Hex(std::string_view data);
Result<std::string> Sha256File(const std::string& path);

}  // namespace moeserve
