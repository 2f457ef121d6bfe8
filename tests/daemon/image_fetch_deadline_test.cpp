// daemon.image_fetch_deadline: a slow allowed image host ties up neither the
// HTTP threads nor more than its tenant's share of the image workers.
//
// The host trickles one byte every 100 ms and never finishes. The daemon has
// two HTTP threads; a tenant sends two requests of four such URLs each.
//  - While both requests' fetches stall at the host, /healthz answers (the
//    fetches run on image workers, not on the HTTP threads), and another
//    tenant's request with an image is served.
//  - A third request of the same tenant is refused at once, 429
//    too_many_image_requests (image_tenant_max_in_flight = 2), and the host
//    never hears of it.
//  - Each stalled request ends with a 400 naming
//    image_fetch_request_timeout_seconds (5 s): its fetches together had
//    that long, though one fetch alone may take image_fetch_timeout_seconds
//    (30 s); the host saw one fetch of each request and none of the refused
//    third.
#include <gtest/gtest.h>

#include <fstream>
#include <future>

#include "daemon_harness.hpp"
#include "image_serving.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAlice = {{"Authorization", "Bearer sk-alice-0123456789"}};
const std::map<std::string, std::string> kBob = {{"Authorization", "Bearer sk-bob-0123456789ab"}};

TEST(ImageFetchDeadline, ASlowHostHoldsNeitherHttpThreadsNorOtherTenantsImageWork) {
  ImageHost host(NoisyPng(32, 24, 1), /*trickle=*/true);
  DaemonConfig c = TestConfig();
  c.model = VisionModelDir();
  c.state_dir = ::testing::TempDir() + "/moe_image_fetch_deadline_" + std::to_string(::getpid());
  std::filesystem::remove_all(c.state_dir);
  std::filesystem::create_directories(c.state_dir);
  c.api_keys_file = c.state_dir + "/keys.yaml";
  std::ofstream(c.api_keys_file) << "keys:\n  - {key: sk-alice-0123456789, tenant: alice}\n"
                                    "  - {key: sk-bob-0123456789ab, tenant: bob}\n";
  c.http_threads = 2;
  c.images.allowed_hosts = {"127.0.0.1"};
  c.images.allow_private_addresses = true;
  c.images.fetch_timeout_seconds = 30;
  c.images.fetch_request_timeout_seconds = 5;
  c.image_work.workers = 4;
  c.image_work.tenant_max_in_flight = 2;
  auto d = StartDaemon(c);
  ASSERT_NE(d, nullptr);
  const int port = PortOf(*d);
  const json stalled = {{"messages", ImageChatMessages({host.Url(1), host.Url(2), host.Url(3), host.Url(4)})},
                        {"max_tokens", 2}};
  auto first = std::async(std::launch::async, [&] { return Chat(port, stalled, kAlice); });
  auto second = std::async(std::launch::async, [&] { return Chat(port, stalled, kAlice); });
  // Both requests' first fetches reach the host and stall there.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (host.open() < 2 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(host.open(), 2);

  auto third = Chat(port, stalled, kAlice);
  EXPECT_EQ(third.status, 429) << third.body;
  EXPECT_EQ(third.Json()["error"]["code"], "too_many_image_requests") << third.body;
  EXPECT_NE(third.body.find("image_tenant_max_in_flight"), std::string::npos) << third.body;
  auto bobs = Chat(port, json{{"messages", ImageChatMessages({PngDataUrl(NoisyPng(32, 24, 2))})}, {"max_tokens", 2}},
                   kBob);
  EXPECT_EQ(bobs.status, 200) << bobs.body;
  EXPECT_EQ(Http(port, "GET", "/healthz").status, 200);
  // All of that was answered while the fetches still stalled at the host.
  EXPECT_GE(host.open(), 1);
  EXPECT_EQ(host.requests(), 2);

  for (auto* f : {&first, &second}) {
    HttpResponse r = f->get();
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("image_fetch_request_timeout_seconds"), std::string::npos) << r.body;
    EXPECT_EQ(r.Json()["error"]["param"], "messages[0].content[1].image_url.url") << r.body;
  }
  EXPECT_EQ(host.requests(), 2);  // each request ended within its first URL's fetch
  d->Shutdown(1);
  std::filesystem::remove_all(c.state_dir);
}

}  // namespace
}  // namespace moeserve::daemon::testing
