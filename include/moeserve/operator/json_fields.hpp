// Reading fields of Kubernetes objects held as JSON, by reference and
// without throwing: a missing field, or one of another type, reads as null
// or "". Objects come from the API server and from tenants, so nothing
// here trusts their shape.
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace moeserve::op::fields {

// Lookups by reference: callers read many objects many times, and copying
// each one's metadata per question dominated the quota review's time.
inline const nlohmann::json& Field(const nlohmann::json& o, const char* key) {
  static const nlohmann::json kNull;
  if (!o.is_object()) return kNull;
  auto it = o.find(key);
  return it == o.end() ? kNull : *it;
}
inline std::string Str(const nlohmann::json& o, const char* key) {
  const nlohmann::json& v = Field(o, key);
  return v.is_string() ? v.get<std::string>() : "";
}
inline std::string NameOf(const nlohmann::json& o) { return Str(Field(o, "metadata"), "name"); }
inline std::string NamespaceOf(const nlohmann::json& o) { return Str(Field(o, "metadata"), "namespace"); }

}  // namespace moeserve::op::fields
