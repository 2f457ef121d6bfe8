// moe-daemon serve configuration: a YAML file (--config) plus flags; flags
// win. Every field is validated with a message naming the file or flag, the
// field and the allowed range. Which keys exist, and the kind of value each
// takes, is config_settings.hpp's list; YAML values are read through
// common/yaml_scalar.hpp (null, blank and the wrong kind are refused);
// docs/http-api.md ("Configuration") gives each its type, default and range.
//
//   model: /models/tiny           # directory, or s3:// https:// file:// URI (required, or --model)
//   model_revision: main          # with a URI: the revision (cache key with the URI)
//   weights_cache: /var/cache/moeserve   # with a URI: the node-local cache the puller fills
//   weights_cache_limit_bytes: 0  # 0: no limit (else LRU eviction of models no process holds)
//   storage_endpoint: ""          # S3-compatible endpoint (MinIO, Ceph RGW); empty: AWS
//   storage_region: ""            # empty: AWS_REGION / AWS_DEFAULT_REGION / us-east-1
//   storage_ca_file: ""           # PEM bundle to trust for https / S3
//   pull_connections: 8           # parallel ranged downloads
//   host: 127.0.0.1               # listen address (0.0.0.0 in a pod)
//   port: 8000
//   served_model_name: tiny       # the id /v1/models reports (default: directory name)
//   api_keys_file: /etc/moe/keys.yaml   # absent: no authentication (loopback only, see allow_unauthenticated)
//   allow_unauthenticated: false  # without api_keys_file, listen on a non-loopback host anyway
//   metrics_token_file: ""        # a file holding the bearer token /metrics requires (with api_keys_file;
//                                 # admin keys are accepted too)
//   tls_cert_file: ""             # PEM chain; with tls_key_file the port serves https only,
//   tls_key_file: ""              # and a change to either file is picked up without a restart
//   max_connections: 16384        # more are closed at accept
//   header_timeout_seconds: 15    # a request head (and keep-alive idle) must arrive within this
//   max_stream_buffer_bytes: 1048576   # unsent SSE bytes before a non-reading client is cut off
//   http_threads: 4
//   max_running: 64               # sequences decoded together
//   max_queue: 256                # waiting sequences before 503
//   max_concurrent_per_tenant: 128 # a tenant's requests in flight before 429 too_many_concurrent_requests
//   prefill_chunk_tokens: 512     # prompt tokens per step while sequences decode
//   prefill_chunk_tokens_idle: 2048   # ... while none does (nothing waits on the step)
//   cache_tokens: 65536           # KV pool size in tokens
//   block_tokens: 16
//   prefix_cache: true
//   prefix_cache_bytes: 1073741824   # bound on what the prefix cache holds: its KV blocks, DeltaNet
//                                    # state copies (one per entry) and bookkeeping; LRU eviction; 0: none
//   public_system_prompt: ""      # a system message shared by tenants: a prompt opening with exactly it
//                                 # reuses its cached state across tenants (moe-dsa-v1); all else is per tenant
//   threads: 0                    # 0: all cores
//   max_context: 0                # 0: the model's
//   default_max_tokens: 1024
//   default_reasoning_effort: medium
//   thinking_budgets: {low: 256, medium: 2048, high: 16384}   # default: the model's config
//   shutdown_grace_seconds: 30
//   max_body_bytes: 8388608
//   kernels: fast                 # fast | reference
//   deterministic: false          # batch-invariant decode: a request's tokens do not depend on
//                                 # what else runs (EngineOptions::deterministic); slower prefill
//   constrained_max_string_bytes: 256   # longest string in a constrained tool call
//   state_dir: ""                 # the daemon's durable state (a PersistentVolumeClaim under Kubernetes)
//   ledger_path: ""               # the usage ledger (SQLite); default <state_dir>/usage.sqlite3;
//                                 # neither set: kept in memory, lost on restart
//   policy_name: standalone       # "policy" in alert payloads
//   deployment_name: ""           # "deployment" in alert payloads (default: served_model_name)
//   pricing: {...}  budgets: [...]  hooks: [...]   # YAML only; budget_policy.hpp
//   hook_retry_initial_seconds: 5      # first wait after a failed delivery (doubles, with jitter)
//   hook_retry_max_seconds: 600        # longest wait between attempts
//   hook_give_up_seconds: 86400        # retried this long after the alert fired (at least 3600)
//   spend_from_operator: false    # under moe-operator: budgets follow the global spend it hands back
//                                 # (PUT /v1/admin/spend); no hooks here (the operator fires them)
//   global_spend_file: ""         # that spend as last recorded (ConfigMap <policy>-budget), read at start
//   session_*                     # server-kept sessions: session_settings.hpp lists them
//   audit_*                       # the audit log (default <state_dir>/audit): audit_log.hpp lists them
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/daemon/chat_request.hpp"
#include "moeserve/daemon/audit_log.hpp"
#include "moeserve/daemon/session_settings.hpp"
#include "moeserve/engine/model_config.hpp"

