#include "moeserve/daemon/config_settings.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <type_traits>
#include <variant>
#include <sstream>

#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon {

namespace {

using enum SettingKind;

// The field a row stores its value in: c.*M1 (.*M2 ...).
template <auto... Members>
SettingField Field(DaemonConfig& c) {
  return &(c.*....*Members);
}

// A tier's reasoning tokens (the budgets exist once one tier is set; the
// order low <= medium <= high is checked when every setting is in).
template <int engine::ThinkingBudgets::*Tier>
SettingField ThinkingBudget(DaemonConfig& c) {
  if (!c.thinking_budgets) c.thinking_budgets = engine::ThinkingBudgets{};
  return &(*c.thinking_budgets.*Tier);
}

Status Wrong(const std::string& what) { return Fail(Error::InvalidArgument(what)); }

Status ParseKernels(DaemonConfig& c, const std::string& value) {
  if (value != "fast" && value != "reference") return Wrong("must be fast or reference");
  c.kernels = value;
  return Ok();
}

Status ParseExperts(DaemonConfig& c, const std::string& value) {
  if (value != "stored" && value != "mxfp4" && value != "bf16") return Wrong("must be stored, mxfp4 or bf16");
  c.experts = value;
  return Ok();
}

Status ParseIndexerScores(DaemonConfig& c, const std::string& value) {
  if (value != "exact" && value != "int8") return Wrong("must be exact or int8");
  c.indexer_scores = value;
  return Ok();
}

Status ParseSpeculative(DaemonConfig& c, const std::string& value) {
  const auto mode = engine::ParseSpeculativeMode(value);
  if (!mode) return Wrong("must be off, mtp, lookup or auto");
  c.speculative = *mode;
  return Ok();
}

Status ParseDefaultReasoningEffort(DaemonConfig& c, const std::string& value) {
  const auto e = ParseReasoningEffort(value);
  if (!e) return Wrong("must be low, medium or high");
  c.default_reasoning_effort = *e;
  return Ok();
}

Status ParseImageHosts(DaemonConfig& c, const std::string& value) {
  auto hosts = ParseImageHostList(value);
  if (!hosts) return Wrong(hosts.error().message());
  c.images.allowed_hosts = std::move(*hosts);
  return Ok();
}

Status ParseReplica(DaemonConfig& c, const std::string& value) {
  if (!ValidReplicaName(value)) return Wrong("must be 1-32 characters of a-z, 0-9 and '-'");
  c.sessions.replica = value;
  return Ok();
}

// "name=http://host:port,name=https://..." (empty items skipped).
Status ParsePeers(DaemonConfig& c, const std::string& value) {
  std::map<std::string, std::string> peers;
  std::stringstream in(value);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) return Wrong("must be name=http://host:port entries separated by commas");
    std::string name = item.substr(0, eq), url = item.substr(eq + 1);
    if (!ValidReplicaName(name)) return Wrong("peer name '" + name + "' must be 1-32 characters of a-z, 0-9 and '-'");
    if (!url.starts_with("http://") && !url.starts_with("https://"))
      return Wrong("peer " + name + ": the URL must start with http:// or https://");
    while (url.ends_with("/")) url.pop_back();
    peers[name] = url;
  }
  c.sessions.peers = std::move(peers);
  return Ok();
}

