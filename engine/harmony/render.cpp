// Conversation -> harmony prompt ids (include/moeserve/engine/harmony.hpp).
// Each run of text between two control tokens is encoded as one piece, which
// is how the harmony library's renderings tokenize.
#include <map>
#include <string>

#include "moeserve/engine/harmony.hpp"

namespace moeserve::engine {
namespace {

using nlohmann::ordered_json;

std::string MessageRef(size_t i) { return "messages[" + std::to_string(i) + "]"; }

const char* EffortName(HarmonyEffort effort) {
  switch (effort) {
    case HarmonyEffort::kLow: return "low";
    case HarmonyEffort::kHigh: return "high";
    case HarmonyEffort::kMedium: break;
  }
  return "medium";
}

class PromptWriter {
 public:
  PromptWriter(const HfTokenizer& tokenizer, const HarmonyTokens& tokens) : tokenizer_(tokenizer), t_(tokens) {}

  void Control(int id) { ids_.push_back(id); }
  Status Text(std::string_view text) {
    if (text.empty()) return Ok();
    MOE_ASSIGN_OR_RETURN(std::vector<int> ids, tokenizer_.Encode(text, AddedTokenText::kSpecialAsText));
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    return Ok();
  }
  // <|start|>{author}<|channel|>{channel}<|message|>{body}<|end|>
  Status Message(std::string_view author, std::string_view channel, std::string_view body) {
    Control(t_.start);
    MOE_TRY(Text(author));
    if (!channel.empty()) {
      Control(t_.channel);
      MOE_TRY(Text(channel));
    }
    Control(t_.message);
    MOE_TRY(Text(body));
    Control(t_.end);
    return Ok();
  }
  Status ToolCall(std::string_view name, std::string_view arguments) {
    Control(t_.start);
    MOE_TRY(Text("assistant"));
    Control(t_.channel);
    MOE_TRY(Text("commentary to=functions." + std::string(name) + " "));
    Control(t_.constrain);
    MOE_TRY(Text("json"));
    Control(t_.message);
    MOE_TRY(Text(arguments));
    Control(t_.call);
    return Ok();
  }
  std::vector<int> Take() { return std::move(ids_); }

