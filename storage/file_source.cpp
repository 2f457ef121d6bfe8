// file:// sources: a directory on a local or network filesystem. Objects are
// read without following links below the root: a link in a source folder
// (to a node file, say) must not carry that file into the cache, where a
// tenant's pod can read it. The root itself may be reached through links.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "moeserve/storage/nofollow.hpp"
#include "source_factories.hpp"

namespace moeserve::storage {
namespace {

class FileConnection final : public ObjectConnection {
 public:
  explicit FileConnection(std::string root) : root_(std::move(root)) {}

  Result<uint64_t> Get(const std::string& key, uint64_t offset, uint64_t length, const ByteSink& sink) override {
    std::string path = root_ + "/" + key;
    MOE_ASSIGN_OR_RETURN(UniqueFd root, OpenDirectory(root_, false));
    auto opened = OpenFileAt(root.get(), key, O_RDONLY, root_);
    if (!opened) return Fail(opened.error().WithContext("file source"));
    int fd = opened->release();
    std::vector<char> buf(1 << 20);
    uint64_t delivered = 0;
    Status status = Ok();
    while (length == kToEnd || delivered < length) {
      size_t want = buf.size();
      if (length != kToEnd) want = static_cast<size_t>(std::min<uint64_t>(want, length - delivered));
      ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(offset + delivered));
      if (n < 0) {
        if (errno == EINTR) continue;
        status = Fail(Error::Io("file '" + path + "': read: " + std::strerror(errno)));
        break;
      }
      if (n == 0) break;
      status = sink(buf.data(), static_cast<size_t>(n));
      if (!status) break;
      delivered += static_cast<uint64_t>(n);
    }
    ::close(fd);
    MOE_TRY(status);
    if (length != kToEnd && delivered < length)
      return Fail(Error::Corruption(path, "file ends at byte " + std::to_string(offset + delivered) +
                                              ", expected at least " + std::to_string(offset + length)));
    return delivered;
  }
  std::optional<std::chrono::milliseconds> RetryAfter() const override { return std::nullopt; }

 private:
  std::string root_;
};

class FileSource final : public ObjectSource {
 public:
  explicit FileSource(std::string root) : root_(std::move(root)) {}
  std::unique_ptr<ObjectConnection> Connect() override { return std::make_unique<FileConnection>(root_); }
  Result<std::vector<ObjectInfo>> List() override {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<ObjectInfo> out;
    fs::recursive_directory_iterator it(root_, ec), end;
    if (ec) return Fail(Error::NotFound("file source '" + root_ + "': " + ec.message()));
    for (; it != end; it.increment(ec)) {
      if (ec) return Fail(Error::Io("listing '" + root_ + "': " + ec.message()));
      // The iterator does not descend into linked folders; a linked file is refused outright.
      fs::file_status st = it->symlink_status(ec);
      if (ec) return Fail(Error::Io("listing '" + root_ + "': " + ec.message()));
      if (fs::is_directory(st)) continue;
      if (!fs::is_regular_file(st))
        return Fail(Error::PermissionDenied("file source: '" + it->path().string() + "' is " +
                                            (fs::is_symlink(st) ? "a symbolic link" : "not a regular file") +
                                            "; refusing to follow or use it"));
      out.push_back({fs::relative(it->path(), root_).generic_string(), static_cast<uint64_t>(it->file_size())});
    }
    return out;
  }
  std::string Describe(const std::string& key) const override { return "file://" + root_ + "/" + key; }

 private:
  std::string root_;
};

}  // namespace

std::unique_ptr<ObjectSource> MakeFileSource(const std::string& root) { return std::make_unique<FileSource>(root); }

}  // namespace moeserve::storage