constexpr SettingSpec kSettings[] = {
    // The model and where it comes from.
    {"model", kText, "none: required (or `--model`)", "a directory, or an `s3://`, `https://` or `file://` URI",
     "the model to serve; a URI is pulled into `weights_cache` first",
     {Field<&DaemonConfig::model>, "must name a model directory"}},
    {"model_revision", kText, "`main`", "",
     "with a URI: the revision (the cache key, with the URI)",
     {Field<&DaemonConfig::model_revision>, "must name a revision"}},
    {"weights_cache", kText, "`/var/cache/moeserve`", "a directory",
     "with a URI: the node-local cache the puller fills",
     {Field<&DaemonConfig::weights_cache>, "must name a directory"}},
    {"weights_cache_limit_bytes", kInteger, "0", "0 to 2^60",
     "bound on the cache; models no process holds are evicted, least recently used first; 0: no bound",
     Field<&DaemonConfig::weights_cache_limit_bytes>},
    {"storage_endpoint", kText, "AWS", "a URL",
     "an S3-compatible endpoint (MinIO, Ceph RGW)",
     Field<&DaemonConfig::storage_endpoint>},
    {"storage_region", kText, "`AWS_REGION`, `AWS_DEFAULT_REGION`, else `us-east-1`", "",
     "the S3 region used in request signing",
     Field<&DaemonConfig::storage_region>},
    {"storage_ca_file", kText, "the system's", "a PEM file",
     "certificates to trust for `https://` and S3",
     Field<&DaemonConfig::storage_ca_file>},
    {"pull_connections", kInteger, "8", "1 to 256",
     "parallel ranged downloads of a pull",
     Field<&DaemonConfig::pull_connections>},
    // The HTTP front.
    {"host", kText, "`127.0.0.1`", "an address",
     "where to listen (`0.0.0.0` in a pod); not loopback needs `api_keys_file` or `allow_unauthenticated`",
     {Field<&DaemonConfig::host>, "must be an address such as 127.0.0.1 or 0.0.0.0"}},
    {"port", kInteger, "8000", "0 to 65535",
     "the TCP port to listen on (0: a free one, which the `listening on` log line names)",
     Field<&DaemonConfig::port>},
    {"served_model_name", kText, "the model directory's name", "",
     "the `id` in `/v1/models`, and what a request's `model` must equal",
     Field<&DaemonConfig::served_model_name>},
    {"api_keys_file", kText, "none: no authentication", "a file",
     "the keys file ([Authentication](#authentication)); followed while running",
     Field<&DaemonConfig::api_keys_file>},
    {"allow_unauthenticated", kBoolean, "false", "",
     "without `api_keys_file`, listen on a host other than loopback anyway",
     Field<&DaemonConfig::allow_unauthenticated>},
    {"metrics_token_file", kText, "none", "a file holding at least 16 characters",
     "a bearer token that opens `/metrics` (needs `api_keys_file`)",
     Field<&DaemonConfig::metrics_token_file>},
    {"tls_cert_file", kText, "none", "a PEM chain",
     "with `tls_key_file`, serve HTTPS only ([TLS](#tls))",
     Field<&DaemonConfig::tls_cert_file>},
    {"tls_key_file", kText, "none", "a PEM key",
     "the certificate's key",
     Field<&DaemonConfig::tls_key_file>},
    {"max_connections", kInteger, "16384", "1 to 1048576",
     "more are closed at accept",
     Field<&DaemonConfig::max_connections>},
    {"header_timeout_seconds", kNumber, "15", "0.1 to 3600",
     "a request head (and a keep-alive idle time) must arrive within this",
     Field<&DaemonConfig::header_timeout_seconds>},
    {"max_stream_buffer_bytes", kInteger, "1048576", "4096 to 2^32",
     "unsent SSE bytes before a client that does not read is cut off",
     Field<&DaemonConfig::max_stream_buffer_bytes>},
    {"http_threads", kInteger, "4", "1 to 256",
     "threads serving HTTP",
     Field<&DaemonConfig::http_threads>},
    {"max_body_bytes", kInteger, "8388608", "1024 to 2^32",
     "largest request body (413 past it)",
     Field<&DaemonConfig::max_body_bytes>},
    {"shutdown_grace_seconds", kNumber, "30", "0 to 3600",
     "on SIGTERM, how long running requests may finish",
     Field<&DaemonConfig::shutdown_grace_seconds>},
    // The engine and its scheduler.
    {"max_running", kInteger, "64", "1 to 4096",
     "sequences decoded together",
     Field<&DaemonConfig::max_running>},
    {"max_queue", kInteger, "256", "1 to 1048576",
     "waiting sequences before 503",
     Field<&DaemonConfig::max_queue>},
    {"max_concurrent_per_tenant", kInteger, "128", "1 to 1048576",
     "a tenant's requests in flight before 429 `too_many_concurrent_requests`",
     Field<&DaemonConfig::max_concurrent_per_tenant>},
    {"prefill_chunk_tokens", kInteger, "512", "1 to 1048576",
     "prompt tokens per step while other sequences decode",
     Field<&DaemonConfig::prefill_chunk_tokens>},
    {"prefill_chunk_tokens_idle", kInteger, "2048", "1 to 1048576",
     "prompt tokens per step while none does (gpt-oss: at most 512)",
     Field<&DaemonConfig::prefill_chunk_tokens_idle>},
    {"cache_tokens", kInteger, "0", "0 to 2^40",
     "KV pool size in tokens (at least `block_tokens`); 0: sized from memory, `cache_memory_share` of what is free once the weights are loaded ([Memory](operations.md#memory-and-the-context-window))",
     Field<&DaemonConfig::cache_tokens>},
    {"cache_memory_share", kNumber, "0.5", "0.01 to 1",
     "with `cache_tokens` 0: the share of free memory (MemAvailable, or the cgroup's memory.max less its usage when lower) less the model directory's bytes that the KV pool takes",
     Field<&DaemonConfig::cache_memory_share>},
    {"block_tokens", kInteger, "16", "1 to 4096",
     "tokens per KV block",
     Field<&DaemonConfig::block_tokens>},
    {"prefix_cache", kBoolean, "true", "",
     "reuse the KV of prompts' common prefixes (`--no-prefix-cache` turns it off)",
     Field<&DaemonConfig::prefix_cache>},
    {"prefix_cache_bytes", kInteger, "1073741824", "0 to 2^50",
     "bound on what the prefix cache holds (KV blocks, DeltaNet state copies, bookkeeping), least recently used evicted; 0: no bound",
     Field<&DaemonConfig::prefix_cache_bytes>},
    {"prefix_disk_dir", kText, "none: off", "a directory on the node",
     "the prefix cache's tier on disk: entries evicted from memory are written here and read back by later prompts, across restarts ([Prefix cache on disk](operations.md#prefix-cache-on-disk))",
     Field<&DaemonConfig::prefix_disk_dir>},
    {"prefix_disk_bytes", kInteger, "17179869184", "1 to 2^50",
     "bound on the files under `prefix_disk_dir`, least recently used deleted",
     Field<&DaemonConfig::prefix_disk_bytes>},
    {"prefix_disk_max_age_seconds", kNumber, "0", "0 to 31536000",
     "files under `prefix_disk_dir` unused for longer than this are deleted, at start and as prompts arrive; 0: no bound by age",
     Field<&DaemonConfig::prefix_disk_max_age_seconds>},
    {"public_system_prompt", kText, "none", "any text",
     "a system message the deployment shares: a conversation opening with exactly it reuses its cached state across tenants; every other prefix is cached per tenant",
     Field<&DaemonConfig::public_system_prompt>},
    {"threads", kInteger, "0", "0 to 4096",
     "compute threads; 0: every core",
     Field<&DaemonConfig::threads>},
    {"max_context", kInteger, "0", "0 to 2147483647",
     "context window in tokens; 0: the model's, within what the KV pool holds (`cache_tokens`)",
     Field<&DaemonConfig::max_context>},
    {"kernels", kText, "`fast`", "`fast` or `reference`",
     "the kernel family (`reference`: the plain implementations, for checking)",
     ParseKernels},
    {"experts", kText, "`stored`", "`stored`, `mxfp4` or `bf16`",
     "the routed experts' format in memory: `stored` as the checkpoint holds them; `mxfp4` requantises the BF16 experts of a DeepSeek-V3.2, Qwen3-Next or `moe-dsa-v1` checkpoint at load (a directory `moe-daemon publish --experts mxfp4` converted holds them requantised already; gpt-oss's are MXFP4 as published: [model format 1.3](model-format.md#13-routed-experts-per-family-as-held-at-load-at-publish-and-what-mxfp4-costs)); a format a model neither holds nor converts to is refused at load",
     ParseExperts},
    {"indexer_scores", kText, "`exact`", "`exact` or `int8`",
     "how the DSA indexer scores cached keys: `exact` fp32 keys and products; `int8` keeps each indexer key int8 in the KV pool (a quarter of its bytes) and scores with integer dot products, several times faster at long contexts, the selected keys close to but not always the exact path's ([operations](operations.md#int8-indexer-scores)); no effect on models without DSA layers",
     ParseIndexerScores},
    {"deterministic", kBoolean, "false", "",
     "batch-invariant decode: a request's tokens do not depend on what else runs ([operations](operations.md#deterministic-decode)); slower prefill",
     Field<&DaemonConfig::deterministic>},
    {"bf16_activations", kBoolean, "false", "",
     "prefill products of 32 rows or more with MXFP4 or BF16 weights take activations rounded to BF16: AVX-512 BF16 dot products, or Intel AMX tiles where the CPU has them, about twice the fp32 speed or more; a BF16 path, its logits further from the reference than fp32's ([operations](operations.md#bf16-activations)); `deterministic` overrides it",
     Field<&DaemonConfig::bf16_activations>},
    {"speculative", kText, "`off`", "`off`, `mtp`, `lookup` or `auto`",
     "speculative decoding for requests that name none (their `speculative` field wins): drafts from the model's multi-token-prediction layers (`mtp`), copied from the context (`lookup`), or lookup and then MTP (`auto`), each verified by the model in one pass; greedy output stays the model's own choice, bit for bit with `deterministic` ([Speculative decoding](operations.md#speculative-decoding)); `mtp` is refused at start for a model without MTP layers",
     ParseSpeculative},
    {"draft_tokens", kInteger, "3", "1 to 4",
     "tokens one draft proposes at most",
     Field<&DaemonConfig::draft_tokens>},
    {"speculative_max_batch", kInteger, "2", "0 to 4096",
     "a step with more decoding sequences than this verifies no drafts: the batch alone keeps the products busy",
     Field<&DaemonConfig::speculative_max_batch>},
    // Requests' defaults and bounds.
    {"default_max_tokens", kInteger, "1024", "1 to 2^30",
     "`max_tokens` of a request that sets none (capped by the context left)",
     Field<&DaemonConfig::default_max_tokens>},
    {"default_reasoning_effort", kText, "`medium`", "`low`, `medium`, `high`",
     "the tier of a request that names none",
     ParseDefaultReasoningEffort},
    {"thinking_budgets.low", kInteger, "the model's config", "0 to 2^30",
     "reasoning tokens at tier low (`thinking_budgets: {low: 256, medium: 2048, high: 16384}`)",
     ThinkingBudget<&engine::ThinkingBudgets::low>},
    {"thinking_budgets.medium", kInteger, "the model's config", "0 to 2^30, at least `low`",
     "reasoning tokens at tier medium",
     ThinkingBudget<&engine::ThinkingBudgets::medium>},
    {"thinking_budgets.high", kInteger, "the model's config", "0 to 2^30, at least `medium`",
     "reasoning tokens at tier high",
     ThinkingBudget<&engine::ThinkingBudgets::high>},
    {"constrained_max_string_bytes", kInteger, "256", "1 to 1048576",
     "longest string in a constrained tool call or `json_object` value",
     Field<&DaemonConfig::constrained_max_string_bytes>},
    // Image parts (image_decode.hpp, image_prompt.hpp).
    {"image_max_bytes", kInteger, "20971520", "1 to 2^30",
     "an image part's encoded size (base64-decoded, or fetched); checked on the base64 length before decoding (a "
     "data: URL is also bounded by `max_body_bytes`)",
     Field<&DaemonConfig::images, &ImageUrlPolicy::limits, &ImageLimits::max_bytes>},
    {"image_max_pixels", kInteger, "16777216", "1 to 2^32",
     "an image's width x height as its header declares it, checked before any pixel buffer exists",
     Field<&DaemonConfig::images, &ImageUrlPolicy::limits, &ImageLimits::max_pixels>},
    {"image_max_per_request", kInteger, "8", "0 to 1024",
     "image parts in one request's messages (history included; a session turn or a continued response counts only its new images); 0 refuses every image",
     Field<&DaemonConfig::images, &ImageUrlPolicy::max_per_request>},
    {"image_url_allowed_hosts", kText, "none", "comma-separated host names or IP literals (`[v6]`)",
     "hosts whose `http(s)` image URLs are fetched; none: only `data:` URLs",
     ParseImageHosts},
    {"image_url_allow_private_addresses", kBoolean, "false", "",
     "let those fetches connect to loopback, link-local and private addresses (refused otherwise, as for hooks)",
     Field<&DaemonConfig::images, &ImageUrlPolicy::allow_private_addresses>},
    {"image_fetch_timeout_seconds", kNumber, "10", "0.1 to 600",
     "the whole fetch of one image URL",
     Field<&DaemonConfig::images, &ImageUrlPolicy::fetch_timeout_seconds>},
    {"image_fetch_request_timeout_seconds", kNumber, "20", "0.1 to 3600",
     "every fetch of one request together (each also within `image_fetch_timeout_seconds`); a request past it is "
     "refused (400) naming it",
     Field<&DaemonConfig::images, &ImageUrlPolicy::fetch_request_timeout_seconds>},
    // Image work (image_work.hpp): off the HTTP threads, after admission.
    {"image_workers", kInteger, "4", "1 to 256",
     "threads that fetch and decode requests' images (a request's images are one job, run after its admission)",
     Field<&DaemonConfig::image_work, &ImageWorkSettings::workers>},
    {"image_tenant_max_in_flight", kInteger, "2", "1 to 4096",
     "one tenant's requests whose images are being fetched or decoded, or wait for a worker; more are refused (429 "
     "`too_many_image_requests`)",
     Field<&DaemonConfig::image_work, &ImageWorkSettings::tenant_max_in_flight>},
    {"image_max_queued", kInteger, "64", "1 to 65536",
     "requests waiting for an image worker, every tenant's; more are refused (503 `image_workers_busy`)",
     Field<&DaemonConfig::image_work, &ImageWorkSettings::max_queued>},
    {"image_decoded_cache_bytes", kInteger, "268435456", "0 to 2^40",
     "decoded pixels of images kept by tenant and content hash (least recently used out first), so that a "
     "continued session or response does not decode its kept images again; 0 keeps none",
     Field<&DaemonConfig::image_work, &ImageWorkSettings::decoded_cache_bytes>},
    // Usage, budgets and hooks (the sections pricing, budgets, hooks aside).
    {"state_dir", kText, "none", "a directory",
     "durable state: the ledger `usage.sqlite3` and sessions `sessions.sqlite3` in it; created if missing",
     Field<&DaemonConfig::state_dir>},
    {"ledger_path", kText, "`<state_dir>/usage.sqlite3`", "a file",
     "the usage ledger (SQLite); with neither it and `state_dir`, the ledger is in memory and lost on restart",
     Field<&DaemonConfig::ledger_path>},
    {"policy_name", kText, "`standalone`", "",
     "`policy` in alert payloads; under the operator, the QuotaPolicy's name",
     {Field<&DaemonConfig::budget, &BudgetPolicy::policy_name>, "must not be empty"}},
    {"deployment_name", kText, "`served_model_name`", "",
     "`deployment` in alert payloads",
     Field<&DaemonConfig::budget, &BudgetPolicy::deployment_name>},
    {"hook_retry_initial_seconds", kNumber, "5", "0.01 to 3600",
     "wait after a failed delivery; doubles after each failure, with jitter",
     Field<&DaemonConfig::hook_retry_initial_seconds>},
    {"hook_retry_max_seconds", kNumber, "600", "0.01 to 86400",
     "longest wait between two attempts",
     Field<&DaemonConfig::hook_retry_max_seconds>},
    {"hook_give_up_seconds", kNumber, "86400", "3600 to 2592000",
     "a delivery is retried this long after its alert fired, then given up (`moe_alert_deliveries_total{result=\"failed\"}`)",
     Field<&DaemonConfig::hook_give_up_seconds>},
    {"spend_from_operator", kBoolean, "false", "",
     "under moe-operator: budgets follow the global spend it hands back; no hooks allowed ([Under the operator](#under-the-operator-global-spend))",
     Field<&DaemonConfig::spend_from_operator>},
    {"global_spend_file", kText, "none", "a file",
     "that spend as last recorded, read at start (may be missing)",
     Field<&DaemonConfig::global_spend_file>},
    // Server-kept sessions (session_settings.hpp).
    {"session_db_path", kText, "`<state_dir>/sessions.sqlite3`", "a file",
     "the session store (SQLite); with neither it and `state_dir`, in memory",
     Field<&DaemonConfig::sessions, &SessionSettings::db_path>},
    {"session_idle_seconds", kNumber, "86400", "1 to 31536000",
     "a session unused this long is deleted",
     Field<&DaemonConfig::sessions, &SessionSettings::idle_seconds>},
    {"session_tenant_quota_bytes", kInteger, "268435456", "0 to 2^50",
     "storage per tenant; a turn or session past it is refused (403)",
     Field<&DaemonConfig::sessions, &SessionSettings::tenant_quota_bytes>},
    {"session_total_quota_bytes", kInteger, "805306368", "0 to 2^50",
     "every tenant's sessions and stored responses together; a turn, session or stored response past it is refused (507); keep it below the state volume so the ledger has room",
     Field<&DaemonConfig::sessions, &SessionSettings::total_quota_bytes>},
    {"session_image_max_bytes", kInteger, "67108864", "0 to 2^50",
     "encoded bytes of the images one session keeps (each distinct image once); a turn past it is refused (400)",
     Field<&DaemonConfig::sessions, &SessionSettings::image_max_bytes>},
    {"session_context_tokens", kInteger, "0", "0 to 2^31",
     "context budget of a session's prompt plus answer; 0: `max_context`",
     Field<&DaemonConfig::sessions, &SessionSettings::context_tokens>},
    {"session_keep_exchanges", kInteger, "2", "1 to 1048576",
     "newest exchanges never compressed (the new turn's included)",
     Field<&DaemonConfig::sessions, &SessionSettings::keep_exchanges>},
    {"session_summary_max_tokens", kInteger, "256", "16 to 1048576",
     "longest summary (the model's, and the extractive one)",
     Field<&DaemonConfig::sessions, &SessionSettings::summary_max_tokens>},
    {"session_replica", kText, "`local`", "1 to 32 of `a-z`, `0-9`, `-`",
     "this replica's name, part of the ids of the sessions it creates",
     ParseReplica},
    {"session_peers", kText, "none", "`name=http://host:port,name=https://...`",
     "the other replicas: a turn for one of their sessions is forwarded there",
     ParsePeers},
    {"session_pin_share", kNumber, "0.5", "0 to 1",
     "share of `prefix_cache_bytes` that active sessions may keep pinned",
     Field<&DaemonConfig::sessions, &SessionSettings::pin_share>},
    {"session_pin_seconds", kNumber, "600", "0 to 86400",
     "a session stays active (its cache pinned) this long after a turn",
     Field<&DaemonConfig::sessions, &SessionSettings::pin_seconds>},
    {"session_forward_max_in_flight", kInteger, "32", "1 to 4096",
     "requests forwarded to other replicas at once (a thread each); more get 503 at once",
     Field<&DaemonConfig::sessions, &SessionSettings::forward_max_in_flight>},
    {"session_forward_deadline_seconds", kNumber, "600", "0.1 to 86400",
     "one forward to another replica, connection to last byte (a streamed turn included); past it, 503",
     Field<&DaemonConfig::sessions, &SessionSettings::forward_deadline_seconds>},
    // The audit log (audit_log.hpp).
    {"audit_dir", kText, "`<state_dir>/audit`", "a directory",
     "the audit log ([Audit log](#audit-log)); with neither it nor `state_dir`, none is kept",
     Field<&DaemonConfig::audit, &AuditSettings::dir>},
    {"audit_log_content", kBoolean, "false", "",
     "also write each request's body and the answer's text to the audit log",
     Field<&DaemonConfig::audit, &AuditSettings::log_content>},
    {"audit_max_file_bytes", kInteger, "16777216", "4096 to 2^40",
     "`audit.log` is rotated past this size",
     Field<&DaemonConfig::audit, &AuditSettings::max_file_bytes>},
    {"audit_max_files", kInteger, "4", "1 to 1000",
     "rotated audit files kept besides `audit.log` (the oldest is deleted, unless it holds an authenticated line within `audit_retention_hours`)",
     Field<&DaemonConfig::audit, &AuditSettings::max_files>},
    {"audit_retention_hours", kNumber, "1", "0 to 87600",
     "an authenticated audit line is never deleted younger than this; when rotation would have to, new audited requests get 503 `audit_log_full` (0: rotation deletes the oldest file whatever it holds)",
     Field<&DaemonConfig::audit, &AuditSettings::retention_hours>},
    {"audit_unauthenticated_lines_per_second", kNumber, "1", "0 to 1000",
     "audit lines written for requests refused before a key was accepted (a sample; each counts those skipped before it); all are counted in `moe_audit_unauthenticated_refusals_total`",
     Field<&DaemonConfig::audit, &AuditSettings::unauthenticated_lines_per_second>},
    {"audit_tenant_max_share", kNumber, "0.5", "0.01 to 1",
     "while the audit log is full, a tenant whose lines within `audit_retention_hours` hold this share of its bound (`audit_max_file_bytes` x (`audit_max_files` + 1)) gets 503 `audit_log_full`; the other tenants are served on until `audit.log` has grown a reserve of `audit_max_file_bytes`",
     Field<&DaemonConfig::audit, &AuditSettings::tenant_max_share>},
};

}  // namespace

