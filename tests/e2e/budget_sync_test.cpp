// e2e.budget_sync: one QuotaPolicy over two MoEDeployments of two replicas
// each, the operator (usage sync every 300 ms) against the Kubernetes API
// double, and four real daemons (the operator's config.yaml, parsed by the
// daemon's own parser) on 127.0.0.2-5, the pod IPs the test writes as the
// kubelet would. Each request costs $1 (one completion token at $1 per
// token), the budget is $10 a month with action block and hooks at
// 50/80/100% posted to a real HTTP receiver:
//  - each hook fires once when the combined spend reaches its threshold,
//    signed as openssl's HMAC of "<timestamp>.<delivery id>.<body>" says;
//  - an operator stopped before 80% and started again after it fires 80%
//    once and repeats nothing;
//  - once status shows the spend at 100%, every replica refuses the tenant
//    with 403 budget_exceeded (the push comes before the status write, in
//    the same sync);
//  - a pod replaced without its ledger (in-memory, new ledger id) between
//    two reads: nothing of the old pod's spend is lost, nothing counted
//    twice; the replacement restores the global spend from the ConfigMap's
//    spend.json before any sync reaches it;
//  - a request refused at 80% (its worst case would pass the limit) fires
//    the 100% alert once, with the refused amount, though the summed spend
//    never reaches 100%.
#include <gtest/gtest.h>

#include <curl/curl.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <fstream>
#include <map>
#include <mutex>

#include "../daemon/daemon_harness.hpp"
#include "fake_apiserver.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/http/http_server.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/operator.hpp"
#include "moeserve/operator/usage_sync.hpp"

namespace moeserve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr char kNs[] = "team-a";
constexpr char kPolicy[] = "shared";
constexpr char kHookSecret[] = "hook-secret-0123456789abcdef";
constexpr double kLimit = 10;

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 60s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

struct Reply {
  long status = 0;
  json body;
};

size_t Append(char* d, size_t s, size_t n, void* out) {
  static_cast<std::string*>(out)->append(d, s * n);
  return s * n;
}

// One request to a daemon on any loopback address.
Reply Call(const std::string& method, const std::string& url, const std::string& key, const std::string& body = "") {
  CURL* c = curl_easy_init();
  std::string got;
  curl_slist* h = curl_slist_append(nullptr, ("Authorization: Bearer " + key).c_str());
  h = curl_slist_append(h, "Content-Type: application/json");
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  if (!body.empty()) curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &got);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
  Reply r;
  if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  r.body = json::parse(got, nullptr, false);
  return r;
}

// HMAC-SHA256 by openssl's command line, not the project's code.
std::string OpensslHmac(const std::string& signed_text) {
  const std::string file = ::testing::TempDir() + "/budget_sync_body";
  std::ofstream(file, std::ios::binary) << signed_text;
  FILE* p = ::popen(("openssl dgst -sha256 -hmac '" + std::string(kHookSecret) + "' -r " + file).c_str(), "r");
  char buf[256] = {};
  std::string out = fgets(buf, sizeof buf, p) ? buf : "";
  ::pclose(p);
  return out.substr(0, out.find(' '));
}

struct Delivery {
  std::string id, signature, body, timestamp;
};

// A real HTTP receiver for the hooks.
class Receiver {
 public:
  Receiver() {
    daemon::HttpServerOptions o;
    o.threads = 1;
    daemon::HttpServerHooks hooks;
    hooks.admit = [](const daemon::HttpHead&) { return daemon::HttpAdmission::Accept(1 << 20); };
    hooks.handle = [this](daemon::HttpHead head, std::string body, std::shared_ptr<daemon::HttpExchange> ex) {
      {
        std::lock_guard lock(mu_);
        got_.push_back({head.Header("x-moe-delivery"), head.Header("x-moe-signature"), body, head.Header("x-moe-timestamp")});
      }
      ex->Reply(daemon::HttpResponse{200, "text/plain", {}, "ok"});
    };
    auto s = daemon::HttpServer::Start(o, std::move(hooks));
    if (!s) ADD_FAILURE() << s.error().ToString();
    else server_ = std::move(*s);
  }
  ~Receiver() {
    if (server_) server_->Stop();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_ ? server_->port() : 0) + "/hook"; }
  std::vector<Delivery> got() {
    std::lock_guard lock(mu_);
    return got_;
  }
  // Thresholds received, in order.
  std::vector<double> thresholds() {
    std::vector<double> out;
    for (const auto& d : got()) out.push_back(json::parse(d.body).value("threshold", -1.0));
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<Delivery> got_;
  std::unique_ptr<daemon::HttpServer> server_;
};

