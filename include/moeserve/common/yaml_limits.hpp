// Size and nesting limits for YAML text, checked before yaml-cpp sees it.
//
// yaml-cpp's parser recurses once per nesting level, flow ([ {) and block
// (indentation, "- " items) alike, so a file of a few hundred KB of "[" or of
// ever deeper "- - - -" items exhausts the stack. CheckYamlLimits scans the
// text line by line, without recursion, and refuses it when the size or the
// nesting passes the limit.
//
// The scan is conservative: it follows quoted scalars, comments and block
// scalars (| and >) only where it is sure of them, and otherwise counts, so it
// may count a bracket that yaml-cpp would read as text (a plain scalar such as
// `it's [a`) but never misses one yaml-cpp nests on. Depth counts the block
// collections open at a line (the node after a "- " item counting as one,
// scalar or not) plus the flow brackets open there: `a: 1` is 1,
// `a: {b: [1]}` is 3, `a:\n  b:\n    c: 1` is 3, `- - x` is 3.
//
// Thread safety: free functions over values.
#pragma once

#include <cstddef>
#include <string_view>

#include "moeserve/common/status.hpp"

namespace moeserve {

struct YamlLimits {
  size_t max_bytes = 0;
  int max_depth = 0;
};

// InvalidArgument "<source>: is N bytes, more than the limit of M" or
// "<source>: line L nests more than D levels deep (...)".
Status CheckYamlLimits(std::string_view text, const YamlLimits& limits, std::string_view source);

}  // namespace moeserve
