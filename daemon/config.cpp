#include "moeserve/daemon/config.hpp"

#include <charconv>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/common/yaml_limits.hpp"
#include "moeserve/common/yaml_scalar.hpp"
#include "moeserve/daemon/config_settings.hpp"

namespace moeserve::daemon {
namespace {

// Every setting is a string value applied by key, so the YAML file and the
// flags share one set of parsers and messages: the checks come from the
// setting's row (config_settings.cpp).
Status ApplySetting(DaemonConfig& c, const std::string& key, const std::string& value, const std::string& where) {
  const SettingSpec* spec = FindDaemonSetting(key);
  if (!spec) {
    return Fail(Error::InvalidArgument(where + ": unknown setting '" + key + "'; see `moe-daemon serve --help`"));
  }
  return ApplySettingValue(c, *spec, value, where);
}

Status CheckBudgets(const DaemonConfig& c, const std::string& where) {
  if (c.thinking_budgets && !(c.thinking_budgets->low <= c.thinking_budgets->medium &&
                              c.thinking_budgets->medium <= c.thinking_budgets->high)) {
    return Fail(Error::InvalidArgument(where + ": thinking_budgets: must satisfy low <= medium <= high"));
  }
  return Ok();
}

// A YAML value as the text ApplySetting parses (the text a flag would give),
// once it is known to be of the setting's kind: a null, blank, map, list or
// scalar of another kind is refused here with the key's path (flags are text
// and skip this).
Result<std::string> SettingText(const YAML::Node& node, const std::string& path, SettingKind kind) {
  switch (kind) {
    case SettingKind::kText:
      return yaml::Text(node, path);
    case SettingKind::kInteger: {
      MOE_ASSIGN_OR_RETURN(int64_t v, yaml::Integer(node, path));
      return std::to_string(v);
    }
    case SettingKind::kNumber:
      MOE_TRY(yaml::Number(node, path));
      return node.Scalar();
    case SettingKind::kBoolean: {
      MOE_ASSIGN_OR_RETURN(bool v, yaml::Boolean(node, path));
      return std::string(v ? "true" : "false");
    }
  }
  return Fail(Error::Internal(path + ": unknown setting kind"));
}

Status ApplyYamlSetting(DaemonConfig& c, const std::string& key, const YAML::Node& value, const std::string& source) {
  const SettingSpec* spec = FindDaemonSetting(key);
  if (!spec) return Fail(Error::InvalidArgument(source + ": unknown setting '" + key + "'; see `moe-daemon serve --help`"));
  MOE_ASSIGN_OR_RETURN(std::string text, SettingText(value, source + ": " + key, spec->kind));
  return ApplySetting(c, key, text, source);
}

Status ApplyYamlSettings(DaemonConfig& c, const YAML::Node& root, const std::string& source) {
  for (const auto& kv : root) {
    MOE_ASSIGN_OR_RETURN(const std::string key, yaml::Key(kv.first, source));
    if (key == "thinking_budgets") {
      if (!kv.second.IsMap()) {
        return Fail(Error::InvalidArgument(source + ": thinking_budgets: must be a map {low, medium, high}, not " +
                                           yaml::Describe(kv.second)));
      }
      for (const auto& b : kv.second) {
        MOE_ASSIGN_OR_RETURN(const std::string tier, yaml::Key(b.first, source + ": thinking_budgets"));
        MOE_TRY(ApplyYamlSetting(c, "thinking_budgets." + tier, b.second, source));
      }
      continue;
    }
    if (key == "pricing" || key == "budgets" || key == "hooks") {
      MOE_TRY(ParseBudgetSection(c.budget, key, kv.second, source));
      continue;
    }
    MOE_TRY(ApplyYamlSetting(c, key, kv.second, source));
  }
  return Ok();
}

}  // namespace

Result<DaemonConfig> ParseDaemonConfigYaml(const std::string& text, const std::string& source, DaemonConfig base) {
  // yaml-cpp parses recursively: bound the text before it sees it.
  MOE_TRY(CheckYamlLimits(text, {.max_bytes = 1 << 20, .max_depth = kMaxJsonDepth}, source));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Fail(Error::InvalidArgument(source + ": not valid YAML: " + e.what()));
  }
  if (root.IsNull()) return base;
  if (!root.IsMap()) return Fail(Error::InvalidArgument(source + ": must be a map of settings"));
  try {
    MOE_TRY(ApplyYamlSettings(base, root, source));
  } catch (const YAML::Exception& e) {
    // Every value is read through yaml_scalar, so this is a bug of ours; it
    // still costs the start a message, never the process.
    return Fail(Error::InvalidArgument(source + ": " + e.what()));
  }
  MOE_TRY(CheckBudgets(base, source));
  return base;
}

std::string ServeUsage() {
  // Markdown's backticks read as noise in a terminal.
  auto plain = [](std::string_view text) {
    std::string out;
    for (char ch : text)
      if (ch != '`') out += ch;
    return out;
  };
  std::string out =
      "usage: moe-daemon [serve] --model DIR|URI [--config FILE] [--SETTING VALUE ...]\n"
      "Every setting below is a key of the --config YAML file and a flag: --max_context 4096,\n"
      "--max-context 4096 or --max-context=4096; flags override the file. --no-prefix-cache is\n"
      "--prefix-cache false; --deterministic alone is --deterministic true. The sections pricing,\n"
      "budgets and hooks are the file's (docs/http-api.md, Configuration).\n";
  for (const SettingSpec& s : DaemonSettings()) {
    std::string flag(s.key);
    for (char& ch : flag)
      if (ch == '_') ch = '-';
    out += "  --" + flag + " " + std::string(SettingKindName(s.kind)) + " (default " + plain(s.default_value) +
           (s.range.empty() ? "" : "; " + plain(s.range)) + ")\n      " + plain(s.doc) + "\n";
  }
  return out;
}

Result<DaemonConfig> ParseServeArgs(int argc, char** argv) {
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") return Fail(Error::InvalidArgument(ServeUsage()));
    if (!a.starts_with("--")) return Fail(Error::InvalidArgument("unexpected argument '" + a + "'\n" + ServeUsage()));
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (key == "no-prefix-cache") {
      key = "prefix_cache";
      value = "false";
    } else if (key == "deterministic" && (i + 1 >= argc || std::string_view(argv[i + 1]).starts_with("--"))) {
      value = "true";  // a bare switch; --deterministic=false turns it off
    } else {
      if (i + 1 >= argc) return Fail(Error::InvalidArgument("flag --" + key + " needs a value"));
      value = argv[++i];
    }
    for (char& ch : key)
      if (ch == '-') ch = '_';
    if (key == "config") config_path = value;
    else flags.emplace_back(key, value);
  }
  DaemonConfig c;
  if (!config_path.empty()) {
    std::ifstream in(config_path);
    if (!in) return Fail(Error::Io("--config " + config_path + ": cannot be opened"));
    std::stringstream ss;
    ss << in.rdbuf();
    MOE_ASSIGN_OR_RETURN(c, ParseDaemonConfigYaml(ss.str(), config_path, c));
  }
  for (const auto& [k, v] : flags) MOE_TRY(ApplySetting(c, k, v, "--" + k));
  MOE_TRY(CheckBudgets(c, "flags"));
  if (c.model.empty()) {
    return Fail(Error::InvalidArgument("no model: pass --model DIR or set 'model' in the --config file\n" + ServeUsage()));
  }
  return c;
}

}  // namespace moeserve::daemon
