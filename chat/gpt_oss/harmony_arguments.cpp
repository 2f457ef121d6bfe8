#include "moeserve/chat/gpt_oss/harmony_arguments.hpp"

#include <algorithm>
#include <limits>

namespace moeserve::chat {

HarmonyArgumentsController::HarmonyArgumentsController(std::shared_ptr<const TokenByteIndex> index, engine::JsonGrammar grammar,
                                                       int call_token)
    : index_(std::move(index)), grammar_(std::move(grammar)), call_token_(call_token) {}

HarmonyArgumentsController::HarmonyArgumentsController(std::shared_ptr<const TokenByteIndex> index,
                                                       std::vector<Choice> choices, std::vector<int> header_tail,
                                                       int call_token)
    : index_(std::move(index)), choices_(std::move(choices)), header_tail_(std::move(header_tail)), call_token_(call_token) {}

std::vector<int> HarmonyArgumentsController::Allowed(int vocab) const {
  if (done_) return call_token_ < vocab ? std::vector<int>{call_token_} : std::vector<int>{};
  return grammar_ ? AllowedArguments(vocab) : AllowedNames(vocab);
}

// Text tokens that continue the name towards one of "NAME " (the space ends it).
std::vector<int> HarmonyArgumentsController::AllowedNames(int vocab) const {
  std::vector<std::string> targets;
  for (const auto& c : choices_) targets.push_back(c.name + " ");
  return TokensContinuingOneOf(*index_, name_written_, targets, vocab);
}

std::vector<int> HarmonyArgumentsController::AllowedArguments(int vocab) const {
  return TokensAcceptedBy(*index_, *grammar_, vocab);
}

void HarmonyArgumentsController::Mask(std::span<float> logits) {
  if (broken_) return;
  MaskAllBut(logits, Allowed(static_cast<int>(logits.size())));
}

std::vector<int> HarmonyArgumentsController::OnToken(int token) {
  if (skip_ > 0) {  // a header token this controller forced
    --skip_;
    return {};
  }
  if (done_ || broken_) return {};
  const std::string& bytes = index_->BytesOf(token);
  if (!grammar_) {
    name_written_ += bytes;
    for (const auto& c : choices_) {
      if (name_written_ == c.name + " ") {
        grammar_ = c.grammar;
        skip_ = static_cast<int>(header_tail_.size());
        return header_tail_;  // <|constrain|>json<|message|>: the arguments come next
      }
    }
    const bool on_the_way = std::any_of(choices_.begin(), choices_.end(), [&](const Choice& c) {
      return (c.name + " ").compare(0, name_written_.size(), name_written_) == 0;
    });
    // A forced or unmasked token off every name: stop constraining; the parser reports the call as generated.
    if (!on_the_way || bytes.empty()) broken_ = true;
    return {};
  }
  // A forced or unmasked token the grammar refuses: stop constraining, the
  // parser reports the arguments as generated.
  if (!FeedTokenBytes(*grammar_, bytes)) {
    broken_ = true;
    return {};
  }
  if (grammar_->Done()) {
    done_ = true;
    return {call_token_};  // the arguments are complete: the call ends
  }
  return {};
}

}  // namespace moeserve::chat