std::span<const SettingSpec> DaemonSettings() { return kSettings; }

std::string_view SettingKindName(SettingKind kind) {
  switch (kind) {
    case kText: return "text";
    case kInteger: return "integer";
    case kNumber: return "number";
    case kBoolean: return "boolean";
  }
  return "?";
}

namespace {

// "N" or "2^N".
std::optional<double> RangeBound(std::string_view text) {
  const bool power = text.starts_with("2^");
  if (power) text.remove_prefix(2);
  double v = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
  return power ? std::ldexp(1.0, static_cast<int>(v)) : v;
}

// Numbers as the messages print them: integers whole, others as written.
std::string FormatBound(double v) {
  std::ostringstream out;
  if (v == std::floor(v) && std::fabs(v) < 9.3e18) out << static_cast<int64_t>(v);
  else out << v;
  return out.str();
}

template <class T>
Status Store(SettingField field, T value) {
  return std::visit(
      [&](auto* slot) -> Status {
        using Slot = std::remove_pointer_t<decltype(slot)>;
        if constexpr (std::is_same_v<Slot, std::string> != std::is_same_v<T, std::string> ||
                      std::is_same_v<Slot, bool> != std::is_same_v<T, bool>) {
          return Fail(Error::Internal("the setting's field does not hold its kind"));
        } else {
          *slot = static_cast<Slot>(value);
          return Ok();
        }
      },
      field);
}

}  // namespace

