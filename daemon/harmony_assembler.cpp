#include "moeserve/daemon/harmony_assembler.hpp"

#include <algorithm>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/daemon/stop_hold.hpp"
#include "moeserve/engine/chat_format.hpp"

namespace moeserve::daemon {

HarmonyAssembler::HarmonyAssembler(HarmonyAssemblerOptions options)
    : tokenizer_(options.tokenizer),
      id_rng_(options.call_id_seed ? std::optional<std::mt19937_64>(*options.call_id_seed) : std::nullopt),
      parser_(*options.tokenizer, options.tokens, std::move(options.tool_names),
              [this] { return id_rng_ ? engine::NewToolCallId(*id_rng_) : engine::NewToolCallId(); }),
      stop_(std::move(options.stop)) {
  for (int id : options.prefill) Apply(parser_.Push(id), held_);
}

void HarmonyAssembler::ReleaseContent(OutputDelta& out, bool all) {
  size_t end = content_all_.size();
  if (!all) {
    end -= StopHoldBack(content_all_, content_released_, stop_);
  }
  if (end > content_released_) {
    const std::string piece = content_all_.substr(content_released_, end - content_released_);
    out.content += piece;
    content_ += piece;
    content_released_ = end;
  }
  // Tokens go out with the text they made.
  ReleaseHeldLogprobs(logprobs_held_, content_released_, out, logprobs_);
}

void HarmonyAssembler::AppendContent(const std::string& text, OutputDelta& out) {
  if (stop_matched_) logprobs_undecoded_.clear();
  if (text.empty() || stop_matched_) return;
  // A match may start in held-back text, so search from what was released.
  const size_t search_from = content_released_;
  content_all_ += text;
  // The tokens whose bytes this text completes end where it ends.
  for (auto& lp : logprobs_undecoded_) logprobs_held_.emplace_back(content_all_.size(), std::move(lp));
  logprobs_undecoded_.clear();
  size_t cut = std::string::npos;
  for (const auto& s : stop_) {
    if (s.empty()) continue;
    const size_t at = content_all_.find(s, search_from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    content_all_.resize(cut);
    // A token whose text runs past the cut is not part of the answer.
    std::erase_if(logprobs_held_, [&](const auto& held) { return held.first > cut; });
    stop_matched_ = true;
    ReleaseContent(out, /*all=*/true);
    return;
  }
  ReleaseContent(out, /*all=*/false);
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
        AppendContent(d.text, out);
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
  if (logprob && parser_.ReadingContent() && !tokenizer_->IsSpecial(token)) logprobs_undecoded_.push_back(*logprob);
  Apply(parser_.Push(token), out);
  return out;
}

OutputDelta HarmonyAssembler::Finish() {
  OutputDelta out = std::move(held_);
  held_ = OutputDelta{};
  if (finished_) return out;
  finished_ = true;
  if (parser_.end() == engine::HarmonyEnd::kRunning) Apply(parser_.Finish(), out);
  if (!stop_matched_) ReleaseContent(out, /*all=*/true);
  for (auto& c : calls_) {
    auto parsed = ParseJsonBounded<nlohmann::json>(c.arguments, {.max_bytes = c.arguments.size() + 1, .max_depth = 64},
                                                   "tool call arguments");
    c.arguments_valid = parsed && parsed->is_object();
    if (!c.arguments_valid) ++parse_errors_;
  }
  return out;
}

}  // namespace moeserve::daemon
