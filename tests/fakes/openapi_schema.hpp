// Structural OpenAPI v3 schemas as a kube-apiserver applies them to custom
// resources: defaulting, pruning of unknown fields (or rejecting them under
// fieldValidation=Strict), then validation with the apiserver's messages
// ("spec.replicas: Invalid value: -1: spec.replicas in body should be greater
// than or equal to 0"), so kubectl prints what a real cluster would.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::fakes {

struct FieldError {
  std::string field;   // "spec.replicas"
  std::string reason;  // FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, FieldValueTypeInvalid, FieldValueTooMany
  std::string detail;  // "Invalid value: -1: spec.replicas in body should be ..."
};

// Fills in `default`s top-down (defaults inside a defaulted value included).
void ApplyDefaults(const nlohmann::json& schema, nlohmann::json& value);

// Removes fields the schema does not declare; returns their paths.
std::vector<std::string> PruneUnknownFields(const nlohmann::json& schema, nlohmann::json& value,
                                            const std::string& path, bool is_root);

std::vector<FieldError> ValidateAgainstSchema(const nlohmann::json& schema, const nlohmann::json& value,
                                              const std::string& path);

}  // namespace moeserve::fakes
