#include "openapi_schema.hpp"

#include <cmath>
#include <regex>

namespace moeserve::fakes {
namespace {

using nlohmann::json;

std::string Join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// How the apiserver renders a value inside "Invalid value: X".
std::string Render(const json& v) {
  if (v.is_string()) return json(v.get<std::string>()).dump();
  if (v.is_object()) return "\"object\"";
  if (v.is_array()) return "\"array\"";
  return v.dump();
}

std::string TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

bool TypeMatches(const std::string& type, const json& v) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "integer") {
    if (v.is_number_integer() || v.is_number_unsigned()) return true;
    return v.is_number_float() && std::floor(v.get<double>()) == v.get<double>();
  }
  if (type == "number") return v.is_number();
  return true;
}

std::string NumberText(const json& v) {
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::floor(d) == d) return std::to_string(static_cast<long long>(d));
  }
  return v.dump();
}

}  // namespace

void ApplyDefaults(const json& schema, json& value) {
  if (!schema.is_object()) return;
  if (value.is_object() && schema.contains("properties")) {
    for (const auto& [key, prop] : schema["properties"].items()) {
      if (!value.contains(key) && prop.contains("default")) value[key] = prop["default"];
      if (value.contains(key)) ApplyDefaults(prop, value[key]);
    }
  }
  if (value.is_object() && schema.contains("additionalProperties") && schema["additionalProperties"].is_object()) {
    for (auto& [key, item] : value.items()) ApplyDefaults(schema["additionalProperties"], item);
  }
  if (value.is_array() && schema.contains("items")) {
    for (auto& item : value) ApplyDefaults(schema["items"], item);
  }
}

std::vector<std::string> PruneUnknownFields(const json& schema, json& value, const std::string& path,
                                            bool is_root) {
  std::vector<std::string> pruned;
  if (!schema.is_object()) return pruned;
  if (schema.value("x-kubernetes-preserve-unknown-fields", false) && !schema.contains("properties")) return pruned;
  if (value.is_object()) {
    if (schema.contains("properties")) {
      std::vector<std::string> unknown;
      for (auto& [key, item] : value.items()) {
        if (is_root && (key == "apiVersion" || key == "kind" || key == "metadata")) continue;
        if (schema["properties"].contains(key)) {
          auto sub = PruneUnknownFields(schema["properties"][key], item, Join(path, key), false);
          pruned.insert(pruned.end(), sub.begin(), sub.end());
        } else if (!schema.value("x-kubernetes-preserve-unknown-fields", false)) {
          unknown.push_back(key);
        }
      }
      for (const auto& key : unknown) {
        value.erase(key);
        pruned.push_back(Join(path, key));
      }
    } else if (schema.contains("additionalProperties") && schema["additionalProperties"].is_object()) {
      for (auto& [key, item] : value.items()) {
        auto sub = PruneUnknownFields(schema["additionalProperties"], item, Join(path, key), false);
        pruned.insert(pruned.end(), sub.begin(), sub.end());
      }
    }
  } else if (value.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < value.size(); ++i) {
      auto sub = PruneUnknownFields(schema["items"], value[i], path + "[" + std::to_string(i) + "]", false);
      pruned.insert(pruned.end(), sub.begin(), sub.end());
    }
  }
  return pruned;
}

