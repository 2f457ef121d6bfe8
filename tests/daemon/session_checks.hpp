// Checks on a session as GET /v1/sessions/{id} returns it, shared by the
// session tests: the entries' tool chains, and summaries against the
// originals they replace.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace moeserve::daemon::testing {

// Every tool result answers an earlier unanswered call of the entries, and
// every call is answered before the next user entry (the session's view of
// api.md invalid_tool_history). Returns "" or what is wrong.
inline std::string ToolChainProblem(const nlohmann::json& entries) {
  std::set<std::string> pending, answered;
  for (const auto& e : entries) {
    const std::string kind = e["kind"], role = e["role"];
    if (kind == "tool_call") {
      std::string id = e["tool_call"]["id"];
      if (pending.contains(id) || answered.contains(id)) return "call id " + id + " used twice";
      pending.insert(id);
    } else if (kind == "tool_result") {
      std::string id = e["tool_call_id"];
      if (!pending.erase(id)) return "result for " + id + " without its call (seq " + e["seq"].dump() + ")";
      answered.insert(id);
    } else if (kind == "text" && role == "user" && !pending.empty()) {
      return "call " + *pending.begin() + " unanswered before the user entry " + e["seq"].dump();
    }
  }
  return "";
}

// With the full view (?full=1): each active summary's `replaces` range holds
// exactly the originals it stands for (directly or through an earlier
// summary), and every replaced original lies inside an active summary's range.
inline std::string SummaryProblem(const nlohmann::json& full) {
  std::map<int64_t, nlohmann::json> by_seq;
  for (const auto& e : full) by_seq[e["seq"].get<int64_t>()] = e;
  auto final_summary = [&](int64_t seq) {
    while (by_seq[seq].contains("replaced_by")) seq = by_seq[seq]["replaced_by"].get<int64_t>();
    return seq;
  };
  for (const auto& e : full) {
    if (e["kind"] == "summary") continue;
    const int64_t seq = e["seq"];
    bool inside = false;
    for (const auto& s : full) {
      if (s["kind"] != "summary" || s.contains("replaced_by")) continue;
      const int64_t a = s["replaces"][0], b = s["replaces"][1];
      if (seq < a || seq > b) continue;
      inside = true;
      if (!e.contains("replaced_by")) return "seq " + std::to_string(seq) + " lies in a summary's range but is active";
      if (final_summary(seq) != s["seq"].get<int64_t>())
        return "seq " + std::to_string(seq) + " is replaced by another summary";
    }
    if (e.contains("replaced_by") && !inside)
      return "seq " + std::to_string(seq) + " is replaced but in no summary's range";
  }
  return "";
}

}  // namespace moeserve::daemon::testing
