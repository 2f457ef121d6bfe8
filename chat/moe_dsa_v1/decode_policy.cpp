#include "moeserve/chat/moe_dsa_v1/decode_policy.hpp"

#include <algorithm>
#include <limits>

#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::chat {

namespace tok = engine::tok;

Result<std::shared_ptr<DecodePolicy>> DecodePolicy::Create(DecodePolicyOptions options) {
  std::shared_ptr<DecodePolicy> p(new DecodePolicy(std::move(options)));
  if (p->options_.mode == DecodeMode::kMustCall) {
    if (p->options_.tools.empty()) return Fail(Error::InvalidArgument("tool_choice requires a call but no tool is offered"));
    for (size_t i = 0; i < p->options_.tools.size(); ++i) {
      const ToolSpec& tool = p->options_.tools[i];
      auto g = engine::JsonGrammar::ForObjectSchema(tool.parameters, p->options_.limits, tool.strict);
      if (!g) {
        // The field in the request's own terms (the tools offered may be a subset).
        const std::string field = "tools[" + std::to_string(tool.index) + "].function.parameters";
        return Fail(g.error().WithContext("'" + field + "' (" + tool.name + ")").WithField(field));
      }
      p->tool_grammars_.push_back(std::move(*g));
    }
  } else if (p->options_.mode == DecodeMode::kJsonObject) {
    auto g = engine::JsonGrammar::ForObjectSchema(p->options_.response_schema, p->options_.limits, p->options_.response_strict);
    if (!g) {
      const std::string field = "response_format.json_schema.schema";
      return Fail(g.error().WithContext("'" + field + "'").WithField(field));
    }
    p->json_template_ = std::move(*g);
  }
  return p;
}

void DecodePolicy::SetLiterals(Phase phase, std::vector<std::string> literals) {
  phase_ = phase;
  literals_ = std::move(literals);
  literal_pos_ = 0;
}

bool DecodePolicy::AllowsByte(uint8_t b) const {
  switch (phase_) {
    case Phase::kCallPrefix:
    case Phase::kCallName:
    case Phase::kCallClose:
      for (const auto& l : literals_)
        if (literal_pos_ < l.size() && static_cast<uint8_t>(l[literal_pos_]) == b) return true;
      return false;
    case Phase::kCallArgs:
    case Phase::kJson:
      return grammar_ && grammar_->CanAccept(b);
    default:
      return false;
  }
}

bool DecodePolicy::Allows(int token) const {
  const DecodeMode mode = options_.mode;
  switch (phase_) {
    case Phase::kReasoning:
      // Reasoning is free text; it ends with <|/think|>. A free-mode model
      // may still open a call here (api.md: such a call is never lost).
      if (tok::IsByte(token)) return true;
      if (token == tok::kEndThink) return true;
      if (mode == DecodeMode::kFree) return token == tok::kToolCall || token == tok::kEnd || token == tok::kEos;
      if (mode == DecodeMode::kNoTools) return token == tok::kEnd || token == tok::kEos;
      return false;
    case Phase::kAnswer:
      if (tok::IsByte(token)) return true;
      if (token == tok::kEnd || token == tok::kEos) return true;
      return mode == DecodeMode::kFree && token == tok::kToolCall;
    case Phase::kFreeCall:
      return tok::IsByte(token) || token == tok::kEndToolCall || token == tok::kEnd || token == tok::kEos;
    case Phase::kExpectCall:
      return token == tok::kToolCall;
    case Phase::kCallEnd:
      return token == tok::kEndToolCall;
    case Phase::kAfterCall:
      if (token == tok::kEnd) return true;
      return token == tok::kToolCall && options_.parallel_calls && calls_ < options_.max_calls;
    case Phase::kJsonEnd:
      return token == tok::kEnd;
    case Phase::kFinished:
      return token == tok::kEnd || token == tok::kEos;
    default:
      return tok::IsByte(token) && AllowsByte(static_cast<uint8_t>(token));
  }
}

