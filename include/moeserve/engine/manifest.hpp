// manifest.json of a model directory (model.md section 1):
// {"files": [{"path", "size", "sha256"}]} for every file but itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::engine {

struct ManifestEntry {
  std::string path;  // relative, '/'-separated, no '..'
  uint64_t size = 0;
  std::string sha256;  // lowercase hex
};

struct Manifest {
  std::vector<ManifestEntry> files;
  std::string ToJson() const;
};

Result<Manifest> ParseManifest(const std::string& text, const std::string& source = "manifest.json");
// Hashes every regular file under dir (except manifest.json) into a manifest.
Result<Manifest> BuildManifest(const std::string& dir);
// Checks sizes and hashes of every listed file in dir; the error names the file.
Status VerifyManifest(const Manifest& manifest, const std::string& dir);

}  // namespace moeserve::engine
