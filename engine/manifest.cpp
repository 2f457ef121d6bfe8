#include "moeserve/engine/manifest.hpp"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/common/sha256.hpp"

namespace moeserve::engine {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Manifest::ToJson() const {
  nlohmann::ordered_json j;
  j["files"] = nlohmann::ordered_json::array();
  for (const auto& f : files) j["files"].push_back({{"path", f.path}, {"size", f.size}, {"sha256", f.sha256}});
  return j.dump(2) + "\n";
}

namespace {

bool SafeRelativePath(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  for (const auto& part : fs::path(p))
    if (part == ".." || part == ".") return false;
  return true;
}

bool IsHex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

Result<Manifest> ParseManifest(const std::string& text, const std::string& source) {
  // ~150 bytes a file: 64 MiB is hundreds of thousands of shards.
  auto parsed = ParseJsonBounded<json>(text, {.max_bytes = 64u << 20, .max_depth = kMaxJsonDepth}, source);
  if (!parsed) return Fail(Error(ErrorCode::kCorruption, parsed.error().message()));
  json j = std::move(*parsed);
  if (!j.is_object() || !j.contains("files") || !j["files"].is_array())
    return Fail(Error::Corruption(source, "missing array 'files'"));
  Manifest m;
  for (size_t i = 0; i < j["files"].size(); ++i) {
    const json& f = j["files"][i];
    std::string at = "files[" + std::to_string(i) + "]";
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("sha256") || !f["sha256"].is_string())
      return Fail(Error::Corruption(source, at + ": needs string 'path', non-negative integer 'size', string 'sha256'"));
    ManifestEntry e{f["path"].get<std::string>(), f["size"].get<uint64_t>(), f["sha256"].get<std::string>()};
    if (!SafeRelativePath(e.path)) return Fail(Error::Corruption(source, at + ": path '" + e.path + "' must be relative without '..'"));
    if (!IsHex64(e.sha256)) return Fail(Error::Corruption(source, at + ": sha256 of '" + e.path + "' is not 64 lowercase hex digits"));
    m.files.push_back(std::move(e));
  }
  return m;
}

Result<Manifest> BuildManifest(const std::string& dir) {
  Manifest m;
  std::error_code ec;
  const fs::path base(dir);
  for (auto it = fs::recursive_directory_iterator(base, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    // Lexical: a symlinked file is listed under its own name (the name the
    // loader opens), never under its target's, which fs::relative would give.
    std::string rel = it->path().lexically_relative(base).generic_string();
    if (rel == "manifest.json") continue;
    MOE_ASSIGN_OR_RETURN(std::string sha, Sha256File(it->path().string()));
    m.files.push_back({rel, static_cast<uint64_t>(it->file_size()), sha});
  }
  if (ec) return Fail(Error::Io(dir + ": cannot list: " + ec.message()));
  std::sort(m.files.begin(), m.files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return m;
}

Status VerifyManifest(const Manifest& manifest, const std::string& dir) {
  for (const auto& f : manifest.files) {
    fs::path p = fs::path(dir) / f.path;
    std::error_code ec;
    uint64_t size = fs::file_size(p, ec);
    if (ec) return Fail(Error::NotFound(p.string() + ": listed in manifest.json but missing"));
    if (size != f.size)
      return Fail(Error::Corruption(p.string(), "size " + std::to_string(size) + " but manifest.json says " + std::to_string(f.size)));
    MOE_ASSIGN_OR_RETURN(std::string sha, Sha256File(p.string()));
    if (sha != f.sha256)
      return Fail(Error::Corruption(p.string(), "sha256 " + sha + " but manifest.json says " + f.sha256));
  }
  return Ok();
}

}  // namespace moeserve::engine
