#include "moeserve/common/yaml_limits.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace moeserve {

namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// "- " or "? " (or the indicator alone at the end of the line): a block
// sequence item or complex key, whose node may open a collection on the line.
bool IsItemIndicator(std::string_view line, size_t i) {
  return (line[i] == '-' || line[i] == '?') && (i + 1 == line.size() || IsBlank(line[i + 1]));
}

// `|` or `>` where a value starts (line start, after ": ", "- " or "? ") and
// followed only by its indicators and a comment: the start of a block scalar.
// Anything else (`a: x |`) is left to the bracket count.
bool IsBlockScalarHeader(std::string_view line, size_t i) {
  if (line[i] != '|' && line[i] != '>') return false;
  size_t before = i;
  while (before > 0 && IsBlank(line[before - 1])) --before;
  if (before > 0) {
    char p = line[before - 1];
    if (before == i || (p != ':' && p != '-' && p != '?')) return false;
  }
  size_t j = i + 1;
  while (j < line.size() && (line[j] == '+' || line[j] == '-' || (line[j] >= '1' && line[j] <= '9'))) ++j;
  size_t k = j;
  while (k < line.size() && IsBlank(line[k])) ++k;
  return k == line.size() || (line[k] == '#' && k > j);
}

}  // namespace

Status CheckYamlLimits(std::string_view text, const YamlLimits& limits, std::string_view source) {
  if (text.size() > limits.max_bytes) {
    return Fail(Error::InvalidArgument(std::string(source) + ": is " + std::to_string(text.size()) +
                                       " bytes, more than the limit of " + std::to_string(limits.max_bytes)));
  }
  const size_t max_depth = static_cast<size_t>(std::max(limits.max_depth, 0));
  std::vector<size_t> block;  // columns of the open block collections, increasing
  size_t flow = 0;            // open [ and {
  char quote = 0;             // '"' or '\'' while inside a quoted scalar (may span lines)
  std::optional<size_t> block_scalar_column;  // lines indented more than this are its text
  size_t line_no = 0;
  auto too_deep = [&]() {
    return Fail(Error::InvalidArgument(std::string(source) + ": line " + std::to_string(line_no) +
                                       " nests collections more than " + std::to_string(max_depth) +
                                       " levels deep"));
  };

  for (size_t pos = 0; pos <= text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const size_t indent = line.find_first_not_of(' ');

    if (block_scalar_column) {
      if (indent == std::string_view::npos || indent > *block_scalar_column) continue;
      block_scalar_column.reset();
    }

    size_t i = 0;
    if (quote == 0 && flow == 0) {
      // Block context: the indentation says which collections are still open.
      if (indent == std::string_view::npos || line[indent] == '#') continue;
      while (!block.empty() && block.back() >= indent) block.pop_back();
      block.push_back(indent);
      i = indent;
      while (i < line.size() && IsItemIndicator(line, i)) {
        size_t next = i + 1;
        while (next < line.size() && IsBlank(line[next])) ++next;
        if (next == line.size() || line[next] == '#') break;  // the item's node starts on a later line
        block.push_back(next);
        if (block.size() > max_depth) return too_deep();
        i = next;
      }
      if (block.size() > max_depth) return too_deep();
    }

    for (; i < line.size(); ++i) {
      const char c = line[i];
      if (quote == '"') {
        if (c == '\\') ++i;
        else if (c == '"') quote = 0;
        continue;
      }
      if (quote == '\'') {
        if (c == '\'') {
          if (i + 1 < line.size() && line[i + 1] == '\'') ++i;  // '' is an escaped quote
          else quote = 0;
        }
        continue;
      }
      const bool after_blank = i == 0 || IsBlank(line[i - 1]);
      if (c == '#' && after_blank) break;  // a comment
      const bool token_start =
          after_blank || (flow > 0 && (line[i - 1] == '[' || line[i - 1] == '{' || line[i - 1] == ','));
      if ((c == '"' || c == '\'') && token_start) {
        quote = c;
      } else if (c == '[' || c == '{') {
        if (block.size() + ++flow > max_depth) return too_deep();
      } else if ((c == ']' || c == '}') && flow > 0) {
        --flow;
      } else if (flow == 0 && IsBlockScalarHeader(line, i)) {
        // Its text must be indented more than the collection the line opened
        // (the innermost column here is at least that), so this never skips
        // a line that yaml-cpp reads as structure.
        block_scalar_column = block.empty() ? 0 : block.back();
        break;
      }
    }
  }
  return Ok();
}

}  // namespace moeserve
