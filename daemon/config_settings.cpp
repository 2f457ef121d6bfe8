#include "moeserve/daemon/config_settings.hpp"

#include <algorithm>

namespace moeserve::daemon {

namespace {

using enum SettingKind;

constexpr SettingSpec kSettings[] = {
    // The model and where it comes from.
    {"model", kText},
    {"model_revision", kText},
    {"weights_cache", kText},
    {"weights_cache_limit_bytes", kInteger},
    {"storage_endpoint", kText},
    {"storage_region", kText},
    {"storage_ca_file", kText},
    {"pull_connections", kInteger},
    // The HTTP front.
    {"host", kText},
    {"port", kInteger},
    {"served_model_name", kText},
    {"api_keys_file", kText},
    {"allow_unauthenticated", kBoolean},
    {"metrics_token_file", kText},
    {"tls_cert_file", kText},
    {"tls_key_file", kText},
    {"max_connections", kInteger},
    {"header_timeout_seconds", kNumber},
    {"max_stream_buffer_bytes", kInteger},
    {"http_threads", kInteger},
    {"max_body_bytes", kInteger},
    {"shutdown_grace_seconds", kNumber},
    // The engine and its scheduler.
    {"max_running", kInteger},
    {"max_queue", kInteger},
    {"max_concurrent_per_tenant", kInteger},
    {"prefill_chunk_tokens", kInteger},
    {"prefill_chunk_tokens_idle", kInteger},
    {"cache_tokens", kInteger},
    {"block_tokens", kInteger},
    {"prefix_cache", kBoolean},
    {"prefix_cache_bytes", kInteger},
    {"public_system_prompt", kText},
    {"threads", kInteger},
    {"max_context", kInteger},
    {"kernels", kText},
    {"deterministic", kBoolean},
    // Requests' defaults and bounds.
    {"default_max_tokens", kInteger},
    {"default_reasoning_effort", kText},
    {"thinking_budgets.low", kInteger},
    {"thinking_budgets.medium", kInteger},
    {"thinking_budgets.high", kInteger},
    {"constrained_max_string_bytes", kInteger},
    // Usage, budgets and hooks (the sections pricing, budgets, hooks aside).
    {"state_dir", kText},
    {"ledger_path", kText},
    {"policy_name", kText},
    {"deployment_name", kText},
    {"hook_retry_initial_seconds", kNumber},
    {"hook_retry_max_seconds", kNumber},
    {"hook_give_up_seconds", kNumber},
    {"spend_from_operator", kBoolean},
    {"global_spend_file", kText},
    // Server-kept sessions (session_settings.hpp).
    {"session_db_path", kText},
    {"session_idle_seconds", kNumber},
    {"session_tenant_quota_bytes", kInteger},
    {"session_total_quota_bytes", kInteger},
    {"session_context_tokens", kInteger},
    {"session_keep_exchanges", kInteger},
    {"session_summary_max_tokens", kInteger},
    {"session_replica", kText},
    {"session_peers", kText},
    {"session_pin_share", kNumber},
    {"session_pin_seconds", kNumber},
    {"session_forward_max_in_flight", kInteger},
    {"session_forward_deadline_seconds", kNumber},
    // The audit log (audit_log.hpp).
    {"audit_dir", kText},
    {"audit_log_content", kBoolean},
    {"audit_max_file_bytes", kInteger},
    {"audit_max_files", kInteger},
};

}  // namespace

std::span<const SettingSpec> DaemonSettings() { return kSettings; }

const SettingSpec* FindDaemonSetting(std::string_view key) {
  auto it = std::find_if(std::begin(kSettings), std::end(kSettings), [&](const SettingSpec& s) { return s.key == key; });
  return it == std::end(kSettings) ? nullptr : &*it;
}

}  // namespace moeserve::daemon
