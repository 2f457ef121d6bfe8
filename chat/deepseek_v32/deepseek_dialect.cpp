// DeepSeek-V3.2's chat dialect: requests in its published encoding in
// thinking mode (RenderDeepseekRequest), output read by DeepseekAssembler; in
// sessions, entries counted in the family's tokens (the markers one each,
// the DSML markup and the words between them as encoded) and summaries read
// as the answer's text, never reasoning. No pins: the engine's prefix cache
// keeps the most recently used prompts' blocks.
#include "moeserve/chat/deepseek_v32/deepseek_dialect.hpp"

#include <filesystem>

#include "../template_dialect.hpp"
#include "moeserve/chat/deepseek_v32/deepseek_assembler.hpp"
#include "moeserve/chat/deepseek_v32/deepseek_request.hpp"
#include "moeserve/engine/deepseek_chat.hpp"

namespace moeserve::chat {

namespace {

class DeepseekDialect final : public TemplateDialect {
 public:
  explicit DeepseekDialect(std::shared_ptr<const DeepseekServing> serving)
      : TemplateDialect(serving->tokenizer), serving_(std::move(serving)) {
    // <｜User｜>..<｜Assistant｜></think>, or an answer and its end of sentence.
    markers_.turn = 3;
    markers_.reasoning = 1;  // </think>
    markers_.call = Words("\n\n" + std::string(engine::kDsmlCallsOpen) + "\n" + std::string(engine::kDsmlInvokeOpen)) +
            Words("\">\n\n" + std::string(engine::kDsmlInvokeClose) + "\n" + std::string(engine::kDsmlCallsClose));
    markers_.result = Words("\n\n<function_results>\n<result>") + Words("</result>\n</function_results>\n\n") + 1;
  }

  std::string family() const override { return "deepseek_v32"; }

  ApiResult<TemplatePrompt> RenderTemplate(const ChatRequest& request,
                                           const engine::GrammarLimits& limits) const override {
    auto p = RenderDeepseekRequest(request, serving_, limits);
    if (!p) return ApiFail(p.error());
    return TemplatePrompt{std::move(p->prompt), std::move(p->controller), p->tools};
  }

  Result<std::vector<engine::ChatPiece>> SystemPieces(const engine::ChatMessage& system) const override {
    return engine::RenderDeepseekChat({system}, {});
  }

  std::unique_ptr<OutputReader> MakeReader(std::vector<std::string> stop, std::optional<uint64_t> call_id_seed,
                                           bool tools) const override {
    return std::make_unique<DeepseekAssembler>(*serving_, std::move(stop), call_id_seed, tools);
  }

  // The arguments as DSML parameters: each one's tag, with its value as
  // text (a string) or compact JSON.
  int64_t CallArgumentTokens(const nlohmann::ordered_json& args) const override {
    if (!args.is_object()) return Words(args.is_string() ? args.get<std::string>() : args.dump());
    int64_t n = 0;
    for (auto it = args.begin(); it != args.end(); ++it) {
      const bool text = it.value().is_string();
      n += Words("\n" + std::string(engine::kDsmlParameterOpen) + it.key() +
                 (text ? "\" string=\"true\">" : "\" string=\"false\">") +
                 (text ? it.value().get<std::string>() : engine::PythonJsonDumps(it.value())) +
                 std::string(engine::kDsmlParameterClose));
    }
    return n;
  }

 private:
  std::shared_ptr<const DeepseekServing> serving_;
};

}  // namespace

Result<std::shared_ptr<const ChatDialect>> LoadDeepseekDialect(const DialectInputs& inputs) {
  MOE_ASSIGN_OR_RETURN(auto serving,
                       DeepseekServing::Load((std::filesystem::path(inputs.model_dir) / "tokenizer.json").string()));
  return std::shared_ptr<const ChatDialect>(std::make_shared<DeepseekDialect>(std::move(serving)));
}

}  // namespace moeserve::chat