json Deployment(const std::string& name, int port) {
  return {{"apiVersion", "moeserve.io/v1alpha1"},
          {"kind", "MoEDeployment"},
          {"metadata", {{"name", name}, {"namespace", kNs}}},
          {"spec",
           {{"image", "moeserve/moe-daemon:0.1.0"},
            {"model", {{"uri", "s3://models/tiny/"}}},
            {"replicas", 2},
            {"parallelism", {{"nodesPerReplica", 1}, {"gpusPerNode", 0}}},
            {"quotaPolicyRef", {{"name", kPolicy}}},
            {"endpoint", {{"port", port}, {"apiKeys", {{"secretRef", {{"name", "keys"}}}}}}}}}};
}

json Policy(const std::string& hook_url) {
  json price = {{"input", 0}, {"cachedInput", 0}, {"output", 1e6}, {"reasoning", 1e6}};  // $1 a completion token
  return {{"apiVersion", "moeserve.io/v1alpha1"},
          {"kind", "QuotaPolicy"},
          {"metadata", {{"name", kPolicy}, {"namespace", kNs}}},
          {"spec",
           {{"pricing", {{"low", price}, {"medium", price}, {"high", price}}},
            {"budgets", json::array({{{"tenant", "*"}, {"period", "month"}, {"limitUSD", kLimit}, {"action", "block"}}})},
            {"hooks", json::array({{{"name", "sre"},
                                    {"url", hook_url},
                                    {"allowHTTP", true},
                                    {"allowPrivateAddresses", true},  // the receiver is on loopback
                                    {"secret", {{"secretRef", {{"name", "hook"}}}}}}})}}}};
}

struct Pod {
  std::string deployment, name, ip;
};

class BudgetSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR_DEFAULT) + "/crds/moeserve.io_moedeployments.yaml"));
    ASSERT_TRUE(server_.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR_DEFAULT) + "/crds/moeserve.io_quotapolicies.yaml"));
    ASSERT_GT(server_.Start(0), 0);
    // The tenant's namespace, and the operator's, which holds the budget record.
    for (const char* ns : {kNs, "moeserve-system"})
      ASSERT_TRUE(server_.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}));
    ASSERT_TRUE(server_.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                           {"metadata", {{"name", "keys"}, {"namespace", kNs},
                                                         {"labels", {{op::kUsableLabel, "true"}}}}},
                                           {"stringData", {{"acme", "sk-acme-1"}, {"globex", "sk-globex-1"}}}}));
    // The hook's key is the platform's: in the operator's namespace, given to this one.
    ASSERT_TRUE(server_.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                           {"metadata", {{"name", "hook"}, {"namespace", "moeserve-system"},
                                                         {"labels", {{op::kHookNamespaceLabel, kNs}}}}},
                                           {"stringData", {{"secret", kHookSecret}}}}));
    port_ = test_support::FreeLoopbackPort();
    ASSERT_TRUE(server_.Create("quotapolicies.moeserve.io", Policy(receiver_.url())));
    for (const char* md : {"alpha", "beta"}) ASSERT_TRUE(server_.Create("moedeployments.moeserve.io", Deployment(md, port_)));
    op::KubeConfig config;
    config.server = server_.url();
    auto client = op::KubeClient::Create(config);
    ASSERT_TRUE(client);
    client_ = std::move(*client);
    StartOperator();
    pods_ = {{"alpha", "alpha-r0-0", "127.0.0.2"}, {"alpha", "alpha-r1-0", "127.0.0.3"},
             {"beta", "beta-r0-0", "127.0.0.4"}, {"beta", "beta-r1-0", "127.0.0.5"}};
    ASSERT_TRUE(WaitFor([&] {
      for (const auto& p : pods_)
        if (!server_.Get("statefulsets.apps", kNs, p.name.substr(0, p.name.size() - 2)) ||
            !server_.Get("secrets", kNs, p.deployment + "-secrets") || !server_.Get("configmaps", kNs, p.deployment + "-config"))
          return false;
      return true;
    }));
    for (const char* md : {"alpha", "beta"}) {  // each deployment has an admin key of its own, in the operator's namespace
      auto secret = server_.Get("secrets", "moeserve-system", "moeserve-admin." + std::string(kNs) + "." + md);
      ASSERT_TRUE(secret) << "no admin key for " << md;
      admin_keys_[md] = Base64Decode((*secret)["data"][op::kAdminKeyKey].get<std::string>());
    }
    for (size_t i = 0; i < pods_.size(); ++i) {
      ASSERT_NO_FATAL_FAILURE(CreatePod(pods_[i]));
      daemons_.push_back(StartDaemon(pods_[i]));
      ASSERT_TRUE(daemons_.back());
    }
  }

  void TearDown() override {
    StopOperator();
    for (auto& d : daemons_)
      if (d) d->Shutdown(1);
  }

  void StartOperator() {
    op::OperatorOptions o;
    o.webhook.addr = "0";
    o.informer.watch_timeout_s = 5;
    o.informer.backoff_initial = 20ms;
    o.informer.backoff_max = 200ms;
    o.usage_sync.interval = 300ms;
    o.usage_sync.request_timeout = 5s;
    o.usage_sync.hook_initial_backoff_s = 0.1;
    operator_ = std::make_unique<op::Operator>(*client_, o);
    runner_ = std::thread([this] { (void)operator_->Run(); });
  }
  void StopOperator() {
    if (!operator_) return;
    operator_->RequestStop();
    runner_.join();
    operator_.reset();
  }
  // Syncs committed by the running operator.
  uint64_t Syncs() { return operator_ ? operator_->usage_sync_stats().syncs : 0; }
  void WaitSyncs(uint64_t n) {
    const uint64_t from = Syncs();
    ASSERT_TRUE(WaitFor([&] { return Syncs() >= from + n; }));
  }

  // The kubelet's part: the group's node-rank-0 pod, controlled by its StatefulSet, with an IP.
  void CreatePod(const Pod& p) {
    const std::string group = p.name.substr(0, p.name.size() - 2);
    auto sts = server_.Get("statefulsets.apps", kNs, group);
    ASSERT_TRUE(sts);
    json labels = (*sts)["spec"]["template"]["metadata"]["labels"];
    labels["apps.kubernetes.io/pod-index"] = "0";
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", p.name},
                  {"namespace", kNs},
                  {"labels", labels},
                  {"ownerReferences", json::array({{{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"}, {"name", group},
                                                    {"uid", (*sts)["metadata"]["uid"]}, {"controller", true}}})}}},
                {"spec", {{"containers", json::array({{{"name", "daemon"}, {"image", "moeserve/moe-daemon:0.1.0"}}})}}}};
    ASSERT_TRUE(server_.Create("pods", pod));
    ASSERT_TRUE(server_.Mutate("pods", kNs, p.name, [&](json& o) { o["status"] = {{"phase", "Running"}, {"podIP", p.ip}}; }, true));
  }

  // A daemon as the pod would run it: the operator's config.yaml, with the
  // mounted files (keys, the budget ConfigMap's spend.json) in a directory here.
  std::unique_ptr<daemon::Daemon> StartDaemon(const Pod& p) {
    const fs::path dir = fs::path(::testing::TempDir()) / ("pod-" + p.name + "-" + std::to_string(restarts_++));
    fs::create_directories(dir);
    auto secret = server_.Get("secrets", kNs, p.deployment + "-secrets");
    std::ofstream(dir / "api-keys.yaml") << Base64Decode((*secret)["data"]["api-keys.yaml"].get<std::string>());
    if (auto budget = server_.Get("configmaps", kNs, op::BudgetConfigMapName(kPolicy)))
      std::ofstream(dir / "spend.json") << (*budget)["data"]["spend.json"].get<std::string>();
    auto cm = server_.Get("configmaps", kNs, p.deployment + "-config");
    auto config = daemon::ParseDaemonConfigYaml((*cm)["data"]["config.yaml"].get<std::string>(), "config.yaml",
                                                daemon::testing::TestConfig());
    if (!config) {
      ADD_FAILURE() << config.error().ToString();
      return nullptr;
    }
    EXPECT_TRUE(config->spend_from_operator);
    EXPECT_EQ(config->budget.policy_name, kPolicy);
    EXPECT_EQ(config->global_spend_file, std::string(op::kBudgetDir) + "/spend.json");
    config->model = daemon::testing::TinyModelDir();
    config->host = p.ip;
    config->max_context = 4096;
    config->api_keys_file = (dir / "api-keys.yaml").string();
    config->metrics_token_file.clear();
    config->global_spend_file = (dir / "spend.json").string();
    config->default_reasoning_effort = daemon::ReasoningEffort::kLow;
    return daemon::testing::StartDaemon(*config);
  }

  std::string Url(const Pod& p) const { return "http://" + p.ip + ":" + std::to_string(port_); }
  Reply Chat(size_t pod, const std::string& key) {
    json body = {{"model", pods_[pod].deployment},
                 {"messages", json::array({{{"role", "user"}, {"content", "hello there"}}})},
                 {"max_tokens", 1}};
    return Call("POST", Url(pods_[pod]) + "/v1/chat/completions", key, body.dump());
  }
  // What the daemons' ledgers hold for `tenant` this month, summed by the test itself.
  double Truth(const std::string& tenant) {
    double usd = 0;
    for (const auto& p : pods_) {
      Reply r = Call("GET", Url(p) + "/v1/usage", admin_keys_[p.deployment]);
      EXPECT_EQ(r.status, 200);
      for (const auto& row : r.body.value("data", json::array()))
        if (row["tenant"] == tenant && row["period"] == "month") usd += row["cost_usd"].get<double>();
    }
    return usd;
  }
  // moe_budget_remaining_ratio{tenant, period="month"} of one daemon (-1: not there).
  double RemainingRatio(const Pod& p, const std::string& tenant) {
    CURL* c = curl_easy_init();
    std::string got;
    curl_slist* h = curl_slist_append(nullptr, ("Authorization: Bearer " + admin_keys_[p.deployment]).c_str());
    curl_easy_setopt(c, CURLOPT_URL, (Url(p) + "/metrics").c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Append);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &got);
    curl_easy_perform(c);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    std::istringstream lines(got);
    for (std::string line; std::getline(lines, line);)
      if (line.starts_with("moe_budget_remaining_ratio{") && line.find("tenant=\"" + tenant + "\"") != std::string::npos &&
          line.find("period=\"month\"") != std::string::npos)
        return std::stod(line.substr(line.rfind(' ') + 1));
    return -1;
  }
  json PolicyStatus() {
    auto p = server_.Get("quotapolicies.moeserve.io", kNs, kPolicy);
    return p ? p->value("status", json::object()) : json::object();
  }
  double StatusSpend(const std::string& tenant) {
    for (const auto& u : PolicyStatus().value("usage", json::array()))
      if (u["tenant"] == tenant && u["period"] == "month") return u["spentUSD"].get<double>();
    return 0;
  }
  bool StatusShows(const std::string& tenant, double usd) { return std::abs(StatusSpend(tenant) - usd) < 1e-9; }
  // Thresholds in status.alerts delivered to the hooks.
  std::vector<double> Delivered(const std::string& tenant) {
    std::vector<double> out;
    for (const auto& a : PolicyStatus().value("alerts", json::array()))
      if (a["tenant"] == tenant && a["delivered"] == true) out.push_back(a["threshold"].get<double>());
    std::sort(out.begin(), out.end());
    return out;
  }
  // Requests of `tenant`, round robin from `next`, until the daemons' sum reaches `usd`; each must be served.
  void SpendUntil(const std::string& tenant, const std::string& key, double usd) {
    for (int i = 0; i < 60 && Truth(tenant) < usd - 1e-9; ++i) {
      Reply r = Chat(next_++ % pods_.size(), key);
      ASSERT_EQ(r.status, 200) << r.body.dump();
    }
    ASSERT_GE(Truth(tenant), usd - 1e-9);
  }

  fakes::FakeApiServer server_;
  Receiver receiver_;
  int port_ = 0;
  std::unique_ptr<op::KubeClient> client_;
  std::unique_ptr<op::Operator> operator_;
  std::thread runner_;
  std::vector<Pod> pods_;
  std::vector<std::unique_ptr<daemon::Daemon>> daemons_;
  std::map<std::string, std::string> admin_keys_;  // deployment -> the operator's admin key
  size_t next_ = 0;
  int restarts_ = 0;
};

