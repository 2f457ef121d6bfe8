// daemon.config_scalars: every scalar of every config the daemon reads (its
// --config with the budget sections and session settings, the API keys
// file, and a QuotaPolicy's budget sections as moe-operator parses them),
// replaced in turn by null (`key:`, `~`, `null`), empty text, whitespace,
// a map, a list, and scalars of the other kinds (integer, float, boolean,
// text), must give an error that names the key's path: never a crash, never
// a default kept in silence, never the text "null" taken as a value.
//
// The documents below are valid; each scalar line is annotated with its kind
// and the path an error about it must name (`# int port`). A line's value is
// swapped textually, so the null forms are written exactly as a person would.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/config_settings.hpp"

namespace moeserve::daemon {
namespace {

const std::string kDaemonConfig = R"(model: /models/tiny  # text model
model_revision: main  # text model_revision
weights_cache: /var/cache/moeserve  # text weights_cache
weights_cache_limit_bytes: 0  # int weights_cache_limit_bytes
storage_endpoint: http://127.0.0.1:9000  # text storage_endpoint
storage_region: eu-west-1  # text storage_region
storage_ca_file: /etc/moe/ca.pem  # text storage_ca_file
pull_connections: 8  # int pull_connections
host: 127.0.0.1  # text host
port: 8000  # int port
served_model_name: tiny  # text served_model_name
api_keys_file: /etc/moe/keys.yaml  # text api_keys_file
allow_unauthenticated: false  # bool allow_unauthenticated
metrics_token_file: /etc/moe/metrics-token  # text metrics_token_file
tls_cert_file: /etc/moe/tls.crt  # text tls_cert_file
tls_key_file: /etc/moe/tls.key  # text tls_key_file
max_connections: 16384  # int max_connections
header_timeout_seconds: 15.5  # num header_timeout_seconds
max_stream_buffer_bytes: 1048576  # int max_stream_buffer_bytes
http_threads: 4  # int http_threads
max_body_bytes: 8388608  # int max_body_bytes
shutdown_grace_seconds: 30.0  # num shutdown_grace_seconds
max_running: 64  # int max_running
max_concurrent_per_tenant: 16  # int max_concurrent_per_tenant
public_system_prompt: You are a helpful assistant.  # text public_system_prompt
max_queue: 256  # int max_queue
prefill_chunk_tokens: 512  # int prefill_chunk_tokens
prefill_chunk_tokens_idle: 2048  # int prefill_chunk_tokens_idle
cache_tokens: 65536  # int cache_tokens
cache_memory_share: 0.5  # num cache_memory_share
block_tokens: 16  # int block_tokens
prefix_cache: true  # bool prefix_cache
prefix_cache_bytes: 1073741824  # int prefix_cache_bytes
prefix_disk_dir: /var/cache/moeserve/prefix  # text prefix_disk_dir
prefix_disk_bytes: 17179869184  # int prefix_disk_bytes
prefix_disk_max_age_seconds: 604800  # num prefix_disk_max_age_seconds
threads: 0  # int threads
max_context: 4096  # int max_context
kernels: fast  # text kernels
experts: stored  # text experts
indexer_scores: exact  # text indexer_scores
deterministic: false  # bool deterministic
bf16_activations: false  # bool bf16_activations
speculative: auto  # text speculative
draft_tokens: 3  # int draft_tokens
speculative_max_batch: 2  # int speculative_max_batch
default_max_tokens: 1024  # int default_max_tokens
default_reasoning_effort: medium  # text default_reasoning_effort
thinking_budgets:
  low: 4  # int thinking_budgets.low
  medium: 8  # int thinking_budgets.medium
  high: 16  # int thinking_budgets.high
constrained_max_string_bytes: 256  # int constrained_max_string_bytes
image_max_bytes: 1048576  # int image_max_bytes
image_max_pixels: 4194304  # int image_max_pixels
image_max_per_request: 4  # int image_max_per_request
image_url_allowed_hosts: images.example.com  # text image_url_allowed_hosts
image_url_allow_private_addresses: false  # bool image_url_allow_private_addresses
image_fetch_timeout_seconds: 5.0  # num image_fetch_timeout_seconds
image_fetch_request_timeout_seconds: 20.0  # num image_fetch_request_timeout_seconds
image_workers: 4  # int image_workers
image_tenant_max_in_flight: 2  # int image_tenant_max_in_flight
image_max_queued: 64  # int image_max_queued
image_decoded_cache_bytes: 268435456  # int image_decoded_cache_bytes
state_dir: /var/lib/moeserve  # text state_dir
ledger_path: /var/lib/moeserve/usage.sqlite3  # text ledger_path
policy_name: team-a  # text policy_name
deployment_name: tiny  # text deployment_name
hook_retry_initial_seconds: 5.0  # num hook_retry_initial_seconds
hook_retry_max_seconds: 600.0  # num hook_retry_max_seconds
hook_give_up_seconds: 86400.0  # num hook_give_up_seconds
spend_from_operator: false  # bool spend_from_operator
global_spend_file: /etc/moe/budget/spend.json  # text global_spend_file
session_db_path: /var/lib/moeserve/sessions.sqlite3  # text session_db_path
session_idle_seconds: 3600.0  # num session_idle_seconds
session_tenant_quota_bytes: 1048576  # int session_tenant_quota_bytes
session_total_quota_bytes: 268435456  # int session_total_quota_bytes
session_image_max_bytes: 1048576  # int session_image_max_bytes
session_context_tokens: 4096  # int session_context_tokens
session_keep_exchanges: 4  # int session_keep_exchanges
session_summary_max_tokens: 256  # int session_summary_max_tokens
session_replica: r0  # text session_replica
session_peers: r1=http://10.0.0.2:8000  # text session_peers
session_pin_share: 0.5  # num session_pin_share
session_pin_seconds: 60.0  # num session_pin_seconds
session_forward_max_in_flight: 16  # int session_forward_max_in_flight
session_forward_deadline_seconds: 30.0  # num session_forward_deadline_seconds
audit_dir: /var/lib/moeserve/audit  # text audit_dir
audit_log_content: false  # bool audit_log_content
audit_max_file_bytes: 1048576  # int audit_max_file_bytes
audit_max_files: 4  # int audit_max_files
audit_retention_hours: 1.0  # num audit_retention_hours
audit_unauthenticated_lines_per_second: 1.0  # num audit_unauthenticated_lines_per_second
audit_tenant_max_share: 0.5  # num audit_tenant_max_share
pricing:
  low:
    input: 0.2  # num pricing.low.input
    cachedInput: 0.02  # num pricing.low.cachedInput
    output: 0.8  # num pricing.low.output
    reasoning: 0.8  # num pricing.low.reasoning
budgets:
  - tenant: acme  # text budgets[0].tenant
    period: day  # text budgets[0].period
    limitUSD: 5.5  # num budgets[0].limitUSD
    thresholds:
      - 0.5  # num budgets[0].thresholds[0]
    action: block  # text budgets[0].action
    requestsPerMinute: 60  # int budgets[0].requestsPerMinute
    tokensPerMinute: 100000  # int budgets[0].tokensPerMinute
hooks:
  - name: sre  # text hooks[0].name
    url: https://alerts.example/moe  # text hooks[0].url
    secretFile: /etc/moe/hook-secret  # text hooks[0].secretFile
    format: json  # text hooks[0].format
    allowHTTP: false  # bool hooks[0].allowHTTP
    allowPrivateAddresses: false  # bool hooks[0].allowPrivateAddresses
)";

const std::string kKeysFile = R"(tenants:
  acme:
    tiers:
      - low  # text tenants.acme.tiers[0]
keys:
  - key: sk-acme-0123456789  # text keys[0].key
    tenant: acme  # text keys[0].tenant
    role: user  # text keys[0].role
  - sha256: )" + Sha256Hex(std::string_view("sk-ops-0123456789")) + R"(  # text keys[1].sha256
    tenant: ops  # text keys[1].tenant
    role: admin  # text keys[1].role
)";

