// HarmonyOutputParser (gpt-oss model output). Each input byte is one
// generated id: 0xF8..0xFF are the control tokens (<|start|>, <|end|>,
// <|message|>, <|channel|>, <|constrain|>, <|return|>, <|call|>,
// <|endoftext|>), every other byte its byte-level token. Checked: the parser
// always ends in a definite state after Finish, with a message exactly when
// the output was malformed or cut off; every delta is whole UTF-8; the
// deltas add up to the reasoning, content and calls it reports; every call
// names an offered tool; nothing is accepted after the end.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_check.hpp"
#include "moeserve/engine/harmony.hpp"

using namespace moeserve;
using fuzz::ByteLevelName;
using engine::HarmonyDelta;
using engine::HarmonyEnd;
using engine::HfTokenizer;

namespace {

constexpr const char* kControls[] = {"<|start|>", "<|end|>",    "<|message|>", "<|channel|>",
                                     "<|constrain|>", "<|return|>", "<|call|>", "<|endoftext|>"};

const HfTokenizer& FixedTokenizer() {
  static const HfTokenizer tokenizer = [] {
    nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
    for (int b = 0; b < 256; ++b) vocab[ByteLevelName(b)] = b;
    nlohmann::ordered_json added = nlohmann::ordered_json::array();
    for (int i = 0; i < 8; ++i) {
      added.push_back({{"id", 256 + i}, {"content", kControls[i]}, {"normalized", false}, {"special", true}});
    }
    nlohmann::ordered_json doc = {
        {"added_tokens", added},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::ordered_json::array()}}},
    };
    auto t = HfTokenizer::FromJsonText(doc.dump(), "fuzz (harmony)");
    FUZZ_CHECK(t.has_value(), t ? "" : t.error().message());
    return std::move(*t);
  }();
  return tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const HfTokenizer& tok = FixedTokenizer();
  auto tokens = engine::HarmonyTokens::From(tok);
  FUZZ_CHECK(tokens.has_value(), "the fixed tokenizer has harmony's tokens");
  const std::vector<std::string> offered = {"f", "get_weather"};
  int next_id = 0;
  engine::HarmonyOutputParser parser(tok, *tokens, offered, [&] { return "call_" + std::to_string(next_id++); });

  std::string reasoning, content;
  std::vector<std::string> args;
  auto apply = [&](const std::vector<HarmonyDelta>& deltas) {
    for (const auto& d : deltas) {
      FUZZ_CHECK(fuzz::IsValidUtf8(d.text), "a delta with half a character");
      switch (d.kind) {
        case HarmonyDelta::Kind::kReasoning: reasoning += d.text; break;
        case HarmonyDelta::Kind::kContent: content += d.text; break;
        case HarmonyDelta::Kind::kToolCallBegin:
          FUZZ_CHECK(d.tool_index == static_cast<int>(args.size()), "call index out of order");
          args.emplace_back();
          break;
        case HarmonyDelta::Kind::kToolCallArguments:
          FUZZ_CHECK(d.tool_index + 1 == static_cast<int>(args.size()), "arguments for another call");
          args.back() += d.text;
          break;
      }
    }
  };
  bool ended_early = false;
  for (size_t i = 0; i < size; ++i) {
    const int id = data[i] >= 0xF8 ? 256 + (data[i] - 0xF8) : data[i];
    if (parser.end() != HarmonyEnd::kRunning) ended_early = true;
    apply(parser.Push(id));
  }
  apply(parser.Finish());
  const HarmonyEnd end = parser.end();
  FUZZ_CHECK(end != HarmonyEnd::kRunning, "still running after Finish");
  const bool failed = end == HarmonyEnd::kMalformed || end == HarmonyEnd::kCutOff;
  FUZZ_CHECK(failed == !parser.error().empty(), "an error message exactly when the output was not well formed");
  if (ended_early) FUZZ_CHECK(end == HarmonyEnd::kMalformed, "tokens after the end were accepted");
  FUZZ_CHECK(reasoning == parser.reasoning(), "reasoning deltas differ from reasoning()");
  FUZZ_CHECK(content == parser.content(), "content deltas differ from content()");
  FUZZ_CHECK(args.size() == parser.tool_calls().size(), "call deltas differ from tool_calls()");
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& call = parser.tool_calls()[i];
    FUZZ_CHECK(args[i] == call.arguments_text, "argument deltas differ");
    FUZZ_CHECK(call.name == "f" || call.name == "get_weather", "a call to a tool not offered: " + call.name);
  }
  if (end == HarmonyEnd::kToolCalls) FUZZ_CHECK(!args.empty(), "ended with tool calls but holds none");
  return 0;
}
