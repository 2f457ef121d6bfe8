// The patch forms a kube-apiserver accepts, applied to JSON objects:
//  - JSON merge patch (RFC 7386) is nlohmann's merge_patch;
//  - strategic merge patch for the built-in kinds we write: lists of objects
//    merge by their Kubernetes patch merge key (containers by name, ports by
//    containerPort/port, conditions by type, ...), `$patch: delete|replace`,
//    `$deleteFromPrimitiveList/<field>`, finalizers merge as a set, other
//    lists are replaced, `$setElementOrder` is accepted and ignored;
//  - server-side apply field sets: the leaf paths an applied configuration
//    sets, stored as managedFields FieldsV1 ({"f:spec":{"f:replicas":{}}}).
//    Lists are atomic (owned whole), a simplification of the real map/set lists.
#pragma once

#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace moeserve::fakes {

void StrategicMergePatch(nlohmann::json& target, const nlohmann::json& patch, const std::string& field = "");

using FieldSet = std::set<std::string>;  // leaf paths joined with '\x1f'

FieldSet LeafFields(const nlohmann::json& value, const std::string& prefix = "");
FieldSet ChangedLeafFields(const nlohmann::json& before, const nlohmann::json& after);
nlohmann::json FieldSetToFieldsV1(const FieldSet& fields);
FieldSet FieldsV1ToFieldSet(const nlohmann::json& fields_v1, const std::string& prefix = "");
// Reads or removes the value at a leaf path.
const nlohmann::json* FieldAt(const nlohmann::json& value, const std::string& path);
void RemoveField(nlohmann::json& value, const std::string& path);
std::string FieldDisplay(const std::string& path);  // ".spec.replicas"

}  // namespace moeserve::fakes
