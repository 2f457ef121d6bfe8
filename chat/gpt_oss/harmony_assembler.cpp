#include "moeserve/chat/gpt_oss/harmony_assembler.hpp"

#include <algorithm>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/chat_format.hpp"

namespace moeserve::chat {

HarmonyAssembler::HarmonyAssembler(HarmonyAssemblerOptions options)
    : tokenizer_(options.tokenizer),
      id_rng_(options.call_id_seed ? std::optional<std::mt19937_64>(*options.call_id_seed) : std::nullopt),
      parser_(*options.tokenizer, options.tokens, std::move(options.tool_names),
              [this] { return id_rng_ ? engine::NewToolCallId(*id_rng_) : engine::NewToolCallId(); }),
      answer_(std::move(options.stop)) {
  for (int id : options.prefill) Apply(parser_.Push(id), held_);
}

void HarmonyAssembler::Apply(std::vector<engine::HarmonyDelta> deltas, OutputDelta& out) {
  using Kind = engine::HarmonyDelta::Kind;
  for (auto& d : deltas) {
    switch (d.kind) {
      case Kind::kReasoning:
        reasoning_ += d.text;
        out.reasoning += d.text;
        break;
      case Kind::kContent:
        answer_.Append(d.text, out);
        break;
      case Kind::kToolCallBegin:
        calls_.push_back({d.tool_id, d.text, "", false});
        out.tool_calls.push_back({d.tool_index, d.tool_id, d.text, ""});
        break;
      case Kind::kToolCallArguments:
        calls_[static_cast<size_t>(d.tool_index)].arguments += d.text;
        // One entry per call in a delta: pieces of the same call are joined.
        if (!out.tool_calls.empty() && out.tool_calls.back().index == d.tool_index) {
          out.tool_calls.back().arguments += d.text;
        } else {
          out.tool_calls.push_back({d.tool_index, std::nullopt, std::nullopt, d.text});
        }
        break;
    }
  }
  if (parser_.end() == engine::HarmonyEnd::kMalformed) malformed_ = true;
}

OutputDelta HarmonyAssembler::OnToken(int token, bool reasoning, const ContentLogprob* logprob) {
  (void)reasoning;  // the parser knows the channel
  OutputDelta out = std::move(held_);
  held_ = OutputDelta{};
  // After the end (a stop string, a broken format, a terminator) nothing more is read:
  // the tokens the engine emits before the cancel lands are dropped.
  if (finished_ || StopMatched() || parser_.end() != engine::HarmonyEnd::kRunning) return out;
  // Content text's tokens only: its bytes arrive with this or a later content delta.
  if (logprob && parser_.ReadingContent() && !tokenizer_->IsSpecial(token)) answer_.AddLogprob(*logprob);
  Apply(parser_.Push(token), out);
  return out;
}

OutputDelta HarmonyAssembler::Finish() {
  OutputDelta out = std::move(held_);
  held_ = OutputDelta{};
  if (finished_) return out;
  finished_ = true;
  if (parser_.end() == engine::HarmonyEnd::kRunning) Apply(parser_.Finish(), out);
  answer_.Flush(out);
  for (auto& c : calls_) {
    auto parsed = ParseJsonBounded<nlohmann::json>(c.arguments, {.max_bytes = c.arguments.size() + 1, .max_depth = 64},
                                                   "tool call arguments");
    c.arguments_valid = parsed && parsed->is_object();
    if (!c.arguments_valid) ++parse_errors_;
  }
  return out;
}

}  // namespace moeserve::chat
