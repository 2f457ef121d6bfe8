// Size and depth limits for JSON that moeserve reads from anyone it does not
// control: request bodies and the JSON strings inside them, checkpoint files
// from a tenant's bucket, files on a node's disk.
//
// Why a limit at all: nlohmann's parser and destructor are iterative, but
// dump(), copies, comparisons and our own schema walkers recurse once per
// level, so a value nested 100,000 deep (200 KB of "[") overflows the stack
// wherever it is serialised later. Every JSON text therefore goes through
// ParseJsonBounded, whose limits are checked by a scan that never recurses and
// keeps O(max_depth) state, before nlohmann builds anything. The scan honours
// strings and escapes, so "[[[[" inside a string is text, not nesting; a JSON
// string that is itself parsed later (tool-call arguments) is bounded when it
// is parsed, by a second call.
//
// Depth counts the objects and arrays open at once: a scalar is depth 0, `{}`
// and `[1]` are 1, `{"a":[1]}` is 2. A text of exactly max_depth is accepted,
// one level more is refused.
//
// Thread safety: free functions over values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve {

struct JsonLimits {
  size_t max_bytes = 0;
  int max_depth = 0;
  // Keys in one object. nlohmann::ordered_json checks each new key against
  // every earlier one, so parsing an object of n keys costs n^2/2 compares:
  // 50,000 keys (0.5 MB) take ~10 s. Texts parsed into ordered_json from
  // outside set this; the default leaves it unbounded.
  size_t max_object_keys = SIZE_MAX;
};

// The depth every JSON text moeserve reads is held to: deeper than any real
// schema, config or checkpoint header, shallow enough that a recursive walk of
// it uses a few KB of stack. Sizes differ by source and are set where it is read.
inline constexpr int kMaxJsonDepth = 64;

// One step from a container to a child: an object key or an array index.
// Keys are kept as written in the text (escapes not decoded), at most
// kMaxKeyBytes of them, which is enough to name a field.
struct JsonPathStep {
  static constexpr size_t kMaxKeyBytes = 64;
  bool is_index = false;
  size_t index = 0;
  std::string key;
};

struct JsonLimitViolation {
  enum class Kind { kTooLarge, kTooDeep, kTooManyKeys };
  Kind kind = Kind::kTooLarge;
  // kTooDeep: the steps from the root to the container that opens one level
  // too many (max_depth steps). kTooManyKeys: the steps to the object.
  // Empty for kTooLarge.
  std::vector<JsonPathStep> path;
  size_t offset = 0;  // byte offset of that container's bracket (kTooManyKeys: of the key); max_bytes for kTooLarge
  // "is 9000000 bytes, more than the limit of 8388608" or
  // "nests objects and arrays more than 64 levels deep (at byte 70, under a.b[3])"
  std::string message;
};

// The first limit `text` breaks, or nullopt. Checks only the limits: text
// that is not JSON is left to the parser (the scan stops at the first bracket
// that closes nothing, so it never undercounts a text the parser accepts).
std::optional<JsonLimitViolation> FindJsonLimitViolation(std::string_view text, const JsonLimits& limits);

// "messages[2].content" from prefix "messages[2]" and steps [.content]; with an
// empty prefix the first key has no leading dot ("tools[0]...").
std::string JsonPathString(std::string_view prefix, std::span<const JsonPathStep> path);

// Parses `text` as one JSON value after checking the limits. Errors are
// InvalidArgument and start with `what` ("tokenizer.json: nests objects and
// arrays more than 64 levels deep ...", "what: not valid JSON: <parser message>").
// Json is nlohmann::json or nlohmann::ordered_json.
template <class Json = nlohmann::ordered_json>
Result<Json> ParseJsonBounded(std::string_view text, const JsonLimits& limits, std::string_view what);

// Depth check of an already-built value, walking it with an explicit stack.
// For values built in code from parts of bounded size (a span re-assembled
// around parsed arguments); the error names the path under `what`.
template <class Json = nlohmann::ordered_json>
Status CheckJsonDepth(const Json& value, int max_depth, std::string_view what);

}  // namespace moeserve
