#include "moeserve/daemon/config_settings.hpp"

#include <algorithm>

namespace moeserve::daemon {

namespace {

using enum SettingKind;

constexpr SettingSpec kSettings[] = {
    // The model and where it comes from.
    {"model", kText, "none: required (or `--model`)", "a directory, or an `s3://`, `https://` or `file://` URI",
     "the model to serve; a URI is pulled into `weights_cache` first"},
    {"model_revision", kText, "`main`", "",
     "with a URI: the revision (the cache key, with the URI)"},
    {"weights_cache", kText, "`/var/cache/moeserve`", "a directory",
     "with a URI: the node-local cache the puller fills"},
    {"weights_cache_limit_bytes", kInteger, "0", "0 to 2^60",
     "bound on the cache; models no process holds are evicted, least recently used first; 0: no bound"},
    {"storage_endpoint", kText, "AWS", "a URL",
     "an S3-compatible endpoint (MinIO, Ceph RGW)"},
    {"storage_region", kText, "`AWS_REGION`, `AWS_DEFAULT_REGION`, else `us-east-1`", "",
     "the S3 region used in request signing"},
    {"storage_ca_file", kText, "the system's", "a PEM file",
     "certificates to trust for `https://` and S3"},
    {"pull_connections", kInteger, "8", "1 to 256",
     "parallel ranged downloads of a pull"},
    // The HTTP front.
    {"host", kText, "`127.0.0.1`", "an address",
     "where to listen (`0.0.0.0` in a pod); not loopback needs `api_keys_file` or `allow_unauthenticated`"},
    {"port", kInteger, "8000", "1 to 65535",
     "the TCP port to listen on"},
    {"served_model_name", kText, "the model directory's name", "",
     "the `id` in `/v1/models`, and what a request's `model` must equal"},
    {"api_keys_file", kText, "none: no authentication", "a file",
     "the keys file ([Authentication](#authentication)); followed while running"},
    {"allow_unauthenticated", kBoolean, "false", "",
     "without `api_keys_file`, listen on a host other than loopback anyway"},
    {"metrics_token_file", kText, "none", "a file holding at least 16 characters",
     "a bearer token that opens `/metrics` (needs `api_keys_file`)"},
    {"tls_cert_file", kText, "none", "a PEM chain",
     "with `tls_key_file`, serve HTTPS only ([TLS](#tls))"},
    {"tls_key_file", kText, "none", "a PEM key",
     "the certificate's key"},
    {"max_connections", kInteger, "16384", "1 to 1048576",
     "more are closed at accept"},
    {"header_timeout_seconds", kNumber, "15", "0.1 to 3600",
     "a request head (and a keep-alive idle time) must arrive within this"},
    {"max_stream_buffer_bytes", kInteger, "1048576", "4096 to 2^32",
     "unsent SSE bytes before a client that does not read is cut off"},
    {"http_threads", kInteger, "4", "1 to 256",
     "threads serving HTTP"},
    {"max_body_bytes", kInteger, "8388608", "1024 to 2^32",
     "largest request body (413 past it)"},
    {"shutdown_grace_seconds", kNumber, "30", "0 to 3600",
     "on SIGTERM, how long running requests may finish"},
    // The engine and its scheduler.
    {"max_running", kInteger, "64", "1 to 4096",
     "sequences decoded together"},
    {"max_queue", kInteger, "256", "1 to 1048576",
     "waiting sequences before 503"},
    {"max_concurrent_per_tenant", kInteger, "128", "1 to 1048576",
     "a tenant's requests in flight before 429 `too_many_concurrent_requests`"},
    {"prefill_chunk_tokens", kInteger, "512", "1 to 1048576",
     "prompt tokens per step while other sequences decode"},
    {"prefill_chunk_tokens_idle", kInteger, "2048", "1 to 1048576",
     "prompt tokens per step while none does"},
    {"cache_tokens", kInteger, "65536", "16 to 2^40",
     "KV pool size in tokens"},
    {"block_tokens", kInteger, "16", "1 to 4096",
     "tokens per KV block"},
    {"prefix_cache", kBoolean, "true", "",
     "reuse the KV of prompts' common prefixes (`--no-prefix-cache` turns it off)"},
    {"prefix_cache_bytes", kInteger, "1073741824", "0 to 2^50",
     "bound on what the prefix cache holds (KV blocks, DeltaNet state copies, bookkeeping), least recently used evicted; 0: no bound"},
    {"public_system_prompt", kText, "none", "any text",
     "a system message the deployment shares: a conversation opening with exactly it reuses its cached state across tenants; every other prefix is cached per tenant"},
    {"threads", kInteger, "0", "0 to 4096",
     "compute threads; 0: every core"},
    {"max_context", kInteger, "0", "0 to 2^31",
     "context window in tokens; 0: the model's"},
    {"kernels", kText, "`fast`", "`fast` or `reference`",
     "the kernel family (`reference`: the plain implementations, for checking)"},
    {"experts", kText, "`stored`", "`stored`, `mxfp4` or `bf16`",
     "the routed experts' format in memory: `stored` as the checkpoint holds them; `mxfp4` requantises a DeepSeek-V3.2 checkpoint's experts at load ([model format](model-format.md#13-the-deepseek-v32-family)); a model of another family whose experts are stored otherwise is refused at load"},
    {"deterministic", kBoolean, "false", "",
     "batch-invariant decode: a request's tokens do not depend on what else runs ([operations](operations.md#deterministic-decode)); slower prefill"},
    // Requests' defaults and bounds.
    {"default_max_tokens", kInteger, "1024", "1 to 2^30",
     "`max_tokens` of a request that sets none (capped by the context left)"},
    {"default_reasoning_effort", kText, "`medium`", "`low`, `medium`, `high`",
     "the tier of a request that names none"},
    {"thinking_budgets.low", kInteger, "the model's config", "0 to 2^30",
     "reasoning tokens at tier low (`thinking_budgets: {low: 256, medium: 2048, high: 16384}`)"},
    {"thinking_budgets.medium", kInteger, "the model's config", "0 to 2^30, at least `low`",
     "reasoning tokens at tier medium"},
    {"thinking_budgets.high", kInteger, "the model's config", "0 to 2^30, at least `medium`",
     "reasoning tokens at tier high"},
    {"constrained_max_string_bytes", kInteger, "256", "1 to 1048576",
     "longest string in a constrained tool call or `json_object` value"},
    // Image parts (image_decode.hpp, image_prompt.hpp).
    {"image_max_bytes", kInteger, "20971520", "1 to 2^30",
     "an image part's encoded size (base64-decoded, or fetched); checked on the base64 length before decoding (a "
     "data: URL is also bounded by `max_body_bytes`)"},
    {"image_max_pixels", kInteger, "16777216", "1 to 2^32",
     "an image's width x height as its header declares it, checked before any pixel buffer exists"},
    {"image_max_per_request", kInteger, "8", "0 to 1024",
     "image parts in one request's messages (history included; a session turn or a continued response counts only its new images); 0 refuses every image"},
    {"image_url_allowed_hosts", kText, "none", "comma-separated host names or IP literals (`[v6]`)",
     "hosts whose `http(s)` image URLs are fetched; none: only `data:` URLs"},
    {"image_url_allow_private_addresses", kBoolean, "false", "",
     "let those fetches connect to loopback, link-local and private addresses (refused otherwise, as for hooks)"},
    {"image_fetch_timeout_seconds", kNumber, "10", "0.1 to 600",
     "the whole fetch of one image URL"},
    // Usage, budgets and hooks (the sections pricing, budgets, hooks aside).
    {"state_dir", kText, "none", "a directory",
     "durable state: the ledger `usage.sqlite3` and sessions `sessions.sqlite3` in it; created if missing"},
    {"ledger_path", kText, "`<state_dir>/usage.sqlite3`", "a file",
     "the usage ledger (SQLite); with neither it and `state_dir`, the ledger is in memory and lost on restart"},
    {"policy_name", kText, "`standalone`", "",
     "`policy` in alert payloads; under the operator, the QuotaPolicy's name"},
    {"deployment_name", kText, "`served_model_name`", "",
     "`deployment` in alert payloads"},
    {"hook_retry_initial_seconds", kNumber, "5", "0.01 to 3600",
     "wait after a failed delivery; doubles after each failure, with jitter"},
    {"hook_retry_max_seconds", kNumber, "600", "0.01 to 86400",
     "longest wait between two attempts"},
    {"hook_give_up_seconds", kNumber, "86400", "3600 to 2592000",
     "a delivery is retried this long after its alert fired, then given up (`moe_alert_deliveries_total{result=\"failed\"}`)"},
    {"spend_from_operator", kBoolean, "false", "",
     "under moe-operator: budgets follow the global spend it hands back; no hooks allowed ([Under the operator](#under-the-operator-global-spend))"},
    {"global_spend_file", kText, "none", "a file",
     "that spend as last recorded, read at start (may be missing)"},
    // Server-kept sessions (session_settings.hpp).
    {"session_db_path", kText, "`<state_dir>/sessions.sqlite3`", "a file",
     "the session store (SQLite); with neither it and `state_dir`, in memory"},
    {"session_idle_seconds", kNumber, "86400", "1 to 31536000",
     "a session unused this long is deleted"},
    {"session_tenant_quota_bytes", kInteger, "268435456", "0 to 2^50",
     "storage per tenant; a turn or session past it is refused (403)"},
    {"session_total_quota_bytes", kInteger, "805306368", "0 to 2^50",
     "every tenant's sessions and stored responses together; a turn, session or stored response past it is refused (507); keep it below the state volume so the ledger has room"},
    {"session_image_max_bytes", kInteger, "67108864", "0 to 2^50",
     "encoded bytes of the images one session keeps (each distinct image once); a turn past it is refused (400)"},
    {"session_context_tokens", kInteger, "0", "0 to 2^31",
     "context budget of a session's prompt plus answer; 0: `max_context`"},
    {"session_keep_exchanges", kInteger, "2", "1 to 1048576",
     "newest exchanges never compressed (the new turn's included)"},
    {"session_summary_max_tokens", kInteger, "256", "16 to 1048576",
     "longest summary (the model's, and the extractive one)"},
    {"session_replica", kText, "`local`", "1 to 32 of `a-z`, `0-9`, `-`",
     "this replica's name, part of the ids of the sessions it creates"},
    {"session_peers", kText, "none", "`name=http://host:port,name=https://...`",
     "the other replicas: a turn for one of their sessions is forwarded there"},
    {"session_pin_share", kNumber, "0.5", "0 to 1",
     "share of `prefix_cache_bytes` that active sessions may keep pinned"},
    {"session_pin_seconds", kNumber, "600", "0 to 86400",
     "a session stays active (its cache pinned) this long after a turn"},
    {"session_forward_max_in_flight", kInteger, "32", "1 to 4096",
     "requests forwarded to other replicas at once (a thread each); more get 503 at once"},
    {"session_forward_deadline_seconds", kNumber, "600", "0.1 to 86400",
     "one forward to another replica, connection to last byte (a streamed turn included); past it, 503"},
    // The audit log (audit_log.hpp).
    {"audit_dir", kText, "`<state_dir>/audit`", "a directory",
     "the audit log ([Audit log](#audit-log)); with neither it nor `state_dir`, none is kept"},
    {"audit_log_content", kBoolean, "false", "",
     "also write each request's body and the answer's text to the audit log"},
    {"audit_max_file_bytes", kInteger, "16777216", "4096 to 2^40",
     "`audit.log` is rotated past this size"},
    {"audit_max_files", kInteger, "4", "1 to 1000",
     "rotated audit files kept besides `audit.log` (the oldest is deleted)"},
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

const SettingSpec* FindDaemonSetting(std::string_view key) {
  auto it = std::find_if(std::begin(kSettings), std::end(kSettings), [&](const SettingSpec& s) { return s.key == key; });
  return it == std::end(kSettings) ? nullptr : &*it;
}

}  // namespace moeserve::daemon
