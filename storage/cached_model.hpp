// The check a complete model in the cache passes before it is served again.
// The cache may be shared, so what is there now need not be what the puller
// published: a link planted in models/<key> would make the daemon load
// whatever it points at.
#pragma once

#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/model_cache.hpp"

namespace moeserve::storage {

// Nothing in models/<key> is a link, FIFO, socket or device. When verified,
// its manifest.json lists only files that are present with their recorded
// size; with rehash, their sha256 is computed again too (reads the whole
// model). kPermissionDenied for a link, kCorruption for a mismatch, both naming the file.
Status CheckCachedModel(const ModelCache& cache, const std::string& key, bool verified, bool rehash);

}  // namespace moeserve::storage
