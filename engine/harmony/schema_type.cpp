// JSON schema -> harmony's TypeScript-like parameter types. The layout (where
// comments go, `?` for optional properties, enum unions, oneOf variants on
// their own lines, how defaults are quoted, "integer" as number) follows the
// harmony library's renderer, because gpt-oss was trained on exactly that
// text; a schema feature it does not know (anyOf, $ref, "null") becomes `any`
// as there.
#include <string>
#include <unordered_set>

#include "moeserve/engine/harmony.hpp"

namespace moeserve::engine {
namespace {

using nlohmann::ordered_json;

bool IsEnum(const ordered_json& schema) {
  auto it = schema.find("enum");
  return it != schema.end() && it->is_array() && !it->empty();
}

bool IsNullable(const ordered_json& schema) {
  auto it = schema.find("nullable");
  return it != schema.end() && it->is_boolean() && it->get<bool>();
}

const std::string* StringField(const ordered_json& schema, const char* key) {
  if (!schema.is_object()) return nullptr;
  auto it = schema.find(key);
  return it != schema.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
}

// A default as harmony comments it: a string in quotes, except for an enum,
// whose members are already quoted in the type; anything else as compact JSON.
std::string DefaultText(const ordered_json& schema, const ordered_json& value) {
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    return IsEnum(schema) ? s : "\"" + s + "\"";
  }
  return value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::string WithNull(const ordered_json& schema, std::string type) {
  if (IsNullable(schema) && type.find("null") == std::string::npos) type += " | null";
  return type;
}

// The trailing `// description default: x` of one oneOf variant.
std::string VariantComment(const ordered_json& variant, bool skip_description) {
  std::string comment;
  if (const std::string* desc = skip_description ? nullptr : StringField(variant, "description")) comment = *desc;
  if (variant.is_object() && variant.contains("default")) {
    if (!comment.empty()) comment += ' ';
    comment += "default: " + DefaultText(variant, variant["default"]);
  }
  return comment.empty() ? "" : " // " + comment;
}

Result<std::string> TypeOf(const ordered_json& schema, const std::string& indent, int depth);

Result<std::string> Variants(const ordered_json& variants, const std::string& indent, int depth,
                             bool skip_first_description) {
  std::string out;
  for (size_t i = 0; i < variants.size(); ++i) {
    const auto& variant = variants[i];
    MOE_ASSIGN_OR_RETURN(std::string type, TypeOf(variant, indent + "   ", depth + 1));
    out += indent + " | " + WithNull(variant, std::move(type)) +
           VariantComment(variant, i == 0 && skip_first_description) + "\n";
  }
  return out;
}

Result<std::string> ObjectType(const ordered_json& schema, const std::string& indent, int depth) {
  std::string out;
  if (const std::string* desc = StringField(schema, "description")) out += indent + "// " + *desc + "\n";
  out += "{\n";
  auto props = schema.find("properties");
  if (props != schema.end() && props->is_object()) {
    std::unordered_set<std::string> required;
    if (auto req = schema.find("required"); req != schema.end() && req->is_array()) {
      for (const auto& r : *req) {
        if (r.is_string()) required.insert(r.get<std::string>());
      }
    }
    for (const auto& [key, val] : props->items()) {
      const char* optional = required.contains(key) ? "" : "?";
      if (const std::string* title = StringField(val, "title")) out += indent + "// " + *title + "\n" + indent + "//\n";
      const bool has_one_of = val.is_object() && val.contains("oneOf") && val["oneOf"].is_array();
      const std::string* desc = StringField(val, "description");
      if (!has_one_of && desc) out += indent + "// " + *desc + "\n";
      if (val.is_object()) {
        if (auto ex = val.find("examples"); ex != val.end() && ex->is_array() && !ex->empty()) {
          out += indent + "// Examples:\n";
          for (const auto& e : *ex) {
            if (e.is_string()) out += indent + "// - \"" + e.get<std::string>() + "\"\n";
          }
        }
      }
      if (has_one_of) {
        const auto& variants = val["oneOf"];
        // The property's description goes above it unless the first variant says the same.
        const std::string* first_desc = variants.empty() ? nullptr : StringField(variants[0], "description");
        const bool desc_above = desc && !(first_desc && *first_desc == *desc);
        if (desc_above) out += indent + "// " + *desc + "\n";
        if (val.contains("default")) out += indent + "// default: " + DefaultText(val, val["default"]) + "\n";
        out += indent + key + optional + ":\n";
        MOE_ASSIGN_OR_RETURN(std::string lines, Variants(variants, indent, depth, desc_above));
        out += lines + indent + ",\n";
        continue;
      }
      MOE_ASSIGN_OR_RETURN(std::string type, TypeOf(val, indent + "    ", depth + 1));
      out += indent + key + optional + ": " + WithNull(val, std::move(type)) + ",";
      if (val.is_object() && val.contains("default")) out += " // default: " + DefaultText(val, val["default"]);
      out += "\n";
    }
  }
  out += indent + "}";
  return out;
}

Result<std::string> TypeOf(const ordered_json& schema, const std::string& indent, int depth) {
  if (depth > kChatJsonMaxDepth) {
    return Fail(Error::InvalidArgument("schema nests more than " + std::to_string(kChatJsonMaxDepth) + " levels deep"));
  }
  if (!schema.is_object()) return std::string("any");
  if (auto one_of = schema.find("oneOf"); one_of != schema.end() && one_of->is_array()) {
    MOE_ASSIGN_OR_RETURN(std::string lines, Variants(*one_of, indent, depth, false));
    if (!lines.empty()) lines.pop_back();  // harmony puts no newline after the last variant here
    return "\n" + lines;
  }
  auto type = schema.find("type");
  if (type == schema.end()) return std::string("any");
  if (type->is_array()) {
    std::string out;
    for (const auto& t : *type) {
      if (!t.is_string()) continue;
      if (!out.empty()) out += " | ";
      out += t.get<std::string>() == "integer" ? "number" : t.get<std::string>();
    }
    return out.empty() ? std::string("any") : out;
  }
  if (!type->is_string()) return std::string("any");
  const auto& name = type->get_ref<const std::string&>();
  if (name == "object") return ObjectType(schema, indent, depth);
  if (name == "string") {
    std::string out;
    if (IsEnum(schema)) {
      for (const auto& v : schema["enum"]) {
        if (!v.is_string()) continue;
        if (!out.empty()) out += " | ";
        out += "\"" + v.get<std::string>() + "\"";
      }
    }
    return out.empty() ? std::string("string") : out;
  }
  if (name == "number" || name == "integer") return std::string("number");
  if (name == "boolean") return std::string("boolean");
  if (name == "array") {
    auto items = schema.find("items");
    if (items == schema.end()) return std::string("Array<any>");
    MOE_ASSIGN_OR_RETURN(std::string item, TypeOf(*items, indent, depth + 1));
    return item + "[]";
  }
  return std::string("any");
}

}  // namespace

Result<std::string> HarmonySchemaType(const nlohmann::ordered_json& schema, const std::string& indent) {
  return TypeOf(schema, indent, 0);
}

Result<std::string> HarmonyFunctionsSection(const nlohmann::ordered_json& tools) {
  if (!tools.is_array()) return Fail(Error::InvalidArgument("tools: must be an array").WithField("tools"));
  std::string out = "# Tools\n\n## functions\n\nnamespace functions {\n\n";
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const auto& tool = tools[i];
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) {
      return Fail(Error::InvalidArgument(where + ": expected {\"type\":\"function\",\"function\":{...}}").WithField(where));
    }
    const auto& fn = tool["function"];
    const std::string* name = StringField(fn, "name");
    if (!name || name->empty()) return Fail(Error::InvalidArgument(where + ".function.name: required").WithField(where));
    if (const std::string* desc = StringField(fn, "description")) {
      // One comment line per line of the description, as harmony writes it.
      size_t pos = 0;
      while (pos < desc->size()) {
        size_t nl = desc->find('\n', pos);
        if (nl == std::string::npos) nl = desc->size();
        out += "// " + desc->substr(pos, nl - pos) + "\n";
        pos = nl + 1;
      }
    }
    auto params = fn.find("parameters");
    if (params != fn.end() && !params->is_null()) {
      auto type = HarmonySchemaType(*params);
      if (!type) return Fail(Error::InvalidArgument(where + ".function.parameters: " + type.error().message()).WithField(where));
      out += "type " + *name + " = (_: " + *type + ") => any;\n\n";
    } else {
      out += "type " + *name + " = () => any;\n\n";
    }
  }
  out += "} // namespace functions";
  return out;
}

}  // namespace moeserve::engine
