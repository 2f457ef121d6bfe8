#include "moeserve/daemon/metrics.hpp"

#include <prometheus/text_serializer.h>

#include "moeserve/storage/pull_metrics.hpp"

namespace moeserve::daemon {

namespace {
// Latency buckets from 5 ms to 2 minutes: TTFT of a long prompt on CPU and a
// full completion both land inside.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}
}  // namespace

DaemonMetrics::DaemonMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  using namespace prometheus;
  requests_ = &BuildCounter().Name("moe_requests_total").Help("Chat completion requests by HTTP status").Register(*registry_);
  request_duration_ = &BuildHistogram()
                           .Name("moe_request_duration_seconds")
                           .Help("Time from request received to response complete")
                           .Register(*registry_)
                           .Add({}, LatencyBuckets());
  ttft_ = &BuildHistogram()
               .Name("moe_time_to_first_token_seconds")
               .Help("Time from request received to the first generated token")
               .Register(*registry_)
               .Add({}, LatencyBuckets());
  itl_ = &BuildHistogram()
              .Name("moe_inter_token_latency_seconds")
              .Help("Time between consecutive generated tokens of one sequence")
              .Register(*registry_)
              .Add({}, LatencyBuckets());
  tokens_ = &BuildCounter()
                 .Name("moe_tokens_total")
                 .Help("Tokens by tenant, tier and kind (input, cached_input, output, reasoning)")
                 .Register(*registry_);
  cost_ = &BuildCounter().Name("moe_cost_usd_total").Help("Cost in USD by tenant and tier").Register(*registry_);
  budget_remaining_ = &BuildGauge()
                           .Name("moe_budget_remaining_ratio")
                           .Help("Share of the tenant's budget left in the period")
                           .Register(*registry_);
  budget_limit_ = &BuildGauge()
                       .Name("moe_budget_limit_usd")
                       .Help("The tenant's budget for the period in USD")
                       .Register(*registry_);
  ledger_commits_ = &BuildCounter()
                         .Name("moe_usage_ledger_commits_total")
                         .Help("Usage ledger transactions committed (one WAL fsync each with a ledger file)")
                         .Register(*registry_)
                         .Add({});
  ledger_charges_ = &BuildCounter()
                         .Name("moe_usage_ledger_charges_total")
                         .Help("Requests charged to the usage ledger")
                         .Register(*registry_)
                         .Add({});
  running_ = &BuildGauge().Name("moe_requests_running").Help("Sequences in the running batch").Register(*registry_).Add({});
  waiting_ = &BuildGauge().Name("moe_requests_waiting").Help("Sequences queued for admission").Register(*registry_).Add({});
  kv_usage_ = &BuildGauge().Name("moe_kv_cache_usage_ratio").Help("Used KV cache blocks / all blocks").Register(*registry_).Add({});
  prefix_hit_ratio_ = &BuildGauge()
                           .Name("moe_prefix_cache_hit_ratio")
                           .Help("Prompt tokens served from the prefix cache / prompt tokens looked up, since start")
                           .Register(*registry_)
                           .Add({});
  prefix_bytes_ = &BuildGauge()
                       .Name("moe_prefix_cache_bytes")
                       .Help("Bytes the prefix cache holds: its KV blocks, DeltaNet state copies and bookkeeping")
                       .Register(*registry_)
                       .Add({});
  prefix_limit_bytes_ = &BuildGauge()
                             .Name("moe_prefix_cache_limit_bytes")
                             .Help("The prefix cache's bound in bytes (prefix_cache_bytes)")
                             .Register(*registry_)
                             .Add({});
  prefix_entries_ =
      &BuildGauge().Name("moe_prefix_cache_entries").Help("Prefixes the prefix cache holds").Register(*registry_).Add({});
  auto& evictions = BuildCounter()
                        .Name("moe_prefix_cache_evictions_total")
                        .Help("Prefix cache entries evicted, by reason (bytes: over the bound, entries: over the "
                              "entry cap, pool: room for a new sequence in the KV pool)")
                        .Register(*registry_);
  prefix_evicted_bytes_ = &evictions.Add({{"reason", "bytes"}});
  prefix_evicted_entries_ = &evictions.Add({{"reason", "entries"}});
  prefix_evicted_pool_ = &evictions.Add({{"reason", "pool"}});
  prefix_uncached_ = &BuildCounter()
                          .Name("moe_prefix_cache_too_large_total")
                          .Help("Prefix snapshots not cached because one alone exceeds the prefix cache's bound")
                          .Register(*registry_)
                          .Add({});
  prefix_disk_bytes_ = &BuildGauge()
                            .Name("moe_prefix_disk_bytes")
                            .Help("Bytes of the prefix cache's files on disk (prefix_disk_dir)")
                            .Register(*registry_)
                            .Add({});
  prefix_disk_entries_ =
      &BuildGauge().Name("moe_prefix_disk_entries").Help("Prefixes the prefix cache holds on disk").Register(*registry_).Add({});
  auto disk_counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
  };
  prefix_disk_hits_ = disk_counter("moe_prefix_disk_hits_total", "Prompts whose prefix was read back from disk");
  prefix_disk_hit_tokens_ = disk_counter("moe_prefix_disk_hit_tokens_total", "Prompt tokens read back from disk");
  prefix_disk_writes_ = disk_counter("moe_prefix_disk_writes_total", "Prefix cache entries written to disk");
  prefix_disk_write_failures_ =
      disk_counter("moe_prefix_disk_write_failures_total", "Prefix cache entries that could not be written to disk");
  prefix_disk_refused_ = disk_counter("moe_prefix_disk_refused_total",
                                      "Prefix cache files refused and deleted (corrupt, truncated, another model's)");
  prefix_disk_evictions_ =
      disk_counter("moe_prefix_disk_evictions_total", "Prefix cache files deleted to stay within prefix_disk_bytes");
  prefix_disk_expired_ = disk_counter("moe_prefix_disk_expired_total",
                                      "Prefix cache files deleted as unused for longer than prefix_disk_max_age_seconds");
  draft_tokens_ = &BuildCounter()
                       .Name("moe_speculative_draft_tokens_total")
                       .Help("Draft tokens verified (outcome proposed) and of them accepted, by draft kind (mtp, lookup)")
                       .Register(*registry_);
  drafts_ = &BuildCounter()
                 .Name("moe_speculative_drafts_total")
                 .Help("Drafts verified, by draft kind (mtp, lookup)")
                 .Register(*registry_);
  expert_tokens_ = &BuildCounter()
                        .Name("moe_expert_tokens_total")
                        .Help("Tokens routed to each expert of each MoE layer (routing balance)")
                        .Register(*registry_);
  alert_deliveries_ = &BuildCounter()
                           .Name("moe_alert_deliveries_total")
                           .Help("Cost-alert hook deliveries by result")
                           .Register(*registry_);
  tool_call_parse_errors_ = &BuildCounter()
                                 .Name("moe_tool_call_parse_errors_total")
                                 .Help("Generated tool calls whose arguments are not a valid JSON object")
                                 .Register(*registry_)
                                 .Add({});
  output_format_errors_ = &BuildCounter()
                               .Name("moe_output_format_errors_total")
                               .Help("Answers whose generated output broke the chat format (answered with what was read before)")
                               .Register(*registry_)
                               .Add({});
  client_disconnects_ = &BuildCounter()
                             .Name("moe_client_disconnects_total")
                             .Help("Clients that went away before the end of their answer; their sequences were cancelled")
                             .Register(*registry_)
                             .Add({});
  http_open_connections_ =
      &BuildGauge().Name("moe_http_open_connections").Help("Open client connections").Register(*registry_).Add({});
  http_refusals_ = &BuildCounter()
                        .Name("moe_http_refusals_total")
                        .Help("Connections or requests the HTTP front cut off, by reason (connection_limit, "
                              "timeout, body_too_large, slow_reader)")
                        .Register(*registry_);
  tls_reloads_ = &BuildCounter()
                      .Name("moe_tls_certificate_reloads_total")
                      .Help("Times a changed TLS certificate/key pair was loaded without a restart")
                      .Register(*registry_)
                      .Add({});
  api_keys_reload_failures_ = &BuildCounter()
                                   .Name("moe_api_keys_reload_failures_total")
                                   .Help("Changed versions of the API keys file that did not load (each one makes "
                                         "the daemon refuse every key until a version loads)")
                                   .Register(*registry_)
                                   .Add({});
  api_keys_file_info_ = &BuildGauge()
                             .Name("moe_api_keys_file_info")
                             .Help("1, labelled with the SHA-256 of the API keys file as last loaded")
                             .Register(*registry_);
  api_keys_refusing_ = &BuildGauge()
                            .Name("moe_api_keys_refusing")
                            .Help("1 while every API key is refused because the keys file stopped loading")
                            .Register(*registry_)
                            .Add({});
  audit_unauthenticated_ = &BuildCounter()
                                .Name("moe_audit_unauthenticated_refusals_total")
                                .Help("Audited requests refused before a key was accepted (the audit log samples them)")
                                .Register(*registry_)
                                .Add({});
  audit_dropped_ = &BuildCounter()
                        .Name("moe_audit_lines_dropped_total")
                        .Help("Audit lines not written or deleted, by reason (sampled, full, rotated, write_error)")
                        .Register(*registry_);
  audit_full_ = &BuildGauge()
                     .Name("moe_audit_log_full")
                     .Help("1 while the audit log is full of lines within retention and new audited requests are refused")
                     .Register(*registry_)
                     .Add({});
}

