// POST /v1/chat/completions after authentication: validate the request
// against the deployment, render it, build the decode policy, submit it to
// the scheduler and answer (a JSON body, or an SSE stream) when events come.
//
// Thread safety: Handle may be called from any thread concurrently.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "moeserve/daemon/api_error.hpp"
#include "moeserve/daemon/api_keys.hpp"
#include "moeserve/daemon/budget_service.hpp"
#include "moeserve/daemon/chat_request.hpp"
#include "moeserve/daemon/harmony_request.hpp"
#include "moeserve/daemon/http_exchange.hpp"
#include "moeserve/daemon/image_decode.hpp"
#include "moeserve/daemon/stored_images.hpp"
#include "moeserve/daemon/metrics.hpp"
#include "moeserve/daemon/deepseek_request.hpp"
#include "moeserve/daemon/qwen3_request.hpp"
#include "moeserve/daemon/scheduler.hpp"
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
  // The chat format: null renders moe-dsa-v1's (model.md section 8); set,
  // the family is gpt-oss and requests are rendered and read in harmony.
  std::shared_ptr<const HarmonyServing> harmony;
  // Set: the family is Qwen3-Next, rendered and read in its ChatML format (qwen3_request.hpp).
  std::shared_ptr<const Qwen3Serving> qwen3;
  // Set: the family is DeepSeek-V3.2, rendered and read in its published encoding (deepseek_request.hpp).
  std::shared_ptr<const DeepseekServing> deepseek;
  // The configured public system prompt rendered on its own (moe-dsa-v1):
  // a prompt that begins with these tokens shares their cached state across
  // tenants; everything else is cached per tenant. Empty: nothing is shared.
  std::vector<int> public_prefix;
  // Image parts (image_prompt.hpp): the config's limits and URL policy, and
  // the model's tower (absent: the model reads text only).
  ImageUrlPolicy images;
  std::optional<engine::VisionConfig> vision;
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
  void Handle(std::shared_ptr<HttpExchange> exchange, const std::string& body, const Principal& who,
              Clock::time_point received, const StoredImages* stored = nullptr);

  const ServingFacts& facts() const { return facts_; }

 private:
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