Status CheckSettingRow(const SettingSpec& spec) {
  const std::string key(spec.key);
  auto wrong = [&](const std::string& what) { return Fail(Error::Internal("setting " + key + ": " + what)); };
  if ((spec.target.field == nullptr) == (spec.target.parse == nullptr)) return wrong("needs exactly one of field, parse");
  if (spec.target.parse) {
    if (spec.kind != SettingKind::kText) return wrong("a parse function is for text settings");
    return Ok();
  }
  DaemonConfig c;
  const SettingField field = spec.target.field(c);
  const auto range = ParseSettingRange(spec.range);
  return std::visit(
      [&](auto* slot) -> Status {
        using Slot = std::remove_pointer_t<decltype(slot)>;
        switch (spec.kind) {
          case SettingKind::kText:
            return std::is_same_v<Slot, std::string> ? Ok() : wrong("a text needs a std::string field");
          case SettingKind::kBoolean:
            return std::is_same_v<Slot, bool> ? Ok() : wrong("a boolean needs a bool field");
          case SettingKind::kNumber:
            if (!std::is_same_v<Slot, double>) return wrong("a number needs a double field");
            return range ? Ok() : wrong("a number's range must read \"A to B\"");
          case SettingKind::kInteger:
            if constexpr (std::is_integral_v<Slot> && !std::is_same_v<Slot, bool>) {
              if (!range) return wrong("an integer's range must read \"A to B\"");
              if (range->lo < static_cast<double>(std::numeric_limits<Slot>::min()) ||
                  range->hi > static_cast<double>(std::numeric_limits<Slot>::max()))
                return wrong("its range does not fit its field's type");
              if (range->lo != std::floor(range->lo) || range->hi != std::floor(range->hi))
                return wrong("an integer's bounds must be whole");
              return Ok();
            } else {
              return wrong("an integer needs an integer field");
            }
        }
        return wrong("unknown kind");
      },
      field);
}

