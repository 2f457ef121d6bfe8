#include "patches.hpp"

#include <map>
#include <sstream>
#include <vector>

namespace moeserve::fakes {
namespace {

using nlohmann::json;

constexpr char kSep = '\x1f';

// The patchMergeKey of the list fields in the built-in kinds we write.
std::string MergeKeyFor(const std::string& field, const json& sample) {
  static const std::map<std::string, std::string> kKeys = {
      {"containers", "name"},   {"initContainers", "name"}, {"env", "name"},
      {"volumes", "name"},      {"volumeMounts", "mountPath"}, {"conditions", "type"},
      {"ownerReferences", "uid"}, {"imagePullSecrets", "name"}, {"envFrom", ""},
      {"volumeClaimTemplates", ""}};
  if (field == "ports") return sample.contains("containerPort") ? "containerPort" : "port";
  auto it = kKeys.find(field);
  return it == kKeys.end() ? "" : it->second;
}

void StripDirectives(json& v) {
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end();) {
      if (!it.key().empty() && it.key()[0] == '$')
        it = v.erase(it);
      else {
        StripDirectives(it.value());
        ++it;
      }
    }
  } else if (v.is_array()) {
    for (auto& item : v) StripDirectives(item);
  }
}

std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : path) {
    if (c == kSep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!path.empty()) parts.push_back(cur);
  return parts;
}

}  // namespace

void StrategicMergePatch(json& target, const json& patch, const std::string& field) {
  if (!patch.is_object()) {
    target = patch;
    return;
  }
  if (patch.value("$patch", "") == "replace") {
    target = patch;
    StripDirectives(target);
    return;
  }
  if (!target.is_object()) target = json::object();
  for (const auto& [key, value] : patch.items()) {
    if (key.rfind("$deleteFromPrimitiveList/", 0) == 0) {
      std::string list = key.substr(std::string("$deleteFromPrimitiveList/").size());
      if (target.contains(list) && target[list].is_array()) {
        json kept = json::array();
        for (const auto& item : target[list]) {
          bool drop = false;
          for (const auto& d : value) drop = drop || d == item;
          if (!drop) kept.push_back(item);
        }
        target[list] = kept;
      }
      continue;
    }
    if (!key.empty() && key[0] == '$') continue;  // $setElementOrder, $retainKeys
    if (value.is_null()) {
      target.erase(key);
    } else if (value.is_object()) {
      if (value.value("$patch", "") == "delete") {
        target.erase(key);
      } else {
        StrategicMergePatch(target[key], value, key);
      }
    } else if (value.is_array()) {
      std::string merge_key = value.empty() ? "" : MergeKeyFor(key, value[0]);
      bool primitive_set = key == "finalizers";
      if (primitive_set && target.contains(key) && target[key].is_array()) {
        for (const auto& item : value) {
          bool present = false;
          for (const auto& t : target[key]) present = present || t == item;
          if (!present) target[key].push_back(item);
        }
      } else if (!merge_key.empty() && value[0].is_object() && target.contains(key) && target[key].is_array()) {
        json& list = target[key];
        for (const auto& item : value) {
          if (!item.contains(merge_key)) continue;
          auto match = std::find_if(list.begin(), list.end(), [&](const json& t) {
            return t.is_object() && t.contains(merge_key) && t[merge_key] == item[merge_key];
          });
          if (item.value("$patch", "") == "delete") {
            if (match != list.end()) list.erase(match);
          } else if (match != list.end()) {
            StrategicMergePatch(*match, item, key);
          } else {
            json added = item;
            StripDirectives(added);
            list.push_back(added);
          }
        }
      } else {
        json replaced = value;
        StripDirectives(replaced);
        target[key] = replaced;
      }
    } else {
      target[key] = value;
    }
  }
}

FieldSet LeafFields(const json& value, const std::string& prefix) {
  FieldSet out;
  if (value.is_object() && !value.empty()) {
    for (const auto& [key, item] : value.items()) {
      auto sub = LeafFields(item, prefix.empty() ? key : prefix + kSep + key);
      out.insert(sub.begin(), sub.end());
    }
  } else if (!prefix.empty()) {
    out.insert(prefix);
  }
  return out;
}

FieldSet ChangedLeafFields(const json& before, const json& after) {
  FieldSet out;
  for (const auto& path : LeafFields(after)) {
    const json* old = FieldAt(before, path);
    const json* now = FieldAt(after, path);
    if (!old || !now || *old != *now) out.insert(path);
  }
  return out;
}

json FieldSetToFieldsV1(const FieldSet& fields) {
  json root = json::object();
  for (const auto& path : fields) {
    json* node = &root;
    for (const auto& part : Split(path)) node = &(*node)["f:" + part];
    if (node->is_null()) *node = json::object();
  }
  return root;
}

FieldSet FieldsV1ToFieldSet(const json& fields_v1, const std::string& prefix) {
  FieldSet out;
  if (!fields_v1.is_object()) return out;
  if (fields_v1.empty() && !prefix.empty()) out.insert(prefix);
  for (const auto& [key, sub] : fields_v1.items()) {
    if (key.rfind("f:", 0) != 0) continue;
    std::string name = key.substr(2);
    auto more = FieldsV1ToFieldSet(sub, prefix.empty() ? name : prefix + kSep + name);
    out.insert(more.begin(), more.end());
  }
  return out;
}

const json* FieldAt(const json& value, const std::string& path) {
  const json* node = &value;
  for (const auto& part : Split(path)) {
    if (!node->is_object() || !node->contains(part)) return nullptr;
    node = &(*node)[part];
  }
  return node;
}

void RemoveField(json& value, const std::string& path) {
  auto parts = Split(path);
  if (parts.empty()) return;
  json* node = &value;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object() || !node->contains(parts[i])) return;
    node = &(*node)[parts[i]];
  }
  if (node->is_object()) node->erase(parts.back());
}

std::string FieldDisplay(const std::string& path) {
  std::string out;
  for (const auto& part : Split(path)) out += "." + part;
  return out;
}

}  // namespace moeserve::fakes
