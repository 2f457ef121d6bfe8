#include "moeserve/chat/deepseek_v32/deepseek_assembler.hpp"

#include <algorithm>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/deepseek_chat.hpp"

namespace moeserve::chat {

namespace {

using engine::kDsmlCallsClose;
using engine::kDsmlCallsOpen;
using engine::kDsmlInvokeClose;
using engine::kDsmlInvokeOpen;
using engine::kDsmlParameterClose;
using engine::kDsmlParameterOpen;

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

size_t SkipNewlines(std::string_view s, size_t at) {
  while (at < s.size() && (s[at] == '\n' || s[at] == ' ')) ++at;
  return at;
}

// One invoke's body (between `<｜DSML｜invoke name="` and `</｜DSML｜invoke>`)
// as the published decoder reads it: `name">` then parameters, each
// `<｜DSML｜parameter name="k" string="true|false">value</｜DSML｜parameter>`,
// newlines between. nullopt when it breaks the format.
std::optional<std::pair<std::string, std::vector<engine::DsmlParameter>>> ParseInvoke(std::string_view body) {
  const size_t name_end = body.find("\">");
  if (name_end == std::string_view::npos || name_end == 0) return std::nullopt;
  std::string name(body.substr(0, name_end));
  if (name.find('"') != std::string::npos || name.find('\n') != std::string::npos) return std::nullopt;
  std::vector<engine::DsmlParameter> parameters;
  size_t at = name_end + 2;
  while (true) {
    at = SkipNewlines(body, at);
    if (at == body.size()) break;
    if (!StartsWith(body.substr(at), kDsmlParameterOpen)) return std::nullopt;
    at += kDsmlParameterOpen.size();
    const size_t key_end = body.find("\" string=\"", at);
    if (key_end == std::string_view::npos) return std::nullopt;
    engine::DsmlParameter p;
    p.name = std::string(body.substr(at, key_end - at));
    at = key_end + 10;
    if (StartsWith(body.substr(at), "true\">")) {
      p.is_string = true;
      at += 6;
    } else if (StartsWith(body.substr(at), "false\">")) {
      at += 7;
    } else {
      return std::nullopt;
    }
    const size_t value_end = body.find(kDsmlParameterClose, at);
    if (value_end == std::string_view::npos) return std::nullopt;
    p.value = std::string(body.substr(at, value_end - at));
    at = value_end + kDsmlParameterClose.size();
    for (const auto& q : parameters)
      if (q.name == p.name) return std::nullopt;  // the published decoder refuses duplicates
    parameters.push_back(std::move(p));
  }
  return std::make_pair(std::move(name), std::move(parameters));
}

}  // namespace

DeepseekAssembler::DeepseekAssembler(const DeepseekServing& serving, std::vector<std::string> stop,
                                     std::optional<uint64_t> call_id_seed, bool tools)
    : serving_(serving), tools_(tools), answer_(std::move(stop)) {
  if (call_id_seed) id_rng_.emplace(*call_id_seed);
}

void DeepseekAssembler::Content(std::string text, OutputDelta& out) {
  if (!tools_) {
    answer_.Append(text, out);
    return;
  }
  if (in_block_) {
    block_ += text;
    block_raw_ += text;
    if (!ReadBlock(out)) BlockAsText(out);
    return;
  }
  pending_ += text;
  const size_t at = pending_.find(kDsmlCallsOpen);
  if (at != std::string::npos) {
    std::string before = pending_.substr(0, at);
    for (int i = 0; i < 2 && !before.empty() && before.back() == '\n'; ++i) before.pop_back();  // the format's "\n\n"
    answer_.Append(before, out);
    answer_.DropUndecodedLogprobs();
    in_block_ = true;
    block_ = pending_.substr(at + kDsmlCallsOpen.size());
    block_raw_ = pending_.substr(at);
    block_calls_ = 0;
    pending_.clear();
    if (!ReadBlock(out)) BlockAsText(out);
    return;
  }
  // Hold back what may still become "\n\n<｜DSML｜function_calls>".
  size_t hold = 0;
  for (size_t k = std::min(pending_.size(), kDsmlCallsOpen.size() - 1); k > 0; --k) {
    if (pending_.compare(pending_.size() - k, k, kDsmlCallsOpen.substr(0, k)) == 0) {
      hold = k;
      break;
    }
  }
  for (int i = 0; i < 2 && hold < pending_.size() && pending_[pending_.size() - hold - 1] == '\n'; ++i) ++hold;
  answer_.Append(pending_.substr(0, pending_.size() - hold), out);
  pending_.erase(0, pending_.size() - hold);
}

bool DeepseekAssembler::ReadBlock(OutputDelta& out) {
  while (true) {
    const size_t at = SkipNewlines(block_, 0);
    const std::string_view rest = std::string_view(block_).substr(at);
    if (StartsWith(rest, kDsmlCallsClose)) {
      std::string after(rest.substr(kDsmlCallsClose.size()));
      in_block_ = false;
      block_.clear();
      block_raw_.clear();
      if (!after.empty()) Content(std::move(after), out);
      return true;
    }
    if (StartsWith(rest, kDsmlInvokeOpen)) {
      const size_t close = rest.find(kDsmlInvokeClose);
      if (close == std::string_view::npos) return true;  // the call is still being written
      auto invoke = ParseInvoke(rest.substr(kDsmlInvokeOpen.size(), close - kDsmlInvokeOpen.size()));
      if (!invoke) return false;
      AssembledToolCall call;
      call.id = id_rng_ ? engine::NewToolCallId(*id_rng_) : engine::NewToolCallId();
      call.name = std::move(invoke->first);
      call.arguments = engine::DsmlArgumentsJson(invoke->second);
      const JsonLimits limits{.max_bytes = call.arguments.size() + 1,
                              .max_depth = engine::kChatJsonMaxDepth,
                              .max_object_keys = engine::kChatJsonMaxObjectKeys};
      auto parsed = ParseJsonBounded<nlohmann::json>(call.arguments, limits, "tool call arguments");
      call.arguments_valid = parsed && parsed->is_object();
      if (!call.arguments_valid) ++parse_errors_;
      out.tool_calls.push_back({static_cast<int>(calls_.size()), call.id, call.name, call.arguments});
      calls_.push_back(std::move(call));
      ++block_calls_;
      block_.erase(0, at + close + kDsmlInvokeClose.size());
      continue;
    }
    // Nothing decided yet while what is there may still become a tag.
    if (StartsWith(kDsmlCallsClose, rest) || StartsWith(kDsmlInvokeOpen, rest)) return true;
    return false;
  }
}

void DeepseekAssembler::BlockAsText(OutputDelta& out) {
  ++parse_errors_;
  in_block_ = false;
  // Calls already out stay calls; what follows them is text.
  std::string text = block_calls_ == 0 ? block_raw_ : block_;
  block_.clear();
  block_raw_.clear();
  answer_.Append(text, out);
}

OutputDelta DeepseekAssembler::OnToken(int token, bool reasoning, const ContentLogprob* logprob) {
  (void)reasoning;  // </think> says where reasoning ends
  OutputDelta out;
  if (ended_ || answer_.stop_matched() || finished_) return out;
  const DeepseekTokens& t = serving_.tokens;
  if (token == t.eos) {
    ended_ = true;
    return out;
  }
  if (token == t.end_think) {
    if (in_think_) {
      std::string tail = reasoning_decoder_.Finish();
      reasoning_ += tail;
      out.reasoning += tail;
      in_think_ = false;
    }
    return out;
  }
  const std::string& bytes = serving_.token_bytes->BytesOf(token);
  if (bytes.empty() || serving_.tokenizer->IsSpecial(token)) return out;  // added tokens mean nothing here
  if (in_think_) {
    std::string text = reasoning_decoder_.Push(bytes);
    reasoning_ += text;
    out.reasoning += text;
    return out;
  }
  if (logprob) answer_.AddLogprob(*logprob);
  Content(content_decoder_.Push(bytes), out);
  return out;
}

OutputDelta DeepseekAssembler::Finish() {
  OutputDelta out;
  if (finished_) return out;
  finished_ = true;
  std::string tail = reasoning_decoder_.Finish();
  reasoning_ += tail;
  out.reasoning += tail;
  if (!answer_.stop_matched()) {
    Content(content_decoder_.Finish(), out);
    if (in_block_) {
      // Never closed: complete calls stand when nothing but the closing tag is missing.
      const std::string_view rest = std::string_view(block_).substr(SkipNewlines(block_, 0));
      if (block_calls_ > 0 && StartsWith(kDsmlCallsClose, rest)) {
        in_block_ = false;
      } else {
        BlockAsText(out);
      }
    }
    answer_.Append(pending_, out);
    pending_.clear();
  }
  answer_.Flush(out);
  return out;
}

}  // namespace moeserve::chat
