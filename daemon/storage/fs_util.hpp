// Durable-write helpers for the cache: data reaches disk before a rename
// publishes it, and renames reach disk through an fsync of the folder.
#pragma once

#include <string>
#include <string_view>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon::storage {

// fsync a file or directory by path.
Status FsyncPath(const std::string& path);
// path.tmp, write, fsync, rename, fsync the folder.
Status WriteFileDurably(const std::string& path, std::string_view data);

}  // namespace moeserve::daemon::storage
