#include "cached_model.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "moeserve/common/sha256.hpp"
#include "moeserve/storage/nofollow.hpp"
#include "moeserve/storage/object_key.hpp"
#include "moeserve/engine/manifest.hpp"

namespace moeserve::storage {
namespace {

// As ReadWholeObject: a manifest larger than this is not one we fetched.
constexpr size_t kMaxManifestBytes = 64 << 20;

Result<std::string> HashFd(int fd, uint64_t size, const std::string& path) {
  Sha256 h;
  std::vector<char> buf(1 << 20);
  uint64_t off = 0;
  while (off < size) {
    ssize_t n = ::pread(fd, buf.data(), static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off)),
                        static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Fail(Error::Io("cache: reading '" + path + "' to verify it: " + std::strerror(errno)));
    h.Update(buf.data(), static_cast<size_t>(n));
    off += static_cast<uint64_t>(n);
  }
  return h.HexDigest();
}

}  // namespace

Status CheckCachedModel(const ModelCache& cache, const std::string& key, bool verified, bool rehash) {
  const std::string dir = cache.ModelPath(key);
  MOE_ASSIGN_OR_RETURN(UniqueFd model, cache.OpenModel(key));
  MOE_TRY(CheckPlainContents(model.get(), dir));
  if (!verified) return Ok();
  MOE_ASSIGN_OR_RETURN(std::string text, ReadFileAt(model.get(), "manifest.json", kMaxManifestBytes, dir));
  MOE_ASSIGN_OR_RETURN(engine::Manifest manifest, engine::ParseManifest(text, dir + "/manifest.json"));
  MOE_TRY(CheckManifestPaths(manifest, dir + "/manifest.json"));
  for (const auto& f : manifest.files) {
    const std::string path = dir + "/" + f.path;
    MOE_ASSIGN_OR_RETURN(UniqueFd file, OpenFileAt(model.get(), f.path, O_RDONLY, dir));
    struct stat st{};
    if (::fstat(file.get(), &st) != 0) return Fail(Error::Io("cache: stat '" + path + "': " + std::strerror(errno)));
    if (static_cast<uint64_t>(st.st_size) != f.size)
      return Fail(Error::Corruption(path, "holds " + std::to_string(st.st_size) + " bytes, manifest.json says " +
                                              std::to_string(f.size) + "; the cached model was changed after it "
                                              "was verified (remove it to pull again)"));
    if (!rehash) continue;
    MOE_ASSIGN_OR_RETURN(std::string digest, HashFd(file.get(), f.size, path));
    if (digest != f.sha256)
      return Fail(Error::Corruption(path, "sha256 " + digest + " differs from manifest.json's " + f.sha256 +
                                              "; the cached model was changed after it was verified "
                                              "(remove it to pull again)"));
  }
  return Ok();
}

}  // namespace moeserve::storage
