#include "moeserve/common/yaml_scalar.hpp"

#include <charconv>
#include <cmath>
#include <regex>
#include <sstream>

namespace moeserve::yaml {

namespace {

constexpr std::string_view kWhitespace = " \t\r\n\f\v";

bool Blank(std::string_view s) { return s.find_first_not_of(kWhitespace) == std::string_view::npos; }

// The spellings yaml-cpp's as<bool> accepts (convert.cpp): each word in lower
// case, upper case, or with a capital first letter.
bool IsBooleanWord(const std::string& s) {
  for (const char* w : {"y", "yes", "true", "on", "n", "no", "false", "off"}) {
    std::string lower = w, upper = w, title = w;
    for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    title[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(title[0])));
    if (s == lower || s == upper || s == title) return true;
  }
  return false;
}

bool IsTrueWord(const std::string& s) {
  for (const char* w : {"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"})
    if (s == w) return true;
  return false;
}

const std::regex& IntegerPattern() {
  static const std::regex re("[-+]?[0-9]+|0x[0-9a-fA-F]+|0o[0-7]+");
  return re;
}

const std::regex& FloatPattern() {
  static const std::regex re("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  return re;
}

ScalarKind KindOfPlain(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return ScalarKind::kNull;
  if (IsBooleanWord(s)) return ScalarKind::kBoolean;
  if (std::regex_match(s, IntegerPattern())) return ScalarKind::kInteger;
  if (std::regex_match(s, FloatPattern())) return ScalarKind::kFloat;
  return ScalarKind::kText;
}

Error Wrong(std::string_view path, std::string_view expected, const YAML::Node& node) {
  std::string found = Describe(node);
  std::string hint;
  const ScalarKind kind = KindOf(node);
  if (kind == ScalarKind::kNull) hint = " (omit the key to keep its default)";
  else if (expected == "text" && (kind == ScalarKind::kBoolean || kind == ScalarKind::kInteger ||
                                  kind == ScalarKind::kFloat)) {
    hint = " (quote it to use it as text)";
  }
  return Error::InvalidArgument(std::string(path) + ": must be " + std::string(expected) + ", not " + found + hint);
}

// Digits of an integer scalar, with its base.
Result<int64_t> ParseInteger(const std::string& s, std::string_view path) {
  std::string_view digits = s;
  int base = 10;
  bool negative = false;
  if (digits.starts_with("0x")) digits.remove_prefix(2), base = 16;
  else if (digits.starts_with("0o")) digits.remove_prefix(2), base = 8;
  else if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) negative = digits[0] == '-', digits.remove_prefix(1);
  uint64_t magnitude = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  if (ec != std::errc() || end != digits.data() + digits.size() || magnitude > limit) {
    return Fail(Error::InvalidArgument(std::string(path) + ": the integer is out of range"));
  }
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
}

}  // namespace

ScalarKind KindOf(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return ScalarKind::kNull;
  if (!node.IsScalar()) return ScalarKind::kText;  // callers check IsScalar first
  const std::string& tag = node.Tag();
  const std::string& s = node.Scalar();
  if (tag == "?") return KindOfPlain(s);
  if (tag == "!" || tag == "tag:yaml.org,2002:str") return ScalarKind::kText;
  if (tag == "tag:yaml.org,2002:null") return ScalarKind::kNull;
  if (tag == "tag:yaml.org,2002:bool") return IsBooleanWord(s) ? ScalarKind::kBoolean : ScalarKind::kText;
  if (tag == "tag:yaml.org,2002:int") return std::regex_match(s, IntegerPattern()) ? ScalarKind::kInteger : ScalarKind::kText;
  if (tag == "tag:yaml.org,2002:float") {
    if (std::regex_match(s, IntegerPattern())) return ScalarKind::kInteger;
    return std::regex_match(s, FloatPattern()) ? ScalarKind::kFloat : ScalarKind::kText;
  }
  return ScalarKind::kText;  // a local tag (!secret): its text
}

std::string Describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  switch (KindOf(node)) {
    case ScalarKind::kNull: return "null";
    case ScalarKind::kBoolean: return "a boolean";
    case ScalarKind::kInteger: return "an integer";
    case ScalarKind::kFloat: return "a number";
    case ScalarKind::kText: break;
  }
  if (node.Scalar().empty()) return "empty text";
  if (Blank(node.Scalar())) return "whitespace-only text";
  return "text";
}

Result<std::string> Text(const YAML::Node& node, std::string_view path) {
  if (!node.IsDefined() || !node.IsScalar() || KindOf(node) != ScalarKind::kText || Blank(node.Scalar())) {
    return Fail(Wrong(path, "text", node));
  }
  return node.Scalar();
}

Result<int64_t> Integer(const YAML::Node& node, std::string_view path, int64_t lo, int64_t hi) {
  if (!node.IsDefined() || !node.IsScalar() || KindOf(node) != ScalarKind::kInteger) {
    return Fail(Wrong(path, "an integer", node));
  }
  MOE_ASSIGN_OR_RETURN(int64_t v, ParseInteger(node.Scalar(), path));
  if (v < lo || v > hi) {
    return Fail(Error::InvalidArgument(std::string(path) + ": must be between " + std::to_string(lo) + " and " +
                                       std::to_string(hi)));
  }
  return v;
}

Result<double> Number(const YAML::Node& node, std::string_view path, double lo, double hi) {
  const ScalarKind kind = KindOf(node);
  if (!node.IsDefined() || !node.IsScalar() || (kind != ScalarKind::kInteger && kind != ScalarKind::kFloat)) {
    return Fail(Wrong(path, "a number", node));
  }
  double v = 0;
  if (kind == ScalarKind::kInteger) {
    MOE_ASSIGN_OR_RETURN(int64_t i, ParseInteger(node.Scalar(), path));
    v = static_cast<double>(i);
  } else {
    try {
      v = node.as<double>();
    } catch (const YAML::Exception&) {
      return Fail(Wrong(path, "a number", node));
    }
  }
  if (!std::isfinite(v)) return Fail(Error::InvalidArgument(std::string(path) + ": must be a finite number"));
  if (v < lo || v > hi) {
    std::ostringstream range;
    range << path << ": must be between " << lo << " and " << hi;
    return Fail(Error::InvalidArgument(range.str()));
  }
  return v;
}

Result<bool> Boolean(const YAML::Node& node, std::string_view path) {
  if (!node.IsDefined() || !node.IsScalar() || KindOf(node) != ScalarKind::kBoolean) {
    return Fail(Wrong(path, "true or false", node));
  }
  return IsTrueWord(node.Scalar());
}

Result<std::string> Key(const YAML::Node& key, std::string_view path) {
  if (!key.IsDefined() || !key.IsScalar() || KindOf(key) == ScalarKind::kNull || Blank(key.Scalar())) {
    return Fail(Error::InvalidArgument(std::string(path) + ": a key must be a name, not " + Describe(key)));
  }
  return key.Scalar();
}

}  // namespace moeserve::yaml
