// daemon.hook_delivery: alerts posted to a real HTTP receiver: a receiver
// that fails five times then succeeds gets one logical alert, delivered once,
// with the same id and body each attempt and a signature that openssl's own
// HMAC verifies; deliveries pending when the ledger closed go out after it
// opens again; loopback, link-local (metadata) and private addresses, plain
// http and redirects are refused unless allowed; Slack format; a
// standalone daemon fires its configured hook; and a `block` budget that
// refuses a request before spend reaches 100% fires its 100% alert once,
// with the refused amount.
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "daemon_harness.hpp"
#include "moeserve/budget/hook_sender.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/usage/hook_outbox.hpp"
#include "moeserve/daemon/http/http_server.hpp"
#include "moeserve/daemon/usage/usage_ledger.hpp"
#include "moeserve/http_client/address_guard.hpp"

namespace moeserve::daemon::testing {
namespace {

using Answer = ::moeserve::daemon::HttpResponse;

constexpr const char* kSecret = "hook-secret-0123456789abcdef";

struct Received {
  std::string body, signature, delivery, content_type, timestamp;
};

// A real HTTP server that records what it is sent and answers `status(n)`
// to the n-th request (0-based).
class Receiver {
 public:
  explicit Receiver(std::function<Answer(int)> answer, int port = 0) : answer_(std::move(answer)) {
    HttpServerOptions o;
    o.port = port;
    o.threads = 1;
    HttpServerHooks hooks;
    hooks.admit = [](const HttpHead&) { return HttpAdmission::Accept(1 << 20); };
    hooks.handle = [this](HttpHead head, std::string body, std::shared_ptr<HttpExchange> ex) {
      int n;
      {
        std::lock_guard lock(mu_);
        got_.push_back({body, head.Header("x-moe-signature"), head.Header("x-moe-delivery"), head.Header("content-type"),
                        head.Header("x-moe-timestamp")});
        n = static_cast<int>(got_.size()) - 1;
      }
      ex->Reply(answer_(n));
    };
    auto s = HttpServer::Start(o, std::move(hooks));
    if (!s) ADD_FAILURE() << s.error().ToString();
    else server_ = std::move(*s);
  }
  ~Receiver() {
    if (server_) server_->Stop();
  }
  int port() const { return server_ ? server_->port() : 0; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()) + "/hook"; }
  std::vector<Received> got() {
    std::lock_guard lock(mu_);
    return got_;
  }
  bool WaitFor(size_t n, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (got().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return got().size() >= n;
  }

 private:
  std::function<Answer(int)> answer_;
  std::mutex mu_;
  std::vector<Received> got_;
  std::unique_ptr<HttpServer> server_;
};

Answer Status(int status) { return Answer{status, "text/plain", {}, "ok"}; }

HookConfig LocalHook(const std::string& url) {
  HookConfig h;
  h.name = "sre";
  h.url = url;
  h.secret = kSecret;
  h.allow_http = true;
  h.allow_private_addresses = true;  // the receiver is on loopback
  return h;
}

BudgetPolicy OneThreshold(HookConfig hook) {
  BudgetPolicy p;
  p.policy_name = "team-a";
  p.deployment_name = "tiny";
  p.pricing["low"] = {1000, 0, 0, 0};
  p.budgets.push_back({"*", BudgetPeriod::kMonth, 0.5, {1.0}, BudgetAction::kAlert});
  p.hooks.push_back(std::move(hook));
  return p;
}

// HMAC-SHA256 by openssl's command line, not the project's code.
std::string OpensslHmac(const std::string& signed_text) {
  std::string file = ::testing::TempDir() + "/moe_hook_body_" + std::to_string(::getpid());
  std::ofstream(file, std::ios::binary) << signed_text;
  FILE* p = ::popen(("openssl dgst -sha256 -hmac '" + std::string(kSecret) + "' -r " + file).c_str(), "r");
  char buf[256] = {};
  std::string out = fgets(buf, sizeof buf, p) ? buf : "";
  ::pclose(p);
  return out.substr(0, out.find(' '));
}

TEST(HookDelivery, AReceiverThatFailsFiveTimesGetsOneAlertOnceSignedCorrectly) {
  Receiver rx([](int n) { return Status(n < 5 ? 503 : 200); });
  auto ledger = UsageLedger::Open({"", SystemWallClock(), OneThreshold(LocalHook(rx.url()))});
  ASSERT_TRUE(ledger);
  std::mutex mu;
  std::map<std::string, int> results;
  HookOutbox outbox(**ledger, {0.02, 0.2, 3600}, [&](const std::string& r) {
    std::lock_guard lock(mu);
    ++results[r];
  });
  (*ledger)->SetAlertListener([&] { outbox.Wake(); });
  outbox.Start();
  // 1000 input tokens at $1000 per million: $1, past the $0.5 budget.
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {1000, 0, 0, 0}}));
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {1000, 0, 0, 0}}));  // already fired: nothing new
  ASSERT_TRUE(rx.WaitFor(6, 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // no seventh attempt comes
  outbox.Stop();
  auto got = rx.got();
  ASSERT_EQ(got.size(), 6u);
  for (const auto& g : got) {
    EXPECT_EQ(g.delivery, got[0].delivery);
    EXPECT_EQ(g.body, got[0].body);
    EXPECT_EQ(g.content_type, "application/json");
  }
  EXPECT_TRUE(got[0].delivery.starts_with("dlv_"));
  // What a receiver does (http-api.md): HMAC of "<timestamp>.<delivery>.<body>".
  ASSERT_FALSE(got[5].timestamp.empty());
  const std::string openssl = OpensslHmac(got[5].timestamp + "." + got[5].delivery + "." + got[5].body);
  ASSERT_EQ(openssl.size(), 64u);
  EXPECT_EQ(got[5].signature, "sha256=" + openssl);
  json body = json::parse(got[5].body);
  EXPECT_EQ(body["type"], "budget.threshold");
  EXPECT_EQ(body["tenant"], "acme");
  EXPECT_EQ(body["policy"], "team-a");
  EXPECT_EQ(body["deployment"], "tiny");
  EXPECT_EQ(body["threshold"], 1.0);
  EXPECT_EQ(body["spent_usd"], 1.0);
  EXPECT_EQ(body["budget_usd"], 0.5);
  EXPECT_EQ(body["tokens"]["input"], 1000);
  EXPECT_EQ(body["by_tier"]["low"]["cost_usd"], 1.0);
  EXPECT_TRUE(body["at"].get<std::string>().ends_with("Z"));
  EXPECT_EQ(*(*ledger)->CountDeliveries("delivered"), 1);
  EXPECT_EQ(*(*ledger)->CountDeliveries("pending"), 0);
  std::lock_guard lock(mu);
  EXPECT_EQ(results["retry"], 5);
  EXPECT_EQ(results["delivered"], 1);
}

// A captured delivery replayed later or under another id no longer
// verifies: the signature covers the timestamp and the id, not the body only.
TEST(HookDelivery, SignatureCoversTimestampAndDeliveryId) {
  Receiver rx([](int) { return Status(200); });
  const auto before = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string body = R"({"type":"budget.threshold","tenant":"acme"})";
  auto r = SendHook(LocalHook(rx.url()), "dlv_replay_1", body);
  ASSERT_TRUE(r.delivered) << r.error;
  auto got = rx.got();
  ASSERT_EQ(got.size(), 1u);
  const Received& g = got[0];
  EXPECT_EQ(g.delivery, "dlv_replay_1");
  ASSERT_FALSE(g.timestamp.empty());
  const long long ts = std::stoll(g.timestamp);
  EXPECT_GE(ts, before);  // the time of sending, in unix seconds
  EXPECT_EQ(g.signature, "sha256=" + OpensslHmac(g.timestamp + "." + g.delivery + "." + body));
  // The same body at another time, under another id, or signed alone: each
  // gives a different MAC, so a receiver checking the headers it got refuses.
  EXPECT_NE(g.signature, "sha256=" + OpensslHmac(std::to_string(ts + 300) + "." + g.delivery + "." + body));
  EXPECT_NE(g.signature, "sha256=" + OpensslHmac(g.timestamp + ".dlv_replay_2." + body));
  EXPECT_NE(g.signature, "sha256=" + OpensslHmac(body));
  EXPECT_EQ(HookSignature(kSecret, ts, g.delivery, body), g.signature);
}

TEST(HookDelivery, DeliveriesPendingAtACloseGoOutAfterReopen) {
  const std::string path = ::testing::TempDir() + "/moe_hook_restart_" + std::to_string(::getpid()) + ".sqlite3";
  for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(path + s);
  const int port = FreeLoopbackPort();  // nothing listens there yet
  const BudgetPolicy policy = OneThreshold(LocalHook("http://127.0.0.1:" + std::to_string(port) + "/hook"));
  {
    auto ledger = UsageLedger::Open({path, SystemWallClock(), policy});
    ASSERT_TRUE(ledger);
    HookOutbox outbox(**ledger, {0.05, 0.1, 3600}, nullptr);
    outbox.Start();
    ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {1000, 0, 0, 0}}));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // attempts fail: connection refused
    outbox.Stop();
    EXPECT_EQ(*(*ledger)->CountDeliveries("pending"), 1);
  }
  Receiver rx([](int) { return Status(204); }, port);
  ASSERT_EQ(rx.port(), port);
  auto ledger = UsageLedger::Open({path, SystemWallClock(), policy});
  ASSERT_TRUE(ledger);
  HookOutbox outbox(**ledger, {0.05, 0.1, 3600}, nullptr);
  outbox.Start();
  ASSERT_TRUE(rx.WaitFor(1, 10));
  outbox.Stop();
  EXPECT_EQ(rx.got().size(), 1u);
  EXPECT_EQ(*(*ledger)->CountDeliveries("delivered"), 1);
}

