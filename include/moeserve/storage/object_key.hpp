// Object keys (from a listing) and manifest paths become file names under the
// cache. Each must name a file strictly below the model's directory, so that
// no listing or manifest, whoever wrote it, can make the puller read or write
// anywhere else. Checked in every mode, verified or not, before any byte is
// fetched.
//
// A key is accepted when it is a '/'-separated relative path whose segments
// are all non-empty and none is "." or ".."; it has no backslash (a separator
// elsewhere, and a trap to carry into a cache another system reads), no NUL or
// other control character (a NUL would cut the path short at open(2)), at
// most 1024 bytes (S3's limit) and segments of at most 255 (NAME_MAX). Names
// the puller writes itself are reserved: "manifest.json" and anything under
// ".pull/" (the resume record).
#pragma once

#include <string_view>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/manifest.hpp"

namespace moeserve::storage {

// kInvalidArgument quoting the key (control characters escaped) and the rule it breaks.
Status CheckObjectKey(std::string_view key);
// Every path checked, and none listed twice or both as a file and as a folder
// ("a" and "a/b"); `where` names the manifest or listing in messages.
Status CheckManifestPaths(const engine::Manifest& manifest, const std::string& where);

}  // namespace moeserve::storage
