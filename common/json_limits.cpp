#include "moeserve/common/json_limits.hpp"

#include <algorithm>

namespace moeserve {

namespace {

// A path in a message is cut here: 64 steps of 64-byte keys would bury the
// rest of the message, and the start of the path is what names the field.
constexpr size_t kMaxPathInMessage = 200;

std::string DepthMessage(int max_depth, std::optional<size_t> offset, std::span<const JsonPathStep> path) {
  std::string msg = "nests objects and arrays more than " + std::to_string(max_depth) + " levels deep (";
  if (offset) msg += "at byte " + std::to_string(*offset) + ", ";
  std::string where = JsonPathString("", path);
  if (where.empty()) where = "the top level";
  if (where.size() > kMaxPathInMessage) where = where.substr(0, kMaxPathInMessage) + "...";
  return msg + "under " + where + ")";
}

// The scan's view of one open container.
struct Frame {
  bool is_object = false;
  bool expecting_key = false;  // objects: the next string is a key
  size_t index = 0;            // arrays: the index of the current element
  std::string_view key;        // objects: the current key, as written
  size_t keys = 0;             // objects: keys seen so far
};

JsonPathStep StepOf(const Frame& f) {
  JsonPathStep step;
  if (f.is_object) {
    step.key = std::string(f.key.substr(0, JsonPathStep::kMaxKeyBytes));
  } else {
    step.is_index = true;
    step.index = f.index;
  }
  return step;
}

}  // namespace

std::string JsonPathString(std::string_view prefix, std::span<const JsonPathStep> path) {
  std::string out(prefix);
  for (const JsonPathStep& step : path) {
    if (step.is_index) {
      out += '[';
      out += std::to_string(step.index);
      out += ']';
    } else {
      if (!out.empty()) out += ".";
      out += step.key;
    }
  }
  return out;
}

std::optional<JsonLimitViolation> FindJsonLimitViolation(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes) {
    JsonLimitViolation v;
    v.kind = JsonLimitViolation::Kind::kTooLarge;
    v.offset = limits.max_bytes;
    v.message = "is " + std::to_string(text.size()) + " bytes, more than the limit of " +
                std::to_string(limits.max_bytes);
    return v;
  }
  // One pass, no recursion: the stack holds at most max_depth frames because
  // the bracket that would push one more is the violation.
  std::vector<Frame> stack;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char ch = text[i];
    switch (ch) {
      case '"': {
        // Skip the string; a backslash escapes exactly the next byte, which
        // covers \" and \\ (longer escapes such as \u0022 contain no quote).
        size_t begin = i + 1, j = begin;
        while (j < n && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
        if (j >= n) return std::nullopt;  // unterminated: the parser says so
        if (!stack.empty() && stack.back().is_object && stack.back().expecting_key) {
          if (++stack.back().keys > limits.max_object_keys) {
            JsonLimitViolation v;
            v.kind = JsonLimitViolation::Kind::kTooManyKeys;
            v.offset = i;
            for (size_t f = 0; f + 1 < stack.size(); ++f) v.path.push_back(StepOf(stack[f]));
            std::string where = JsonPathString("", v.path);
            if (where.size() > kMaxPathInMessage) where = where.substr(0, kMaxPathInMessage) + "...";
            v.message = "has an object with more than " + std::to_string(limits.max_object_keys) + " keys (at byte " +
                        std::to_string(i) + ", " + (where.empty() ? std::string("the top level") : "under " + where) +
                        ")";
            return v;
          }
          stack.back().key = text.substr(begin, j - begin);
          stack.back().expecting_key = false;
        }
        i = j;
        break;
      }
      case '{':
      case '[':
        if (stack.size() >= static_cast<size_t>(std::max(limits.max_depth, 0))) {
          JsonLimitViolation v;
          v.kind = JsonLimitViolation::Kind::kTooDeep;
          v.offset = i;
          for (const Frame& f : stack) v.path.push_back(StepOf(f));
          v.message = DepthMessage(limits.max_depth, i, v.path);
          return v;
        }
        stack.push_back(Frame{.is_object = ch == '{', .expecting_key = ch == '{', .index = 0, .key = {}, .keys = 0});
        break;
      case '}':
      case ']':
        // A bracket that closes nothing makes the text invalid; stopping here
        // keeps the count from going negative and letting deeper text through.
        if (stack.empty()) return std::nullopt;
        stack.pop_back();
        break;
      case ',':
        if (!stack.empty()) {
          Frame& f = stack.back();
          if (f.is_object) f.expecting_key = true;
          else ++f.index;
        }
        break;
      default:
        break;
    }
  }
  return std::nullopt;
}

template <class Json>
Result<Json> ParseJsonBounded(std::string_view text, const JsonLimits& limits, std::string_view what) {
  if (auto v = FindJsonLimitViolation(text, limits)) {
    return Fail(Error::InvalidArgument(std::string(what) + ": " + v->message).WithField(std::string(what)));
  }
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's message names the line, column and what it expected.
    return Fail(Error::InvalidArgument(std::string(what) + ": not valid JSON: " + e.what()).WithField(std::string(what)));
  }
}

template <class Json>
Status CheckJsonDepth(const Json& value, int max_depth, std::string_view what) {
  if (!value.is_structured()) return Ok();
  if (max_depth < 1) return Fail(Error::InvalidArgument(std::string(what) + ": " + DepthMessage(max_depth, {}, {})).WithField(std::string(what)));
  struct Walk {
    const Json* node;
    typename Json::const_iterator it;  // the current child
    size_t index = 0;
    bool descended = false;            // the walk is below `it`; advance on return
  };
  std::vector<Walk> stack;
  stack.push_back({&value, value.cbegin()});
  while (!stack.empty()) {
    Walk& w = stack.back();
    if (w.descended) {
      ++w.it;
      ++w.index;
      w.descended = false;
    }
    if (w.it == w.node->cend()) {
      stack.pop_back();
      continue;
    }
    const Json& child = *w.it;
    if (!child.is_structured()) {
      ++w.it;
      ++w.index;
      continue;
    }
    if (stack.size() >= static_cast<size_t>(max_depth)) {
      std::vector<JsonPathStep> path;
      for (const Walk& f : stack) {
        JsonPathStep step;
        if (f.node->is_object()) {
          step.key = f.it.key().substr(0, JsonPathStep::kMaxKeyBytes);
        } else {
          step.is_index = true;
          step.index = f.index;
        }
        path.push_back(std::move(step));
      }
      return Fail(Error::InvalidArgument(std::string(what) + ": " + DepthMessage(max_depth, {}, path)).WithField(std::string(what)));
    }
    w.descended = true;
    stack.push_back({&child, child.cbegin()});  // may move `w`; not used after this
  }
  return Ok();
}

template Result<nlohmann::json> ParseJsonBounded<nlohmann::json>(std::string_view, const JsonLimits&, std::string_view);
template Result<nlohmann::ordered_json> ParseJsonBounded<nlohmann::ordered_json>(std::string_view, const JsonLimits&,
                                                                                 std::string_view);
template Status CheckJsonDepth<nlohmann::json>(const nlohmann::json&, int, std::string_view);
template Status CheckJsonDepth<nlohmann::ordered_json>(const nlohmann::ordered_json&, int, std::string_view);

}  // namespace moeserve
