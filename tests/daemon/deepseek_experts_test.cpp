// daemon.deepseek_experts: the `experts` setting. A daemon serving a tiny
// DeepSeek-V3.2 checkpoint in the published layout with `experts: mxfp4`
// requantises its routed experts at load: it answers, and the log-probability
// of its first answer token differs from that of a daemon serving the same
// checkpoint as stored (the FP8 weights dequantised to BF16). A model whose
// family does not convert is refused at load, naming the setting.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <unistd.h>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

std::string Checkpoint() {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "/moe_daemon_ds32_experts_" + std::to_string(::getpid());
    std::filesystem::remove_all(d);
    const std::string cmd = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/families/deepseek_v32.py write --out " +
                            d + " --layers 2 --seed 5 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}

// The first answer token's log-probability, greedy, from a daemon with `experts`.
double FirstLogprob(const std::string& experts) {
  DaemonConfig c = TestConfig();
  c.model = Checkpoint();
  c.served_model_name = "deepseek-v32-tiny";
  c.max_context = 2048;
  c.cache_tokens = 8192;
  c.experts = experts;
  std::unique_ptr<Daemon> d = StartDaemon(c);
  if (!d) return 0;
  // The low tier's thinking budget (4 tokens) closes the think block; the
  // answer's tokens carry log-probabilities.
  json body = {{"messages", UserTurn("What is 2+2?")}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", true}};
  auto r = Chat(PortOf(*d), body);
  d->Shutdown(1);
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return 0;
  const json j = r.Json();
  return j.at("choices").at(0).at("logprobs").at("content").at(0).at("logprob").get<double>();
}

TEST(DeepseekExperts, Mxfp4AtLoadServesOtherLogits) {
  const double stored = FirstLogprob("stored"), mxfp4 = FirstLogprob("mxfp4");
  std::printf("first answer token's log-probability: stored %.6f, mxfp4 %.6f\n", stored, mxfp4);
  EXPECT_LT(stored, 0);
  EXPECT_LT(mxfp4, 0);
  EXPECT_NE(stored, mxfp4);
  std::filesystem::remove_all(Checkpoint());
}

TEST(DeepseekExperts, AFamilyThatDoesNotConvertRefusesAtLoad) {
  DaemonConfig c = TestConfig();  // the moe-dsa-v1 tiny model: MXFP4 experts as stored
  c.experts = "bf16";
  auto d = Daemon::Create(c);
  ASSERT_TRUE(d) << d.error().ToString();
  ASSERT_TRUE((*d)->Start());
  auto st = (*d)->LoadModel();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("experts: bf16 requested"), std::string::npos) << st.error().message();
  (*d)->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