namespace moeserve::daemon {

struct DaemonConfig {
  std::string model;
  std::string model_revision = "main";
  std::string weights_cache = "/var/cache/moeserve";
  int64_t weights_cache_limit_bytes = 0;
  std::string storage_endpoint;
  std::string storage_region;
  std::string storage_ca_file;
  int pull_connections = 8;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;
  std::string api_keys_file;
  bool allow_unauthenticated = false;
  std::string metrics_token_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  int max_connections = 16384;
  double header_timeout_seconds = 15;
  size_t max_stream_buffer_bytes = 1 << 20;
  int http_threads = 4;
  int max_running = 64;
  int max_queue = 256;
  int max_concurrent_per_tenant = 128;  // one tenant cannot fill the queue
  int prefill_chunk_tokens = 512;
  int prefill_chunk_tokens_idle = 2048;
  int64_t cache_tokens = 1 << 16;
  int block_tokens = 16;
  bool prefix_cache = true;
  int64_t prefix_cache_bytes = int64_t{1} << 30;
  std::string public_system_prompt;  // the one prefix the cache shares across tenants
  int threads = 0;
  int max_context = 0;
  int default_max_tokens = 1024;
  ReasoningEffort default_reasoning_effort = ReasoningEffort::kMedium;
  std::optional<engine::ThinkingBudgets> thinking_budgets;
  double shutdown_grace_seconds = 30;
  size_t max_body_bytes = 8u << 20;
  std::string kernels = "fast";
  bool deterministic = false;  // EngineOptions::deterministic (not for gpt-oss models)
  // Constrained decoding: the longest string a tool argument (or json_object
  // value) may hold. A bound keeps a poorly sampling model from running on.
  int constrained_max_string_bytes = 256;
  // Budgets and the usage ledger (budget_service.hpp).
  std::string state_dir;
  std::string ledger_path;
  BudgetPolicy budget;  // policy_name, deployment_name, pricing, budgets, hooks
  double hook_retry_initial_seconds = 5;
  double hook_retry_max_seconds = 600;
  double hook_give_up_seconds = 86400;
  bool spend_from_operator = false;
  std::string global_spend_file;  // may be absent: nothing recorded yet
  SessionSettings sessions;        // server-kept sessions (session_settings.hpp)
  AuditSettings audit;             // the audit log (audit_log.hpp)
};

// YAML text; `source` names the file in messages. Unknown keys are refused
// (a typo would otherwise silently keep a default).
Result<DaemonConfig> ParseDaemonConfigYaml(const std::string& text, const std::string& source, DaemonConfig base = {});
// argv of `moe-daemon serve` (argv[0] is the command): --config is read
// first, then every flag overrides. --help gives kInvalidArgument with the usage.
Result<DaemonConfig> ParseServeArgs(int argc, char** argv);
std::string ServeUsage();

}  // namespace moeserve::daemon
