// Helpers for tests that hold a streamed answer open (a client that reads
// the first tokens and then hangs up or stays connected): a request whose
// whole answer is long, and whether a stream has carried generated text yet.
// Both keep such tests from depending on a sampled answer of the random test
// model, which may end at its first token or never enter its reasoning.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {

// Whether an SSE chunk in got carries generated text (reasoning, content or
// a tool call), not only the role.
inline bool HasGeneratedText(const std::string& got) {
  size_t at = 0;
  while ((at = got.find("data: {", at)) != std::string::npos) {
    const size_t end = got.find("\n\n", at);
    if (end == std::string::npos) return false;
    const json chunk = json::parse(got.substr(at + 6, end - at - 6), nullptr, false);
    at = end;
    if (!chunk.is_object() || !chunk.contains("choices") || chunk["choices"].empty()) continue;
    const json& delta = chunk["choices"][0].value("delta", json::object());
    for (const char* key : {"reasoning_content", "content"})
      if (delta.contains(key) && delta[key].is_string() && !delta[key].get<std::string>().empty()) return true;
    if (delta.contains("tool_calls")) return true;
  }
  return false;
}

// A response_format that holds the answer to 64 rows of 64 integers: more
// than 3,500 tokens, so a request with max_tokens at or below that cannot
// end early, whatever it samples. A free sampled answer of the random test
// model may draw an end token within its first tokens.
inline json LongAnswerFormat() {
  const json row = {{"type", "array"}, {"minItems", 64}, {"maxItems", 64}, {"items", {{"type", "integer"}}}};
  const json rows = {{"type", "array"}, {"minItems", 64}, {"maxItems", 64}, {"items", row}};
  const json schema = {{"type", "object"},
                       {"required", {"rows"}},
                       {"additionalProperties", false},
                       {"properties", {{"rows", rows}}}};
  return {{"type", "json_schema"}, {"json_schema", {{"name", "rows"}, {"schema", schema}}}};
}

// A greedy chat request (the same answer on every run) whose whole answer,
// asked once through Chat with key, is at least min_tokens long: prompts
// are tried in turn because the random model's answers differ in length by
// prompt and by the CPU's kernels. whole_tokens gets that answer's length
// (0 when no prompt's answer was long enough; the caller asserts on it).
inline json LongGreedyRequest(int port, const std::map<std::string, std::string>& key, int64_t min_tokens,
                              int64_t* whole_tokens) {
  json body;
  *whole_tokens = 0;
  for (int i = 0; i < 8; ++i) {
    body = {{"messages", UserTurn("a long answer please " + std::to_string(i))},
            {"max_tokens", 3000},
            {"temperature", 0}};
    const HttpResponse whole = Chat(port, body, key);
    if (whole.status != 200) return body;
    const int64_t n = whole.Json()["usage"]["completion_tokens"].get<int64_t>();
    if (n >= min_tokens) {
      *whole_tokens = n;
      return body;
    }
  }
  return body;
}

}  // namespace moeserve::daemon::testing
