#include "moeserve/chat/gpt_oss/harmony_structure.hpp"

#include <algorithm>
#include <limits>

namespace moeserve::chat {

namespace {

void AppendBytes(std::vector<int>& units, const std::string& text) {
  for (unsigned char c : text) units.push_back(c);
}

}  // namespace

HarmonyStructureController::HarmonyStructureController(HarmonyStructureOptions options) : options_(std::move(options)) {
  const engine::HarmonyTokens& t = options_.tokens;
  auto path = [&](const std::string& channel_text, Body body, int function, bool constrain_json) {
    HeaderPath p;
    p.body = body;
    p.function = function;
    AppendBytes(p.units, "assistant");
    p.units.push_back(kControl + t.channel);
    AppendBytes(p.units, channel_text);
    if (constrain_json) {
      p.units.push_back(kControl + t.constrain);
      AppendBytes(p.units, "json");
    }
    p.units.push_back(kControl + t.message);
    paths_.push_back(std::move(p));
  };
  path("analysis", Body::kFreeText, -1, false);
  path("final", options_.response ? Body::kJsonFinal : Body::kFreeFinal, -1, false);
  // A preamble is content; under response_format the content is the JSON alone.
  if (!options_.functions.empty() && !options_.response) path("commentary", Body::kFreeText, -1, false);
  for (size_t i = 0; i < options_.functions.size(); ++i) {
    path("commentary to=functions." + options_.functions[i].name + " ", Body::kCall, static_cast<int>(i), true);
  }
  BeginHeader("assistant");  // the prompt ends with <|start|>assistant
}

void HarmonyStructureController::BeginHeader(const std::string& role_written) {
  phase_ = Phase::kHeader;
  written_.clear();
  AppendBytes(written_, role_written);
  live_.clear();
  for (size_t i = 0; i < paths_.size(); ++i) live_.push_back(i);
}

void HarmonyStructureController::BeginBody(const HeaderPath& path) {
  phase_ = Phase::kBody;
  body_ = path.body;
  grammar_.reset();
  terminator_ = -1;
  if (body_ == Body::kJsonFinal) {
    grammar_ = *options_.response;
    terminator_ = options_.tokens.return_;
  } else if (body_ == Body::kCall) {
    grammar_ = options_.functions[static_cast<size_t>(path.function)].grammar;
    terminator_ = options_.tokens.call;
  }
}

int HarmonyStructureController::FreeBodyEnd() const {
  return body_ == Body::kFreeFinal ? options_.tokens.return_ : options_.tokens.end;
}

std::vector<int> HarmonyStructureController::AllowedInHeader(int vocab) const {
  std::vector<int> out;
  std::vector<std::string> runs;  // the text each live path continues with, up to its next control token
  const size_t at = written_.size();
  for (size_t i : live_) {
    const std::vector<int>& units = paths_[i].units;
    if (at >= units.size()) continue;
    if (units[at] >= kControl) {
      const int id = units[at] - kControl;
      if (id < vocab && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
      continue;
    }
    std::string run;
    for (size_t k = at; k < units.size() && units[k] < kControl; ++k) run += static_cast<char>(units[k]);
    if (std::find(runs.begin(), runs.end(), run) == runs.end()) runs.push_back(std::move(run));
  }
  // A text token is allowed when its bytes begin a run: look up each of the
  // run's prefixes among the tokens sorted by their bytes.
  const auto& entries = options_.index->entries();
  for (const std::string& run : runs) {
    for (size_t len = 1; len <= run.size(); ++len) {
      const std::string_view prefix(run.data(), len);
      auto it = std::lower_bound(entries.begin(), entries.end(), prefix,
                                 [](const TokenByteIndex::Entry& e, std::string_view p) { return e.bytes < p; });
      for (; it != entries.end() && it->bytes == prefix; ++it) {
        if (it->id < vocab && std::find(out.begin(), out.end(), it->id) == out.end()) out.push_back(it->id);
      }
    }
  }
  return out;
}

std::vector<int> HarmonyStructureController::Allowed(int vocab) const {
  switch (phase_) {
    case Phase::kHeader:
      return AllowedInHeader(vocab);
    case Phase::kBetween:
      return options_.tokens.start < vocab ? std::vector<int>{options_.tokens.start} : std::vector<int>{};
    case Phase::kDone:
      return terminator_ >= 0 && terminator_ < vocab ? std::vector<int>{terminator_} : std::vector<int>{};
    case Phase::kBroken: {
      std::vector<int> all(static_cast<size_t>(vocab));
      for (int i = 0; i < vocab; ++i) all[static_cast<size_t>(i)] = i;
      return all;
    }
    case Phase::kBody:
      break;
  }
  if (grammar_) return TokensAcceptedBy(*options_.index, *grammar_, vocab);
  std::vector<int> out;
  for (int id = 0; id < vocab; ++id)
    if (IsText(id) || id == FreeBodyEnd()) out.push_back(id);
  return out;
}

void HarmonyStructureController::Mask(std::span<float> logits) {
  // kDone without a terminator: the answer ended with <|return|>, a stop token.
  if (phase_ == Phase::kBroken || (phase_ == Phase::kDone && terminator_ < 0)) return;
  if (phase_ == Phase::kBody && !grammar_) {
    // Free text: every text token stays, control tokens but the body's end go.
    const int end = FreeBodyEnd();
    for (size_t id = 0; id < logits.size(); ++id) {
      if (!IsText(static_cast<int>(id)) && static_cast<int>(id) != end) logits[id] = -std::numeric_limits<float>::infinity();
    }
    return;
  }
  MaskAllBut(logits, Allowed(static_cast<int>(logits.size())));
}

std::vector<int> HarmonyStructureController::OnToken(int token) {
  const engine::HarmonyTokens& t = options_.tokens;
  const std::string& bytes = options_.index->BytesOf(token);
  switch (phase_) {
    case Phase::kBroken:
    case Phase::kDone:
      return {};
    case Phase::kBetween:
      if (token == t.start) BeginHeader("");
      else phase_ = Phase::kBroken;
      return {};
    case Phase::kHeader: {
      if (bytes.empty()) written_.push_back(kControl + token);
      else AppendBytes(written_, bytes);
      std::erase_if(live_, [&](size_t i) {
        const std::vector<int>& units = paths_[i].units;
        return units.size() < written_.size() || !std::equal(written_.begin(), written_.end(), units.begin());
      });
      if (live_.empty()) {
        phase_ = Phase::kBroken;
        return {};
      }
      for (size_t i : live_) {
        if (paths_[i].units.size() == written_.size()) {
          BeginBody(paths_[i]);
          break;
        }
      }
      return {};
    }
    case Phase::kBody:
      break;
  }
  if (!grammar_) {
    if (!bytes.empty()) return {};
    if (token == FreeBodyEnd()) phase_ = body_ == Body::kFreeFinal ? Phase::kDone : Phase::kBetween;
    else phase_ = Phase::kBroken;
    return {};
  }
  if (bytes.empty() || !FeedTokenBytes(*grammar_, bytes)) {
    phase_ = Phase::kBroken;
    return {};
  }
  if (grammar_->Done()) {
    phase_ = Phase::kDone;
    return {terminator_};  // the JSON is complete: the call or the answer ends
  }
  return {};
}

}  // namespace moeserve::chat