// A QuotaPolicy's spec sections, where hooks name a Secret or a Vault path.
const std::string kQuotaPolicySpec = R"(pricing:
  medium:
    input: 0.4  # num pricing.medium.input
budgets:
  - tenant: "*"  # text budgets[0].tenant
    period: month  # text budgets[0].period
    limitUSD: 100.0  # num budgets[0].limitUSD
hooks:
  - name: team  # text hooks[0].name
    url: https://hooks.example/a  # text hooks[0].url
    secret:
      secretRef:
        name: team-hook  # text hooks[0].secret.secretRef.name
  - name: vaulted  # text hooks[1].name
    url: https://hooks.example/b  # text hooks[1].url
    secret:
      vault:
        path: secret/data/hooks/b  # text hooks[1].secret.vault.path
)";

Status ParseQuotaPolicySpec(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Fail(Error::InvalidArgument(std::string("not YAML: ") + e.what()));
  }
  BudgetPolicy policy;
  for (const char* section : {"pricing", "budgets", "hooks"}) {
    if (root[section]) MOE_TRY(ParseBudgetSection(policy, section, root[section], "QuotaPolicy spec"));
  }
  return Ok();
}

using Loader = std::function<Status(const std::string&)>;

struct Loaders {
  std::string name;
  std::string document;
  Loader load;
};