sockaddr_storage Addr(const char* text) {
  sockaddr_storage ss{};
  if (std::string(text).find(':') != std::string::npos) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    EXPECT_EQ(inet_pton(AF_INET6, text, &a->sin6_addr), 1) << text;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    EXPECT_EQ(inet_pton(AF_INET, text, &a->sin_addr), 1) << text;
  }
  return ss;
}

// The rule itself is http_client's guard (http_client.address_guard tests
// every range at connect time); here each range is refused to a hook.
TEST(HookDelivery, AddressesHooksMayNotReachUnlessAllowed) {
  for (const char* refused : {"127.0.0.1", "127.8.9.10", "169.254.169.254", "10.1.2.3", "172.16.0.1", "172.31.255.255",
                              "192.168.1.1", "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "::",
                              "fe80::1", "fd00::1", "fc00::2", "::ffff:127.0.0.1", "::ffff:169.254.169.254",
                              "64:ff9b::a9fe:a9fe", "ff02::1",
                              // IPv4-mapped and NAT64 forms of private v4
                              "::ffff:10.0.0.1", "::ffff:192.168.0.1", "64:ff9b::7f00:1", "64:ff9b::a00:1",
                              // local-use NAT64, 6to4 and Teredo reach v4 through a relay
                              "64:ff9b:1::a9fe:a9fe", "64:ff9b:1:ffff::808:808", "64:ff9b:1::808:808",
                              "2002:a9fe:a9fe::1", "2002:7f00:1::", "2002:808:808::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                              "2001::1"}) {
    auto a = Addr(refused);
    EXPECT_FALSE(http_client::IsPublicAddress(reinterpret_cast<sockaddr*>(&a))) << refused;
    // Sent to it: refused when the socket is opened, before any packet.
    const std::string host = std::string(refused).find(':') != std::string::npos ? "[" + std::string(refused) + "]" : refused;
    HookConfig h = LocalHook("http://" + host + ":9/hook");
    h.allow_private_addresses = false;
    const auto r = SendHook(h, "dlv_range", "{}", 2);
    EXPECT_TRUE(r.refused) << refused << ": " << r.error;
    EXPECT_NE(r.error.find("allowPrivateAddresses"), std::string::npos) << r.error;
  }
  for (const char* allowed : {"8.8.8.8", "172.32.0.1", "192.169.0.1", "2001:4860:4860::8888", "::ffff:8.8.8.8",
                              "64:ff9b::808:808", "2001:1::1", "2003::1"}) {
    auto a = Addr(allowed);
    EXPECT_TRUE(http_client::IsPublicAddress(reinterpret_cast<sockaddr*>(&a))) << allowed;
  }
}

TEST(HookDelivery, LoopbackMetadataPlainHttpAndRedirectsAreRefused) {
  Receiver rx([](int) { return Status(200); });
  HookConfig h = LocalHook(rx.url());
  h.allow_private_addresses = false;
  auto r = SendHook(h, "dlv_1", "{}");
  EXPECT_TRUE(r.refused) << r.error;
  EXPECT_FALSE(r.delivered);
  h.url = "http://localhost:" + std::to_string(rx.port()) + "/hook";  // a name that resolves to loopback
  r = SendHook(h, "dlv_2", "{}");
  EXPECT_TRUE(r.refused) << r.error;
  h.url = "http://169.254.169.254/latest/meta-data/";
  r = SendHook(h, "dlv_3", "{}", 2);
  EXPECT_TRUE(r.refused) << r.error;
  EXPECT_EQ(r.error.find("meta-data"), std::string::npos) << "the URL's path is not for logs";
  EXPECT_TRUE(rx.got().empty());

  h = LocalHook(rx.url());
  h.allow_http = false;
  r = SendHook(h, "dlv_4", "{}");
  EXPECT_TRUE(r.refused) << r.error;
  EXPECT_TRUE(rx.got().empty());

  // A redirect is an answer, not a place to go.
  Receiver target([](int) { return Status(200); });
  Receiver redirect([&](int) { return Answer{302, "text/plain", {{"Location", target.url()}}, ""}; });
  r = SendHook(LocalHook(redirect.url()), "dlv_5", "{}");
  EXPECT_FALSE(r.delivered);
  EXPECT_EQ(r.http_status, 302);
  EXPECT_EQ(redirect.got().size(), 1u);
  EXPECT_TRUE(target.got().empty());

  // With both allowances the same receiver is reached.
  r = SendHook(LocalHook(rx.url()), "dlv_6", "{}");
  EXPECT_TRUE(r.delivered) << r.error;
  EXPECT_EQ(rx.got().size(), 1u);
}

TEST(HookDelivery, ConfigRefusesPlainHttpWithoutAllowHttp) {
  auto c = ParseDaemonConfigYaml("hooks:\n  - {name: a, url: 'http://alerts.example/x', secretFile: /nonexistent}\n", "c.yaml");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("allowHTTP"), std::string::npos);
  c = ParseDaemonConfigYaml("hooks:\n  - {name: a, url: 'ftp://alerts.example/x', secretFile: /x}\n", "c.yaml");
  EXPECT_FALSE(c);
  c = ParseDaemonConfigYaml("budgets:\n  - {tenant: a, period: week, limitUSD: 1}\n", "c.yaml");
  EXPECT_FALSE(c);
  c = ParseDaemonConfigYaml("budgets:\n  - {tenant: a, period: day, limitUSD: 1, action: reject}\n", "c.yaml");
  EXPECT_FALSE(c);
  c = ParseDaemonConfigYaml("budgets:\n  - {tenant: a, period: day, limitUSD: 1, thresholds: [1.5]}\n", "c.yaml");
  EXPECT_FALSE(c);
  c = ParseDaemonConfigYaml("budgets:\n  - {tenant: a, period: day, limitUSD: 1}\n", "c.yaml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->budget.budgets[0].thresholds, (std::vector<double>{0.5, 0.8, 1.0}));
}

TEST(HookDelivery, SlackFormatIsATextMessage) {
  Receiver rx([](int) { return Status(200); });
  HookConfig h = LocalHook(rx.url());
  h.format = HookFormat::kSlack;
  auto ledger = UsageLedger::Open({"", SystemWallClock(), OneThreshold(h)});
  ASSERT_TRUE(ledger);
  HookOutbox outbox(**ledger, {0.02, 0.1, 3600}, nullptr);
  (*ledger)->SetAlertListener([&] { outbox.Wake(); });
  outbox.Start();
  ASSERT_TRUE((*ledger)->ChargeAndWait({"acme", "low", {1000, 0, 0, 0}}));
  ASSERT_TRUE(rx.WaitFor(1, 10));
  outbox.Stop();
  json body = json::parse(rx.got()[0].body);
  ASSERT_TRUE(body.contains("text"));
  const std::string text = body["text"];
  EXPECT_NE(text.find("tenant acme has spent $1.00 of its monthly budget of $0.50"), std::string::npos) << text;
  const auto all = rx.got();
  const Received& got = all[0];
  EXPECT_EQ(got.signature, "sha256=" + OpensslHmac(got.timestamp + "." + got.delivery + "." + got.body));
}

TEST(HookDelivery, AStandaloneDaemonFiresItsConfiguredHook) {
  Receiver rx([](int) { return Status(200); });
  const std::string secret_file = ::testing::TempDir() + "/moe_hook_secret_" + std::to_string(::getpid());
  std::ofstream(secret_file) << kSecret << "\n";
  DaemonConfig c = TestConfig();
  // About $0.001 a request (10 prompt tokens at $100 per thousand): sixteen
  // concurrent requests pass 50%, 80% and 100% of $0.01 in whatever batches
  // the ledger commits them.
  auto parsed = ParseDaemonConfigYaml("pricing:\n  low: {input: 100000}\nbudgets:\n  - {tenant: '*', period: day, limitUSD: 0.01}\n"
                                      "hooks:\n  - {name: sre, url: '" + rx.url() + "', secretFile: '" + secret_file +
                                          "', allowHTTP: true, allowPrivateAddresses: true}\n"
                                      "hook_retry_initial_seconds: 0.05\n",
                                      "daemon.yaml", c);
  ASSERT_TRUE(parsed) << parsed.error().ToString();
  auto d = StartDaemon(*parsed);
  ASSERT_TRUE(d);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      if (Chat(PortOf(*d), {{"messages", UserTurn("hi " + std::to_string(i % 10))}, {"max_tokens", 1}}).status == 200) ++ok;
    });
  }
  for (auto& c : clients) c.join();
  ASSERT_EQ(ok.load(), 16);
  ASSERT_TRUE(rx.WaitFor(3, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(rx.got().size(), 3u);  // each threshold once, however the requests were batched
  std::set<double> thresholds;
  for (const auto& g : rx.got()) {
    json b = json::parse(g.body);
    thresholds.insert(b["threshold"].get<double>());
    EXPECT_EQ(b["tenant"], "default");
    EXPECT_EQ(b["deployment"], "tiny");
    EXPECT_EQ(b["policy"], "standalone");
    EXPECT_EQ(g.signature, "sha256=" + OpensslHmac(g.timestamp + "." + g.delivery + "." + g.body));
  }
  EXPECT_EQ(thresholds, (std::set<double>{0.5, 0.8, 1.0}));
  auto m = Http(PortOf(*d), "GET", "/metrics");
  EXPECT_NE(m.body.find("moe_alert_deliveries_total{result=\"delivered\"} 3"), std::string::npos) << m.body;
  d->Shutdown(1);
}

// Admission refuses once spend plus the next request's worst case would pass
// the limit, so spend stops short of 100%: the refusal is what fires the
// 100% alert (budget_rules.hpp RefusalReachesLimit), once a period.
TEST(HookDelivery, ABlockBudgetsRefusalFiresItsHundredPercentAlertOnceWithTheRefusedAmount) {
  Receiver rx([](int) { return Status(200); });
  const std::string secret_file = ::testing::TempDir() + "/moe_hook_secret_refusal_" + std::to_string(::getpid());
  std::ofstream(secret_file) << kSecret << "\n";
  // $0.001 a completion token, prompts free: spend is a whole number of
  // tenths of a cent, served only while it fits the $0.0105, so it can never
  // reach 100% by itself. max_tokens 3: a worst case of $0.003.
  auto parsed = ParseDaemonConfigYaml(
      "pricing:\n  low: {input: 0, output: 1000, reasoning: 1000}\n"
      "budgets:\n  - {tenant: '*', period: day, limitUSD: 0.0105, action: block}\n"
      "hooks:\n  - {name: sre, url: '" + rx.url() + "', secretFile: '" + secret_file +
          "', allowHTTP: true, allowPrivateAddresses: true}\n"
      "hook_retry_initial_seconds: 0.05\n",
      "daemon.yaml", TestConfig());
  ASSERT_TRUE(parsed) << parsed.error().ToString();
  auto d = StartDaemon(*parsed);
  ASSERT_TRUE(d);
  const json ask = {{"messages", UserTurn("hello")}, {"max_tokens", 3}};
  HttpResponse r = Chat(PortOf(*d), ask);
  for (int i = 0; i < 20 && r.status == 200; ++i) r = Chat(PortOf(*d), ask);
  ASSERT_EQ(r.status, 403) << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "budget_exceeded");
  auto hundred = [&] {
    std::vector<json> out;
    for (const auto& g : rx.got())
      if (json b = json::parse(g.body); b["threshold"] == 1.0) out.push_back(b);
    return out;
  };
  for (int i = 0; i < 500 && hundred().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(hundred().size(), 1u) << "the refusal did not fire the 100% alert";
  const json b = hundred()[0];
  EXPECT_EQ(b["type"], "budget.threshold");
  EXPECT_EQ(b["tenant"], "default");
  EXPECT_NEAR(b["refused_usd"].get<double>(), 0.003, 1e-9);
  EXPECT_LT(b["spent_usd"].get<double>(), b["budget_usd"].get<double>());  // fired by the refusal, not by spend
  EXPECT_GE(b["spent_usd"].get<double>(), 0.0075);
  // More refusals in the period fire nothing more; the lower thresholds say nothing of a refusal.
  EXPECT_EQ(Chat(PortOf(*d), ask).status, 403);
  EXPECT_EQ(Chat(PortOf(*d), ask).status, 403);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(hundred().size(), 1u);
  std::set<double> thresholds;
  for (const auto& g : rx.got()) {
    json body = json::parse(g.body);
    EXPECT_TRUE(thresholds.insert(body["threshold"].get<double>()).second) << "fired twice: " << g.body;
    if (body["threshold"] != 1.0) {
      EXPECT_FALSE(body.contains("refused_usd")) << g.body;
    }
  }
  EXPECT_TRUE(thresholds.contains(0.5));
  // GET /v1/usage lists the period's refusal (what an operator fires from).
  const json usage = Http(PortOf(*d), "GET", "/v1/usage").Json();
  ASSERT_EQ(usage["refusals"].size(), 1u) << usage.dump();
  EXPECT_EQ(usage["refusals"][0]["tenant"], "default");
  EXPECT_EQ(usage["refusals"][0]["period"], "day");
  EXPECT_NEAR(usage["refusals"][0]["refused_usd"].get<double>(), 0.003, 1e-9);
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
