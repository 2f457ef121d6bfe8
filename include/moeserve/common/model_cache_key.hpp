// The name of a model in a node's weight cache (models/<key>), computed here
// once: `moe-daemon pull` stores a model under it and moe-operator points the
// daemon's `model` setting at the same directory, so the two cannot disagree.
//
// Thread safety: a pure function.
#pragma once

#include <string>

namespace moeserve {

// The first 32 hex digits of sha256(uri + "\n" + revision), with
// "\nunverified" appended before hashing for a pull that skipped the
// manifest's checksums (so an unverified copy never satisfies a verified
// request).
std::string ModelCacheKey(const std::string& uri, const std::string& revision, bool verified = true);

}  // namespace moeserve
