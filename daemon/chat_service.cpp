#include "moeserve/daemon/chat_service.hpp"
#include "moeserve/daemon/image_prompt.hpp"

#include <algorithm>
#include <optional>
#include <random>

#include "completion_sink.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/daemon/decode_policy.hpp"
#include "moeserve/daemon/harmony_structure.hpp"

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
  std::vector<std::string> constrained_names;  // the callable tools of a constrained call
  std::vector<int> harmony_prefill;            // gpt-oss: the call header the prompt ends with
  std::vector<std::string> harmony_tool_names; // gpt-oss: the functions the output may call
  std::optional<ToolSpec> harmony_call;        // gpt-oss: the call the prompt opened
  std::vector<ToolSpec> harmony_choices;       // gpt-oss: the functions a required call chooses among
  std::vector<int> harmony_header_tail;        // gpt-oss: <|constrain|>json<|message|>
  bool deepseek_tools = false;                 // DeepSeek-V3.2: the prompt rendered tools
};

// `images`: the request's image parts, decoded (PrepareImages); placed into
// the prompt as placeholder spans, which the usage counts as prompt tokens.
ApiResult<Prepared> Prepare(const ChatRequest& req, const ServingFacts& facts, const std::vector<PreparedImage>& images) {
  if (!req.model.empty() && req.model != facts.model_name) return ApiFail(ApiError::ModelNotFound(req.model));
  ReasoningEffort effort = req.reasoning_effort.value_or(facts.default_effort);
  engine::GrammarLimits limits;
  limits.max_string_bytes = facts.constrained_max_string_bytes;
  Prepared p;
  std::optional<std::vector<int>> prompt;
  std::vector<engine::ImageSpan> rendered_images;
  std::shared_ptr<engine::DecodeController> family_controller;
  if (facts.deepseek) {
    // DeepSeek-V3.2: its published encoding in thinking mode; the controller
    // follows tool_choice and response_format.
    auto d = RenderDeepseekRequest(req, facts.deepseek, limits);
    if (!d) return ApiFail(d.error());
    prompt = std::move(d->prompt);
    family_controller = std::move(d->controller);
    p.deepseek_tools = d->tools;
  } else if (facts.qwen3) {
    // Qwen3-Next: its ChatML; the controller follows tool_choice and response_format.
    auto q = RenderQwen3Request(req, *facts.qwen3, limits);
    if (!q) return ApiFail(q.error());
    prompt = std::move(q->prompt);
    family_controller = std::move(q->controller);
  } else if (facts.harmony) {
    // gpt-oss: harmony (harmony_request.hpp), the tier's effort in the system message.
    auto h = RenderHarmonyRequest(req, effort, *facts.harmony, limits);
    if (!h) return ApiFail(h.error());
    prompt = std::move(h->prompt);
    p.harmony_prefill = std::move(h->prefill);
    p.harmony_tool_names = std::move(h->tool_names);
    p.harmony_call = std::move(h->opened_call);
    p.harmony_choices = std::move(h->call_choices);
    p.harmony_header_tail = std::move(h->header_tail);
  } else {
    const nlohmann::ordered_json* tools = req.tools.is_array() ? &req.tools : nullptr;
    std::vector<engine::ChatMessage> with_images;
    if (!images.empty()) {
      with_images = req.messages;
      PlaceImages(images, with_images);
    }
    auto rendered = engine::RenderChatWithImages(images.empty() ? req.messages : with_images, tools,
                                                 /*add_generation_prompt=*/true, facts.vision ? &*facts.vision : nullptr);
    if (!rendered) {
      const std::string& field = rendered.error().field();
      return ApiFail(ApiError::InvalidRequest(rendered.error().message(), field.empty() ? "messages" : field));
    }
    prompt = std::move(rendered->tokens);
    rendered_images = std::move(rendered->images);
  }
  const int prompt_tokens = static_cast<int>(prompt->size());
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

  p.tier = std::string(ReasoningEffortName(effort));
  auto& g = p.generation;
  g.prompt = std::move(*prompt);
  g.images = std::move(rendered_images);
  g.max_tokens = max_tokens;
  g.thinking_budget = budget;
  g.starts_in_reasoning = true;
  g.sampling.temperature = req.temperature;
  g.sampling.top_p = req.top_p;
  g.logprobs = req.logprobs ? req.top_logprobs : -1;  // -1: the engine computes nothing
  const auto& pub = facts.public_prefix;
  if (!pub.empty() && g.prompt.size() > pub.size() && std::equal(pub.begin(), pub.end(), g.prompt.begin()))
    g.public_prefix_tokens = static_cast<int64_t>(pub.size());
  g.sampling.seed = req.seed ? *req.seed : std::random_device{}() * 0x100000001ull + std::random_device{}();

  DecodePolicyOptions policy;
  // Same request, same call ids (streamed and not agree); the prompt is in
  // the seed so that a client sending one seed every turn still gets fresh
  // ids for each turn's calls.
  uint64_t prompt_hash = 0xcbf29ce484222325ull;  // FNV-1a over the token ids
  for (int t : g.prompt) prompt_hash = (prompt_hash ^ static_cast<uint32_t>(t)) * 0x100000001b3ull;
  policy.id_seed = g.sampling.seed ^ prompt_hash;
  policy.limits.max_string_bytes = facts.constrained_max_string_bytes;
  p.call_id_seed = policy.id_seed;
  if (facts.qwen3 || facts.deepseek) {
    // Stops: the family's (Qwen3: <|im_end|> and the config's eos; DeepSeek:
    // the end of sentence); the prompt opened <think>.
    g.controller = std::move(family_controller);
    return p;
  }
  if (facts.harmony) {
    // The output is read by harmony's parser; the tool choice is in the prompt
    // (RenderHarmonyRequest). A demanded call's arguments follow its schema
    // (HarmonyArgumentsController); when the model chooses (tools under auto,
    // or a response_format), the whole output follows harmony's structure
    // (HarmonyStructureController).
    g.starts_in_reasoning = false;
    g.stop_tokens = engine::HarmonyStopTokens(facts.harmony->tokens);
    if (facts.harmony->token_bytes && (p.harmony_call || !p.harmony_choices.empty())) {
      // The call tool_choice demands: its arguments follow the function's schema, then <|call|>.
      std::vector<HarmonyArgumentsController::Choice> choices;
      for (const ToolSpec& t : p.harmony_call ? std::vector<ToolSpec>{*p.harmony_call} : p.harmony_choices) {
        auto grammar = engine::JsonGrammar::ForObjectSchema(t.parameters, limits, t.strict);
        if (!grammar) {
          return ApiFail(ApiError::InvalidRequest(grammar.error().message(),
                                                  "tools[" + std::to_string(t.index) + "].function.parameters"));
        }
        choices.push_back({t.name, std::move(*grammar)});
      }
      if (p.harmony_call) {
        g.controller = std::make_shared<HarmonyArgumentsController>(facts.harmony->token_bytes,
                                                                    std::move(choices[0].grammar), facts.harmony->tokens.call);
      } else {
        g.controller = std::make_shared<HarmonyArgumentsController>(facts.harmony->token_bytes, std::move(choices),
                                                                    p.harmony_header_tail, facts.harmony->tokens.call);
      }
    } else if (facts.harmony->token_bytes && (req.json_object || !p.harmony_tool_names.empty())) {
      HarmonyStructureOptions structure;
      structure.index = facts.harmony->token_bytes;
      structure.tokens = facts.harmony->tokens;
      for (const ToolSpec& t : req.tool_specs) {
        if (std::find(p.harmony_tool_names.begin(), p.harmony_tool_names.end(), t.name) == p.harmony_tool_names.end()) {
          continue;
        }
        auto grammar = engine::JsonGrammar::ForObjectSchema(t.parameters, limits, t.strict);
        if (!grammar) {
          return ApiFail(ApiError::InvalidRequest(grammar.error().message(),
                                                  "tools[" + std::to_string(t.index) + "].function.parameters"));
        }
        structure.functions.push_back({t.name, std::move(*grammar)});
      }
      if (req.json_object) {
        const nlohmann::ordered_json schema =
            req.response_schema.is_object() ? req.response_schema : nlohmann::ordered_json{{"type", "object"}};
        auto grammar = engine::JsonGrammar::ForObjectSchema(schema, limits, req.response_schema_strict);
        if (!grammar) {
          return ApiFail(ApiError::InvalidRequest(grammar.error().message(), "response_format.json_schema.schema"));
        }
        structure.response = std::move(*grammar);
      }
      g.controller = std::make_shared<HarmonyStructureController>(std::move(structure));
    }
    return p;
  }
  if (req.tool_choice == ToolChoice::kRequired || req.tool_choice == ToolChoice::kNamed) {
    policy.mode = DecodeMode::kMustCall;
    for (const auto& t : req.tool_specs) {
      if (req.tool_choice == ToolChoice::kRequired || t.name == req.tool_choice_name) policy.tools.push_back(t);
    }
    policy.parallel_calls = req.parallel_tool_calls && req.tool_choice == ToolChoice::kRequired;
    for (const auto& t : policy.tools) p.constrained_names.push_back(t.name);
  } else if (req.json_object) {
    policy.mode = DecodeMode::kJsonObject;
    if (req.response_schema.is_object()) policy.response_schema = req.response_schema;
    policy.response_strict = req.response_schema_strict;
  } else if (req.tool_choice == ToolChoice::kAuto && !req.tool_specs.empty()) {
    policy.mode = DecodeMode::kFree;
  } else {
    policy.mode = DecodeMode::kNoTools;
  }
  p.call_id_seed = policy.id_seed;
  auto controller = DecodePolicy::Create(std::move(policy));
  if (!controller) {
    const std::string& field = controller.error().field();
    return ApiFail(ApiError::InvalidRequest(controller.error().message(), field.empty() ? "tools" : field));
  }
  g.controller = std::move(*controller);
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
  info.constrained_names = prepared->constrained_names;
  info.logprobs = req->logprobs;
  for (const PreparedImage& image : *images) info.image_tokens += image.span_tokens;
  info.harmony = facts_.harmony;
  info.qwen3 = facts_.qwen3;
  info.deepseek = facts_.deepseek;
  info.deepseek_tools = prepared->deepseek_tools;
  info.harmony_tool_names = prepared->harmony_tool_names;
  info.harmony_prefill = prepared->harmony_prefill;
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
