// Checked reads of YAML scalars: the one way a config value leaves yaml-cpp.
//
// yaml-cpp's as<std::string>() turns a null node (`key:`, `key: ~`,
// `key: null`) into the text "null" (so a blank API key became the key
// "null"), and as<T>() throws on what it cannot convert. Every value of
// every config the project reads (the daemon's --config, the API keys file,
// budget sections of a config or QuotaPolicy, a kubeconfig) goes through
// these functions instead. A value must be a scalar of the kind its key
// expects; null, a map or a list where a scalar belongs, empty or
// whitespace-only text, and a scalar of another kind are refused with
// "<path>: must be <kind>, not <what was found>". Messages never repeat the
// value: it may be a secret.
//
// Kinds follow YAML's core schema for plain (unquoted) scalars: empty, `~`,
// `null`, `Null`, `NULL` are null; true/false in any of yaml-cpp's spellings
// (including YAML 1.1's yes/no/on/off/y/n, which yaml-cpp's as<bool> reads as
// booleans) are booleans; decimal, 0x hex and 0o octal integers are integers;
// decimal floats and .inf/.nan are floats. Anything else, and every quoted or
// block scalar, is text: `port: "8000"` is text, not an integer, and
// `tenant: no` is a boolean, not the tenant "no" (quote it). An explicit tag
// (!!str, !!int, ...) decides the kind itself.
//
// Thread safety: free functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "moeserve/common/status.hpp"

namespace moeserve::yaml {

enum class ScalarKind { kNull, kBoolean, kInteger, kFloat, kText };

// The kind of a scalar node's value (a null or absent node is kNull).
ScalarKind KindOf(const YAML::Node& node);
// What a node is, for messages: "null", "a map", "a list", "a boolean",
// "an integer", "a number", "empty text", "whitespace-only text", "text".
std::string Describe(const YAML::Node& node);

// Text with at least one non-whitespace character.
Result<std::string> Text(const YAML::Node& node, std::string_view path);
// An integer in [lo, hi].
Result<int64_t> Integer(const YAML::Node& node, std::string_view path, int64_t lo = INT64_MIN,
                        int64_t hi = INT64_MAX);
// A finite number (integer or float) in [lo, hi].
Result<double> Number(const YAML::Node& node, std::string_view path, double lo = -1e300, double hi = 1e300);
Result<bool> Boolean(const YAML::Node& node, std::string_view path);
// A mapping key: a scalar that is neither null nor blank, as written (a
// number or boolean key is its text: `1: x` has the key "1").
Result<std::string> Key(const YAML::Node& key, std::string_view path);

}  // namespace moeserve::yaml
