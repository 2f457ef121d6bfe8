// Generated ids -> reasoning, content and tool calls
// (include/moeserve/engine/harmony.hpp). A header is collected whole (it is a
// few tokens) and read when <|message|> arrives; a body streams out as its
// text completes, through one HfStreamDecoder per message so that no
// half-character is ever emitted.
#include <algorithm>
#include <sstream>

#include "moeserve/engine/harmony.hpp"

namespace moeserve::engine {
namespace {

constexpr size_t kMaxHeaderTokens = 64;  // real headers are under 20; longer is a model gone astray

std::vector<std::string> Words(std::string_view text) {
  std::vector<std::string> words;
  std::istringstream in{std::string(text)};
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

}  // namespace

HarmonyOutputParser::HarmonyOutputParser(const HfTokenizer& tokenizer, HarmonyTokens tokens,
                                         std::vector<std::string> tool_names, std::function<std::string()> new_id)
    : tokenizer_(&tokenizer), tokens_(tokens), tool_names_(std::move(tool_names)), new_id_(std::move(new_id)) {
  if (!new_id_) new_id_ = [] { return NewToolCallId(); };
}

void HarmonyOutputParser::Fail(std::string message) {
  end_ = HarmonyEnd::kMalformed;
  error_ = std::move(message);
  state_ = State::kDone;
}

std::optional<std::string> HarmonyOutputParser::ArgumentsOpenFor() const {
  if (state_ == State::kBody && target_ == Target::kToolArguments) return tool_calls_.back().name;
  return std::nullopt;
}

void HarmonyOutputParser::Emit(std::string text, std::vector<HarmonyDelta>& out) {
  if (text.empty()) return;
  HarmonyDelta d;
  switch (target_) {
    case Target::kReasoning:
      reasoning_ += text;
      d.kind = HarmonyDelta::Kind::kReasoning;
      break;
    case Target::kContent:
      content_ += text;
      d.kind = HarmonyDelta::Kind::kContent;
      break;
    case Target::kToolArguments:
      tool_calls_.back().arguments_text += text;
      d.kind = HarmonyDelta::Kind::kToolCallArguments;
      d.tool_index = static_cast<int>(tool_calls_.size()) - 1;
      break;
  }
  d.text = std::move(text);
  out.push_back(std::move(d));
}

// Reads the collected header: [author][ to=R]<|channel|>CHANNEL[ to=R][ <|constrain|>TYPE | TYPE].
// Both places of the recipient occur in gpt-oss output, so both are read.
void HarmonyOutputParser::StartBody(std::vector<HarmonyDelta>& out) {
  std::string author;
  std::string recipient;
  std::string channel;
  bool saw_channel = false;
  size_t i = 0;
  auto text_until_control = [&] {
    std::vector<int> run;
    while (i < header_.size() && header_[i] != tokens_.channel && header_[i] != tokens_.constrain) {
      run.push_back(header_[i++]);
    }
    return tokenizer_->Decode(run);
  };
  auto take_recipient = [&](const std::string& word) {
    if (!word.starts_with("to=")) return false;
    recipient = word.substr(3);
    return true;
  };
  std::vector<std::string> words = Words(text_until_control());
  size_t w = 0;
  if (first_header_) {
    author = "assistant";  // the prompt ended with <|start|>assistant
  } else if (w < words.size()) {
    author = words[w++];
  }
  for (; w < words.size(); ++w) {
    if (!take_recipient(words[w])) return Fail("unexpected '" + words[w] + "' in a message header");
  }
  if (author != "assistant") return Fail("the model wrote a message as '" + author + "', not as the assistant");
  while (i < header_.size()) {
    const int control = header_[i++];
    std::vector<std::string> rest = Words(text_until_control());
    size_t r = 0;
    if (control == tokens_.channel) {
      if (saw_channel) return Fail("a message header with two channels");
      saw_channel = true;
      if (rest.empty()) return Fail("a message header with an empty channel");
      channel = rest[r++];
    } else {  // <|constrain|>: the content type; only JSON is produced for function calls
      if (rest.empty()) return Fail("a message header with an empty <|constrain|>");
      ++r;
    }
    for (; r < rest.size(); ++r) {
      // After the channel: a recipient, or a bare content type ("json") as some outputs write it.
      if (!take_recipient(rest[r]) && r + 1 != rest.size()) {
        return Fail("unexpected '" + rest[r] + "' in a message header");
      }
    }
  }
  if (!saw_channel) return Fail("a message header without a channel");
  if (channel != "analysis" && channel != "commentary" && channel != "final") {
    return Fail("unknown channel '" + channel + "'");
  }
  first_header_ = false;
  if (!recipient.empty()) {
    // gpt-oss sometimes addresses a function from the analysis channel; the call is honoured either way.
    if (channel == "final") return Fail("a final message addressed to '" + recipient + "'");
    if (!recipient.starts_with("functions.")) return Fail("unknown recipient '" + recipient + "'");
    std::string name = recipient.substr(std::string_view("functions.").size());
    if (std::find(tool_names_.begin(), tool_names_.end(), name) == tool_names_.end()) {
      return Fail("a call to '" + name + "', which is not among the request's tools");
    }
    tool_calls_.push_back({new_id_(), name, ""});
    HarmonyDelta d;
    d.kind = HarmonyDelta::Kind::kToolCallBegin;
    d.text = name;
    d.tool_index = static_cast<int>(tool_calls_.size()) - 1;
    d.tool_id = tool_calls_.back().id;
    out.push_back(std::move(d));
    target_ = Target::kToolArguments;
  } else if (channel == "analysis") {
    target_ = Target::kReasoning;
  } else {
    if (channel == "final") saw_final_ = true;
    target_ = Target::kContent;  // final, or a commentary preamble meant for the user
  }
  header_.clear();
  body_decoder_.emplace(*tokenizer_);
  state_ = State::kBody;
}

void HarmonyOutputParser::EndMessage(int terminator, std::vector<HarmonyDelta>& out) {
  Emit(body_decoder_->Finish(), out);
  body_decoder_.reset();
  const bool was_call = target_ == Target::kToolArguments;
  if (terminator == tokens_.call) {
    if (!was_call) return Fail("<|call|> ends a message that addresses no tool");
    end_ = HarmonyEnd::kToolCalls;
    state_ = State::kDone;
  } else if (terminator == tokens_.return_) {
    if (was_call) return Fail("<|return|> ends a tool call");
    end_ = HarmonyEnd::kFinal;
    state_ = State::kDone;
  } else {
    state_ = State::kBetween;  // <|end|>: another message may follow
  }
}

std::vector<HarmonyDelta> HarmonyOutputParser::Push(int id) {
  std::vector<HarmonyDelta> out;
  const bool is_terminator = id == tokens_.end || id == tokens_.call || id == tokens_.return_;
  switch (state_) {
    case State::kDone:
      if (end_ != HarmonyEnd::kMalformed) Fail("output continues after the generation ended");
      break;
    case State::kBetween:
      if (id == tokens_.start) {
        state_ = State::kHeader;
      } else if (id == tokens_.return_ && saw_final_) {
        end_ = HarmonyEnd::kFinal;  // a stray stop after a final answer's <|end|>
        state_ = State::kDone;
      } else {
        Fail("expected <|start|> after a message, got " + tokenizer_->Decode(std::vector<int>{id}));
      }
      break;
    case State::kHeader:
      if (id == tokens_.message) {
        StartBody(out);
      } else if (id == tokens_.start || is_terminator) {
        Fail("a message header ended by " + tokenizer_->Decode(std::vector<int>{id}) + " before <|message|>");
      } else if (tokenizer_->IsSpecial(id) && id != tokens_.channel && id != tokens_.constrain) {
        Fail("control token " + tokenizer_->Decode(std::vector<int>{id}) + " inside a message header");
      } else if (header_.size() >= kMaxHeaderTokens) {
        Fail("a message header longer than " + std::to_string(kMaxHeaderTokens) + " tokens");
      } else {
        header_.push_back(id);
      }
      break;
    case State::kBody:
      if (is_terminator) {
        EndMessage(id, out);
      } else if (tokenizer_->IsSpecial(id)) {
        Emit(body_decoder_->Finish(), out);
        Fail("control token " + tokenizer_->Decode(std::vector<int>{id}) + " inside a message");
      } else {
        Emit(body_decoder_->Push(id), out);
      }
      break;
  }
  return out;
}

std::vector<HarmonyDelta> HarmonyOutputParser::Finish() {
  std::vector<HarmonyDelta> out;
  if (state_ == State::kDone) return out;
  if (state_ == State::kBody) Emit(body_decoder_->Finish(), out);
  if (state_ == State::kBetween && saw_final_) {
    end_ = HarmonyEnd::kFinal;  // a final answer ended by <|end|> rather than <|return|>
  } else {
    end_ = HarmonyEnd::kCutOff;
    error_ = state_ == State::kBody     ? "generation stopped inside a message"
             : state_ == State::kHeader ? "generation stopped inside a message header"
                                        : "generation stopped before a final answer or a tool call";
  }
  state_ = State::kDone;
  return out;
}

}  // namespace moeserve::engine