std::vector<Loaders> AllLoaders() {
  return {
      {"daemon --config", kDaemonConfig,
       [](const std::string& t) -> Status {
         auto c = ParseDaemonConfigYaml(t, "daemon.yaml");
         if (!c) return Fail(c.error());
         return Ok();
       }},
      {"API keys file", kKeysFile,
       [](const std::string& t) -> Status {
         auto k = ApiKeys::Parse(t, "keys.yaml");
         if (!k) return Fail(k.error());
         // Never the literal key "null" (nor an empty one) let in.
         if (k->Authenticate("Bearer null") || k->Authenticate("Bearer ~")) {
           return Fail(Error::Internal("LOADED AND ADMITS 'Bearer null'"));
         }
         return Ok();
       }},
      {"QuotaPolicy spec", kQuotaPolicySpec, ParseQuotaPolicySpec},
  };
}

struct ScalarLine {
  size_t line = 0;
  std::string before;  // up to the value
  std::string value;
  std::string after;   // the annotation comment
  std::string key_prefix, key;  // for "key: value" lines
  std::string kind, path;
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string Join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

std::vector<ScalarLine> Annotated(const std::string& document) {
  static const std::regex annotated(R"(^(\s*(?:- )?)(?:([A-Za-z_][A-Za-z0-9_]*): )?(.*?)(  # (text|int|num|bool) (\S+))$)");
  std::vector<ScalarLine> out;
  const auto lines = Lines(document);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    if (!std::regex_match(lines[i], m, annotated)) continue;
    ScalarLine s;
    s.line = i;
    s.key_prefix = m[1];
    s.key = m[2];
    s.before = m[1].str() + (s.key.empty() ? "" : s.key + ": ");
    s.value = m[3];
    s.after = m[4];
    s.kind = m[5];
    s.path = m[6];
    out.push_back(s);
  }
  return out;
}

struct Replacement {
  std::string text;
  std::string kind;  // null | blank | map | list | int | num | bool | text
};

const std::vector<Replacement> kReplacements = {
    {"", "null"},       {"~", "null"},        {"null", "null"}, {"NULL", "null"}, {"\"\"", "blank"},
    {"''", "blank"},    {"\"   \"", "blank"}, {"\" \\t \"", "blank"}, {"{a: 1}", "map"}, {"[1, 2]", "list"},
    {"[]", "list"},     {"12345", "int"},     {"-3", "int"},    {"1.5", "num"},   {"true", "bool"},
    {"no", "bool"},     {"word-text", "text"},
};

