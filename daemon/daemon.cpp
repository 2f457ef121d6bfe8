#include "moeserve/daemon/daemon.hpp"
#include "moeserve/storage/weight_puller.hpp"

#include <openssl/crypto.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "audit/audit_exchange.hpp"
#include "model/model_loading.hpp"
#include "http/route_table.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/common/rfc3339.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/audit/audit_log.hpp"
#include "moeserve/daemon/keys/api_keys_reloader.hpp"
#include "moeserve/daemon/usage/budget_service.hpp"
#include "moeserve/daemon/completions/chat_service.hpp"
#include "moeserve/daemon/model/expert_parallel.hpp"
#include "moeserve/daemon/http/http_server.hpp"
#include "moeserve/daemon/image/image_work.hpp"
#include "moeserve/daemon/metrics.hpp"
#include "moeserve/daemon/responses/response_service.hpp"
#include "moeserve/daemon/completions/scheduler.hpp"
#include "moeserve/daemon/sessions/session_service.hpp"
#include "moeserve/daemon/usage/usage_history.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/family_registry.hpp"

namespace moeserve::daemon {

using Clock = std::chrono::steady_clock;

struct Daemon::Impl {
  DaemonConfig config;
  // Followed on disk: a rotated Secret reaches requests without a restart.
  std::unique_ptr<ReloadingApiKeys> keys = ReloadingApiKeys::Fixed(ApiKeys::Open());
  std::string metrics_token_sha256;  // empty: /metrics follows the API keys alone
  Readiness readiness;
  std::unique_ptr<storage::PulledModel> pulled;  // set when the model came from a URI
  DaemonMetrics metrics;
  // The audit log (null: off). Shared with the exchanges that write to it,
  // and declared before the server so it outlives every handler.
  std::shared_ptr<AuditLog> audit;
  // Declared before what serves requests, so it is destroyed after them:
  // exchanges that sinks still hold then find their connections gone.
  std::unique_ptr<HttpServer> server;
  // After the server, before the scheduler: destroyed once no sink can
  // charge any more, and its last commits still find the server to answer on.
  std::unique_ptr<BudgetService> budget;
  std::unique_ptr<engine::Engine> engine;  // whatever the model's family
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ChatService> chat;
  // Server-kept sessions: after what a turn runs through (chat, scheduler,
  // budget), so they go first and their last commits still find those.
  std::unique_ptr<SessionService> sessions;
  // The Responses API: stored in the sessions' database, so after them.
  std::unique_ptr<ResponseService> responses;
  // Image fetches and decodes (image_work.hpp): after everything its jobs
  // call into, so it is stopped (its queued jobs run, its workers joined) first.
  std::unique_ptr<ImageWork> image_work;
  // Expert parallelism (MOE_NUM_NODES > 1): rank 0 leads, the others follow.
  // After the engine, so that it stops (and goes) first.
  std::unique_ptr<ExpertParallel> ep;
  std::atomic<bool> serving{false};   // engine and scheduler are up
  std::atomic<bool> draining{false};

