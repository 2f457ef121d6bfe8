// YAML documents to JSON values, with YAML 1.2 core-schema scalars: plain
// true/false/null/numbers become JSON booleans/null/numbers, quoted scalars
// stay strings (so `revision: "2026-11-01"` and `status: "True"` survive).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::fakes {

Result<std::vector<nlohmann::json>> YamlDocumentsToJson(const std::string& text);
Result<nlohmann::json> YamlToJson(const std::string& text);  // the first document
Result<std::vector<nlohmann::json>> LoadYamlFile(const std::string& path);

}  // namespace moeserve::fakes