TEST_F(BudgetSyncTest, HooksFireOnceOnCombinedSpendBlockAppliesEverywhereAndResetsAreCountedOnce) {
  // 50%: one alert, once the combined spend (never one daemon's) reaches $5.
  ASSERT_NO_FATAL_FAILURE(SpendUntil("acme", "sk-acme-1", 0.5 * kLimit));
  double truth = Truth("acme");
  ASSERT_TRUE(WaitFor([&] { return StatusShows("acme", truth); })) << StatusSpend("acme") << " vs " << truth;
  ASSERT_TRUE(WaitFor([&] { return Delivered("acme") == std::vector<double>{0.5}; })) << PolicyStatus().dump();
  EXPECT_EQ(receiver_.thresholds(), std::vector<double>{0.5});
  // Every daemon's share is under $5 by itself: only the sum crosses.
  EXPECT_GE(pods_.size(), 4u);

  // The operator goes away; spend reaches 80% meanwhile; a new one fires 80% once and not 50% again.
  StopOperator();
  ASSERT_NO_FATAL_FAILURE(SpendUntil("acme", "sk-acme-1", 0.8 * kLimit));
  StartOperator();
  truth = Truth("acme");
  ASSERT_TRUE(WaitFor([&] { return StatusShows("acme", truth); }));
  ASSERT_TRUE(WaitFor([&] { return Delivered("acme") == std::vector<double>{0.5, 0.8}; })) << PolicyStatus().dump();
  ASSERT_NO_FATAL_FAILURE(WaitSyncs(3));
  EXPECT_EQ(receiver_.thresholds(), (std::vector<double>{0.5, 0.8}));

  // 100%: once status shows it, every replica of both deployments refuses the tenant.
  ASSERT_NO_FATAL_FAILURE(SpendUntil("acme", "sk-acme-1", kLimit));
  const auto crossed = std::chrono::steady_clock::now();
  // Measured, not asserted: how long after the crossing request every replica has a spent budget.
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& p : pods_)
      if (RemainingRatio(p, "acme") != 0.0) return false;
    return true;
  }));
  std::printf("[ measured ] block on all %zu replicas %.0f ms after the crossing request was answered "
              "(sync interval 300 ms)\n",
              pods_.size(), std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - crossed).count());
  truth = Truth("acme");
  ASSERT_TRUE(WaitFor([&] { return StatusShows("acme", truth); }));
  for (size_t i = 0; i < pods_.size(); ++i) {
    Reply r = Chat(i, "sk-acme-1");
    EXPECT_EQ(r.status, 403) << pods_[i].name << " " << r.body.dump();
    EXPECT_EQ(r.body["error"].value("code", ""), "budget_exceeded") << r.body.dump();
  }
  // Another tenant has its own budget and is served.
  EXPECT_EQ(Chat(0, "sk-globex-1").status, 200);
  ASSERT_TRUE(WaitFor([&] { return Delivered("acme") == std::vector<double>{0.5, 0.8, 1.0}; })) << PolicyStatus().dump();
  ASSERT_NO_FATAL_FAILURE(WaitSyncs(3));
  std::printf("[ measured ] usage sync of %zu pods (read, commit, push, status): %.1f ms\n", pods_.size(),
              operator_->usage_sync_stats().last_sync_seconds * 1000);
  const auto got = receiver_.got();
  ASSERT_EQ(receiver_.thresholds(), (std::vector<double>{0.5, 0.8, 1.0}));
  std::set<std::string> ids;
  for (const auto& d : got) {
    ids.insert(d.id);
    ASSERT_FALSE(d.timestamp.empty());
    EXPECT_EQ(d.signature, "sha256=" + OpensslHmac(d.timestamp + "." + d.id + "." + d.body));
    const json body = json::parse(d.body);
    EXPECT_EQ(body["type"], "budget.threshold");
    EXPECT_EQ(body["tenant"], "acme");
    EXPECT_EQ(body["policy"], kPolicy);
    EXPECT_EQ(body["deployment"], "alpha,beta");
    EXPECT_GE(body["spent_usd"].get<double>(), body["threshold"].get<double>() * kLimit - 1e-9);
  }
  EXPECT_EQ(ids.size(), 3u);

  // A pod replaced without its ledger between two reads: globex's spend on it is kept, not doubled.
  const double globex_before = Truth("globex");
  ASSERT_TRUE(WaitFor([&] { return StatusShows("globex", globex_before); }));
  StopOperator();
  daemons_[0]->Shutdown(1);
  daemons_[0].reset();
  ASSERT_TRUE(server_.Delete("pods", kNs, pods_[0].name));
  ASSERT_NO_FATAL_FAILURE(CreatePod(pods_[0]));
  daemons_[0] = StartDaemon(pods_[0]);
  ASSERT_TRUE(daemons_[0]);
  // No operator runs: only the ConfigMap's spend.json can tell it acme is spent.
  Reply blocked = Chat(0, "sk-acme-1");
  EXPECT_EQ(blocked.status, 403) << blocked.body.dump();
  ASSERT_EQ(Chat(0, "sk-globex-1").status, 200);
  StartOperator();
  double replacement = 0;  // what the new ledger charged
  for (const auto& row : Call("GET", Url(pods_[0]) + "/v1/usage", admin_keys_[pods_[0].deployment]).body.value("data", json::array()))
    if (row["tenant"] == "globex" && row["period"] == "month") replacement += row["cost_usd"].get<double>();
  ASSERT_GT(replacement, 0);
  const double expected = globex_before + replacement;
  ASSERT_TRUE(WaitFor([&] { return StatusShows("globex", expected); })) << StatusSpend("globex") << " vs " << expected;
  ASSERT_NO_FATAL_FAILURE(WaitSyncs(3));
  EXPECT_TRUE(StatusShows("globex", expected)) << StatusSpend("globex") << " vs " << expected;
  EXPECT_TRUE(StatusShows("acme", truth));
  EXPECT_EQ(receiver_.got().size(), 3u);  // two operator restarts, no alert repeated
}

