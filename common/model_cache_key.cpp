#include "moeserve/common/model_cache_key.hpp"

#include "moeserve/common/sha256.hpp"

namespace moeserve {

std::string ModelCacheKey(const std::string& uri, const std::string& revision, bool verified) {
  return Sha256Hex(uri + "\n" + revision + (verified ? "" : "\nunverified")).substr(0, 32);
}

}  // namespace moeserve