// A replacement of the original's own kind is a valid value, not an attack.
bool SameKind(const std::string& original, const std::string& replacement) {
  if (original == replacement) return true;
  return original == "num" && replacement == "int";
}

TEST(ConfigScalars, TheDocumentsAreValid) {
  for (const auto& l : AllLoaders()) {
    auto st = l.load(l.document);
    EXPECT_TRUE(st) << l.name << ": " << st.error().ToString();
    EXPECT_GE(Annotated(l.document).size(), 7u) << l.name;
  }
}

// Every setting the daemon accepts is exercised (a new setting must be added
// above), and every field of the budget sections.
TEST(ConfigScalars, EverySettingAndBudgetFieldIsCovered) {
  std::set<std::string> paths;
  for (const auto& l : AllLoaders())
    for (const auto& s : Annotated(l.document)) paths.insert(l.name + ":" + s.path);
  for (const auto& setting : DaemonSettings()) {
    EXPECT_TRUE(paths.contains("daemon --config:" + std::string(setting.key))) << setting.key << " is not in kDaemonConfig";
  }
  auto covered = [&](std::string_view field) {
    for (const auto& p : paths)
      if (p.find("." + std::string(field)) != std::string::npos) return true;
    return false;
  };
  for (auto f : kPricingFields) EXPECT_TRUE(covered(f)) << "pricing field " << f;
  for (auto f : kBudgetFields) EXPECT_TRUE(covered(f)) << "budget field " << f;
  for (auto f : kHookFields) {
    if (f != "secret") {
      EXPECT_TRUE(covered(f)) << "hook field " << f;
    }
  }
  EXPECT_TRUE(covered("secret.secretRef.name"));
  EXPECT_TRUE(covered("secret.vault.path"));
}

TEST(ConfigScalars, EveryValueOfTheWrongKindIsRefusedNamingItsPath) {
  size_t checked = 0;
  for (const auto& l : AllLoaders()) {
    auto lines = Lines(l.document);
    for (const auto& s : Annotated(l.document)) {
      for (const auto& r : kReplacements) {
        if (SameKind(s.kind, r.kind)) continue;
        auto changed = lines;
        changed[s.line] = s.before + r.text + s.after;
        const std::string text = Join(changed);
        auto st = l.load(text);
        ++checked;
        if (st) {
          ADD_FAILURE() << l.name << ": " << s.path << " = " << r.text << " (" << r.kind << ") was accepted";
          continue;
        }
        const std::string& m = st.error().message();
        EXPECT_NE(m.find(s.path), std::string::npos)
            << l.name << ": " << s.path << " = " << r.text << ": the error does not name the path: " << m;
        EXPECT_EQ(m.find("LOADED"), std::string::npos) << m;
      }
    }
  }
  EXPECT_GT(checked, 900u);
}

// A key that is not a name (null, empty, a list) is refused, never read as
// the text "null" or turned into a crash.
TEST(ConfigScalars, KeysThatAreNotNamesAreRefused) {
  size_t checked = 0;
  for (const auto& l : AllLoaders()) {
    auto lines = Lines(l.document);
    for (const auto& s : Annotated(l.document)) {
      if (s.key.empty()) continue;
      for (const std::string bad_key : {"~", "\"\"", "\"  \"", "[a, b]", "{a: 1}"}) {
        auto changed = lines;
        // An explicit key ("? k" then ": v"); after "- " it opens the entry's map.
        changed[s.line] = s.key_prefix + "? " + bad_key + "\n" + std::string(s.key_prefix.size(), ' ') + ": " + s.value;
        auto st = l.load(Join(changed));
        ++checked;
        EXPECT_FALSE(st) << l.name << ": the key of " << s.path << " replaced by " << bad_key << " was accepted";
      }
    }
  }
  EXPECT_GT(checked, 300u);
}

}  // namespace
}  // namespace moeserve::daemon
