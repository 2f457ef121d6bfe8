// Qwen3-Next's chat dialect: requests in its published ChatML
// (RenderQwen3Request), output read by Qwen3Assembler; in sessions, entries
// counted in the family's tokens and summaries read as the answer's text,
// never reasoning. No pins: the engine's prefix cache keeps the most
// recently used prompts' blocks.
#include "moeserve/chat/qwen3_next/qwen3_dialect.hpp"

#include <filesystem>

#include "../template_dialect.hpp"
#include "moeserve/chat/qwen3_next/qwen3_assembler.hpp"
#include "moeserve/chat/qwen3_next/qwen3_request.hpp"
#include "moeserve/engine/qwen3_chat.hpp"

namespace moeserve::chat {

namespace {

class Qwen3Dialect final : public TemplateDialect {
 public:
  explicit Qwen3Dialect(std::shared_ptr<const Qwen3Serving> serving)
      : TemplateDialect(serving->tokenizer), serving_(std::move(serving)) {
    // The markers around each kind of entry (engine/qwen3_chat.cpp): marker
    // tokens count one each, the words between them as encoded.
    markers_.turn = 2 + Words("user\n") + Words("\n");
    markers_.reasoning = 2 + Words("\n") + Words("\n") + Words("\n\n");
    markers_.call = 2 + Words("\n{\"name\": \"") + Words("\", \"arguments\": ") + Words("}\n");
    markers_.result = 2 + Words("\n") + Words("\n") + Words("\n");
  }

  std::string family() const override { return "qwen3_next"; }

  ApiResult<TemplatePrompt> RenderTemplate(const ChatRequest& request,
                                           const engine::GrammarLimits& limits) const override {
    auto p = RenderQwen3Request(request, *serving_, limits);
    if (!p) return ApiFail(p.error());
    return TemplatePrompt{std::move(p->prompt), std::move(p->controller), false};
  }

  Result<std::vector<engine::ChatPiece>> SystemPieces(const engine::ChatMessage& system) const override {
    return engine::RenderQwen3Chat({system}, nullptr, /*add_generation_prompt=*/false);
  }

  std::unique_ptr<OutputReader> MakeReader(std::vector<std::string> stop, std::optional<uint64_t> call_id_seed,
                                           bool) const override {
    return std::make_unique<Qwen3Assembler>(*serving_, std::move(stop), call_id_seed);
  }

  // The arguments as the template writes them: Python's json.dumps of the object.
  int64_t CallArgumentTokens(const nlohmann::ordered_json& args) const override {
    return Words(args.is_string() ? args.get<std::string>() : engine::PythonJsonDumps(args));
  }

 private:
  std::shared_ptr<const Qwen3Serving> serving_;
};

}  // namespace

Result<std::shared_ptr<const ChatDialect>> LoadQwen3Dialect(const DialectInputs& inputs) {
  MOE_ASSIGN_OR_RETURN(auto serving,
                       Qwen3Serving::Load((std::filesystem::path(inputs.model_dir) / "tokenizer.json").string()));
  return std::shared_ptr<const ChatDialect>(std::make_shared<Qwen3Dialect>(std::move(serving)));
}

}  // namespace moeserve::chat