  // Declared once (route_table.hpp); Admit and Handle look requests up here.
  std::vector<Route> routes;
  std::vector<Route> BuildRoutes();
  HttpAdmission Admit(const HttpHead& head);
  void Handle(const HttpHead& head, std::string body, std::shared_ptr<HttpExchange> exchange);
  std::optional<ApiError> CheckAuth(const Route& route, const HttpHead& head, std::optional<Principal>& who) const;
  void ChatCompletion(std::string body, std::shared_ptr<HttpExchange> exchange, const Principal& who);
  void Ready(HttpExchange& exchange);
  void SetGlobalSpend(const std::string& body, HttpExchange& exchange);
  void ReadAudit(const std::string& query, HttpExchange& exchange);
  void Scrape(HttpExchange& exchange);
  void Models(HttpExchange& exchange);
  std::optional<Principal> Authenticate(const HttpHead& head) const;
  bool MetricsAllowed(const HttpHead& head) const;
  // The exchange a chat or session request is answered through: the
  // client's, or with the audit log on, one that records the request first.
  std::shared_ptr<HttpExchange> Audited(const HttpHead& head, const Principal& who, const std::string& body,
                                        std::shared_ptr<HttpExchange> exchange) const;
  // A request to an audited route (chat, sessions) refused from its head, into the audit log.
  void AuditRefusal(const HttpHead& head, const ApiError& e) const;
};

namespace {

// GET routes read no meaningful body; a little is allowed so that clients
// which send an empty JSON object are not refused.
constexpr size_t kSmallBodyLimit = 64 << 10;

constexpr char kAdminSpendPath[] = "/v1/admin/spend";
constexpr char kAdminAuditPath[] = "/v1/admin/audit";
// One entry per tenant and period: room for tens of thousands of tenants.
constexpr size_t kAdminBodyLimit = 16 << 20;

ApiError AdminOnly() {
  return ApiError{403, "permission_error", "admin_only", "Only a key with the admin role may do this", "", 0};
}

// GET /v1/admin/audit?tenant=T&since=RFC3339&limit=N
ApiResult<AuditFilter> ParseAuditQuery(const std::string& query) {
  AuditFilter f;
  std::stringstream in(query);
  std::string item;
  while (std::getline(in, item, '&')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    std::string decoded;  // percent-decoding: "+" and %XX (a time's ':' arrives as %3A)
    for (size_t i = 0; i < value.size(); ++i) {
      if (value[i] == '+') decoded += ' ';
      else if (value[i] == '%' && i + 2 < value.size() && std::isxdigit(static_cast<unsigned char>(value[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(value[i + 2]))) {
        decoded += static_cast<char>(std::stoi(value.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else decoded += value[i];
    }
    if (key == "tenant") f.tenant = decoded;
    else if (key == "since") f.since = decoded;
    else if (key == "limit") {
      try {
        size_t used = 0;
        const long n = std::stol(decoded, &used);
        if (used != decoded.size() || n < 1 || n > 100000) throw std::out_of_range("limit");
        f.limit = static_cast<size_t>(n);
      } catch (...) {
        return ApiFail(ApiError::InvalidRequest("limit must be an integer from 1 to 100000 (got '" + decoded + "')", "limit"));
      }
    } else {
      return ApiFail(ApiError::InvalidRequest("unknown query parameter '" + key + "' (tenant, since, limit)", key));
    }
  }
  return f;
}

// A last guard around a handler that reports its errors as values: a bug
// costs one request, never the daemon.
template <class F>
void Guarded(HttpExchange& exchange, F&& handle) {
  try {
    handle();
  } catch (const std::exception& e) {
    log::Error(std::string("unexpected exception: ") + e.what());
    ReplyError(exchange, ApiError::Internal(std::string("internal error: ") + e.what()));
  }
}

ApiError MissingKey() { return ApiError::InvalidApiKey("Missing or wrong API key: send Authorization: Bearer <key>"); }

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.starts_with("127.");
}

Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Fail(Error::Io("metrics token file " + path + ": cannot be opened"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.front()))) token.erase(token.begin());
  if (token.size() < 16) return Fail(Error::InvalidArgument("metrics token file " + path + ": the token must be at least 16 characters"));
  return token;
}

}  // namespace

// "/v1/sessions/sess_a_X/chat/completions" -> the endpoint
// "/v1/sessions/{id}/chat/completions" and the session id.
static std::pair<std::string, std::string> AuditEndpoint(const std::string& path) {
  constexpr std::string_view kSessions = "/v1/sessions/";
  constexpr std::string_view kResponses = "/v1/responses/";
  if (path.starts_with(kResponses)) {
    // "/v1/responses/resp_a_X/cancel" -> "/v1/responses/{id}/cancel": ids stay out of the endpoint.
    const size_t end = path.find('/', kResponses.size());
    return {std::string(kResponses) + "{id}" + (end == std::string::npos ? "" : path.substr(end)), ""};
  }
  if (!path.starts_with(kSessions)) return {path, ""};
  const size_t end = path.find('/', kSessions.size());
  const std::string id = path.substr(kSessions.size(), end == std::string::npos ? std::string::npos : end - kSessions.size());
  return {std::string(kSessions) + "{id}" + (end == std::string::npos ? "" : path.substr(end)), id};
}

std::shared_ptr<HttpExchange> Daemon::Impl::Audited(const HttpHead& head, const Principal& who, const std::string& body,
                                                    std::shared_ptr<HttpExchange> exchange) const {
  if (!audit) return exchange;
  AuditContext c;
  c.tenant = who.tenant;
  c.key_id = AuditKeyId(head.Header("authorization"));
  c.method = head.method;
  std::tie(c.endpoint, c.session_id) = AuditEndpoint(head.path);
  c.model = chat ? chat->facts().model_name : config.served_model_name;
  if (audit->settings().log_content) c.request_body = body;
  return std::make_shared<AuditExchange>(std::move(exchange), audit, std::move(c));
}

void Daemon::Impl::AuditRefusal(const HttpHead& head, const ApiError& e) const {
  if (!audit) return;
  const auto who = Authenticate(head);
  const auto [endpoint, session_id] = AuditEndpoint(head.path);
  const std::string key_id = AuditKeyId(head.Header("authorization"));
  nlohmann::json line = {{"time", NowMicroTime()},
                         {"request_id", nullptr},
                         {"tenant", who ? nlohmann::json(who->tenant) : nlohmann::json(nullptr)},
                         {"key_id", key_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(key_id)},
                         {"method", head.method},
                         {"endpoint", endpoint},
                         {"model", chat ? chat->facts().model_name : config.served_model_name},
                         {"tier", nullptr},
                         {"status", e.status},
                         {"stream", false},
                         {"tokens", {{"prompt", 0}, {"cached", 0}, {"completion", 0}, {"reasoning", 0}}},
                         {"completion_id", nullptr},
                         {"session_id", session_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(session_id)},
                         {"refused_at", "head"}};
  // Not waited for: the refusal carries nothing to lose, and the head
  // stage answers synchronously. Without a key it is only sampled
  // (audit_log.hpp): requests nobody is accountable for cannot flush the log.
  if (who) return audit->Append(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), nullptr,
                                AuditLineKind::kRefusal, who->tenant);
  audit->AppendUnauthenticated([&line](uint64_t skipped) {
    line["skipped_refusals"] = skipped;
    return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  });
}

std::optional<Principal> Daemon::Impl::Authenticate(const HttpHead& head) const {
  return keys->Current()->Authenticate(head.Header("authorization"));
}

bool Daemon::Impl::MetricsAllowed(const HttpHead& head) const {
  const auto current = keys->Current();
  if (!current->enabled()) return true;  // loopback-only development daemon
  const std::string header = head.Header("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (!metrics_token_sha256.empty() && header.size() > kBearer.size() && header.starts_with(kBearer)) {
    std::string got = Sha256Hex(std::string_view(header).substr(kBearer.size()));
    if (CRYPTO_memcmp(got.data(), metrics_token_sha256.data(), got.size()) == 0) return true;
  }
  auto who = current->Authenticate(header);
  return who && who->admin;
}

// The routes, declared once (route_table.hpp): Admit and Handle both look
// them up here.
std::vector<Route> Daemon::Impl::BuildRoutes() {
  auto small = [] { return kSmallBodyLimit; };
  auto chat_body = [this] { return config.max_body_bytes; };
  // Chat completions need the model: not while draining, not on a follower
  // of an expert-parallel group, not before the model is loaded.
  auto model_serving = [this](const HttpHead&) -> ApiResult<void> {
    if (draining.load()) return ApiFail(ApiError::Unavailable("The server is shutting down; retry on another replica", 5));
    if (ep && !engine) {
      return ApiFail(ApiError::Unavailable(
          "This pod follows rank 0 of an expert-parallel group; send requests to the deployment's Service", 5));
    }
    if (!serving.load()) {
      auto r = readiness.Get();
      return ApiFail(ApiError::Unavailable(
          "The model is not ready yet (" + r.state + (r.detail.empty() ? "" : ": " + r.detail) + "); retry shortly", 5));
    }
    return {};
  };
  using H = std::shared_ptr<HttpExchange>;
  // Sessions (session_service.hpp). A turn starts work: not while draining,
  // and one for a session this replica owns needs the model.
  auto session_turn_admit = [this](const HttpHead& head) -> ApiResult<void> {
    if (draining.load()) return ApiFail(ApiError::Unavailable("The server is shutting down; retry on another replica", 5));
    return sessions->AdmitTurn(head, PathParam("/v1/sessions/{id}/chat/completions", head.path), serving.load());
  };
  auto session_create_admit = [this](const HttpHead&) -> ApiResult<void> {
    if (draining.load()) return ApiFail(ApiError::Unavailable("The server is shutting down; retry on another replica", 5));
    return {};
  };
  auto to_session = [this](SessionService::Op op, std::string pattern) {
    return [this, op, pattern](const HttpHead& head, std::string body, H exchange, const Principal* who) {
      Guarded(*exchange, [&] {
        sessions->OnSession(op, PathParam(pattern, head.path), head, std::move(body), exchange, *who, Clock::now());
      });
    };
  };
  auto create_session = [this](const HttpHead&, std::string body, H exchange, const Principal* who) {
    Guarded(*exchange, [&] { sessions->Create(std::move(body), exchange, *who); });
  };
  // The Responses API (responses/response_service.hpp): reading, deleting
  // and cancelling need no model; creating runs it, and a background run
  // answers through an exchange of its own, audited on a line of its own.
  using ResponseCall = void (ResponseService::*)(const std::string&, const HttpHead&, std::string, H, const Principal&);
  auto to_responses = [this](ResponseCall call, std::string pattern) {
    return [this, call, pattern](const HttpHead& head, std::string body, H exchange, const Principal* who) {
      Guarded(*exchange,
              [&] { (responses.get()->*call)(PathParam(pattern, head.path), head, std::move(body), exchange, *who); });
    };
  };
  auto create_response = [this](const HttpHead& head, std::string body, H exchange, const Principal* who) {
    ResponseService::RunExchange audit_run;
    if (audit) {
      std::string kept = audit->settings().log_content ? body : std::string();
      audit_run = [this, head, who = *who, kept = std::move(kept)](H run) { return Audited(head, who, kept, std::move(run)); };
    }
    Guarded(*exchange, [&] { responses->Create(head, std::move(body), exchange, *who, Clock::now(), audit_run); });
  };
  std::vector<Route> r;
  r.push_back({"POST", "/v1/chat/completions", RouteAuth::kTenant, model_serving, chat_body, true, true,
               [this](const HttpHead&, std::string body, H exchange, const Principal* who) {
                 ChatCompletion(std::move(body), std::move(exchange), *who);
               }});
  using Op = SessionService::Op;
  r.push_back({"POST", "/v1/sessions", RouteAuth::kTenant, session_create_admit, chat_body, true, false, create_session});
  r.push_back({"GET", "/v1/sessions/{id}", RouteAuth::kTenant, {}, small, true, false,
               to_session(Op::kGet, "/v1/sessions/{id}")});
  r.push_back({"DELETE", "/v1/sessions/{id}", RouteAuth::kTenant, {}, small, true, false,
               to_session(Op::kDelete, "/v1/sessions/{id}")});
  r.push_back({"POST", "/v1/sessions/{id}/chat/completions", RouteAuth::kTenant, session_turn_admit, chat_body, true,
               false, to_session(Op::kTurn, "/v1/sessions/{id}/chat/completions")});
  r.push_back({"POST", "/v1/responses", RouteAuth::kTenant, model_serving, chat_body, true, false, create_response});
  r.push_back({"GET", "/v1/responses/{id}", RouteAuth::kTenant, {}, small, true, false,
               to_responses(&ResponseService::Get, "/v1/responses/{id}")});
  r.push_back({"DELETE", "/v1/responses/{id}", RouteAuth::kTenant, {}, small, true, false,
               to_responses(&ResponseService::Delete, "/v1/responses/{id}")});
  r.push_back({"POST", "/v1/responses/{id}/cancel", RouteAuth::kTenant, {}, small, true, false,
               to_responses(&ResponseService::Cancel, "/v1/responses/{id}/cancel")});
  r.push_back({"GET", "/v1/models", RouteAuth::kTenant, {}, small, false, false,
               [this](const HttpHead&, std::string, H exchange, const Principal*) { Models(*exchange); }});
  r.push_back({"GET", "/v1/usage", RouteAuth::kTenant, {}, small, false, false,
               [this](const HttpHead&, std::string, H exchange, const Principal* who) {
                 // A tenant's key sees its own rows; an admin key sees every tenant's.
                 auto usage = budget->Usage(*who);
                 if (!usage) return ReplyError(*exchange, usage.error());
                 ReplyJson(*exchange, 200, usage->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
               }});
  r.push_back({"GET", "/v1/usage/history", RouteAuth::kTenant, {}, small, false, false,
               [this](const HttpHead& head, std::string, H exchange, const Principal* who) {
                 // Spend per hour of the current period (usage_history.hpp).
                 auto history = UsageHistoryJson(budget->ledger(), *who, head.query);
                 if (!history) return ReplyError(*exchange, history.error());
                 ReplyJson(*exchange, 200, history->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
               }});
  r.push_back({"PUT", kAdminSpendPath, RouteAuth::kAdmin, {}, [] { return kAdminBodyLimit; }, false, false,
               [this](const HttpHead&, std::string body, H exchange, const Principal*) {
                 SetGlobalSpend(body, *exchange);
               }});
  r.push_back({"GET", kAdminAuditPath, RouteAuth::kAdmin, {}, small, false, false,
               [this](const HttpHead& head, std::string, H exchange, const Principal*) {
                 ReadAudit(head.query, *exchange);
               }});
  r.push_back({"GET", "/healthz", RouteAuth::kPublic, {}, small, false, false,
               [](const HttpHead&, std::string, H exchange, const Principal*) {
                 ReplyJson(*exchange, 200, R"({"status":"ok"})");
               }});
  r.push_back({"GET", "/readyz", RouteAuth::kPublic, {}, small, false, false,
               [this](const HttpHead&, std::string, H exchange, const Principal*) { Ready(*exchange); }});
  r.push_back({"GET", "/metrics", RouteAuth::kMetrics, {}, small, false, false,
               [this](const HttpHead&, std::string, H exchange, const Principal*) { Scrape(*exchange); }});
  return r;
}

std::vector<RouteDescription> Daemon::Routes() const {
  std::vector<RouteDescription> out;
  for (const Route& r : impl_->routes) out.push_back({r.method, r.pattern, r.auth});
  return out;
}

// Whether the head's credentials satisfy the route: nullopt when they do
// (with the caller in `who` for tenant and admin routes), else the refusal.
std::optional<ApiError> Daemon::Impl::CheckAuth(const Route& route, const HttpHead& head,
                                                std::optional<Principal>& who) const {
  switch (route.auth) {
    case RouteAuth::kPublic:
      return std::nullopt;
    case RouteAuth::kMetrics:
      if (MetricsAllowed(head)) return std::nullopt;
      return ApiError::InvalidApiKey(route.pattern + " needs Authorization: Bearer <metrics token or admin key>");
    case RouteAuth::kTenant:
    case RouteAuth::kAdmin:
      who = Authenticate(head);
      if (!who) return MissingKey();
      if (route.auth == RouteAuth::kAdmin && !who->admin) return AdminOnly();
      return std::nullopt;
  }
  return MissingKey();
}

// Everything that can be decided from the head is decided here, before a
// byte of the body is read: a refused request costs its head, nothing more.
// In order: the path (404), the method (405), the key (401, 403), then the
// route's own checks (503 while draining or loading).
HttpAdmission Daemon::Impl::Admit(const HttpHead& head) {
  const RouteMatch match = FindRoute(routes, head.method, head.path);
  auto refuse = [&](const ApiError& e) {
    if (match.route && match.route->counted) metrics.RequestFinished(e.status, 0);
    if (match.route && match.route->audited) AuditRefusal(head, e);
    return HttpAdmission::Refuse(ErrorResponse(e));
  };
  if (!match.route) {
    return refuse(match.path_known ? ApiError::MethodNotAllowed(head.method, head.path)
                                   : ApiError::NoSuchRoute(head.method, head.path));
  }
  const Route& route = *match.route;
  std::optional<Principal> who;
  if (auto refused = CheckAuth(route, head, who)) return refuse(*refused);
  const std::string audited_tenant = who ? who->tenant : "";
  if (route.audited && audit && audit->RefusesTenant(audited_tenant)) {
    // Its line could only be written by deleting one still within retention
    // (audit_log.hpp); the tenants that did not fill it are still served.
    return refuse(ApiError{503, "server_error", "audit_log_full",
                           "The audit log is full of lines younger than audit_retention_hours and tenant " +
                               audited_tenant + " holds " + std::to_string(audit->RetainedBytes(audited_tenant)) +
                               " bytes of them (audit_tenant_max_share), or its reserve is spent; this daemon takes "
                               "no new requests of this tenant until the oldest may be deleted",
                           "", 60});
  }
  if (route.admit) {
    if (auto ok = route.admit(head); !ok) return refuse(ok.error());
  }
  return HttpAdmission::Accept(route.body_limit());
}

void Daemon::Impl::Handle(const HttpHead& head, std::string body, std::shared_ptr<HttpExchange> exchange) {
  const RouteMatch match = FindRoute(routes, head.method, head.path);
  if (!match.route) return ReplyError(*exchange, ApiError::NoSuchRoute(head.method, head.path));  // admitted, so never
  const Route& route = *match.route;
  std::optional<Principal> who;
  // Checked again: the keys may have changed since the head was admitted.
  if (auto refused = CheckAuth(route, head, who)) return ReplyError(*exchange, *refused);
  if (route.audited) exchange = Audited(head, *who, body, std::move(exchange));
  route.handle(head, std::move(body), std::move(exchange), who ? &*who : nullptr);
}

void Daemon::Impl::ChatCompletion(std::string body, std::shared_ptr<HttpExchange> exchange, const Principal& who) {
  const auto received = Clock::now();
  try {
    chat->Handle(exchange, body, who, received);
  } catch (const std::exception& e) {
    // Handle reports errors as values; this is a last guard so that a bug
    // costs one request, never the daemon.
    log::Error(std::string("chat completion: unexpected exception: ") + e.what());
    metrics.RequestFinished(500, std::chrono::duration<double>(Clock::now() - received).count());
    ReplyError(*exchange, ApiError::Internal(std::string("internal error: ") + e.what()));
  }
}

void Daemon::Impl::Ready(HttpExchange& exchange) {
  auto r = readiness.Get();
  // The kubelet's probe doubles as a check of the keys file, so a file that
  // stopped loading takes the pod out of its Service even with no traffic.
  (void)keys->Current();
  const auto k = keys->State();
  if (k.refusing) {
    const std::string why = "every API key is refused until the keys file loads again: " + k.problem;
    if (r.ready()) r = {"api_keys_invalid", why};
    else r.detail += (r.detail.empty() ? "" : "; ") + why;
  }
  nlohmann::json out = {{"status", r.state}};
  if (!r.detail.empty()) out["detail"] = r.detail;
  ReplyJson(exchange, r.ready() ? 200 : 503, out.dump());
}

void Daemon::Impl::SetGlobalSpend(const std::string& body, HttpExchange& exchange) {
  // The operator's global spend (global_spend.hpp).
  auto parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_discarded()) return ReplyError(exchange, ApiError::InvalidRequest("The body is not JSON"));
  auto spend = ParseGlobalSpend(parsed);
  if (!spend) return ReplyError(exchange, ApiError::InvalidRequest(spend.error().message()));
  auto set = budget->SetGlobalSpend(*spend);
  if (!set) return ReplyError(exchange, set.error());
  ReplyJson(exchange, 200, set->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void Daemon::Impl::ReadAudit(const std::string& query, HttpExchange& exchange) {
  // The audit log's lines (audit_log.hpp).
  if (!audit) return ReplyError(exchange, ApiError{404, "invalid_request_error", "audit_log_off",
                                                   "This daemon keeps no audit log (set state_dir or audit_dir)", "", 0});
  auto filter = ParseAuditQuery(query);
  if (!filter) return ReplyError(exchange, filter.error());
  auto lines = ReadAuditLog(audit->settings().dir, *filter);
  if (!lines) return ReplyError(exchange, ApiError::InvalidRequest(lines.error().message(), "since"));
  ReplyJson(exchange, 200,
            nlohmann::json{{"object", "list"}, {"data", std::move(*lines)}}.dump(
                -1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void Daemon::Impl::Scrape(HttpExchange& exchange) {
  budget->RefreshMetrics();
  if (serving.load() && engine) metrics.UpdateFromEngine(engine->Metrics());
  if (ep) {
    const auto em = engine ? engine->Metrics() : engine::EngineMetrics{};
    ep->RefreshMetrics(engine ? &em : nullptr);
  }
  if (server) metrics.UpdateFromHttp(server->stats());
  if (audit) metrics.UpdateFromAudit(audit->stats());
  if (!config.api_keys_file.empty()) {
    const auto k = keys->State();
    metrics.UpdateApiKeys(k.failures, k.file_sha256, k.refusing);
  }
  exchange.Reply(HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", {}, metrics.Scrape()});
}

void Daemon::Impl::Models(HttpExchange& exchange) {
  nlohmann::json model = {{"id", chat ? chat->facts().model_name : config.served_model_name},
                          {"object", "model"},
                          {"created", 0},
                          {"owned_by", "moeserve"},
                          {"max_model_len", chat ? chat->facts().max_context : 0}};
  ReplyJson(exchange, 200, nlohmann::json{{"object", "list"}, {"data", {model}}}.dump());
}

namespace {
// The global spend the operator last recorded (ConfigMap <policy>-budget), so
// that a restarted daemon enforces a spent budget before the next sync. Not
// there yet, or unreadable: the next sync brings it (one interval).
void RestoreGlobalSpend(BudgetService& budget, const std::string& file) {
  std::ifstream in(file);
  if (!in) {
    log::Info("moe-daemon: no global spend recorded yet at " + file + "; waiting for the operator's first sync");
    return;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = nlohmann::json::parse(text.str(), nullptr, false);
  auto spend = parsed.is_discarded() ? Result<GlobalSpend>(Fail(Error::InvalidArgument("not JSON"))) : ParseGlobalSpend(parsed);
  if (!spend) return log::Warn("moe-daemon: global spend in " + file + " ignored: " + spend.error().message());
  auto set = budget.SetGlobalSpend(*spend);
  if (!set) return log::Warn("moe-daemon: global spend in " + file + " ignored: " + set.error().message);
  log::Info("moe-daemon: global spend of policy " + spend->policy + " restored from " + file + " (" +
            std::to_string(spend->spend.size()) + " entries)");
}
}  // namespace

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() {
  if (impl_->server) impl_->server->Stop();
  if (impl_->scheduler) impl_->scheduler->Stop();
}

Result<std::unique_ptr<Daemon>> Daemon::Create(DaemonConfig config) {
  auto impl = std::make_unique<Impl>();
  impl->routes = impl->BuildRoutes();
  if (config.served_model_name.empty()) {
    config.served_model_name = std::filesystem::path(config.model).filename().string();
    if (config.served_model_name.empty()) config.served_model_name = std::filesystem::path(config.model).parent_path().filename().string();
  }
  if (!config.api_keys_file.empty()) {
    MOE_ASSIGN_OR_RETURN(impl->keys, ReloadingApiKeys::Open(config.api_keys_file));
    log::Info("moe-daemon: " + std::to_string(impl->keys->Current()->size()) + " API keys loaded from " +
              config.api_keys_file + " (followed for changes)");
  } else if (!IsLoopback(config.host) && !config.allow_unauthenticated) {
    // Without keys anyone who reaches the port may spend the GPUs and read
    // /metrics: only loopback, unless the operator of the daemon says so.
    return Fail(Error::InvalidArgument("refusing to listen on " + config.host +
                                       " without API keys: set api_keys_file (--api-keys-file), listen on "
                                       "127.0.0.1, or set allow_unauthenticated (--allow-unauthenticated true)"));
  }
  if (!config.metrics_token_file.empty()) {
    if (config.api_keys_file.empty()) {
      return Fail(Error::InvalidArgument("metrics_token_file needs api_keys_file: without keys /metrics is open"));
    }
    MOE_ASSIGN_OR_RETURN(std::string token, ReadTokenFile(config.metrics_token_file));
    impl->metrics_token_sha256 = Sha256Hex(std::string_view(token));
  }
  // The usage ledger opens before the model loads, so /v1/usage answers while
  // weights are pulled, and a ledger that cannot be opened stops the start.
  BudgetServiceOptions bo;
  bo.ledger_path = config.ledger_path;
  if (bo.ledger_path.empty() && !config.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.state_dir, ec);
    if (ec) return Fail(Error::Io("state_dir " + config.state_dir + ": " + ec.message()));
    bo.ledger_path = (std::filesystem::path(config.state_dir) / "usage.sqlite3").string();
  }
  bo.policy = config.budget;
  if (bo.policy.deployment_name.empty()) bo.policy.deployment_name = config.served_model_name;
  MOE_TRY(LoadHookSecrets(bo.policy));
  bo.retry = {config.hook_retry_initial_seconds, config.hook_retry_max_seconds, config.hook_give_up_seconds};
  bo.spend_from_operator = config.spend_from_operator;
  bo.max_concurrent_per_tenant = config.max_concurrent_per_tenant;
  MOE_ASSIGN_OR_RETURN(impl->budget, BudgetService::Create(std::move(bo), &impl->metrics));
  if (config.spend_from_operator && !config.global_spend_file.empty()) RestoreGlobalSpend(*impl->budget, config.global_spend_file);
  if (config.audit.dir.empty() && !config.state_dir.empty())
    config.audit.dir = (std::filesystem::path(config.state_dir) / "audit").string();
  if (!config.audit.dir.empty()) {
    auto audit = AuditLog::Open(config.audit);
    if (!audit) return Fail(audit.error().WithContext("audit log"));
    impl->audit = std::move(*audit);
  }
  std::string session_db = config.sessions.db_path;
  if (session_db.empty() && !config.state_dir.empty()) session_db = (std::filesystem::path(config.state_dir) / "sessions.sqlite3").string();
  MOE_ASSIGN_OR_RETURN(impl->sessions, SessionService::Create(config.sessions, session_db, *impl->budget));
  MOE_ASSIGN_OR_RETURN(impl->responses, ResponseService::Create(config.sessions, impl->sessions->store()));
  impl->image_work = std::make_unique<ImageWork>(config.image_work, &impl->metrics.registry());
  impl->config = std::move(config);
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Status Daemon::Start() {
  Impl* impl = impl_.get();
  const DaemonConfig& c = impl->config;
  HttpServerOptions o;
  o.host = c.host;
  o.port = c.port;
  o.threads = c.http_threads;
  o.max_connections = static_cast<size_t>(c.max_connections);
  o.header_timeout_seconds = c.header_timeout_seconds;
  o.max_stream_buffer_bytes = c.max_stream_buffer_bytes;
  o.tls_cert_file = c.tls_cert_file;
  o.tls_key_file = c.tls_key_file;
  HttpServerHooks hooks;
  hooks.admit = [impl](const HttpHead& head) { return impl->Admit(head); };
  hooks.handle = [impl](HttpHead head, std::string body, std::shared_ptr<HttpExchange> exchange) {
    impl->Handle(head, std::move(body), std::move(exchange));
  };
  hooks.error_response = [](int status, const std::string& message) {
    ApiError e = status >= 500 ? ApiError::Internal(message) : ApiError::InvalidRequest(message);
    e.status = status;
    return ErrorResponse(e);
  };
  auto server = HttpServer::Start(std::move(o), std::move(hooks));
  if (!server) return Fail(server.error().WithContext("moe-daemon"));
  impl->server = std::move(*server);
  if (impl->config.port == 0) impl->config.port = impl->server->port();
  return Ok();
}

Status Daemon::LoadModel() {
  Impl& m = *impl_;
  MOE_ASSIGN_OR_RETURN(const std::string model_dir, ResolveModelDir(m.config, m.readiness, m.pulled));
  m.readiness.Set("loading", model_dir);
  auto fail = [&](const Error& e, const std::string& context) {
    m.readiness.Set("failed", e.message());
    return Fail(e.WithContext(context));
  };
  // The family (engine/families/registry.cpp) decides how the model loads
  // and, through its chat dialect, how its chat is served.
  auto family = engine::FindFamily(model_dir);
  if (!family) return fail(family.error(), "loading model " + m.config.model);
  const std::string family_name = (*family)->name;
  engine::EngineOptions o = EngineOptionsFrom(m.config);
  // Expert parallelism from the operator's variables: this rank's slice of
  // the experts (engine::LoadLayerGraph).
  auto group = engine::ExpertGroupSettingsFromEnv();
  if (!group) return fail(group.error(), "expert-parallel settings");
  o.ep_rank = group->rank;
  o.ep_world = group->world;
  SizeCacheFromMemory(m.config, model_dir, group->enabled(), o);
  // A follower runs no engine and renders no chat: it loads its slice as
  // rank 0 loads the model and runs rank 0's passes.
  if (group->enabled() && group->rank > 0) {
    auto follower = ExpertParallel::Follow(*group, model_dir, o, m.readiness, m.metrics);
    if (!follower) return fail(follower.error(), "following expert-parallel rank 0 with " + family_name + " model " + m.config.model);
    m.ep = std::move(*follower);
    log::Info("moe-daemon: expert-parallel rank " + std::to_string(group->rank) + " of " + std::to_string(group->world) +
              " (" + family_name + "), following rank 0 at " + group->master_addr);
    return Ok();
  }
  auto eng = engine::Engine::Open(model_dir, o);
  if (!eng) return fail(eng.error(), "loading " + family_name + " model " + m.config.model);
  m.engine = std::move(*eng);
  auto facts = ServingFactsFor(m.config, *m.engine, family_name, model_dir, m.image_work.get());
  if (!facts) return fail(facts.error(), "loading model " + m.config.model);
  m.scheduler = std::make_unique<Scheduler>(*m.engine);
  m.scheduler->Start();
  m.chat = std::make_unique<ChatService>(*m.scheduler, m.metrics, *m.budget, *facts);
  m.sessions->Attach(*m.chat, *m.scheduler, facts->dialect);
  m.responses->Attach(*m.chat);
  if (group->enabled()) {
    // Ready, and serving, only while every rank is connected.
    auto leader = ExpertParallel::Lead(*group, *m.engine, m.readiness, m.serving, m.metrics);
    if (!leader) return fail(leader.error(), "leading the expert-parallel group");
    m.ep = std::move(*leader);
  } else {
    m.serving.store(true);
    m.readiness.Set("ready");
  }
  log::Info("moe-daemon: serving " + family_name + " model " + facts->model_name + " (context " +
            std::to_string(facts->max_context) + ") on " + url());
  // Which CPU kernels serve it (an SRE reading why prefill is as fast as it is).
  log::Info("moe-daemon: kernels " +
            (o.kernels == engine::KernelChoice::kReference ? std::string("reference") : kernels::IsaReport()) +
            (o.bf16_activations && !o.deterministic ? "; prefill products with BF16 activations" : ""));
  return Ok();
}

void Daemon::Shutdown(double grace_seconds) {
  Impl& m = *impl_;
  m.draining.store(true);
  m.readiness.Set("draining");
  if (m.scheduler) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_seconds));
    while (m.scheduler->InFlight() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (m.scheduler->InFlight() > 0) {
      log::Warn("moe-daemon: cancelling " + std::to_string(m.scheduler->InFlight()) + " requests still running after " +
                std::to_string(grace_seconds) + " s");
      m.scheduler->CancelAll();
      const auto cancel_deadline = Clock::now() + std::chrono::seconds(5);
      while (m.scheduler->InFlight() > 0 && Clock::now() < cancel_deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Let the last replies leave before the sockets close.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (m.ep) m.ep->Stop();
  if (m.server) m.server->Stop();
  if (m.scheduler) m.scheduler->Stop();
}

std::string Daemon::url() const {
  const bool tls = !impl_->config.tls_cert_file.empty();
  const std::string& host = impl_->config.host;
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return std::string(tls ? "https://" : "http://") + h + ":" + std::to_string(impl_->config.port);
}
Readiness& Daemon::readiness() { return impl_->readiness; }
DaemonMetrics& Daemon::metrics() { return impl_->metrics; }
size_t Daemon::InFlight() const { return impl_->scheduler ? impl_->scheduler->InFlight() : 0; }

}  // namespace moeserve::daemon
