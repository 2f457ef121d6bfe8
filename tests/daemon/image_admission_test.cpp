// daemon.image_admission: a request's images are fetched and decoded only
// after its tenant's admission, and a continued conversation does not decode
// its kept images again.
//  - A tenant over its requestsPerMinute sends requests naming images on an
//    allowed host (the chat endpoint, the Responses API, a session turn):
//    each is 429, and the host never receives a request (admission came
//    first; nothing was fetched or decoded for a refused request), and
//    each refusal counts in moe_requests_total.
//  - A response with an image, then one continuing it with
//    previous_response_id, then a session turn with an image and a text-only
//    turn after it: moe_image_decodes_total counts one decode per new image
//    and none for the kept ones, which come from the decoded-image cache
//    (moe_image_decoded_cache_hits_total).
#include <gtest/gtest.h>

#include <fstream>

#include "daemon_harness.hpp"
#include "image_serving.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAlice = {{"Authorization", "Bearer sk-alice-0123456789"}};
const std::map<std::string, std::string> kAdmin = {{"Authorization", "Bearer sk-admin-0123456789"}};

DaemonConfig VisionConfig(const std::string& name) {
  DaemonConfig c = TestConfig();
  c.model = VisionModelDir();
  c.state_dir = ::testing::TempDir() + "/moe_image_admission_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(c.state_dir);
  std::filesystem::create_directories(c.state_dir);
  c.api_keys_file = c.state_dir + "/keys.yaml";
  std::ofstream(c.api_keys_file) << "keys:\n  - {key: sk-alice-0123456789, tenant: alice}\n"
                                    "  - {key: sk-admin-0123456789, tenant: ops, role: admin}\n";
  return c;
}

TEST(ImageAdmission, ARateLimitedTenantsImagesAreNeverFetched) {
  ImageHost host(NoisyPng(32, 24, 1), /*trickle=*/false);
  DaemonConfig c = VisionConfig("rate");
  c.images.allowed_hosts = {"127.0.0.1"};
  c.images.allow_private_addresses = true;
  Budget b;
  b.tenant = "*";
  b.limit_usd = 1000;
  b.action = BudgetAction::kBlock;
  b.requests_per_minute = 1;
  c.budget.budgets.push_back(b);
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  const int port = PortOf(*d);
  auto session = Http(port, "POST", "/v1/sessions", json{{"system", "s"}}.dump(), kAlice);
  ASSERT_EQ(session.status, 200) << session.body;
  const std::string sid = session.Json()["id"];

  // The minute's one request, text only.
  ASSERT_EQ(Chat(port, json{{"messages", UserTurn("hi")}, {"max_tokens", 2}}, kAlice).status, 200);

  auto chat = Chat(port, json{{"messages", ImageChatMessages({host.Url(1), host.Url(2)})}, {"max_tokens", 2}}, kAlice);
  EXPECT_EQ(chat.status, 429) << chat.body;
  EXPECT_EQ(chat.Json()["error"]["code"], "rate_limit_exceeded") << chat.body;
  auto response = Http(port, "POST", "/v1/responses",
                       json{{"model", "tiny"}, {"input", ImageInput(host.Url(3))}, {"max_output_tokens", 2}}.dump(),
                       kAlice);
  EXPECT_EQ(response.status, 429) << response.body;
  auto turn = Http(port, "POST", "/v1/sessions/" + sid + "/chat/completions",
                   json{{"messages", ImageChatMessages({host.Url(4)})}, {"max_tokens", 2}}.dump(), kAlice);
  EXPECT_EQ(turn.status, 429) << turn.body;
  EXPECT_EQ(host.requests(), 0) << "a refused request's images were fetched";
  // Each refusal is counted as the chat path counts its own.
  const std::string scrape = Http(port, "GET", "/metrics", "", kAdmin).body;
  EXPECT_NE(scrape.find("\nmoe_requests_total{status=\"429\"} 3\n"), std::string::npos) << scrape.substr(0, 2000);
  d->Shutdown(1);
  std::filesystem::remove_all(c.state_dir);
}

TEST(ImageAdmission, AContinuationDecodesNoKeptImageAgain) {
  DaemonConfig c = VisionConfig("cache");
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  const int port = PortOf(*d);
  auto counters = [&] {
    const std::string scrape = Http(port, "GET", "/metrics", "", kAdmin).body;
    return std::pair<double, double>{CounterValue(scrape, "moe_image_decodes_total"),
                                     CounterValue(scrape, "moe_image_decoded_cache_hits_total")};
  };
  ASSERT_EQ(counters(), (std::pair<double, double>{0, 0}));

  auto first = Http(port, "POST", "/v1/responses",
                    json{{"model", "tiny"}, {"input", ImageInput(PngDataUrl(NoisyPng(48, 32, 2)))},
                         {"max_output_tokens", 2}}
                        .dump(),
                    kAlice);
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(counters(), (std::pair<double, double>{1, 0}));
  auto next = Http(port, "POST", "/v1/responses",
                   json{{"model", "tiny"}, {"input", "And now?"}, {"previous_response_id", first.Json()["id"]},
                        {"max_output_tokens", 2}}
                       .dump(),
                   kAlice);
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_GT(next.Json()["usage"]["input_tokens_details"]["image_tokens"].get<int64_t>(), 0) << next.body;
  EXPECT_EQ(counters(), (std::pair<double, double>{1, 1}));

  auto session = Http(port, "POST", "/v1/sessions", json{{"system", "s"}}.dump(), kAlice);
  ASSERT_EQ(session.status, 200) << session.body;
  const std::string turns = "/v1/sessions/" + session.Json()["id"].get<std::string>() + "/chat/completions";
  auto with_image = Http(port, "POST", turns,
                         json{{"messages", ImageChatMessages({PngDataUrl(NoisyPng(40, 24, 3))})}, {"max_tokens", 2}}.dump(),
                         kAlice);
  ASSERT_EQ(with_image.status, 200) << with_image.body;
  EXPECT_EQ(counters(), (std::pair<double, double>{2, 1}));
  auto text_only = Http(port, "POST", turns, json{{"messages", UserTurn("And the colours?")}, {"max_tokens", 2}}.dump(),
                        kAlice);
  ASSERT_EQ(text_only.status, 200) << text_only.body;
  EXPECT_GT(text_only.Json()["usage"]["prompt_tokens_details"]["image_tokens"].get<int64_t>(), 0) << text_only.body;
  EXPECT_EQ(counters(), (std::pair<double, double>{2, 2}));
  d->Shutdown(1);
  std::filesystem::remove_all(c.state_dir);
}

}  // namespace
}  // namespace moeserve::daemon::testing