void DaemonMetrics::UpdateFromAudit(const AuditStats& s) {
  audit_full_->Set(s.full ? 1 : 0);
  std::lock_guard lock(mu_);
  auto advance = [](prometheus::Counter& c, uint64_t now, uint64_t& last) {
    if (now > last) c.Increment(static_cast<double>(now - last));
    last = now;
  };
  advance(*audit_unauthenticated_, s.unauthenticated_refusals, last_audit_.unauthenticated_refusals);
  advance(audit_dropped_->Add({{"reason", "sampled"}}), s.dropped_sampled, last_audit_.dropped_sampled);
  advance(audit_dropped_->Add({{"reason", "full"}}), s.dropped_full, last_audit_.dropped_full);
  advance(audit_dropped_->Add({{"reason", "rotated"}}), s.dropped_rotated, last_audit_.dropped_rotated);
  advance(audit_dropped_->Add({{"reason", "write_error"}}), s.dropped_write_error, last_audit_.dropped_write_error);
}

void DaemonMetrics::UpdateApiKeys(uint64_t reload_failures, const std::string& file_sha256, bool refusing) {
  api_keys_refusing_->Set(refusing ? 1 : 0);
  std::lock_guard lock(mu_);
  if (reload_failures > last_api_keys_failures_) {
    api_keys_reload_failures_->Increment(static_cast<double>(reload_failures - last_api_keys_failures_));
  }
  last_api_keys_failures_ = reload_failures;
  if (file_sha256 != api_keys_sha256_) {
    // One sample: the version in force, never a history of them.
    if (!api_keys_sha256_.empty()) api_keys_file_info_->Remove(&api_keys_file_info_->Add({{"sha256", api_keys_sha256_}}));
    if (!file_sha256.empty()) api_keys_file_info_->Add({{"sha256", file_sha256}}).Set(1);
    api_keys_sha256_ = file_sha256;
  }
}

