// Durable writes: data reaches disk before a rename publishes it, and the
// rename reaches disk through an fsync of the folder, so a reader (or a
// process after a crash) sees either the old file or the whole new one.
#pragma once

#include <string>
#include <string_view>

#include "moeserve/common/status.hpp"

namespace moeserve {

// fsync a file or directory by path.
Status FsyncPath(const std::string& path);
// path.tmp, write, fsync, rename over path, fsync the folder.
Status WriteFileDurably(const std::string& path, std::string_view data);

}  // namespace moeserve
