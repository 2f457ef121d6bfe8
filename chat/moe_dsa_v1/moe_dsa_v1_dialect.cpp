// moe-dsa-v1's chat dialect: requests rendered by RenderChat (images as
// their placeholder spans), tool_choice and response_format followed by the
// decode policy (a server-written call id after each <|tool_call|>, a JSON
// grammar when constrained), output read by OutputAssembler. In sessions,
// entries count as bytes plus markers (ByteEntryTokens), summaries start in
// the think span, and prompts are pinned in the engine's prefix cache.
#include "moeserve/chat/moe_dsa_v1/moe_dsa_v1_dialect.hpp"

#include "moeserve/chat/moe_dsa_v1/decode_policy.hpp"
#include "moeserve/chat/moe_dsa_v1/output_assembler.hpp"

namespace moeserve::chat {

namespace {

class MoeDsaTurn final : public RenderedTurn {
 public:
  MoeDsaTurn(engine::RenderedChat rendered, const ChatRequest& req, const engine::GrammarLimits& limits) {
    prompt = std::move(rendered.tokens);
    images = std::move(rendered.images);
    starts_in_reasoning = true;  // generation starts inside <|think|>
    policy_.limits = limits;
    if (req.tool_choice == ToolChoice::kRequired || req.tool_choice == ToolChoice::kNamed) {
      policy_.mode = DecodeMode::kMustCall;
      for (const auto& t : req.tool_specs) {
        if (req.tool_choice == ToolChoice::kRequired || t.name == req.tool_choice_name) policy_.tools.push_back(t);
      }
      policy_.parallel_calls = req.parallel_tool_calls && req.tool_choice == ToolChoice::kRequired;
      for (const auto& t : policy_.tools) constrained_names_.push_back(t.name);
    } else if (req.json_object) {
      policy_.mode = DecodeMode::kJsonObject;
      if (req.response_schema.is_object()) policy_.response_schema = req.response_schema;
      policy_.response_strict = req.response_schema_strict;
    } else if (req.tool_choice == ToolChoice::kAuto && !req.tool_specs.empty()) {
      policy_.mode = DecodeMode::kFree;
    } else {
      policy_.mode = DecodeMode::kNoTools;
    }
  }

  ApiResult<std::shared_ptr<engine::DecodeController>> Controller(uint64_t id_seed) override {
    DecodePolicyOptions policy = std::move(policy_);
    policy.id_seed = id_seed;
    auto controller = DecodePolicy::Create(std::move(policy));
    if (!controller) {
      const std::string& field = controller.error().field();
      return ApiFail(ApiError::InvalidRequest(controller.error().message(), field.empty() ? "tools" : field));
    }
    return std::shared_ptr<engine::DecodeController>(std::move(*controller));
  }

  std::unique_ptr<OutputReader> Reader(std::vector<std::string> stop, uint64_t id_seed) const override {
    return std::make_unique<OutputAssembler>(AssemblerOptions{std::move(stop), id_seed, constrained_names_});
  }

 private:
  DecodePolicyOptions policy_;
  std::vector<std::string> constrained_names_;  // the callable tools of a constrained call
};

class MoeDsaDialect final : public ChatDialect {
 public:
  explicit MoeDsaDialect(engine::Engine* engine) : engine_(engine) {}

  std::string family() const override { return "moe-dsa-v1"; }

  ApiResult<std::unique_ptr<RenderedTurn>> Render(const ChatRequest& req, const RenderOptions& options) const override {
    const nlohmann::ordered_json* tools = req.tools.is_array() ? &req.tools : nullptr;
    const std::optional<engine::VisionConfig> tower = vision();
    auto rendered = engine::RenderChatWithImages(req.messages, tools, /*add_generation_prompt=*/true,
                                                 tower ? &*tower : nullptr);
    if (!rendered) {
      const std::string& field = rendered.error().field();
      return ApiFail(ApiError::InvalidRequest(rendered.error().message(), field.empty() ? "messages" : field));
    }
    return std::unique_ptr<RenderedTurn>(std::make_unique<MoeDsaTurn>(std::move(*rendered), req, options.limits));
  }

  Result<std::vector<int>> PublicPrefix(const std::string& system_prompt) const override {
    engine::ChatMessage system{engine::ChatRole::kSystem, system_prompt, std::nullopt, {}, {}};
    return engine::RenderChat({system}, nullptr, /*add_generation_prompt=*/false);
  }

  engine::ThinkingBudgets DefaultBudgets() const override {
    return engine_ ? engine_->config().thinking_budgets : engine::ThinkingBudgets{};
  }

  std::optional<engine::VisionConfig> vision() const override {
    return engine_ ? engine_->config().vision : std::nullopt;
  }

  std::optional<int64_t> PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                      const nlohmann::ordered_json& tools, const ChatRequest&) const override {
    // Kept images count as the spans they render to (their pixels are not needed to count).
    const std::optional<engine::VisionConfig> tower = vision();
    auto p = engine::RenderChatWithImages(messages, tools.is_array() ? &tools : nullptr, true, tower ? &*tower : nullptr);
    if (!p) return std::nullopt;
    return static_cast<int64_t>(p->tokens.size());
  }

  int64_t EntryTokens(const TranscriptEntry& entry) const override { return ByteEntryTokens(entry); }

  void PinPrompt(uint64_t key, const std::vector<engine::ChatMessage>& messages, const nlohmann::ordered_json& tools,
                 double seconds) const override {
    if (!engine_) return;
    // A pin holds token ids only, while the cache keys an image's blocks by
    // its hash too: a prompt with images does not render here and is not
    // pinned (its blocks stay cached as any other prefix).
    if (auto prompt = engine::RenderChat(messages, tools.is_array() ? &tools : nullptr, true)) {
      engine_->PinPrefix(key, std::move(*prompt), seconds);
    }
  }

  void Unpin(uint64_t key) const override {
    if (engine_) engine_->PinPrefix(key, {}, 0);
  }

  std::optional<engine::GenerationRequest> SummaryRequest(const std::vector<engine::ChatMessage>& messages,
                                                          int max_tokens, int thinking_budget,
                                                          uint64_t seed) const override {
    auto prompt = engine::RenderChat(messages, nullptr, true);
    if (!prompt) return std::nullopt;
    engine::GenerationRequest g;
    g.prompt = std::move(*prompt);
    g.max_tokens = max_tokens;
    g.thinking_budget = thinking_budget;
    g.starts_in_reasoning = true;
    g.sampling.temperature = 0;
    g.sampling.seed = seed;
    DecodePolicyOptions policy;
    policy.mode = DecodeMode::kNoTools;
    auto controller = DecodePolicy::Create(std::move(policy));
    if (!controller) return std::nullopt;
    g.controller = std::move(*controller);
    return g;
  }

  std::unique_ptr<OutputReader> MakeSummaryReader() const override { return std::make_unique<OutputAssembler>(); }

 private:
  engine::Engine* engine_;  // null: no pins, no tower, the format's own budgets (tests)
};

}  // namespace

Result<std::shared_ptr<const ChatDialect>> LoadMoeDsaV1Dialect(const DialectInputs& inputs) {
  return std::shared_ptr<const ChatDialect>(std::make_shared<MoeDsaDialect>(inputs.engine));
}

}  // namespace moeserve::chat