void DaemonMetrics::UpdateFromHttp(const HttpServerStats& s) {
  http_open_connections_->Set(static_cast<double>(s.open_connections));
  std::lock_guard lock(mu_);
  auto advance = [](prometheus::Counter& c, uint64_t now, uint64_t& last) {
    if (now > last) c.Increment(static_cast<double>(now - last));
    last = now;
  };
  advance(http_refusals_->Add({{"reason", "connection_limit"}}), s.refused_connections, last_http_.refused_connections);
  advance(http_refusals_->Add({{"reason", "timeout"}}), s.timed_out_connections, last_http_.timed_out_connections);
  advance(http_refusals_->Add({{"reason", "body_too_large"}}), s.oversized_bodies, last_http_.oversized_bodies);
  advance(http_refusals_->Add({{"reason", "slow_reader"}}), s.slow_readers_cut, last_http_.slow_readers_cut);
  advance(*tls_reloads_, s.tls_reloads, last_http_.tls_reloads);
}

void DaemonMetrics::RequestFinished(int http_status, double seconds) {
  requests_->Add({{"status", std::to_string(http_status)}}).Increment();
  request_duration_->Observe(seconds);
}
void DaemonMetrics::ObserveTimeToFirstToken(double seconds) { ttft_->Observe(seconds); }
void DaemonMetrics::ObserveInterTokenLatency(double seconds) { itl_->Observe(seconds); }
void DaemonMetrics::AddTokens(const std::string& tenant, const std::string& tier, const std::string& kind, uint64_t n) {
  tokens_->Add({{"tenant", tenant}, {"tier", tier}, {"kind", kind}}).Increment(static_cast<double>(n));
}
void DaemonMetrics::AddToolCallParseErrors(uint64_t n) { tool_call_parse_errors_->Increment(static_cast<double>(n)); }
void DaemonMetrics::AddOutputFormatError() { output_format_errors_->Increment(); }
void DaemonMetrics::AddClientDisconnect() { client_disconnects_->Increment(); }
void DaemonMetrics::AddCost(const std::string& tenant, const std::string& tier, double usd) {
  cost_->Add({{"tenant", tenant}, {"tier", tier}}).Increment(usd);
}
void DaemonMetrics::SetBudget(const std::string& tenant, const std::string& period, double limit_usd,
                              double remaining_ratio) {
  budget_limit_->Add({{"tenant", tenant}, {"period", period}}).Set(limit_usd);
  budget_remaining_->Add({{"tenant", tenant}, {"period", period}}).Set(remaining_ratio);
}
void DaemonMetrics::AddLedgerCommit(uint64_t requests) {
  ledger_commits_->Increment();
  ledger_charges_->Increment(static_cast<double>(requests));
}
void DaemonMetrics::AddAlertDelivery(const std::string& result) {
  alert_deliveries_->Add({{"result", result}}).Increment();
}