// Admission refuses a request whose worst case would pass the limit, so a
// tenant's spend can stop short of 100% for good: the daemon reports the
// refusal in GET /v1/usage and the operator fires the 100% alert from it.
TEST_F(BudgetSyncTest, ARefusalShortOfTheLimitFiresTheHundredPercentAlertOnce) {
  ASSERT_NO_FATAL_FAILURE(SpendUntil("acme", "sk-acme-1", 0.8 * kLimit));
  const double truth = Truth("acme");
  ASSERT_TRUE(WaitFor([&] { return Delivered("acme") == std::vector<double>{0.5, 0.8}; })) << PolicyStatus().dump();
  ASSERT_NO_FATAL_FAILURE(WaitSyncs(2));  // every daemon has the summed spend
  // max_tokens 5: a worst case of $5 on top of $8 spent passes the $10.
  json big = {{"model", pods_[1].deployment},
              {"messages", json::array({{{"role", "user"}, {"content", "hello there"}}})},
              {"max_tokens", 5}};
  Reply r = Call("POST", Url(pods_[1]) + "/v1/chat/completions", "sk-acme-1", big.dump());
  ASSERT_EQ(r.status, 403) << r.body.dump();
  EXPECT_EQ(r.body["error"].value("code", ""), "budget_exceeded");
  ASSERT_TRUE(WaitFor([&] { return Delivered("acme") == std::vector<double>{0.5, 0.8, 1.0}; })) << PolicyStatus().dump();
  std::vector<json> hundred;
  for (const auto& d : receiver_.got())
    if (json b = json::parse(d.body); b["threshold"] == 1.0) hundred.push_back(b);
  ASSERT_EQ(hundred.size(), 1u);
  EXPECT_EQ(hundred[0]["tenant"], "acme");
  EXPECT_EQ(hundred[0]["deployment"], "alpha,beta");
  EXPECT_NEAR(hundred[0]["refused_usd"].get<double>(), 5.0, 1e-9);
  EXPECT_NEAR(hundred[0]["spent_usd"].get<double>(), truth, 1e-9);  // spend stayed short of 100%
  // Another refusal, on another deployment, repeats nothing.
  big["model"] = pods_[2].deployment;
  EXPECT_EQ(Call("POST", Url(pods_[2]) + "/v1/chat/completions", "sk-acme-1", big.dump()).status, 403);
  ASSERT_NO_FATAL_FAILURE(WaitSyncs(3));
  EXPECT_EQ(receiver_.thresholds(), (std::vector<double>{0.5, 0.8, 1.0}));
  EXPECT_TRUE(StatusShows("acme", truth));
}

}  // namespace
}  // namespace moeserve
