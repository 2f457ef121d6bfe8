// POST /v1/chat/completions after authentication: validate the request
// against the deployment, render it, build the decode policy, submit it to
// the scheduler and answer (a JSON body, or an SSE stream) when events come.
//
// Thread safety: Handle may be called from any thread concurrently.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/usage/budget_service.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"
#include "moeserve/daemon/image/image_decode.hpp"
#include "moeserve/daemon/image/image_prompt.hpp"
#include "moeserve/daemon/image/image_work.hpp"
#include "moeserve/daemon/image/stored_images.hpp"
#include "moeserve/daemon/metrics.hpp"
#include "moeserve/daemon/completions/scheduler.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon {

struct ServingFacts {
  std::string model_name;
  int max_context = 0;
  int default_max_tokens = 1024;
  // A tier's budget; negative: no budget (gpt-oss without thinking_budgets configured).
  engine::ThinkingBudgets budgets;
  ReasoningEffort default_effort = ReasoningEffort::kMedium;
  int constrained_max_string_bytes = 256;
  // The served family's chat (chat/dialect.hpp), chosen once at load:
  // every request is rendered, constrained and read through it.
  std::shared_ptr<const ChatDialect> dialect;
  // The configured public system prompt rendered on its own (ChatDialect::PublicPrefix):
  // a prompt that begins with these tokens shares their cached state across
  // tenants; everything else is cached per tenant. Empty: nothing is shared.
  std::vector<int> public_prefix;
  // Image parts (image_prompt.hpp): the config's limits and URL policy, and
  // the model's tower (absent: the model reads text only).
  ImageUrlPolicy images;
  std::optional<engine::VisionConfig> vision;
  // The image workers and decoded-image cache (image_work.hpp); null: image
  // work runs on the calling thread, uncached (tests).
  ImageWork* image_work = nullptr;
};

class ChatService {
 public:
  using Clock = std::chrono::steady_clock;
  // `budget` admits each request for its tenant (tiers, budgets, rate
  // limits) and charges it when it ends; a request is answered only once its
  // charge is committed (usage_ledger.hpp).
  ChatService(Scheduler& scheduler, DaemonMetrics& metrics, BudgetService& budget, ServingFacts facts)
      : scheduler_(scheduler), metrics_(metrics), budget_(budget), facts_(std::move(facts)) {}

  // Answers the request itself, now (errors) or later (from the scheduler
  // thread). A client that hangs up (exchange->OnClientGone) cancels its
  // sequence, streamed or not.
  // `stored`: the pixels of the images a kept conversation (a session, a
  // stored response) names by StoredImageUrl (stored_images.hpp), read only
  // during the call; null for a client's own request, whose body can then
  // name no stored image.
  //
  // A request whose images must be fetched or decoded is admitted first
  // (AdmitBeforeImages), and only then are they, on an image worker
  // (RunImageWork); the HTTP thread returns at once. `admitted`: the
  // admission a caller (a session turn, a Responses request) got before its
  // own image work; the request is then not admitted again.
  struct EarlyAdmission;
  void Handle(std::shared_ptr<HttpExchange> exchange, const std::string& body, const Principal& who,
              Clock::time_point received, const StoredImages* stored = nullptr,
              std::shared_ptr<EarlyAdmission> admitted = nullptr);

  // The tenant's admission (tiers, spent budgets, rate limits: BudgetService
  // Admit) at `effort` (null: the default), and a slot of its concurrency
  // (max_concurrent_per_tenant), taken before any of a request's images is
  // fetched or decoded: a tenant past a limit is refused without costing
  // the daemon a fetch or a decode. The slot is held until the request is
  // reserved at its real size (or ends).
  struct EarlyAdmission {
    std::string tier;  // asked for
    BudgetService::Admission admission;
    std::unique_ptr<BudgetService::Reservation> slot;
  };
  ApiResult<std::shared_ptr<EarlyAdmission>> AdmitBeforeImages(const Principal& who,
                                                              std::optional<ReasoningEffort> effort);
  // Runs `job` on an image worker for the tenant (or refuses it: its share
  // of the workers taken, the queue full); inline without workers.
  ApiResult<void> RunImageWork(const Principal& who, std::function<void()> job);
  // Answers a request refused by either (sessions, responses), counted in
  // moe_requests_total as Handle's own refusals are.
  void Refuse(HttpExchange& exchange, Clock::time_point received, const ApiError& e) { Fail(exchange, received, e); }

  const ServingFacts& facts() const { return facts_; }

 private:
  void Fail(HttpExchange& exchange, Clock::time_point received, const ApiError& e);
  // After the images are ready: render, admit (unless `admitted`), reserve, submit.
  void Serve(std::shared_ptr<HttpExchange> exchange, ChatRequest& req, const std::vector<PreparedImage>& images,
             const Principal& who, Clock::time_point received, std::shared_ptr<EarlyAdmission> admitted);

  Scheduler& scheduler_;
  DaemonMetrics& metrics_;
  BudgetService& budget_;
  ServingFacts facts_;
};

// The api.md error body (with Retry-After when set) as a response.
HttpResponse ErrorResponse(const ApiError& error);
// Sends an api.md error body.
void ReplyError(HttpExchange& exchange, const ApiError& error);
// Sends a JSON body with the given status.
void ReplyJson(HttpExchange& exchange, int status, std::string json_text);

}  // namespace moeserve::daemon
