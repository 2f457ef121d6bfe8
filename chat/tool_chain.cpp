#include "moeserve/chat/tool_chain.hpp"

#include <map>
#include <set>
#include <utility>

namespace moeserve::chat {

std::optional<ToolChainViolation> FindToolChainViolation(const std::vector<engine::ChatMessage>& messages) {
  using Kind = ToolChainViolation::Kind;
  // id -> (message, call) of every call not yet answered; ordered by id.
  std::map<std::string, std::pair<size_t, size_t>> pending;
  std::set<std::string> answered;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    switch (m.role) {
      case engine::ChatRole::kAssistant:
        for (size_t j = 0; j < m.tool_calls.size(); ++j) {
          const auto& id = m.tool_calls[j].id;
          if (pending.contains(id) || answered.contains(id))
            return ToolChainViolation{Kind::kDuplicateCallId, i, j, 0, id};
          pending[id] = {i, j};
        }
        break;
      case engine::ChatRole::kTool: {
        auto it = pending.find(m.tool_call_id);
        if (it == pending.end()) {
          return ToolChainViolation{answered.contains(m.tool_call_id) ? Kind::kAnsweredTwice : Kind::kUnknownResult, i,
                                    0, 0, m.tool_call_id};
        }
        answered.insert(it->first);
        pending.erase(it);
        break;
      }
      case engine::ChatRole::kUser:
        if (!pending.empty()) {
          const auto& [id, where] = *pending.begin();
          return ToolChainViolation{Kind::kUnanswered, where.first, where.second, i, id};
        }
        break;
      case engine::ChatRole::kSystem:
        break;
    }
  }
  return std::nullopt;
}

}  // namespace moeserve::chat
