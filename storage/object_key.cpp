#include "moeserve/storage/object_key.hpp"

#include <cstdio>
#include <set>

namespace moeserve::storage {
namespace {

constexpr size_t kMaxKeyBytes = 1024;
constexpr size_t kMaxSegmentBytes = 255;

// The key as it can be shown in one log line.
std::string Quoted(std::string_view key) {
  std::string out = "'";
  for (unsigned char c : key.substr(0, 300)) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (key.size() > 300) out += "...";
  return out + "'";
}

Status Refuse(std::string_view key, const std::string& why) {
  return Fail(Error::InvalidArgument("object key " + Quoted(key) + " " + why +
                                     "; refusing it, as it would not name a file inside the model's directory"));
}

}  // namespace

Status CheckObjectKey(std::string_view key) {
  if (key.empty()) return Refuse(key, "is empty");
  if (key.size() > kMaxKeyBytes) return Refuse(key, "is longer than 1024 bytes");
  for (unsigned char c : key) {
    if (c == '\0') return Refuse(key, "holds a NUL byte");
    if (c < 0x20 || c == 0x7f) return Refuse(key, "holds a control character");
    if (c == '\\') return Refuse(key, "holds a backslash");
  }
  if (key.front() == '/') return Refuse(key, "is an absolute path");
  size_t b = 0;
  bool first = true;
  while (b <= key.size()) {
    size_t e = key.find('/', b);
    if (e == std::string_view::npos) e = key.size();
    std::string_view seg = key.substr(b, e - b);
    if (seg.empty()) return Refuse(key, "has an empty path segment ('//' or a trailing '/')");
    if (seg == "..") return Refuse(key, "has a '..' segment");
    if (seg == ".") return Refuse(key, "has a '.' segment");
    if (seg.size() > kMaxSegmentBytes) return Refuse(key, "has a segment longer than 255 bytes");
    if (first && seg == ".pull") return Refuse(key, "is under '.pull/', where the puller keeps its resume record");
    if (first && seg == "manifest.json") return Refuse(key, "is the puller's own 'manifest.json'");
    first = false;
    b = e + 1;
  }
  return Ok();
}

Status CheckManifestPaths(const engine::Manifest& manifest, const std::string& where) {
  std::set<std::string_view> files;
  for (const auto& f : manifest.files) {
    Status s = CheckObjectKey(f.path);
    if (!s) return Fail(s.error().WithContext(where));
    if (!files.insert(f.path).second)
      return Fail(Error::InvalidArgument(where + ": '" + f.path + "' is listed twice"));
  }
  // "a" and "a/b" cannot both be files. Sorted, a folder's files follow it
  // directly unless a name sorting between them ("a-x", '-' < '/') intervenes,
  // so each file's every parent is looked up instead.
  for (std::string_view path : files) {
    for (size_t slash = path.find('/'); slash != std::string_view::npos; slash = path.find('/', slash + 1))
      if (files.count(path.substr(0, slash)))
        return Fail(Error::InvalidArgument(where + ": '" + std::string(path.substr(0, slash)) +
                                           "' is listed as a file and as the folder of '" + std::string(path) + "'"));
  }
  return Ok();
}

}  // namespace moeserve::storage
