#include "moeserve/storage/nofollow.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace moeserve::storage {
namespace {

std::vector<std::string_view> Segments(std::string_view rel) {
  std::vector<std::string_view> out;
  size_t b = 0;
  while (b <= rel.size()) {
    size_t e = rel.find('/', b);
    if (e == std::string_view::npos) e = rel.size();
    out.push_back(rel.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

std::string Join(const std::string& shown, std::string_view rel) {
  return shown.empty() ? std::string(rel) : shown + "/" + std::string(rel);
}

const char* KindOf(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

Error Refused(const std::string& path, mode_t mode) {
  return Error::PermissionDenied("'" + path + "' is " + KindOf(mode) +
                                 "; refusing to follow or use it (something other than the puller put it there: "
                                 "remove it)");
}

// Turns a failed openat of name in dirfd into an error that says what is there.
Error OpenError(int dirfd, const std::string& name, int err, const std::string& path) {
  if (err == ELOOP || err == ENOTDIR || err == ENXIO) {
    struct stat st{};
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode) &&
        !S_ISREG(st.st_mode))
      return Refused(path, st.st_mode);
  }
  std::string msg = "open '" + path + "': " + std::strerror(err);
  if (err == ENOENT) return Error::NotFound(msg);
  if (err == EACCES || err == EPERM) return Error::PermissionDenied(msg);
  return Error::Io(msg);
}

// Opens segment name of dirfd as a directory, making it first when create.
Result<UniqueFd> OpenSegmentDir(int dirfd, const std::string& name, bool create, const std::string& path) {
  for (int tries = 0;; ++tries) {
    int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return UniqueFd(fd);
    int err = errno;
    if (err == ENOENT && create && tries == 0) {
      if (::mkdirat(dirfd, name.c_str(), 0755) != 0 && errno != EEXIST)
        return Fail(Error::Io("mkdir '" + path + "': " + std::strerror(errno)));
      continue;
    }
    return Fail(OpenError(dirfd, name, err, path));
  }
}

template <class Fn>
Status ForEachEntry(int dirfd, const std::string& shown, Fn fn) {
  int dup = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup < 0) return Fail(Error::Io("open '" + shown + "': " + std::strerror(errno)));
  DIR* dir = ::fdopendir(dup);
  if (!dir) {
    ::close(dup);
    return Fail(Error::Io("opendir '" + shown + "': " + std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  ::closedir(dir);
  for (const auto& name : names) MOE_TRY(fn(name));
  return Ok();
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

Result<UniqueFd> OpenDirectory(const std::string& path, bool create) {
  if (create) {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return Fail(Error::Io("mkdir '" + path + "': " + ec.message()));
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = "open '" + path + "': " + std::strerror(err);
    if (err == ENOENT) return Fail(Error::NotFound(msg));
    return Fail(Error::Io(msg));
  }
  return UniqueFd(fd);
}

Result<UniqueFd> OpenDirectoryAt(int dirfd, std::string_view rel, bool create, const std::string& shown) {
  if (rel.empty()) return Fail(Error::InvalidArgument("open '" + shown + "': empty relative path"));
  UniqueFd cur;
  int at = dirfd;
  std::string path = shown;
  for (std::string_view seg : Segments(rel)) {
    path = Join(path, seg);
    MOE_ASSIGN_OR_RETURN(cur, OpenSegmentDir(at, std::string(seg), create, path));
    at = cur.get();
  }
  return cur;
}

Result<UniqueFd> OpenFileAt(int dirfd, std::string_view rel, int flags, const std::string& shown) {
  if (rel.empty()) return Fail(Error::InvalidArgument("open '" + shown + "': empty relative path"));
  auto segs = Segments(rel);
  UniqueFd parent;
  int at = dirfd;
  std::string path = shown;
  for (size_t i = 0; i + 1 < segs.size(); ++i) {
    path = Join(path, segs[i]);
    MOE_ASSIGN_OR_RETURN(parent, OpenSegmentDir(at, std::string(segs[i]), (flags & O_CREAT) != 0, path));
    at = parent.get();
  }
  std::string name(segs.back());
  path = Join(path, name);
  // O_NONBLOCK: opening a FIFO someone planted must not hang the puller; it
  // changes nothing for regular files.
  int fd = ::openat(at, name.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) return Fail(OpenError(at, name, errno, path));
  UniqueFd file(fd);
  struct stat st{};
  if (::fstat(fd, &st) != 0) return Fail(Error::Io("stat '" + path + "': " + std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return Fail(Refused(path, st.st_mode));
  return file;
}

Status FsyncFd(int fd, const std::string& shown) {
  if (::fsync(fd) != 0) return Fail(Error::Io("fsync '" + shown + "': " + std::strerror(errno)));
  return Ok();
}

Status WriteFileAt(int dirfd, const std::string& name, std::string_view data, const std::string& shown) {
  const std::string tmp = name + ".tmp";
  const std::string path = Join(shown, tmp);
  // Whatever sits at the temporary name (a crashed writer's file, or a link
  // someone planted) is removed first; O_EXCL then makes a new file or fails.
  if (::unlinkat(dirfd, tmp.c_str(), 0) != 0 && errno != ENOENT)
    return Fail(Error::Io("remove '" + path + "': " + std::strerror(errno)));
  int fd = ::openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return Fail(OpenError(dirfd, tmp, errno, path));
  UniqueFd file(fd);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::unlinkat(dirfd, tmp.c_str(), 0);
      return Fail(Error::Io("write '" + path + "': " + std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::unlinkat(dirfd, tmp.c_str(), 0);
    return Fail(Error::Io("fsync '" + path + "': " + std::strerror(err)));
  }
  // rename(2) replaces a link at name itself; it never writes through one.
  if (::renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) != 0) {
    int err = errno;
    ::unlinkat(dirfd, tmp.c_str(), 0);
    return Fail(Error::Io("rename '" + path + "' to '" + name + "': " + std::strerror(err)));
  }
  return FsyncFd(dirfd, shown);
}

Result<std::string> ReadFileAt(int dirfd, const std::string& name, size_t max_bytes, const std::string& shown) {
  const std::string path = Join(shown, name);
  MOE_ASSIGN_OR_RETURN(UniqueFd file, OpenFileAt(dirfd, name, O_RDONLY, shown));
  struct stat st{};
  if (::fstat(file.get(), &st) != 0) return Fail(Error::Io("stat '" + path + "': " + std::strerror(errno)));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return Fail(Error::ResourceExhausted("'" + path + "' holds " + std::to_string(st.st_size) +
                                         " bytes, more than the " + std::to_string(max_bytes) + " allowed"));
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(file.get(), out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Fail(Error::Io("read '" + path + "': " + std::strerror(errno)));
    if (n == 0) break;  // shrank meanwhile
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

Status RemoveTreeAt(int dirfd, const std::string& name, const std::string& shown) {
  const std::string path = Join(shown, name);
  struct stat st{};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return Ok();
    return Fail(Error::Io("stat '" + path + "': " + std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    MOE_ASSIGN_OR_RETURN(UniqueFd dir, OpenSegmentDir(dirfd, name, false, path));
    MOE_TRY(ClearDirectory(dir.get(), path));
    if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
      return Fail(Error::Io("rmdir '" + path + "': " + std::strerror(errno)));
    return Ok();
  }
  if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT)
    return Fail(Error::Io("remove '" + path + "': " + std::strerror(errno)));
  return Ok();
}

Status ClearDirectory(int dirfd, const std::string& shown) {
  return ForEachEntry(dirfd, shown, [&](const std::string& name) { return RemoveTreeAt(dirfd, name, shown); });
}

uint64_t TreeBytesAt(int dirfd, const std::string& name) {
  struct stat st{};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  if (!S_ISDIR(st.st_mode)) return 0;
  auto dir = OpenSegmentDir(dirfd, name, false, name);
  if (!dir) return 0;
  uint64_t total = 0;
  (void)ForEachEntry(dir->get(), name, [&](const std::string& child) -> Status {
    total += TreeBytesAt(dir->get(), child);
    return Ok();
  });
  return total;
}

namespace {
Status CheckPlainTreeAt(int dirfd, const std::string& name, const std::string& shown) {
  const std::string path = Join(shown, name);
  struct stat st{};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return Fail(Error::Io("stat '" + path + "': " + std::strerror(errno)));
  if (S_ISREG(st.st_mode)) return Ok();
  if (!S_ISDIR(st.st_mode)) return Fail(Refused(path, st.st_mode));
  MOE_ASSIGN_OR_RETURN(UniqueFd dir, OpenSegmentDir(dirfd, name, false, path));
  return CheckPlainContents(dir.get(), path);
}
}  // namespace

Status CheckPlainContents(int dirfd, const std::string& shown) {
  return ForEachEntry(dirfd, shown, [&](const std::string& child) { return CheckPlainTreeAt(dirfd, child, shown); });
}

}  // namespace moeserve::storage
