// The daemon's Prometheus metrics (api.md "Metrics"), exposed as text on
// GET /metrics by Scrape(). Cost, budget and alert-delivery samples come from
// the budget service (budget_service.hpp) as requests are charged.
//
// The weight puller's counters (moe_weights_bytes_pulled_total, ...) live in
// storage/pull_metrics and are appended to every scrape.
//
// Engine-side numbers (running, waiting, cache usage, prefix hits, the prefix
// cache's bytes and evictions, expert routing) are pulled from Engine::Metrics() at scrape time; counters the
// engine reports as running totals are advanced by their difference.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "moeserve/daemon/audit/audit_log.hpp"
#include "moeserve/daemon/http/http_server.hpp"
#include "moeserve/engine/engine.hpp"

namespace moeserve::daemon {

class DaemonMetrics {
 public:
  DaemonMetrics();

  // One finished chat completion (or refused request) with its HTTP status.
  void RequestFinished(int http_status, double seconds);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  // kind: input | cached_input | output | reasoning
  void AddTokens(const std::string& tenant, const std::string& tier, const std::string& kind, uint64_t n);
  void AddToolCallParseErrors(uint64_t n);
  void AddOutputFormatError();
  void AddClientDisconnect();
  // Budgets (budget_service.hpp): a charged request's cost; a budget's limit
  // and the share of it left in the current period; a hook delivery attempt
  // (result: delivered | retry | refused | failed).
  void AddCost(const std::string& tenant, const std::string& tier, double usd);
  void SetBudget(const std::string& tenant, const std::string& period, double limit_usd, double remaining_ratio);
  void AddAlertDelivery(const std::string& result);
  // One transaction of the usage ledger committed, charging `requests`.
  void AddLedgerCommit(uint64_t requests);

  void UpdateFromEngine(const engine::EngineMetrics& m);
  // The HTTP front's connection counts and cut-offs (running totals).
  void UpdateFromHttp(const HttpServerStats& s);
  // The API keys file (api_keys_reloader.hpp): changed versions that did not
  // load (a running total), the SHA-256 of the version in force, and whether
  // every key is being refused because the file stopped loading.
  void UpdateApiKeys(uint64_t reload_failures, const std::string& file_sha256, bool refusing);
  // The audit log's refusals without a key, lines dropped by reason and
  // whether it is full (audit_log.hpp; running totals).
  void UpdateFromAudit(const AuditStats& s);
  // Text exposition format 0.0.4.
  std::string Scrape();

  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Histogram* request_duration_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Family<prometheus::Counter>* tokens_;
  prometheus::Family<prometheus::Counter>* cost_;
  prometheus::Family<prometheus::Gauge>* budget_remaining_;
  prometheus::Family<prometheus::Gauge>* budget_limit_;
  prometheus::Counter* ledger_commits_;
  prometheus::Counter* ledger_charges_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* prefix_hit_ratio_;
  prometheus::Gauge* prefix_bytes_;
  prometheus::Gauge* prefix_limit_bytes_;
  prometheus::Gauge* prefix_entries_;
  prometheus::Counter* prefix_evicted_bytes_;
  prometheus::Counter* prefix_evicted_entries_;
  prometheus::Counter* prefix_evicted_pool_;
  prometheus::Counter* prefix_uncached_;
  // The prefix cache's tier on disk (prefix_disk_dir).
  prometheus::Gauge* prefix_disk_bytes_;
  prometheus::Gauge* prefix_disk_entries_;
  prometheus::Counter* prefix_disk_hits_;
  prometheus::Counter* prefix_disk_hit_tokens_;
  prometheus::Counter* prefix_disk_writes_;
  prometheus::Counter* prefix_disk_write_failures_;
  prometheus::Counter* prefix_disk_refused_;
  prometheus::Counter* prefix_disk_evictions_;
  prometheus::Counter* prefix_disk_expired_;
  prometheus::Family<prometheus::Counter>* expert_tokens_;
  // Speculative decoding, by draft kind (mtp, lookup).
  prometheus::Family<prometheus::Counter>* draft_tokens_;  // {kind, outcome=proposed|accepted}
  prometheus::Family<prometheus::Counter>* drafts_;        // {kind}
  prometheus::Family<prometheus::Counter>* alert_deliveries_;
  prometheus::Counter* tool_call_parse_errors_;
  prometheus::Counter* output_format_errors_;
  prometheus::Counter* client_disconnects_;
  prometheus::Gauge* http_open_connections_;
  prometheus::Family<prometheus::Counter>* http_refusals_;
  prometheus::Counter* tls_reloads_;
  prometheus::Counter* api_keys_reload_failures_;
  prometheus::Family<prometheus::Gauge>* api_keys_file_info_;
  prometheus::Gauge* api_keys_refusing_;
  prometheus::Counter* audit_unauthenticated_;
  prometheus::Family<prometheus::Counter>* audit_dropped_;
  prometheus::Gauge* audit_full_;

  std::mutex mu_;  // guards the last-seen engine totals
  std::vector<std::vector<uint64_t>> last_expert_tokens_;
  engine::PrefixCacheStats last_prefix_;
  engine::DraftCounts last_drafts_mtp_, last_drafts_lookup_;
  HttpServerStats last_http_;
  uint64_t last_api_keys_failures_ = 0;
  std::string api_keys_sha256_;  // the label of the file-info sample in place
  AuditStats last_audit_;
};

}  // namespace moeserve::daemon