void DaemonMetrics::UpdateFromEngine(const engine::EngineMetrics& m) {
  running_->Set(m.running);
  waiting_->Set(m.waiting);
  kv_usage_->Set(m.cache_usage_ratio);
  prefix_hit_ratio_->Set(m.prefix_lookup_tokens ? static_cast<double>(m.prefix_hit_tokens) / m.prefix_lookup_tokens : 0.0);
  const engine::PrefixCacheStats& pc = m.prefix_cache;
  prefix_bytes_->Set(static_cast<double>(pc.bytes));
  prefix_limit_bytes_->Set(static_cast<double>(pc.limit_bytes));
  prefix_entries_->Set(static_cast<double>(pc.entries));
  std::lock_guard lock(mu_);
  auto advance_prefix = [](prometheus::Counter& c, uint64_t now, uint64_t& last) {
    if (now > last) c.Increment(static_cast<double>(now - last));
    last = now;
  };
  advance_prefix(*prefix_evicted_bytes_, pc.evicted_for_bytes, last_prefix_.evicted_for_bytes);
  advance_prefix(*prefix_evicted_entries_, pc.evicted_for_entries, last_prefix_.evicted_for_entries);
  advance_prefix(*prefix_evicted_pool_, pc.evicted_for_pool, last_prefix_.evicted_for_pool);
  advance_prefix(*prefix_uncached_, pc.too_large, last_prefix_.too_large);
  prefix_disk_bytes_->Set(static_cast<double>(pc.disk_bytes));
  prefix_disk_entries_->Set(static_cast<double>(pc.disk_entries));
  advance_prefix(*prefix_disk_hits_, pc.disk_hits, last_prefix_.disk_hits);
  advance_prefix(*prefix_disk_hit_tokens_, pc.disk_hit_tokens, last_prefix_.disk_hit_tokens);
  advance_prefix(*prefix_disk_writes_, pc.disk_writes, last_prefix_.disk_writes);
  advance_prefix(*prefix_disk_write_failures_, pc.disk_write_failures, last_prefix_.disk_write_failures);
  advance_prefix(*prefix_disk_refused_, pc.disk_refused, last_prefix_.disk_refused);
  advance_prefix(*prefix_disk_evictions_, pc.disk_evictions, last_prefix_.disk_evictions);
  advance_prefix(*prefix_disk_expired_, pc.disk_expired, last_prefix_.disk_expired);
  const auto advance_drafts = [&](const char* kind, const engine::DraftCounts& now, engine::DraftCounts& last) {
    advance_prefix(draft_tokens_->Add({{"kind", kind}, {"outcome", "proposed"}}), now.proposed, last.proposed);
    advance_prefix(draft_tokens_->Add({{"kind", kind}, {"outcome", "accepted"}}), now.accepted, last.accepted);
    advance_prefix(drafts_->Add({{"kind", kind}}), now.drafts, last.drafts);
  };
  advance_drafts("mtp", m.drafts_mtp, last_drafts_mtp_);
  advance_drafts("lookup", m.drafts_lookup, last_drafts_lookup_);
  if (last_expert_tokens_.size() < m.expert_tokens.size()) last_expert_tokens_.resize(m.expert_tokens.size());
  for (size_t layer = 0; layer < m.expert_tokens.size(); ++layer) {
    auto& last = last_expert_tokens_[layer];
    if (last.size() < m.expert_tokens[layer].size()) last.resize(m.expert_tokens[layer].size(), 0);
    for (size_t e = 0; e < m.expert_tokens[layer].size(); ++e) {
      uint64_t now = m.expert_tokens[layer][e];
      auto& c = expert_tokens_->Add({{"layer", std::to_string(layer)}, {"expert", std::to_string(e)}});
      if (now > last[e]) c.Increment(static_cast<double>(now - last[e]));
      last[e] = now;
    }
  }
}

std::string DaemonMetrics::Scrape() {
  prometheus::TextSerializer serializer;
  auto families = registry_->Collect();
  for (auto& f : storage::PullMetricsCollectable()->Collect()) families.push_back(std::move(f));
  return serializer.Serialize(families);
}

}  // namespace moeserve::daemon
