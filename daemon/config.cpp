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

std::string FormatSeconds(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

// Every setting is a string value applied by key, so the YAML file and the
// flags share one set of parsers and messages.
Status ApplySetting(DaemonConfig& c, const std::string& key, const std::string& value, const std::string& where) {
  // The list in config_settings.cpp decides which keys exist, for the YAML
  // file and the flags alike.
  if (!FindDaemonSetting(key)) {
    return Fail(Error::InvalidArgument(where + ": unknown setting '" + key + "'; see `moe-daemon serve --help`"));
  }
  auto bad = [&](const std::string& what) {
    return Fail(Error::InvalidArgument(where + ": " + key + ": " + what + " (got '" + value + "')"));
  };
  auto integer = [&](int64_t lo, int64_t hi, auto& out) -> Status {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || p != value.data() + value.size()) return bad("must be an integer");
    if (v < lo || v > hi) return bad("must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    out = static_cast<std::remove_reference_t<decltype(out)>>(v);
    return Ok();
  };
  auto seconds = [&](double lo, double hi, double& out) -> Status {
    try {
      size_t used = 0;
      double v = std::stod(value, &used);
      if (used != value.size() || !(v >= lo && v <= hi)) {
        return bad("must be a number of seconds between " + FormatSeconds(lo) + " and " + FormatSeconds(hi));
      }
      out = v;
    } catch (...) {
      return bad("must be a number of seconds");
    }
    return Ok();
  };
  auto boolean = [&](bool& out) -> Status {
    if (value == "true" || value == "1" || value == "yes") out = true;
    else if (value == "false" || value == "0" || value == "no") out = false;
    else return bad("must be true or false");
    return Ok();
  };
  if (key == "model") {
    if (value.empty()) return bad("must name a model directory");
    c.model = value;
  } else if (key == "model_revision") {
    if (value.empty()) return bad("must name a revision");
    c.model_revision = value;
  } else if (key == "weights_cache") {
    if (value.empty()) return bad("must name a directory");
    c.weights_cache = value;
  } else if (key == "weights_cache_limit_bytes") return integer(0, int64_t{1} << 60, c.weights_cache_limit_bytes);
  else if (key == "storage_endpoint") c.storage_endpoint = value;
  else if (key == "storage_region") c.storage_region = value;
  else if (key == "storage_ca_file") c.storage_ca_file = value;
  else if (key == "pull_connections") return integer(1, 256, c.pull_connections);
  else if (key == "host") {
    if (value.empty()) return bad("must be an address such as 127.0.0.1 or 0.0.0.0");
    c.host = value;
  } else if (key == "port") return integer(1, 65535, c.port);
  else if (key == "served_model_name") c.served_model_name = value;
  else if (key == "api_keys_file") c.api_keys_file = value;
  else if (key == "max_running") return integer(1, 4096, c.max_running);
  else if (key == "max_queue") return integer(1, 1 << 20, c.max_queue);
  else if (key == "public_system_prompt") c.public_system_prompt = value;
  else if (key == "max_concurrent_per_tenant") return integer(1, 1 << 20, c.max_concurrent_per_tenant);
  else if (key == "prefill_chunk_tokens") return integer(1, 1 << 20, c.prefill_chunk_tokens);
  else if (key == "prefill_chunk_tokens_idle") return integer(1, 1 << 20, c.prefill_chunk_tokens_idle);
  else if (key == "cache_tokens") return integer(16, int64_t{1} << 40, c.cache_tokens);
  else if (key == "block_tokens") return integer(1, 4096, c.block_tokens);
  else if (key == "prefix_cache") return boolean(c.prefix_cache);
  else if (key == "deterministic") return boolean(c.deterministic);
  else if (key == "prefix_cache_bytes") return integer(0, int64_t{1} << 50, c.prefix_cache_bytes);
  else if (key == "threads") return integer(0, 4096, c.threads);
  else if (key == "max_context") return integer(0, int64_t{1} << 31, c.max_context);
  else if (key == "default_max_tokens") return integer(1, int64_t{1} << 30, c.default_max_tokens);
  else if (key == "default_reasoning_effort") {
    auto e = ParseReasoningEffort(value);
    if (!e) return bad("must be low, medium or high");
    c.default_reasoning_effort = *e;
  } else if (key == "thinking_budgets.low" || key == "thinking_budgets.medium" || key == "thinking_budgets.high") {
    if (!c.thinking_budgets) c.thinking_budgets = engine::ThinkingBudgets{};
    int& slot = key.ends_with("low") ? c.thinking_budgets->low
                : key.ends_with("medium") ? c.thinking_budgets->medium : c.thinking_budgets->high;
    return integer(0, int64_t{1} << 30, slot);
  } else if (key == "shutdown_grace_seconds") {
    return seconds(0, 3600, c.shutdown_grace_seconds);
  } else if (key == "max_body_bytes") {
    return integer(1024, int64_t{1} << 32, c.max_body_bytes);
  } else if (key == "constrained_max_string_bytes") {
    return integer(1, 1 << 20, c.constrained_max_string_bytes);
  } else if (key == "image_max_bytes") {
    return integer(1, int64_t{1} << 30, c.images.limits.max_bytes);
  } else if (key == "image_max_pixels") {
    return integer(1, int64_t{1} << 32, c.images.limits.max_pixels);
  } else if (key == "image_max_per_request") {
    return integer(0, 1024, c.images.max_per_request);
  } else if (key == "image_url_allowed_hosts") {
    auto hosts = ParseImageHostList(value);
    if (!hosts) return bad(hosts.error().message());
    c.images.allowed_hosts = std::move(*hosts);
  } else if (key == "image_url_allow_private_addresses") {
    return boolean(c.images.allow_private_addresses);
  } else if (key == "image_fetch_timeout_seconds") {
    return seconds(0.1, 600, c.images.fetch_timeout_seconds);
  } else if (key == "tls_cert_file") {
    c.tls_cert_file = value;
  } else if (key == "tls_key_file") {
    c.tls_key_file = value;
  } else if (key == "metrics_token_file") {
    c.metrics_token_file = value;
  } else if (key == "allow_unauthenticated") {
    return boolean(c.allow_unauthenticated);
  } else if (key == "max_connections") {
    return integer(1, 1 << 20, c.max_connections);
  } else if (key == "header_timeout_seconds") {
    return seconds(0.1, 3600, c.header_timeout_seconds);
  } else if (key == "max_stream_buffer_bytes") {
    return integer(4096, int64_t{1} << 32, c.max_stream_buffer_bytes);
  } else if (key == "http_threads") {
    return integer(1, 256, c.http_threads);
  } else if (key == "state_dir") {
    c.state_dir = value;
  } else if (key == "ledger_path") {
    c.ledger_path = value;
  } else if (key == "policy_name") {
    if (value.empty()) return bad("must not be empty");
    c.budget.policy_name = value;
  } else if (key == "deployment_name") {
    c.budget.deployment_name = value;
  } else if (key == "hook_retry_initial_seconds") {
    return seconds(0.01, 3600, c.hook_retry_initial_seconds);
  } else if (key == "hook_retry_max_seconds") {
    return seconds(0.01, 86400, c.hook_retry_max_seconds);
  } else if (key == "hook_give_up_seconds") {
    return seconds(3600, 30 * 86400, c.hook_give_up_seconds);
  } else if (key == "spend_from_operator") {
    return boolean(c.spend_from_operator);
  } else if (key == "global_spend_file") {
    c.global_spend_file = value;
  } else if (key.starts_with("session_")) {
    return ApplySessionSetting(c.sessions, key, value, where);
  } else if (key.starts_with("audit_")) {
    return ApplyAuditSetting(c.audit, key, value, where);
  } else if (key == "kernels") {
    if (value != "fast" && value != "reference") return bad("must be fast or reference");
    c.kernels = value;
  } else if (key == "experts") {
    if (value != "stored" && value != "mxfp4" && value != "bf16") return bad("must be stored, mxfp4 or bf16");
    c.experts = value;
  } else {
    return Fail(Error::InvalidArgument(where + ": unknown setting '" + key + "'; see `moe-daemon serve --help`"));
  }
  return Ok();
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