std::vector<FieldError> ValidateAgainstSchema(const json& schema, const json& value, const std::string& path) {
  std::vector<FieldError> errors;
  if (!schema.is_object()) return errors;
  auto invalid = [&](const std::string& what) {
    errors.push_back({path, "FieldValueInvalid", "Invalid value: " + Render(value) + ": " + path + " in body " + what});
  };
  if (value.is_null()) {
    if (!schema.value("nullable", false) && schema.contains("type"))
      errors.push_back({path, "FieldValueTypeInvalid",
                        "Invalid value: \"null\": " + path + " in body must be of type " +
                            schema["type"].get<std::string>() + ": \"null\""});
    return errors;
  }
  if (schema.value("x-kubernetes-int-or-string", false)) {
    if (!value.is_string() && !TypeMatches("integer", value))
      errors.push_back({path, "FieldValueTypeInvalid",
                        "Invalid value: " + Render(value) + ": " + path + " in body must be of type integer,string: " +
                            Render(value)});
    return errors;
  }
  if (schema.contains("type")) {
    std::string type = schema["type"];
    if (!TypeMatches(type, value)) {
      errors.push_back({path, "FieldValueTypeInvalid",
                        "Invalid value: \"" + TypeName(value) + "\": " + path + " in body must be of type " + type +
                            ": \"" + TypeName(value) + "\""});
      return errors;
    }
  }
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& e : schema["enum"]) found = found || e == value;
    if (!found) {
      std::string supported;
      for (const auto& e : schema["enum"]) supported += (supported.empty() ? "" : ", ") + e.dump();
      errors.push_back({path, "FieldValueNotSupported",
                        "Unsupported value: " + value.dump() + ": supported values: " + supported});
    }
  }
  if (value.is_number()) {
    double v = value.get<double>();
    if (schema.contains("minimum")) {
      double m = schema["minimum"].get<double>();
      bool exclusive = schema.value("exclusiveMinimum", false);
      if (exclusive ? v <= m : v < m)
        invalid(std::string("should be greater than ") + (exclusive ? "" : "or equal to ") + NumberText(schema["minimum"]));
    }
    if (schema.contains("maximum")) {
      double m = schema["maximum"].get<double>();
      bool exclusive = schema.value("exclusiveMaximum", false);
      if (exclusive ? v >= m : v > m)
        invalid(std::string("should be less than ") + (exclusive ? "" : "or equal to ") + NumberText(schema["maximum"]));
    }
  }
  if (value.is_string()) {
    const std::string s = value.get<std::string>();
    if (schema.contains("minLength") && s.size() < schema["minLength"].get<size_t>())
      invalid("should be at least " + std::to_string(schema["minLength"].get<size_t>()) + " chars long");
    if (schema.contains("maxLength") && s.size() > schema["maxLength"].get<size_t>())
      errors.push_back({path, "FieldValueTooLong",
                        "Too long: may not be more than " + std::to_string(schema["maxLength"].get<size_t>()) +
                            " bytes"});
    if (schema.contains("pattern")) {
      const std::string pattern = schema["pattern"];
      try {
        if (!std::regex_search(s, std::regex(pattern, std::regex::ECMAScript)))
          invalid("should match '" + pattern + "'");
      } catch (const std::regex_error&) {
        // A pattern std::regex cannot compile is not checked; Go's RE2 may accept it.
      }
    }
  }
  if (value.is_object()) {
    if (schema.contains("required")) {
      for (const auto& r : schema["required"]) {
        if (!value.contains(r.get<std::string>()))
          errors.push_back({Join(path, r.get<std::string>()), "FieldValueRequired", "Required value"});
      }
    }
    if (schema.contains("maxProperties") && value.size() > schema["maxProperties"].get<size_t>())
      errors.push_back({path, "FieldValueTooMany",
                        "Too many: " + std::to_string(value.size()) + ": must have at most " +
                            std::to_string(schema["maxProperties"].get<size_t>()) + " items"});
    if (schema.contains("minProperties") && value.size() < schema["minProperties"].get<size_t>())
      errors.push_back({path, "FieldValueInvalid",
                        "Invalid value: " + std::to_string(value.size()) + ": must have at least " +
                            std::to_string(schema["minProperties"].get<size_t>()) + " items"});
    for (const auto& [key, item] : value.items()) {
      const json* sub = nullptr;
      if (schema.contains("properties") && schema["properties"].contains(key))
        sub = &schema["properties"][key];
      else if (schema.contains("additionalProperties") && schema["additionalProperties"].is_object())
        sub = &schema["additionalProperties"];
      if (sub) {
        auto more = ValidateAgainstSchema(*sub, item, Join(path, key));
        errors.insert(errors.end(), more.begin(), more.end());
      }
    }
  }
  if (value.is_array()) {
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>())
      invalid("should have at least " + std::to_string(schema["minItems"].get<size_t>()) + " items");
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>())
      errors.push_back({path, "FieldValueTooMany",
                        "Too many: " + std::to_string(value.size()) + ": must have at most " +
                            std::to_string(schema["maxItems"].get<size_t>()) + " items"});
    if (schema.contains("items")) {
      for (size_t i = 0; i < value.size(); ++i) {
        auto more = ValidateAgainstSchema(schema["items"], value[i], path + "[" + std::to_string(i) + "]");
        errors.insert(errors.end(), more.begin(), more.end());
      }
    }
  }
  return errors;
}

}  // namespace moeserve::fakes
