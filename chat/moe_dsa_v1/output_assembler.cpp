#include "moeserve/chat/moe_dsa_v1/output_assembler.hpp"

#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/chat_format.hpp"

namespace moeserve::chat {

namespace tok = engine::tok;

namespace {

// Reads the rendered head {"id":"..","name":"..","arguments": and returns the
// offset where the arguments start, or 0 while it is incomplete or differs.
size_t ArgumentsOffset(const std::string& span, std::string* id, std::string* name) {
  // Ids and names are JSON strings; parse each with nlohmann to honour escapes.
  static const std::string kId = "{\"id\":";
  if (span.compare(0, kId.size(), kId) != 0) return 0;
  auto read_string = [&](size_t at, std::string* out) -> size_t {
    if (at >= span.size() || span[at] != '"') return 0;
    for (size_t i = at + 1; i < span.size(); ++i) {
      if (span[i] == '\\') { ++i; continue; }
      if (span[i] == '"') {
        // One string literal: depth 0, no longer than itself.
        std::string literal = span.substr(at, i + 1 - at);
        auto v = ParseJsonBounded<nlohmann::json>(literal, {.max_bytes = literal.size(), .max_depth = 0}, "tool call");
        if (!v || !v->is_string()) return 0;
        *out = v->get<std::string>();
        return i + 1;
      }
    }
    return 0;
  };
  size_t p = read_string(kId.size(), id);
  static const std::string kName = ",\"name\":";
  if (p == 0 || span.compare(p, kName.size(), kName) != 0) return 0;
  p = read_string(p + kName.size(), name);
  static const std::string kArgs = ",\"arguments\":";
  if (p == 0 || span.compare(p, kArgs.size(), kArgs) != 0) return 0;
  return p + kArgs.size();
}

// What a head cut short holds: the id when its string is complete, and the
// name's text so far (JSON-escaped, without its quotes).
struct PartialHead {
  std::optional<std::string> id;
  bool name_started = false;
  bool name_complete = false;
  std::string name_text;
};

PartialHead ReadPartialHead(const std::string& span) {
  PartialHead h;
  static const std::string kId = "{\"id\":";
  if (span.compare(0, kId.size(), kId) != 0) return h;
  // The end of the string literal at `at`, or npos while it is unfinished.
  auto literal_end = [&](size_t at) -> size_t {
    if (at >= span.size() || span[at] != '"') return std::string::npos;
    for (size_t i = at + 1; i < span.size(); ++i) {
      if (span[i] == '\\') ++i;
      else if (span[i] == '"') return i + 1;
    }
    return std::string::npos;
  };
  size_t end = literal_end(kId.size());
  if (end == std::string::npos) return h;
  auto id = ParseJsonBounded<nlohmann::json>(span.substr(kId.size(), end - kId.size()),
                                             {.max_bytes = end - kId.size(), .max_depth = 0}, "tool call");
  if (id && id->is_string()) h.id = id->get<std::string>();
  static const std::string kName = ",\"name\":\"";
  if (span.compare(end, kName.size(), kName) != 0) return h;
  h.name_started = true;
  size_t name_end = literal_end(end + kName.size() - 1);
  h.name_complete = name_end != std::string::npos;
  h.name_text = span.substr(end + kName.size(), h.name_complete ? name_end - 1 - (end + kName.size()) : std::string::npos);
  return h;
}

// The one allowed name whose JSON-escaped text starts with (or, complete,
// equals) what was written; nullopt when none or several do.
std::optional<std::string> UniqueName(const std::vector<std::string>& names, const PartialHead& h) {
  std::optional<std::string> found;
  for (const auto& n : names) {
    std::string quoted = nlohmann::json(n).dump();
    std::string text = quoted.substr(1, quoted.size() - 2);
    const bool fits = h.name_complete ? text == h.name_text : text.compare(0, h.name_text.size(), h.name_text) == 0;
    if (!fits) continue;
    if (found) return std::nullopt;
    found = n;
  }
  return found;
}

}  // namespace

OutputAssembler::OutputAssembler(AssemblerOptions options)
    : answer_(std::move(options.stop)), constrained_names_(std::move(options.constrained_names)) {
  if (options.call_id_seed) id_rng_.emplace(*options.call_id_seed);
}

void OutputAssembler::AppendContent(const std::string& text, OutputDelta& out) {
  answer_.Append(text, out);
  if (answer_.stop_matched()) ended_ = true;
}

void OutputAssembler::SpanBytes(const std::string& text, OutputDelta& out) {
  span_ += text;
  const int index = static_cast<int>(calls_.size());
  if (!head_sent_) {
    std::string id, name;
    size_t off = ArgumentsOffset(span_, &id, &name);
    if (off == 0) return;
    head_sent_ = true;
    args_start_ = off;
    args_sent_ = 0;
    ToolCallDelta d;
    d.index = index;
    d.id = id;
    d.name = name;
    out.tool_calls.push_back(std::move(d));
  }
  // Stream the arguments except a trailing run of '}' and whitespace: the
  // last '}' belongs to the span, not to the arguments.
  size_t end = span_.size();
  while (end > args_start_ + args_sent_ &&
         (span_[end - 1] == '}' || span_[end - 1] == ' ' || span_[end - 1] == '\n' || span_[end - 1] == '\t' ||
          span_[end - 1] == '\r'))
    --end;
  // Leading whitespace is trimmed from the final arguments: never stream it.
  size_t from = args_start_ + args_sent_;
  if (args_sent_ == 0) {
    while (from < end && (span_[from] == ' ' || span_[from] == '\n' || span_[from] == '\t' || span_[from] == '\r')) ++from;
    args_start_ = from;
  }
  if (end > from) {
    ToolCallDelta d;
    d.index = index;
    d.arguments = span_.substr(from, end - from);
    args_sent_ = end - args_start_;
    if (!out.tool_calls.empty() && out.tool_calls.back().index == index) out.tool_calls.back().arguments += d.arguments;
    else out.tool_calls.push_back(std::move(d));
  }
}

void OutputAssembler::CloseSpan(OutputDelta& out) {
  SpanBytes(span_decoder_.Finish(), out);
  in_span_ = false;
  const int index = static_cast<int>(calls_.size());
  auto parsed = engine::ParseToolCallSpan(span_);
  AssembledToolCall call;
  if (parsed) {
    call.id = parsed->id;
    call.name = parsed->name;
    call.arguments = parsed->arguments_text;
    call.arguments_valid = parsed->arguments_is_object;
  } else {
    // Generation stopped inside the head (max_tokens): there are no
    // arguments yet. The call keeps the id it was being written with and,
    // when constrained, the one name the written part leaves; it is reported
    // (finish_reason tells why it is short) and counted as a parse error.
    std::string id, name;
    ArgumentsOffset(span_, &id, &name);
    PartialHead head = ReadPartialHead(span_);
    call.id = head.id ? *head.id : !expected_id_.empty() ? expected_id_ : engine::NewToolCallId();
    call.name = name;
    call.arguments = "";
    if (!constrained_names_.empty() && !head_sent_) {
      auto unique = UniqueName(constrained_names_, head);
      if (!unique) {
        // Several tools and no name decided yet: a call without a name is
        // of no use to a client, and nothing of it was streamed.
        span_.clear();
        args_start_ = args_sent_ = 0;
        return;
      }
      call.name = *unique;
    }
  }
  if (!call.arguments_valid) ++parse_errors_;
  const std::string streamed = head_sent_ ? span_.substr(args_start_, args_sent_) : std::string();
  if (!head_sent_) {
    ToolCallDelta d;
    d.index = index;
    d.id = call.id;
    d.name = call.name;
    d.arguments = call.arguments;
    out.tool_calls.push_back(std::move(d));
  } else if (call.arguments.compare(0, streamed.size(), streamed) == 0 && call.arguments.size() > streamed.size()) {
    ToolCallDelta d;
    d.index = index;
    d.arguments = call.arguments.substr(streamed.size());
    if (!out.tool_calls.empty() && out.tool_calls.back().index == index) out.tool_calls.back().arguments += d.arguments;
    else out.tool_calls.push_back(std::move(d));
  } else if (call.arguments.compare(0, streamed.size(), streamed) != 0) {
    // The parser re-serialised arguments we already streamed (keys out of
    // the rendered order). The streamed text is what the client has, so make
    // the final message agree with it.
    call.arguments = streamed;
  }
  calls_.push_back(std::move(call));
  span_.clear();
  head_sent_ = false;
  args_start_ = args_sent_ = 0;
}

OutputDelta OutputAssembler::OnToken(int token, bool reasoning, const ContentLogprob* logprob) {
  OutputDelta out;
  if (ended_ || token < 0) return out;
  if (tok::IsByte(token)) {
    const auto byte = static_cast<uint8_t>(token);
    if (in_span_) SpanBytes(span_decoder_.Push(byte), out);
    else if (in_think_ || reasoning) {
      std::string t = reasoning_decoder_.Push(byte);
      reasoning_ += t;
      out.reasoning += t;
    } else {
      if (logprob && !answer_.stop_matched()) answer_.AddLogprob(*logprob);
      AppendContent(content_decoder_.Push(byte), out);
    }
    return out;
  }
  // A special token ends any half character of the channel it interrupts.
  auto flush_text = [&] {
    std::string r = reasoning_decoder_.Finish();
    reasoning_ += r;
    out.reasoning += r;
    AppendContent(content_decoder_.Finish(), out);
  };
  switch (token) {
    case tok::kThink:
      flush_text();
      in_think_ = true;
      break;
    case tok::kEndThink:
      flush_text();
      in_think_ = false;
      break;
    case tok::kToolCall:
      flush_text();
      if (in_span_) CloseSpan(out);  // a span opened twice: the first ends here
      in_span_ = true;
      // The decode policy draws this call's id now, from the same seed.
      if (id_rng_) expected_id_ = engine::NewToolCallId(*id_rng_);
      break;
    case tok::kEndToolCall:
      if (in_span_) CloseSpan(out);
      break;
    case tok::kEnd:
    case tok::kEos: {
      OutputDelta rest = Finish();
      out.reasoning += rest.reasoning;
      out.content += rest.content;
      for (auto& d : rest.tool_calls) out.tool_calls.push_back(std::move(d));
      // The tokens of the text released here (held back for a stop string) go with it.
      for (auto& l : rest.logprobs) out.logprobs.push_back(std::move(l));
      ended_ = true;
      break;
    }
    default:
      break;  // other specials carry no text
  }
  return out;
}

OutputDelta OutputAssembler::Finish() {
  OutputDelta out;
  if (ended_) return out;
  std::string r = reasoning_decoder_.Finish();
  reasoning_ += r;
  out.reasoning += r;
  AppendContent(content_decoder_.Finish(), out);
  if (in_span_) CloseSpan(out);
  answer_.Flush(out);
  return out;
}

}  // namespace moeserve::chat