void DecodePolicy::Mask(std::span<float> logits) {
  const float kNeg = -std::numeric_limits<float>::infinity();
  const int n = static_cast<int>(logits.size());
  // Byte-constrained phases: ask the grammar about each of the 256 bytes once.
  for (int id = 0; id < n; ++id) {
    if (id >= tok::kFirstPadding) {
      logits[id] = kNeg;  // padding is never sampled (the engine masks it too)
      continue;
    }
    if (!Allows(id)) logits[id] = kNeg;
  }
}

bool DecodePolicy::FeedByte(uint8_t b) {
  switch (phase_) {
    case Phase::kCallPrefix:
    case Phase::kCallName:
    case Phase::kCallClose: {
      std::vector<std::string> next;
      for (auto& l : literals_)
        if (literal_pos_ < l.size() && static_cast<uint8_t>(l[literal_pos_]) == b) next.push_back(std::move(l));
      if (next.empty()) return false;
      literals_ = std::move(next);
      ++literal_pos_;
      if (literals_.size() != 1 || literal_pos_ != literals_[0].size()) return true;
      // One literal fully read: move on.
      if (phase_ == Phase::kCallPrefix) {
        std::vector<std::string> names;
        for (size_t i = 0; i < options_.tools.size(); ++i) {
          names.push_back(nlohmann::ordered_json(options_.tools[i].name).dump() + ",\"arguments\":");
        }
        SetLiterals(Phase::kCallName, std::move(names));
      } else if (phase_ == Phase::kCallName) {
        size_t tool = 0;
        for (size_t i = 0; i < options_.tools.size(); ++i) {
          if (nlohmann::ordered_json(options_.tools[i].name).dump() + ",\"arguments\":" == literals_[0]) tool = i;
        }
        grammar_ = tool_grammars_[tool];
        phase_ = Phase::kCallArgs;
      } else {
        phase_ = Phase::kCallEnd;
      }
      return true;
    }
    case Phase::kCallArgs:
      if (!grammar_ || !grammar_->Feed(b)) return false;
      if (grammar_->Done()) {
        grammar_.reset();
        SetLiterals(Phase::kCallClose, {"}"});
      }
      return true;
    case Phase::kJson:
      if (!grammar_ || !grammar_->Feed(b)) return false;
      if (grammar_->Done()) {
        grammar_.reset();
        phase_ = Phase::kJsonEnd;
      }
      return true;
    default:
      return false;
  }
}

std::vector<int> DecodePolicy::OnToken(int token) {
  const DecodeMode mode = options_.mode;
  if (token == tok::kEnd || token == tok::kEos) {
    phase_ = Phase::kFinished;
    return {};
  }
  if (token == tok::kEndThink) {
    if (phase_ != Phase::kReasoning) return {};
    if (mode == DecodeMode::kMustCall) phase_ = Phase::kExpectCall;
    else if (mode == DecodeMode::kJsonObject) {
      grammar_ = *json_template_;
      phase_ = Phase::kJson;
    } else {
      phase_ = Phase::kAnswer;
    }
    return {};
  }
  if (token == tok::kToolCall) {
    // The server assigns the id (model.md section 8): the engine writes it
    // right after <|tool_call|>, and the model continues with "name".
    std::string id = engine::NewToolCallId(rng_);
    std::string prefix = engine::ToolCallSpanIdPrefix(id);
    if (mode == DecodeMode::kMustCall) {
      ++calls_;
      SetLiterals(Phase::kCallPrefix, {prefix + "\"name\":"});
    } else {
      phase_ = Phase::kFreeCall;
    }
    std::vector<int> forced;
    for (unsigned char c : prefix) forced.push_back(c);
    return forced;
  }
  if (token == tok::kEndToolCall) {
    if (mode == DecodeMode::kMustCall) phase_ = Phase::kAfterCall;
    else if (phase_ == Phase::kFreeCall) phase_ = Phase::kAnswer;
    return {};
  }
  if (tok::IsByte(token)) {
    switch (phase_) {
      case Phase::kCallPrefix:
      case Phase::kCallName:
      case Phase::kCallClose:
      case Phase::kCallArgs:
      case Phase::kJson:
        // A byte the grammar refuses can only be forced by the engine; the
        // grammar then stops constraining rather than masking everything.
        if (!FeedByte(static_cast<uint8_t>(token))) phase_ = Phase::kFinished;
        break;
      default:
        break;
    }
  }
  return {};
}

}  // namespace moeserve::chat
