#include "moeserve/chat/qwen3_next/qwen3_assembler.hpp"

#include <algorithm>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/chat_format.hpp"

namespace moeserve::chat {

Qwen3Assembler::Qwen3Assembler(const Qwen3Serving& serving, std::vector<std::string> stop,
                               std::optional<uint64_t> call_id_seed)
    : serving_(serving), answer_(std::move(stop)) {
  if (call_id_seed) id_rng_.emplace(*call_id_seed);
}

// Newlines are held back until text follows: the ones before </think> (or
// at the very start) belong to the format.
void Qwen3Assembler::Reasoning(const std::string& text, OutputDelta& out) {
  std::string emit;
  for (char c : text) {
    if (c == '\n') {
      if (reasoning_started_) ++reasoning_newlines_;
      continue;
    }
    reasoning_started_ = true;
    emit.append(reasoning_newlines_, '\n');
    reasoning_newlines_ = 0;
    emit += c;
  }
  reasoning_ += emit;
  out.reasoning += emit;
}

// Leading newlines (after </think>) and those before a call are the format's.
void Qwen3Assembler::Content(const std::string& text, OutputDelta& out) {
  std::string emit;
  for (char c : text) {
    if (c == '\n') {
      if (content_started_) ++content_newlines_;
      continue;
    }
    content_started_ = true;
    emit.append(content_newlines_, '\n');
    content_newlines_ = 0;
    emit += c;
  }
  answer_.Append(emit, out);
}

void Qwen3Assembler::CloseCall(OutputDelta& out) {
  in_call_ = false;
  const JsonLimits limits{.max_bytes = span_.size() + 1,
                          .max_depth = engine::kChatJsonMaxDepth,
                          .max_object_keys = engine::kChatJsonMaxObjectKeys};
  auto body = ParseJsonBounded<nlohmann::ordered_json>(span_, limits, "tool call");
  const bool shaped = body && body->is_object() && body->contains("name") && (*body)["name"].is_string() &&
                      body->contains("arguments");
  if (!shaped) {
    ++parse_errors_;
    content_started_ = true;
    answer_.Append("<tool_call>" + span_ + "</tool_call>", out);
    span_.clear();
    return;
  }
  const auto& args = (*body)["arguments"];
  AssembledToolCall call;
  call.id = id_rng_ ? engine::NewToolCallId(*id_rng_) : engine::NewToolCallId();
  call.name = (*body)["name"].get<std::string>();
  call.arguments = args.is_string() ? args.get<std::string>() : args.dump();
  if (args.is_object()) {
    call.arguments_valid = true;
  } else if (args.is_string()) {
    auto inner = ParseJsonBounded<nlohmann::json>(call.arguments, limits, "tool call arguments");
    call.arguments_valid = inner && inner->is_object();
  }
  if (!call.arguments_valid) ++parse_errors_;
  out.tool_calls.push_back({static_cast<int>(calls_.size()), call.id, call.name, call.arguments});
  calls_.push_back(std::move(call));
  span_.clear();
}

OutputDelta Qwen3Assembler::OnToken(int token, bool reasoning, const ContentLogprob* logprob) {
  (void)reasoning;  // the markers say where reasoning ends
  OutputDelta out;
  if (ended_ || answer_.stop_matched() || finished_) return out;
  const Qwen3Tokens& t = serving_.tokens;
  const engine::HfTokenizer& tok = *serving_.tokenizer;
  if (token == t.im_end || (t.endoftext >= 0 && token == t.endoftext)) {
    ended_ = true;
    return out;
  }
  if (token == t.end_think) {
    if (in_think_ && !in_call_) {
      Reasoning(reasoning_decoder_.Finish(), out);
      reasoning_newlines_ = 0;
      in_think_ = false;
    }
    return out;
  }
  if (token == t.tool_call && !in_call_) {
    // Text before the call ends here; the newlines before it are the format's.
    if (in_think_) {
      Reasoning(reasoning_decoder_.Finish(), out);
    } else {
      Content(content_decoder_.Finish(), out);
      content_newlines_ = 0;
      answer_.DropUndecodedLogprobs();
    }
    in_call_ = true;
    return out;
  }
  if (token == t.end_tool_call && in_call_) {
    CloseCall(out);
    return out;
  }
  if (tok.IsSpecial(token) || token == t.think || token == t.tool_call || token == t.end_tool_call) return out;
  const std::string_view bytes = tok.TokenBytes(token);
  if (in_call_) {
    span_ += bytes;
  } else if (in_think_) {
    Reasoning(reasoning_decoder_.Push(bytes), out);
  } else {
    if (logprob) answer_.AddLogprob(*logprob);
    Content(content_decoder_.Push(bytes), out);
  }
  return out;
}

OutputDelta Qwen3Assembler::Finish() {
  OutputDelta out;
  if (finished_) return out;
  finished_ = true;
  if (in_call_) {
    // Never closed: what was written stays visible as text.
    ++parse_errors_;
    in_call_ = false;
    content_started_ = true;
    answer_.Append("<tool_call>" + span_, out);
    span_.clear();
  }
  Reasoning(reasoning_decoder_.Finish(), out);
  Content(content_decoder_.Finish(), out);
  answer_.Append(std::string(content_newlines_, '\n'), out);
  answer_.Flush(out);
  return out;
}

}  // namespace moeserve::chat
