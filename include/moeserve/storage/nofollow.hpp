// Files under a directory that others may write to, such as a node cache
// shared by several tenants' pods. Every path below a directory descriptor is
// walked one segment at a time with openat(2) and O_NOFOLLOW, so a symbolic
// link planted anywhere on the way is an error (kPermissionDenied naming it),
// never a redirection of a read or a write. Only the starting directory
// (OpenDirectory) is resolved as an ordinary path: the operator may reach the
// cache root through links of its own.
//
// Relative paths given here must already be checked (object_key.hpp): no
// "..", no leading '/', no empty segments. `shown` is the path used in
// messages; nothing is opened by it.
//
// Thread safety: functions are reentrant; UniqueFd is a plain owner.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "moeserve/common/status.hpp"

namespace moeserve::storage {

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Hands the descriptor to the caller, who closes it.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Opens (with create: first makes, like mkdir -p) the directory at an ordinary path.
Result<UniqueFd> OpenDirectory(const std::string& path, bool create);
// Opens the directory rel below dirfd; with create, missing segments are made (0755).
Result<UniqueFd> OpenDirectoryAt(int dirfd, std::string_view rel, bool create, const std::string& shown);
// Opens the regular file rel below dirfd with flags (O_RDONLY, O_RDWR, O_CREAT, ...);
// with O_CREAT missing parent directories are made too. Anything but a
// regular file (a link, a FIFO, a device) is refused.
Result<UniqueFd> OpenFileAt(int dirfd, std::string_view rel, int flags, const std::string& shown);
// Replaces name in dirfd durably: name.tmp is made afresh (a link there is
// removed, never written through), written, fsynced, renamed over name, and
// the directory fsynced, so a reader sees the old file or the whole new one.
Status WriteFileAt(int dirfd, const std::string& name, std::string_view data, const std::string& shown);
// The whole regular file name in dirfd, at most max_bytes (kResourceExhausted
// beyond); kNotFound when it does not exist.
Result<std::string> ReadFileAt(int dirfd, const std::string& name, size_t max_bytes, const std::string& shown);
// Removes name from dirfd, and everything under it when it is a directory,
// without following links (a link is removed, not its target). Absent is fine.
Status RemoveTreeAt(int dirfd, const std::string& name, const std::string& shown);
// Removes every entry of the directory dirfd.
Status ClearDirectory(int dirfd, const std::string& shown);
// Apparent size of the regular files under name (links not followed, not counted).
uint64_t TreeBytesAt(int dirfd, const std::string& name);
// Everything inside the directory dirfd, at any depth, is a directory or a
// regular file; otherwise kPermissionDenied naming the first link (or FIFO,
// socket, device) found.
Status CheckPlainContents(int dirfd, const std::string& shown);
// fsync of an open file or directory.
Status FsyncFd(int fd, const std::string& shown);

}  // namespace moeserve::storage
