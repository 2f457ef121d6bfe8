// moe-daemon serve configuration: a YAML file (--config) plus flags; flags
// win. Every field is validated with a message naming the file or flag, the
// field and the allowed range. Which keys exist, and the kind of value each
// takes, is config_settings.hpp's list; YAML values are read through
// common/yaml_scalar.hpp (null, blank and the wrong kind are refused);
// docs/http-api.md ("Configuration") gives each its type, default and range.
//
// The settings themselves (name, kind, default, range, meaning) are one
// table, config_settings.cpp: `moe-daemon serve --help` prints it and
// daemon.config_reference holds docs/http-api.md to it. A field below that
// feeds the engine or the HTTP server takes its default from that side's
// options (EngineOptions, HttpServerOptions), so each default is written once.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/daemon/image/image_decode.hpp"
#include "moeserve/daemon/image/image_work.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/audit/audit_log.hpp"
#include "moeserve/daemon/http/http_server.hpp"
#include "moeserve/daemon/sessions/session_settings.hpp"
#include "moeserve/engine/engine.hpp"
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
  std::string host = HttpServerOptions{}.host;
  int port = HttpServerOptions{}.port;
  std::string served_model_name;
  std::string api_keys_file;
  bool allow_unauthenticated = false;
  std::string metrics_token_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  int max_connections = static_cast<int>(HttpServerOptions{}.max_connections);
  double header_timeout_seconds = HttpServerOptions{}.header_timeout_seconds;
  size_t max_stream_buffer_bytes = HttpServerOptions{}.max_stream_buffer_bytes;
  int http_threads = HttpServerOptions{}.threads;
  int max_running = engine::EngineOptions{}.max_running;
  int max_queue = engine::EngineOptions{}.max_waiting;
  int max_concurrent_per_tenant = 128;  // one tenant cannot fill the queue
  int prefill_chunk_tokens = engine::EngineOptions{}.prefill_chunk_tokens;
  int prefill_chunk_tokens_idle = engine::EngineOptions{}.prefill_chunk_tokens_idle;
  // 0: sized from memory, cache_memory_share of what is free after the
  // weights (model/machine_memory.hpp).
  int64_t cache_tokens = 0;
  double cache_memory_share = 0.5;
  int block_tokens = engine::EngineOptions{}.block_tokens;
  bool prefix_cache = engine::EngineOptions{}.prefix_cache;
  int64_t prefix_cache_bytes = engine::EngineOptions{}.prefix_cache_bytes;
  std::string prefix_disk_dir;  // the prefix cache's tier on disk; empty: off
  int64_t prefix_disk_bytes = engine::EngineOptions{}.prefix_disk_bytes;
  double prefix_disk_max_age_seconds = engine::EngineOptions{}.prefix_disk_max_age_seconds;  // 0: no bound
  std::string public_system_prompt;  // the one prefix the cache shares across tenants
  int threads = 0;
  int max_context = 0;
  int default_max_tokens = 1024;
  ReasoningEffort default_reasoning_effort = ReasoningEffort::kMedium;
  std::optional<engine::ThinkingBudgets> thinking_budgets;
  double shutdown_grace_seconds = 30;
  size_t max_body_bytes = 8u << 20;
  std::string kernels = "fast";
  // The routed experts' format in memory (EngineOptions::experts): "stored"
  // as the checkpoint has them; "mxfp4" requantises a DeepSeek-V3.2 or
  // Qwen3-Next checkpoint's at load; other families refuse a format they do not store.
  std::string experts = "stored";
  // EngineOptions::indexer_scores: "exact" or "int8" (DSA models).
  std::string indexer_scores = "exact";
  bool deterministic = false;  // EngineOptions::deterministic (not for gpt-oss models)
  bool bf16_activations = false;  // EngineOptions::bf16_activations (prefill products in BF16)
  // Speculative decoding (EngineOptions::speculative, draft_tokens,
  // speculative_max_batch): the default of requests that name none.
  engine::SpeculativeMode speculative = engine::EngineOptions{}.speculative;
  int draft_tokens = engine::EngineOptions{}.draft_tokens;
  int speculative_max_batch = engine::EngineOptions{}.speculative_max_batch;
  // Constrained decoding: the longest string a tool argument (or json_object
  // value) may hold. A bound keeps a poorly sampling model from running on.
  int constrained_max_string_bytes = 256;
  ImageUrlPolicy images;  // image parts: limits, allowed URL hosts (image_decode.hpp)
  ImageWorkSettings image_work;  // image workers and decoded-image cache (image_work.hpp)
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
