#include "moeserve/daemon/completions/chat_service.hpp"
#include "moeserve/daemon/image/image_prompt.hpp"

#include <algorithm>
#include <optional>
#include <random>

#include "completions/completion_sink.hpp"
#include "moeserve/common/log.hpp"

namespace moeserve::daemon {

HttpResponse ErrorResponse(const ApiError& error) {
  HttpResponse r;
  r.status = error.status;
  if (error.retry_after_seconds > 0) r.headers.emplace_back("Retry-After", std::to_string(error.retry_after_seconds));
  r.body = error.ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

void ReplyError(HttpExchange& exchange, const ApiError& error) { exchange.Reply(ErrorResponse(error)); }

void ReplyJson(HttpExchange& exchange, int status, std::string json_text) {
  exchange.Reply(HttpResponse{status, "application/json", {}, std::move(json_text)});
}

namespace {

std::string NewCompletionId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::uniform_int_distribution<int> pick(0, 61);
  std::string id = "chatcmpl-";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

struct Prepared {
  engine::GenerationRequest generation;
  std::string tier;
  uint64_t call_id_seed = 0;
  // The request as its family rendered it: its output's reader comes from it.
  std::shared_ptr<const RenderedTurn> turn;
};

// `images`: the request's image parts, decoded (PrepareImages); placed into
// the prompt as placeholder spans, which the usage counts as prompt tokens.
ApiResult<Prepared> Prepare(const ChatRequest& req, const ServingFacts& facts, const std::vector<PreparedImage>& images) {
  if (!req.model.empty() && req.model != facts.model_name) return ApiFail(ApiError::ModelNotFound(req.model));
  ReasoningEffort effort = req.reasoning_effort.value_or(facts.default_effort);
  RenderOptions options;
  options.effort = effort;
  options.limits.max_string_bytes = facts.constrained_max_string_bytes;
  ApiResult<std::unique_ptr<RenderedTurn>> rendered = [&] {
    if (images.empty()) return facts.dialect->Render(req, options);
    ChatRequest with_images = req;
    PlaceImages(images, with_images.messages);
    return facts.dialect->Render(with_images, options);
  }();
  if (!rendered) return ApiFail(rendered.error());
  std::unique_ptr<RenderedTurn>& turn = *rendered;
  const int prompt_tokens = static_cast<int>(turn->prompt.size());
  if (prompt_tokens >= facts.max_context) {
    return ApiFail(ApiError::ContextLengthExceeded(
        "The conversation renders to " + std::to_string(prompt_tokens) + " tokens, but this model's context window is " +
        std::to_string(facts.max_context) + " tokens (including the answer); shorten the messages"));
  }
  int max_tokens;
  if (req.max_tokens) {
    max_tokens = *req.max_tokens;
    if (static_cast<int64_t>(prompt_tokens) + max_tokens > facts.max_context) {
      return ApiFail(ApiError::ContextLengthExceeded(
          "The conversation renders to " + std::to_string(prompt_tokens) + " tokens and max_tokens is " +
          std::to_string(max_tokens) + ", together more than this model's context window of " +
          std::to_string(facts.max_context) + " tokens; lower max_tokens or shorten the messages"));
    }
  } else {
    max_tokens = std::min(facts.default_max_tokens, facts.max_context - prompt_tokens);
  }

  int budget = effort == ReasoningEffort::kLow      ? facts.budgets.low
               : effort == ReasoningEffort::kMedium ? facts.budgets.medium
                                                    : facts.budgets.high;
  // thinking_budget may lower the tier's budget, never raise it (model.md 9);
  // a tier without a budget (negative) takes the request's.
  if (req.thinking_budget) budget = budget < 0 ? *req.thinking_budget : std::min(budget, *req.thinking_budget);

  Prepared p;
  p.tier = std::string(ReasoningEffortName(effort));
  auto& g = p.generation;
  g.prompt = std::move(turn->prompt);
  g.images = std::move(turn->images);
  g.stop_tokens = std::move(turn->stop_tokens);
  g.max_tokens = max_tokens;
  g.thinking_budget = budget;
  g.starts_in_reasoning = turn->starts_in_reasoning;
  g.sampling.temperature = req.temperature;
  g.sampling.top_p = req.top_p;
  g.logprobs = req.logprobs ? req.top_logprobs : -1;  // -1: the engine computes nothing
  g.speculative = req.speculative;
  const auto& pub = facts.public_prefix;
  if (!pub.empty() && g.prompt.size() > pub.size() && std::equal(pub.begin(), pub.end(), g.prompt.begin()))
    g.public_prefix_tokens = static_cast<int64_t>(pub.size());
  g.sampling.seed = req.seed ? *req.seed : std::random_device{}() * 0x100000001ull + std::random_device{}();

  // Same request, same call ids (streamed and not agree); the prompt is in
  // the seed so that a client sending one seed every turn still gets fresh
  // ids for each turn's calls.
  uint64_t prompt_hash = 0xcbf29ce484222325ull;  // FNV-1a over the token ids
  for (int t : g.prompt) prompt_hash = (prompt_hash ^ static_cast<uint32_t>(t)) * 0x100000001b3ull;
  p.call_id_seed = g.sampling.seed ^ prompt_hash;
  auto controller = turn->Controller(p.call_id_seed);
  if (!controller) return ApiFail(controller.error());
  g.controller = std::move(*controller);
  p.turn = std::move(turn);
  return p;
}

}  // namespace

void ChatService::Fail(HttpExchange& exchange, Clock::time_point received, const ApiError& e) {
  metrics_.RequestFinished(e.status, std::chrono::duration<double>(Clock::now() - received).count());
  ReplyError(exchange, e);
}

ApiResult<std::shared_ptr<ChatService::EarlyAdmission>> ChatService::AdmitBeforeImages(
    const Principal& who, std::optional<ReasoningEffort> effort) {
  auto early = std::make_shared<EarlyAdmission>();
  early->tier = std::string(ReasoningEffortName(effort.value_or(facts_.default_effort)));
  auto admission = budget_.Admit(who, early->tier);
  if (!admission) return ApiFail(admission.error());
  early->admission = std::move(*admission);
  // A slot of the tenant's concurrency, at no cost yet (its size is known once its images are).
  auto slot = budget_.Reserve(who, early->admission.tier, 0, 0);
  if (!slot) return ApiFail(slot.error());
  early->slot = std::move(*slot);
  return early;
}

ApiResult<void> ChatService::RunImageWork(const Principal& who, std::function<void()> job) {
  if (!facts_.image_work) {
    job();
    return {};
  }
  return facts_.image_work->Submit(who.tenant, std::move(job));
}

void ChatService::Handle(std::shared_ptr<HttpExchange> exchange, const std::string& body, const Principal& who,
                         Clock::time_point received, const StoredImages* stored,
                         std::shared_ptr<EarlyAdmission> admitted) {
  auto req = ParseChatRequest(body);
  if (!req) return Fail(*exchange, received, req.error());
  const engine::VisionConfig* vision = facts_.vision ? &*facts_.vision : nullptr;
  // The parts checked; nothing fetched or decoded yet.
  auto plan = PlanImages(req->images, facts_.images, vision, stored);
  if (!plan) return Fail(*exchange, received, plan.error());
  if (plan->needs_work() && !admitted) {
    // Admitted before the work, which then runs on an image worker.
    if (!req->model.empty() && req->model != facts_.model_name)
      return Fail(*exchange, received, ApiError::ModelNotFound(req->model));
    auto early = AdmitBeforeImages(who, req->reasoning_effort);
    if (!early) return Fail(*exchange, received, early.error());
    auto request = std::make_shared<ChatRequest>(std::move(*req));
    auto planned = std::make_shared<ImagePlan>(std::move(*plan));
    auto queued = RunImageWork(who, [this, exchange, request, planned, who, received, early = *early] {
      if (exchange->client_gone()) return;  // nothing to fetch or decode for
      auto images = LoadImages(std::move(*planned), facts_.images, facts_.vision ? &*facts_.vision : nullptr,
                               facts_.max_context, facts_.image_work);
      if (!images) return Fail(*exchange, received, images.error());
      Serve(exchange, *request, *images, who, received, early);
    });
    if (!queued) return Fail(*exchange, received, queued.error());
    return;
  }
  // Kept images only (or the caller's worker already runs this).
  auto images = LoadImages(std::move(*plan), facts_.images, vision, facts_.max_context, facts_.image_work);
  if (!images) return Fail(*exchange, received, images.error());
  Serve(exchange, *req, *images, who, received, std::move(admitted));
}

void ChatService::Serve(std::shared_ptr<HttpExchange> exchange, ChatRequest& request,
                        const std::vector<PreparedImage>& images_in, const Principal& who, Clock::time_point received,
                        std::shared_ptr<EarlyAdmission> admitted) {
  auto fail = [&](const ApiError& e) { Fail(*exchange, received, e); };
  ChatRequest* req = &request;
  const std::vector<PreparedImage>* images = &images_in;
  auto prepared = Prepare(*req, facts_, *images);
  if (!prepared) return fail(prepared.error());
  // The tenant's tiers, budgets and rate limits; checked on a valid request
  // only, at the tier it would run at (unless the request was admitted
  // before its images were fetched or decoded, at this tier).
  ApiResult<BudgetService::Admission> admission =
      admitted && admitted->tier == prepared->tier ? ApiResult<BudgetService::Admission>(admitted->admission)
                                                   : budget_.Admit(who, prepared->tier);
  if (!admission) return fail(admission.error());
  if (admission->downgraded) {
    // A spent `downgrade` budget: served at low, whatever was asked; the
    // request's own thinking_budget can only lower low's budget further.
    req->reasoning_effort = ReasoningEffort::kLow;
    prepared = Prepare(*req, facts_, *images);
    if (!prepared) return fail(prepared.error());
  }
  // The early slot makes way for the real reservation.
  if (admitted) admitted->slot.reset();
  // The worst case held against `block` budgets and a slot of the tenant's
  // concurrency, until the charge is committed.
  auto reservation = budget_.Reserve(who, prepared->tier, static_cast<int64_t>(prepared->generation.prompt.size()),
                                     prepared->generation.max_tokens);
  if (!reservation) return fail(reservation.error());

  CompletionInfo info;
  info.id = NewCompletionId();
  info.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  info.model = facts_.model_name;
  info.stream = req->stream;
  info.include_usage = req->include_usage;
  info.tenant = who.tenant;
  info.tier = prepared->tier;
  info.downgraded = admission->downgraded;
  info.stop = req->stop;
  info.call_id_seed = prepared->call_id_seed;
  info.logprobs = req->logprobs;
  for (const PreparedImage& image : *images) info.image_tokens += image.span_tokens;
  info.turn = prepared->turn;
  info.logprobs_tokenizer = facts_.dialect->logprobs_tokenizer();
  info.received = received;
  info.reservation = std::move(*reservation);
  // The prefix cache and fair share are per tenant (engine.hpp).
  prepared->generation.tenant = who.tenant;
  auto sink = std::make_shared<CompletionSink>(std::move(info), exchange, scheduler_, metrics_, budget_);
  // Registered before Submit: a hang-up in between cancels as soon as the id is known.
  exchange->OnClientGone([weak = std::weak_ptr<CompletionSink>(sink)] {
    if (auto s = weak.lock()) s->OnDisconnect();
  });

  auto id = scheduler_.Submit(std::move(prepared->generation), sink);
  if (!id) return fail(ApiError::FromError(id.error()));
  // The stream's head goes out only once the sequence exists, so a refused
  // request still gets a plain HTTP error status.
  if (req->stream) sink->BeginStream();
  sink->SetSequence(*id);
}

}  // namespace moeserve::daemon
