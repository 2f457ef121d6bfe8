// moectl's output formats, as kubectl prints: `table` (upper-case headers,
// columns padded by three spaces; NAMESPACE first only across namespaces),
// `json` and `yaml` (a {kind, items} list with camelCase fields). Table
// cells come from daemons and the cluster, so they pass through Printable.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/moectl/usage_data.hpp"

namespace moeserve::moectl {

enum class OutputFormat { kTable, kJson, kYaml };

nlohmann::json UsageListJson(const std::vector<UsageEntry>& rows);
nlohmann::json AlertListJson(const std::vector<AlertEntry>& rows);
nlohmann::json BudgetListJson(const std::vector<BudgetEntry>& rows);

std::string UsageTable(const std::vector<UsageEntry>& rows, bool with_namespace);
std::string AlertTable(const std::vector<AlertEntry>& rows, bool with_namespace);
std::string BudgetTable(const std::vector<BudgetEntry>& rows, bool with_namespace);

// JSON as YAML (block style; strings that would read back as another type are quoted).
std::string ToYaml(const nlohmann::json& value);
// Text for a terminal: control bytes (ESC, newlines, DEL) as \xNN, so a
// tenant name or a peer's message cannot move the cursor or forge lines.
std::string Printable(const std::string& text);
// Dollars as the tables print them: six decimals.
std::string FormatUsd(double usd);

}  // namespace moeserve::moectl