 private:
  const HfTokenizer& tokenizer_;
  const HarmonyTokens& t_;
  std::vector<int> ids_;
};

std::string SystemText(const HarmonySystemOptions& system, bool has_tools) {
  std::string top = system.model_identity;
  auto line = [&](const std::string& s) {
    if (!top.empty()) top += "\n";
    top += s;
  };
  if (!system.knowledge_cutoff.empty()) line("Knowledge cutoff: " + system.knowledge_cutoff);
  if (!system.current_date.empty()) line("Current date: " + system.current_date);
  std::string out = top.empty() ? "" : top + "\n\n";
  out += std::string("Reasoning: ") + EffortName(system.effort) + "\n\n";
  out += "# Valid channels: analysis, commentary, final. Channel must be included for every message.";
  if (has_tools) out += "\nCalls to these tools must go to the commentary channel: 'functions'.";
  return out;
}

// An assistant message ends its turn with a final answer when it calls no tool.
bool IsFinalAnswer(const ChatMessage& m) { return m.role == ChatRole::kAssistant && m.tool_calls.empty(); }

}  // namespace

Result<HarmonyTokens> HarmonyTokens::From(const HfTokenizer& tokenizer) {
  HarmonyTokens t;
  const std::pair<const char*, int*> wanted[] = {
      {"<|start|>", &t.start},         {"<|end|>", &t.end},       {"<|message|>", &t.message},
      {"<|channel|>", &t.channel},     {"<|constrain|>", &t.constrain},
      {"<|return|>", &t.return_},      {"<|call|>", &t.call},
  };
  for (const auto& [text, slot] : wanted) {
    auto id = tokenizer.TokenId(text);
    if (!id) return Fail(Error::InvalidArgument(std::string("tokenizer has no ") + text + " token: not a harmony tokenizer"));
    *slot = *id;
  }
  return t;
}

std::vector<int> HarmonyStopTokens(const HarmonyTokens& tokens) { return {tokens.return_, tokens.call}; }

Result<std::vector<int>> RenderHarmonyChat(const HfTokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                           const ordered_json* tools, const HarmonySystemOptions& system,
                                           bool add_generation_prompt) {
  MOE_ASSIGN_OR_RETURN(HarmonyTokens t, HarmonyTokens::From(tokenizer));
  const bool has_tools = tools && !tools->is_null() && !(tools->is_array() && tools->empty());
  if (tools && !tools->is_null() && !tools->is_array()) {
    return Fail(Error::InvalidArgument("tools: must be an array").WithField("tools"));
  }

  std::string instructions;
  size_t last_final = messages.size();  // none
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != ChatRole::kAssistant && (m.reasoning || !m.tool_calls.empty())) {
      return Fail(Error::InvalidArgument(MessageRef(i) + ": only assistant messages carry reasoning and tool_calls")
                      .WithField(MessageRef(i)));
    }
    if (m.role == ChatRole::kSystem) {
      if (!instructions.empty()) instructions += "\n";
      instructions += m.content;
    }
    if (IsFinalAnswer(m)) last_final = i;
  }

  PromptWriter w(tokenizer, t);
  MOE_TRY(w.Message("system", "", SystemText(system, has_tools)));
  std::string developer;
  if (!instructions.empty()) developer = "# Instructions\n\n" + instructions;
  if (has_tools) {
    MOE_ASSIGN_OR_RETURN(std::string section, HarmonyFunctionsSection(*tools));
    developer += (developer.empty() ? "" : "\n\n") + section;
  }
  if (system.response_format) {
    const HarmonyResponseFormat& f = *system.response_format;
    std::string section = "# Response Formats\n\n## " + f.name + "\n\n";
    // Every line of the description is a comment line.
    if (!f.description.empty()) {
      std::string comment = "// ";
      for (char c : f.description) comment += c == '\n' ? std::string("\n// ") : std::string(1, c);
      section += comment + "\n";
    }
    section += f.schema.dump();
    developer += (developer.empty() ? "" : "\n\n") + section;
  }
  if (!developer.empty()) MOE_TRY(w.Message("developer", "", developer));

  std::map<std::string, std::string, std::less<>> call_names;  // tool_call_id -> function name
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    switch (m.role) {
      case ChatRole::kSystem:
        break;  // rendered in the developer message
      case ChatRole::kUser:
        MOE_TRY(w.Message("user", "", m.content));
        break;
      case ChatRole::kAssistant: {
        // Harmony's rule: reasoning up to the last final answer is dropped;
        // after it (a tool loop under way) it is what the model continues from.
        const bool keep_reasoning = last_final == messages.size() || i > last_final;
        if (keep_reasoning && m.reasoning && !m.reasoning->empty()) {
          MOE_TRY(w.Message("assistant", "analysis", *m.reasoning));
        }
        if (!m.tool_calls.empty()) {
          if (!m.content.empty()) MOE_TRY(w.Message("assistant", "commentary", m.content));
          for (const ChatToolCall& call : m.tool_calls) {
            if (call.name.empty()) {
              return Fail(Error::InvalidArgument(MessageRef(i) + ": a tool call without a name").WithField(MessageRef(i)));
            }
            std::string args;
            try {
              args = call.arguments.dump(-1, ' ', false, ordered_json::error_handler_t::strict);
            } catch (const std::exception& e) {
              return Fail(Error::InvalidArgument(MessageRef(i) + ": arguments cannot be written as JSON (" + e.what() +
                                                 ")").WithField(MessageRef(i)));
            }
            MOE_TRY(w.ToolCall(call.name, args));
            call_names[call.id] = call.name;
          }
        } else {
          MOE_TRY(w.Message("assistant", "final", m.content));
        }
        break;
      }
      case ChatRole::kTool: {
        auto it = call_names.find(m.tool_call_id);
        if (it == call_names.end()) {
          return Fail(Error::InvalidArgument(MessageRef(i) + ": tool_call_id '" + m.tool_call_id +
                                             "' answers no earlier tool call").WithField(MessageRef(i)));
        }
        MOE_TRY(w.Message("functions." + it->second + " to=assistant", "commentary", m.content));
        break;
      }
    }
  }
  if (add_generation_prompt) {
    w.Control(t.start);
    MOE_TRY(w.Text("assistant"));
  }
  return w.Take();
}

}  // namespace moeserve::engine
