#include "moeserve/daemon/daemon.hpp"
#include "moeserve/daemon/storage/weight_puller.hpp"

#include <filesystem>
#include <thread>

#include <cpprest/http_listener.h>

#include "moeserve/common/log.hpp"
#include "moeserve/daemon/api_keys.hpp"
#include "moeserve/daemon/chat_service.hpp"
#include "moeserve/daemon/metrics.hpp"
#include "moeserve/daemon/scheduler.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model_dir.hpp"

namespace moeserve::daemon {

namespace http = web::http;
using Clock = std::chrono::steady_clock;

struct Daemon::Impl {
  DaemonConfig config;
  ApiKeys keys = ApiKeys::Open();
  Readiness readiness;
  std::unique_ptr<storage::PulledModel> pulled;  // set when the model came from a URI
  DaemonMetrics metrics;
  std::unique_ptr<http::experimental::listener::http_listener> listener;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ChatService> chat;
  std::atomic<bool> serving{false};   // engine and scheduler are up
  std::atomic<bool> draining{false};

  void Route(http::http_request request);
  void HandleChat(http::http_request request, Clock::time_point received);
  std::optional<Principal> Authenticate(const http::http_request& request);
};

namespace {

// cpprestsdk reads the body on its own; a Content-Length this far past the
// limit is refused without reading it at all.
constexpr size_t kNoDrainFactor = 8;

}  // namespace

std::optional<Principal> Daemon::Impl::Authenticate(const http::http_request& request) {
  auto it = request.headers().find(http::header_names::authorization);
  return keys.Authenticate(it == request.headers().end() ? std::string() : it->second);
}

void Daemon::Impl::HandleChat(http::http_request request, Clock::time_point received) {
  auto refuse = [&](const ApiError& e) {
    metrics.RequestFinished(e.status, std::chrono::duration<double>(Clock::now() - received).count());
    ReplyError(request, e);
  };
  auto who = Authenticate(request);
  if (!who) return refuse(ApiError::InvalidApiKey("Missing or wrong API key: send Authorization: Bearer <key>"));
  if (draining.load()) return refuse(ApiError::Unavailable("The server is shutting down; retry on another replica", 5));
  if (!serving.load()) {
    auto r = readiness.Get();
    return refuse(ApiError::Unavailable("The model is not ready yet (" + r.state +
                                            (r.detail.empty() ? "" : ": " + r.detail) + "); retry shortly",
                                        5));
  }
  const size_t limit = config.max_body_bytes;
  const auto declared = request.headers().content_length();
  if (declared > limit * kNoDrainFactor) return refuse(ApiError::BodyTooLarge(limit));
  request.extract_vector().then([this, request, received, who = *who, limit](pplx::task<std::vector<unsigned char>> t) {
    std::vector<unsigned char> body;
    try {
      body = t.get();
    } catch (const std::exception& e) {
      metrics.RequestFinished(400, std::chrono::duration<double>(Clock::now() - received).count());
      ReplyError(request, ApiError::InvalidRequest(std::string("The request body could not be read: ") + e.what()));
      return;
    }
    if (body.size() > limit) {
      metrics.RequestFinished(413, std::chrono::duration<double>(Clock::now() - received).count());
      ReplyError(request, ApiError::BodyTooLarge(limit));
      return;
    }
    try {
      chat->Handle(request, std::string(body.begin(), body.end()), who, received);
    } catch (const std::exception& e) {
      // Handle reports errors as values; this is a last guard so that a bug
      // costs one request, never the daemon.
      log::Error(std::string("chat completion: unexpected exception: ") + e.what());
      metrics.RequestFinished(500, std::chrono::duration<double>(Clock::now() - received).count());
      ReplyError(request, ApiError::Internal(std::string("internal error: ") + e.what()));
    }
  });
}

void Daemon::Impl::Route(http::http_request request) {
  const auto received = Clock::now();
  const std::string method = request.method();
  const std::string path = request.relative_uri().path();
  try {
    if (path == "/v1/chat/completions") {
      if (method != http::methods::POST) return ReplyError(request, ApiError::MethodNotAllowed(method, path));
      return HandleChat(request, received);
    }
    if (path == "/healthz") {
      if (method != http::methods::GET) return ReplyError(request, ApiError::MethodNotAllowed(method, path));
      return ReplyJson(request, 200, R"({"status":"ok"})");
    }
    if (path == "/readyz") {
      if (method != http::methods::GET) return ReplyError(request, ApiError::MethodNotAllowed(method, path));
      auto r = readiness.Get();
      nlohmann::json body = {{"status", r.state}};
      if (!r.detail.empty()) body["detail"] = r.detail;
      return ReplyJson(request, r.ready() ? 200 : 503, body.dump());
    }
    if (path == "/metrics") {
      if (method != http::methods::GET) return ReplyError(request, ApiError::MethodNotAllowed(method, path));
      if (serving.load()) metrics.UpdateFromEngine(engine->Metrics());
      http::http_response response(http::status_codes::OK);
      response.set_body(metrics.Scrape(), "text/plain; version=0.0.4; charset=utf-8");
      request.reply(response).then([](pplx::task<void> t) {
        try {
          t.get();
        } catch (...) {
        }
      });
      return;
    }
    if (path == "/v1/models") {
      if (method != http::methods::GET) return ReplyError(request, ApiError::MethodNotAllowed(method, path));
      if (!Authenticate(request)) {
        return ReplyError(request, ApiError::InvalidApiKey("Missing or wrong API key: send Authorization: Bearer <key>"));
      }
      nlohmann::json model = {{"id", chat ? chat->facts().model_name : config.served_model_name},
                              {"object", "model"},
                              {"created", 0},
                              {"owned_by", "moeserve"},
                              {"max_model_len", chat ? chat->facts().max_context : 0}};
      return ReplyJson(request, 200, nlohmann::json{{"object", "list"}, {"data", {model}}}.dump());
    }
    return ReplyError(request, ApiError::NoSuchRoute(method, path));
  } catch (const std::exception& e) {
    log::Error(std::string("http: ") + method + " " + path + ": " + e.what());
    ReplyError(request, ApiError::Internal(std::string("internal error: ") + e.what()));
  }
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() {
  if (impl_->listener) {
    try {
      impl_->listener->close().wait();
    } catch (...) {
    }
  }
  if (impl_->scheduler) impl_->scheduler->Stop();
}

Result<std::unique_ptr<Daemon>> Daemon::Create(DaemonConfig config) {
  auto impl = std::make_unique<Impl>();
  if (config.served_model_name.empty()) {
    config.served_model_name = std::filesystem::path(config.model).filename().string();
    if (config.served_model_name.empty()) config.served_model_name = std::filesystem::path(config.model).parent_path().filename().string();
  }
  if (!config.api_keys_file.empty()) {
    MOE_ASSIGN_OR_RETURN(impl->keys, ApiKeys::LoadFile(config.api_keys_file));
    log::Info("moe-daemon: " + std::to_string(impl->keys.size()) + " API keys loaded from " + config.api_keys_file);
  }
  impl->config = std::move(config);
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Status Daemon::Start() {
  Impl* impl = impl_.get();
  try {
    impl->listener = std::make_unique<http::experimental::listener::http_listener>(url());
    impl->listener->support([impl](http::http_request request) { impl->Route(std::move(request)); });
    impl->listener->open().wait();
  } catch (const std::exception& e) {
    return Fail(Error::Unavailable("cannot listen on " + url() + ": " + e.what()));
  }
  return Ok();
}

Status Daemon::LoadModel() {
  Impl& m = *impl_;
  std::string model_dir = m.config.model;
  if (model_dir.find("://") != std::string::npos) {
    // A URI: pull into the node-local cache first; /readyz reports the pull.
    storage::PullOptions po;
    po.revision = m.config.model_revision;
    po.connections = m.config.pull_connections;
    po.source.endpoint_url = m.config.storage_endpoint;
    po.source.region = m.config.storage_region;
    po.source.ca_file = m.config.storage_ca_file;
    po.on_progress = [&m](const storage::PullProgress& p) { m.readiness.Set("pulling", p.ToLogLine()); };
    m.readiness.Set("pulling", m.config.model + " @ " + m.config.model_revision);
    storage::WeightPuller puller(storage::CacheConfig{m.config.weights_cache, static_cast<uint64_t>(m.config.weights_cache_limit_bytes)});
    auto pulled = puller.Pull(m.config.model, po);
    if (!pulled) {
      m.readiness.Set("failed", pulled.error().message());
      return Fail(pulled.error().WithContext("pulling model " + m.config.model));
    }
    model_dir = pulled->dir;
    m.pulled = std::make_unique<storage::PulledModel>(std::move(*pulled));  // its lease keeps the model from eviction
  }
  m.readiness.Set("loading", model_dir);
  auto dir = engine::OpenModelDir(model_dir);
  if (!dir) {
    m.readiness.Set("failed", dir.error().message());
    return Fail(dir.error().WithContext("loading model " + m.config.model));
  }
  engine::EngineOptions o;
  o.max_running = m.config.max_running;
  o.max_waiting = m.config.max_queue;
  o.prefill_chunk_tokens = m.config.prefill_chunk_tokens;
  o.cache_tokens = m.config.cache_tokens;
  o.block_tokens = m.config.block_tokens;
  o.prefix_cache = m.config.prefix_cache;
  o.prefix_cache_bytes = m.config.prefix_cache_bytes;
  o.kernels = m.config.kernels == "reference" ? engine::KernelChoice::kReference : engine::KernelChoice::kFast;
  o.threads = m.config.threads;
  o.max_context = m.config.max_context;
  auto eng = engine::Engine::Create(*dir, o);
  if (!eng) {
    m.readiness.Set("failed", eng.error().message());
    return Fail(eng.error().WithContext("starting the engine on " + m.config.model));
  }
  m.engine = std::move(*eng);
  ServingFacts facts;
  facts.model_name = m.config.served_model_name;
  facts.max_context = m.engine->max_context();
  facts.default_max_tokens = m.config.default_max_tokens;
  facts.budgets = m.config.thinking_budgets.value_or(m.engine->config().thinking_budgets);
  facts.default_effort = m.config.default_reasoning_effort;
  facts.constrained_max_string_bytes = m.config.constrained_max_string_bytes;
  m.scheduler = std::make_unique<Scheduler>(*m.engine);
  m.scheduler->Start();
  m.chat = std::make_unique<ChatService>(*m.scheduler, m.metrics, facts);
  m.serving.store(true);
  m.readiness.Set("ready");
  log::Info("moe-daemon: serving " + facts.model_name + " (context " + std::to_string(facts.max_context) + ") on " + url());
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
  if (m.listener) {
    try {
      m.listener->close().wait();
    } catch (...) {
    }
    m.listener.reset();
  }
  if (m.scheduler) m.scheduler->Stop();
}

std::string Daemon::url() const {
  return "http://" + impl_->config.host + ":" + std::to_string(impl_->config.port);
}
Readiness& Daemon::readiness() { return impl_->readiness; }
DaemonMetrics& Daemon::metrics() { return impl_->metrics; }
size_t Daemon::InFlight() const { return impl_->scheduler ? impl_->scheduler->InFlight() : 0; }

}  // namespace moeserve::daemon
