// HarmonyChatHooks (gpt_oss_model.hpp): harmony as the engine sees it, and
// LoadGptOss, the family's loader.
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"

namespace moeserve::engine {

namespace {

// Which harmony message the generated tokens are in, so that analysis
// tokens are reported (and budgeted) as reasoning. Fed the prompt from its
// last <|start|> on, then every emitted token.
class ChannelTracker {
 public:
  ChannelTracker(const HfTokenizer& tokenizer, const HarmonyTokens& t) : tokenizer_(&tokenizer), t_(t) {}

  bool InAnalysisBody() const { return state_ == State::kBody && analysis_; }
  bool IsTerminator(int token) const { return token == t_.end || token == t_.call || token == t_.return_; }

  void Feed(int token) {
    if (token == t_.start) {
      state_ = State::kHeader;
      header_.clear();
      return;
    }
    switch (state_) {
      case State::kHeader:
        if (token == t_.message) {
          analysis_ = HeaderChannel() == "analysis";
          state_ = State::kBody;
        } else if (header_.size() < 64) {
          header_.push_back(token);
        }
        break;
      case State::kBody:
        if (IsTerminator(token)) {
          state_ = State::kOutside;
          analysis_ = false;
        }
        break;
      case State::kOutside:
        break;
    }
  }

 private:
  enum class State { kHeader, kBody, kOutside };
  // The word after <|channel|> in the header ("analysis", "final", ...).
  std::string HeaderChannel() const {
    auto it = std::find(header_.begin(), header_.end(), t_.channel);
    if (it == header_.end()) return "";
    std::vector<int> rest(it + 1, header_.end());
    auto stop = std::find_if(rest.begin(), rest.end(), [&](int id) { return id == t_.constrain || id == t_.channel; });
    rest.erase(stop, rest.end());
    std::istringstream words(tokenizer_->Decode(rest));
    std::string word;
    words >> word;
    return word;
  }

  const HfTokenizer* tokenizer_;
  HarmonyTokens t_;
  State state_ = State::kHeader;  // a generation starts after <|start|>assistant
  bool analysis_ = false;
  std::vector<int> header_;
};

// The family's view of a sequence: ChannelTracker over its prompt's last
// message, then every emitted token.
class HarmonyReasoning final : public ReasoningTracker {
 public:
  HarmonyReasoning(const HfTokenizer& tokenizer, const HarmonyTokens& t) : channel_(tokenizer, t) {}
  ChannelTracker& channel() { return channel_; }
  bool InReasoning() const override { return channel_.InAnalysisBody(); }
  bool Feed(int token, bool is_stop) override {
    (void)is_stop;  // harmony's terminators end a message whether or not they stop the turn
    const bool reasoning = channel_.InAnalysisBody() && !channel_.IsTerminator(token);
    channel_.Feed(token);
    return reasoning;
  }

 private:
  ChannelTracker channel_;
};

// No chat format: ids in, ids out (GptOssIdsOnlyChat).
class NoReasoning final : public ReasoningTracker {
 public:
  bool InReasoning() const override { return false; }
  bool Feed(int, bool) override { return false; }
};

class IdsOnlyChat final : public ChatHooks {
 public:
  IdsOnlyChat(std::vector<int> stops, int vocab) : stops_(std::move(stops)), vocab_(vocab) {}
  std::string family() const override { return "gpt-oss"; }
  std::vector<int> DefaultStops() const override { return stops_; }
  int sampled_ids() const override { return vocab_; }
  std::unique_ptr<ReasoningTracker> NewTracker(const GenerationRequest&) const override {
    return std::make_unique<NoReasoning>();
  }
  std::vector<int> CloseReasoning() const override { return {}; }
  std::optional<int> AllMaskedToken() const override { return std::nullopt; }

 private:
  std::vector<int> stops_;
  int vocab_;
};

}  // namespace

std::shared_ptr<const ChatHooks> GptOssIdsOnlyChat(const GptOssConfig& config) {
  std::vector<int> stops;
  for (int e : config.eos_tokens)
    if (e >= 0 && e < config.vocab) stops.push_back(e);
  return std::make_shared<const IdsOnlyChat>(std::move(stops), config.vocab);
}

Result<std::shared_ptr<const HarmonyChatHooks>> HarmonyChatHooks::Create(HfTokenizer tokenizer, const GptOssConfig& config) {
  if (tokenizer.vocab_size() > config.vocab)
    return Fail(Error::InvalidArgument("tokenizer.json defines " + std::to_string(tokenizer.vocab_size()) +
                                       " tokens, more than config.json's vocab_size " + std::to_string(config.vocab)));
  std::shared_ptr<HarmonyChatHooks> h(new HarmonyChatHooks(std::move(tokenizer)));
  MOE_ASSIGN_OR_RETURN(h->harmony_, HarmonyTokens::From(h->tokenizer_));
  h->stops_ = HarmonyStopTokens(h->harmony_);
  for (int e : config.eos_tokens)
    if (e >= 0 && e < config.vocab && std::find(h->stops_.begin(), h->stops_.end(), e) == h->stops_.end())
      h->stops_.push_back(e);
  const HarmonyTokens& t = h->harmony_;
  MOE_ASSIGN_OR_RETURN(auto assistant, h->tokenizer_.Encode("assistant"));
  MOE_ASSIGN_OR_RETURN(auto final_word, h->tokenizer_.Encode("final"));
  h->close_analysis_ = {t.end, t.start};
  h->close_analysis_.insert(h->close_analysis_.end(), assistant.begin(), assistant.end());
  h->close_analysis_.push_back(t.channel);
  h->close_analysis_.insert(h->close_analysis_.end(), final_word.begin(), final_word.end());
  h->close_analysis_.push_back(t.message);
  return std::shared_ptr<const HarmonyChatHooks>(std::move(h));
}

std::unique_ptr<ReasoningTracker> HarmonyChatHooks::NewTracker(const GenerationRequest& request) const {
  auto r = std::make_unique<HarmonyReasoning>(tokenizer_, harmony_);
  // The prompt may end inside a message (a prefilled header): read its last one.
  const auto& p = request.prompt;
  auto last_start = std::find(p.rbegin(), p.rend(), harmony_.start);
  for (auto it = last_start == p.rend() ? p.end() : last_start.base() - 1; it != p.end(); ++it) r->channel().Feed(*it);
  return r;
}

Result<FamilyParts> LoadGptOss(const std::string& dir, kernels::Isa isa, bool bf16_activations) {
  MOE_ASSIGN_OR_RETURN(HfTokenizer tokenizer, HfTokenizer::FromFile((std::filesystem::path(dir) / "tokenizer.json").string()));
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<GptOssModel> model, GptOssModel::Load(dir, isa, bf16_activations));
  FamilyParts parts;
  MOE_ASSIGN_OR_RETURN(parts.chat, HarmonyChatHooks::Create(std::move(tokenizer), model->config()));
  parts.model = std::move(model);
  return parts;
}

}  // namespace moeserve::engine