std::optional<SettingRange> ParseSettingRange(std::string_view range) {
  const auto to = range.find(" to ");
  if (to == std::string_view::npos) return std::nullopt;
  std::string_view hi = range.substr(to + 4);
  if (const auto comma = hi.find(','); comma != std::string_view::npos) hi = hi.substr(0, comma);
  const auto lo_v = RangeBound(range.substr(0, to)), hi_v = RangeBound(hi);
  if (!lo_v || !hi_v || *lo_v > *hi_v) return std::nullopt;
  return SettingRange{*lo_v, *hi_v};
}

Status ApplySettingValue(DaemonConfig& c, const SettingSpec& spec, const std::string& value, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return Fail(Error::InvalidArgument(where + ": " + std::string(spec.key) + ": " + what + " (got '" + value + "')"));
  };
  if (spec.target.parse) {
    Status st = spec.target.parse(c, value);
    if (!st) return bad(st.error().message());
    return Ok();
  }
  const SettingField field = spec.target.field(c);
  const bool seconds = spec.key.ends_with("_seconds");
  switch (spec.kind) {
    case SettingKind::kText:
      if (value.empty() && !spec.target.if_empty.empty()) return bad(std::string(spec.target.if_empty));
      return Store(field, value);
    case SettingKind::kBoolean:
      if (value == "true" || value == "1" || value == "yes") return Store(field, true);
      if (value == "false" || value == "0" || value == "no") return Store(field, false);
      return bad("must be true or false");
    case SettingKind::kInteger: {
      const auto range = ParseSettingRange(spec.range);
      if (!range) return Fail(Error::Internal(std::string(spec.key) + ": its row states no numeric range"));
      int64_t v = 0;
      const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || p != value.data() + value.size()) return bad("must be an integer");
      // The bounds are whole and inside int64 (CheckSettingRow): compare exactly.
      if (v < static_cast<int64_t>(range->lo) || v > static_cast<int64_t>(range->hi))
        return bad("must be between " + FormatBound(range->lo) + " and " + FormatBound(range->hi));
      return Store(field, v);
    }
    case SettingKind::kNumber: {
      const auto range = ParseSettingRange(spec.range);
      if (!range) return Fail(Error::Internal(std::string(spec.key) + ": its row states no numeric range"));
      const std::string what = seconds ? "must be a number of seconds" : "must be a number";
      double v = 0;
      try {
        size_t used = 0;
        v = std::stod(value, &used);
        if (used != value.size()) return bad(what);
      } catch (const std::exception&) {
        return bad(what);
      }
      if (!(v >= range->lo && v <= range->hi))
        return bad(what + " between " + FormatBound(range->lo) + " and " + FormatBound(range->hi));
      return Store(field, v);
    }
  }
  return Fail(Error::Internal(std::string(spec.key) + ": unknown setting kind"));
}

const SettingSpec* FindDaemonSetting(std::string_view key) {
  auto it = std::find_if(std::begin(kSettings), std::end(kSettings), [&](const SettingSpec& s) { return s.key == key; });
  return it == std::end(kSettings) ? nullptr : &*it;
}

}  // namespace moeserve::daemon
