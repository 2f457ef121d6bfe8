#include "yaml_json.hpp"

#include <fstream>
#include <regex>
#include <sstream>

#include <yaml-cpp/yaml.h>

namespace moeserve::fakes {
namespace {

nlohmann::json ScalarToJson(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str") return s;  // quoted
  if (s == "null" || s == "~" || s == "Null" || s == "NULL" || s.empty()) return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  static const std::regex kInt("^[-+]?[0-9]+$");
  static const std::regex kFloat(R"(^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$)");
  if (std::regex_match(s, kInt)) {
    try {
      return std::stoll(s);
    } catch (...) {
      return s;
    }
  }
  if (std::regex_match(s, kFloat)) return std::stod(s);
  return s;
}

nlohmann::json NodeToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return ScalarToJson(node);
    case YAML::NodeType::Sequence: {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& item : node) arr.push_back(NodeToJson(item));
      return arr;
    }
    case YAML::NodeType::Map: {
      nlohmann::json obj = nlohmann::json::object();
      for (const auto& kv : node) obj[kv.first.Scalar()] = NodeToJson(kv.second);
      return obj;
    }
  }
  return nullptr;
}

}  // namespace

Result<std::vector<nlohmann::json>> YamlDocumentsToJson(const std::string& text) {
  try {
    std::vector<nlohmann::json> docs;
    for (const auto& node : YAML::LoadAll(text)) {
      if (node.IsNull()) continue;
      docs.push_back(NodeToJson(node));
    }
    return docs;
  } catch (const std::exception& e) {
    return Fail(Error::InvalidArgument(std::string("yaml: ") + e.what()));
  }
}

Result<nlohmann::json> YamlToJson(const std::string& text) {
  MOE_ASSIGN_OR_RETURN(auto docs, YamlDocumentsToJson(text));
  if (docs.empty()) return nlohmann::json(nullptr);
  return docs.front();
}

Result<std::vector<nlohmann::json>> LoadYamlFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Fail(Error::NotFound("cannot open " + path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto docs = YamlDocumentsToJson(ss.str());
  if (!docs) return Fail(docs.error().WithContext(path));
  return docs;
}

}  // namespace moeserve::fakes
