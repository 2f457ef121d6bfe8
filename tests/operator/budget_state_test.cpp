// Budget state a tenant cannot forge. The usage sync used to keep its
// record (totals.json, alerts.json with the bodies to post, spend.json) in
// ConfigMap <policy>-budget of the tenant's namespace and trust it on every
// read: whoever could write ConfigMaps there (the standard `edit` role) could
// plant an undelivered alert whose body the operator then posted signed with
// the hook's secret, reset the totals, and so lift a `block`. Here the
// operator runs against the API double with a stand-in daemon (its
// /v1/usage and /v1/admin/spend) and a real hook receiver; the tenant's
// ConfigMap is then overwritten with such a forgery, and the operator must
// neither post the planted alert nor hand back a lowered spend.
#include <algorithm>
#include <mutex>

#include "http_server.hpp"
#include "moeserve/budget/global_spend.hpp"
#include "moeserve/budget/usage_period.hpp"
#include "moeserve/operator/budget_record.hpp"
#include "moeserve/operator/hook_secret_source.hpp"
#include "moeserve/operator/usage_sync.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

constexpr char kNs[] = "team-a";
constexpr char kOperatorNs[] = "moeserve-system";
constexpr char kPolicy[] = "shared";
constexpr double kSpent = 10.5;  // of a $10 block budget: blocked

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// GET /v1/usage and PUT /v1/admin/spend as a daemon answers them.
class StandInDaemon {
 public:
  StandInDaemon() {
    server_ = std::make_unique<fakes::HttpServer>([this](const fakes::HttpRequest& r, fakes::HttpResponseWriter& w) {
      std::lock_guard lock(mu_);
      if (r.method == "GET" && r.path == "/v1/usage") return w.Send(200, "application/json", Usage().dump());
      if (r.method == "PUT" && r.path == "/v1/admin/spend") {
        spends_.push_back(json::parse(r.body, nullptr, false));
        return w.Send(200, "application/json", "{}");
      }
      w.Send(404, "application/json", "{}");
    });
    port_ = server_->Start(0);
  }
  static json Usage() {
    const int64_t start = PeriodStart(BudgetPeriod::kMonth, Now());
    return {{"ledger_id", "ledger-1"},
            {"data", json::array({{{"tenant", "acme"},
                                   {"tier", "medium"},
                                   {"period", "month"},
                                   {"period_start", Iso8601Utc(start)},
                                   {"requests", 21},
                                   {"tokens", {{"input", 0}, {"cached_input", 0}, {"output", 21}, {"reasoning", 0}}},
                                   {"cost_usd", kSpent}}})}};
  }
  int port() const { return port_; }
  std::vector<json> spends() const {
    std::lock_guard lock(mu_);
    return spends_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<json> spends_;
  std::unique_ptr<fakes::HttpServer> server_;
  int port_ = -1;
};

class HookReceiver {
 public:
  HookReceiver() {
    server_ = std::make_unique<fakes::HttpServer>([this](const fakes::HttpRequest& r, fakes::HttpResponseWriter& w) {
      std::lock_guard lock(mu_);
      posts_.push_back({r.Header("x-moe-delivery"), r.body});
      w.Send(200, "application/json", "{}");
    });
    port_ = server_->Start(0);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/alerts"; }
  std::vector<std::pair<std::string, std::string>> posts() const {
    std::lock_guard lock(mu_);
    return posts_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> posts_;  // delivery id, body
  std::unique_ptr<fakes::HttpServer> server_;
  int port_ = -1;
};

// The global spend the last PUT handed the daemon for acme, or -1.
double LastSpend(const StandInDaemon& daemon) {
  const auto spends = daemon.spends();
  if (spends.empty()) return -1;
  auto parsed = ParseGlobalSpend(spends.back());
  if (!parsed) return -1;
  for (const auto& e : parsed->spend)
    if (e.tenant == "acme") return e.spent_usd;
  return -1;
}

class BudgetState : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& server = cluster_.server;
    (void)server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", kOperatorNs}}}});  // FakeCluster may have made it
    ASSERT_GT(daemon_.port(), 0);
    ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                          // The hook's key is the platform's: in the operator's namespace, given to kNs.
                                          {"metadata", {{"name", "hook"}, {"namespace", kOperatorNs},
                                                        {"labels", {{kHookNamespaceLabel, kNs}}}}},
                                          {"stringData", {{"secret", "hook-secret-0123456789abcdef0123456789"}}}}));
    ASSERT_TRUE(server.Create(
        "quotapolicies.moeserve.io",
        {{"apiVersion", "moeserve.io/v1alpha1"},
         {"kind", "QuotaPolicy"},
         {"metadata", {{"name", kPolicy}, {"namespace", kNs}}},
         {"spec",
          {{"budgets", json::array({{{"tenant", "*"}, {"period", "month"}, {"limitUSD", 10}, {"action", "block"}}})},
           {"hooks", json::array({{{"name", "sre"},
                                   {"url", receiver_.url()},
                                   {"allowHTTP", true},
                                   {"allowPrivateAddresses", true},  // the receiver is on loopback
                                   {"secret", {{"secretRef", {{"name", "hook"}}}}}}})}}}}));
    json md = MoEDeploymentManifest(kNs, "m", 1, 1);
    md["spec"]["parallelism"]["gpusPerNode"] = 0;
    md["spec"]["endpoint"]["port"] = daemon_.port();
    md["spec"]["quotaPolicyRef"] = {{"name", kPolicy}};
    ASSERT_TRUE(server.Create("moedeployments.moeserve.io", md));

    client_ = cluster_.Client();
    OperatorOptions options;
    options.webhook.operator_namespace = kOperatorNs;
    options.usage_sync.interval = 150ms;
    options.usage_sync.request_timeout = 2s;
    options.usage_sync.hook_initial_backoff_s = 0.05;
    options.usage_sync.hook_max_backoff_s = 0.1;
    op_ = std::make_unique<RunningOperator>(*client_, options);

    // The group's rank-0 pod, as the StatefulSet controller and kubelet would make it.
    ASSERT_TRUE(WaitFor([&] { return server.Get("statefulsets.apps", kNs, "m-r0").has_value(); }));
    const json sts = *server.Get("statefulsets.apps", kNs, "m-r0");
    json labels = sts["spec"]["template"]["metadata"]["labels"];
    labels["apps.kubernetes.io/pod-index"] = "0";
    ASSERT_TRUE(server.Create("pods", {{"apiVersion", "v1"}, {"kind", "Pod"},
                                       {"metadata", {{"name", "m-r0-0"}, {"namespace", kNs}, {"labels", labels},
                                                     {"ownerReferences", json::array({{{"apiVersion", "apps/v1"},
                                                                                       {"kind", "StatefulSet"},
                                                                                       {"name", "m-r0"},
                                                                                       {"uid", sts["metadata"]["uid"]},
                                                                                       {"controller", true}}})}}},
                                       {"spec", {{"containers", json::array({{{"name", "moe-daemon"}, {"image", "x"}}})}}}}));
    ASSERT_TRUE(server.Mutate("pods", kNs, "m-r0-0", [](json& o) { o["status"] = {{"phase", "Running"}, {"podIP", "127.0.0.1"}}; },
                              true));
    // Blocked: the spend handed back is past the budget, the three thresholds delivered.
    ASSERT_TRUE(WaitFor([&] { return LastSpend(daemon_) == kSpent && receiver_.posts().size() == 3; }, 20s))
        << LastSpend(daemon_) << " " << receiver_.posts().size();
  }
  void TearDown() override {
    if (op_) op_->Stop();
  }
  double StatusSpent() {
    auto p = cluster_.server.Get("quotapolicies.moeserve.io", kNs, kPolicy);
    for (const auto& u : p->value("status", json::object()).value("usage", json::array()))
      if (u.value("tenant", "") == "acme") return u.value("spentUSD", -1.0);
    return -1;
  }

  FakeCluster cluster_;
  StandInDaemon daemon_;
  HookReceiver receiver_;
  std::unique_ptr<KubeClient> client_;
  std::unique_ptr<RunningOperator> op_;
};

TEST_F(BudgetState, TheRecordLivesInTheOperatorsNamespaceAndTheTenantGetsOnlySpend) {
  // The record says delivered once the posts are committed (right after them, in the same sync).
  ASSERT_TRUE(WaitFor([&] {
    auto r = cluster_.server.Get("configmaps", kOperatorNs, BudgetRecordName(kNs, kPolicy));
    auto parsed = r ? ParseBudgetRecord((*r)["data"]) : Result<BudgetRecord>(Fail(Error::NotFound("no record")));
    return parsed && parsed->alerts.size() == 3 &&
           std::all_of(parsed->alerts.begin(), parsed->alerts.end(), [](const AlertRecord& a) { return a.delivered; });
  }));
  auto record = cluster_.server.Get("configmaps", kOperatorNs, BudgetRecordName(kNs, kPolicy));
  ASSERT_TRUE(record);
  EXPECT_EQ((*record)["metadata"]["annotations"].value(kBudgetRecordNamespace, ""), kNs);
  EXPECT_EQ((*record)["metadata"]["annotations"].value(kBudgetRecordPolicy, ""), kPolicy);
  auto parsed = ParseBudgetRecord((*record)["data"]);
  ASSERT_TRUE(parsed) << parsed.error().ToString();
  EXPECT_EQ(parsed->alerts.size(), 3u);
  auto copy = cluster_.server.Get("configmaps", kNs, BudgetConfigMapName(kPolicy));
  ASSERT_TRUE(copy);
  ASSERT_EQ((*copy)["data"].size(), 1u) << (*copy)["data"].dump();
  EXPECT_TRUE((*copy)["data"].contains("spend.json"));
  // What was posted is what the record rebuilds, byte for byte.
  for (const auto& [id, body] : receiver_.posts()) {
    bool matched = false;
    for (const auto& a : parsed->alerts) {
      if (a.delivery_id != id) continue;
      matched = true;
      EXPECT_TRUE(a.delivered);
      EXPECT_NE(body.find("\"threshold\":" + json(a.threshold).dump()), std::string::npos) << body;
    }
    EXPECT_TRUE(matched) << id;
  }
}

TEST_F(BudgetState, AForgedTenantConfigMapIsNeitherPostedNorTrusted) {
  // The forgery, as a tenant with ConfigMap write would plant it in its own
  // namespace: totals whose sum is zero (with the pod's last read as it is,
  // so the next read adds nothing), an undelivered alert with a body of its
  // choosing, and a spend of zero.
  const int64_t now = Now();
  const int64_t month = PeriodStart(BudgetPeriod::kMonth, now);
  UsageTotals reset;
  auto reading = ParseUsageReading(StandInDaemon::Usage());
  ASSERT_TRUE(reading);
  reset.pods[std::string(kNs) + "/m-r0-0"] = {reading->ledger_id, reading->rows};
  const std::string planted_body = R"({"type":"budget.threshold","tenant":"acme","note":"PLANTED: wire the refund to ..."})";
  json planted_alert = {{"tenant", "acme"},
                        {"period", "month"},
                        {"periodStart", Iso8601Utc(month)},
                        {"threshold", 0.25},
                        {"firedAt", Iso8601Utc(now)},
                        {"deliveryId", "dlv_planted"},
                        {"delivered", false},
                        {"bodies", {{"json", planted_body}}},
                        {"crossing", {{"spentUSD", 2.5}, {"tokens", {{"input", 0}, {"cachedInput", 0}, {"output", 0}, {"reasoning", 0}}},
                                      {"byTier", json::object()}, {"budgetUSD", 10}, {"action", "alert"},
                                      {"deployment", "PLANTED"}, {"formats", json::array({"json"})}}}};
  GlobalSpend zero;
  zero.policy = kPolicy;
  zero.synced_at = now;
  zero.spend.push_back({"acme", BudgetPeriod::kMonth, month, 0.0, std::nullopt});
  const json forged = {{"totals.json", reset.ToJson().dump()},
                       {"alerts.json", json::array({planted_alert}).dump()},
                       {"spend.json", GlobalSpendJson(zero).dump()}};
  ASSERT_TRUE(cluster_.server.Mutate("configmaps", kNs, BudgetConfigMapName(kPolicy), [&](json& cm) { cm["data"] = forged; }));
  const size_t pushes = daemon_.spends().size();

  // Several syncs later: the planted alert was never posted, the spend
  // handed back and shown is still the real one, the block stands.
  ASSERT_TRUE(WaitFor([&] { return daemon_.spends().size() >= pushes + 4; }, 20s));
  for (const auto& [id, body] : receiver_.posts()) {
    EXPECT_NE(id, "dlv_planted");
    EXPECT_EQ(body.find("PLANTED"), std::string::npos) << body;
  }
  EXPECT_EQ(receiver_.posts().size(), 3u);
  const auto spends = daemon_.spends();
  for (size_t i = pushes; i < spends.size(); ++i) {
    auto parsed = ParseGlobalSpend(spends[i]);
    ASSERT_TRUE(parsed);
    ASSERT_EQ(parsed->spend.size(), 1u);
    EXPECT_DOUBLE_EQ(parsed->spend[0].spent_usd, kSpent) << "push " << i << " handed back a lowered spend";
  }
  EXPECT_DOUBLE_EQ(StatusSpent(), kSpent);
  // And the daemons' copy is put back whole: only the real spend.json.
  ASSERT_TRUE(WaitFor([&] {
    auto copy = cluster_.server.Get("configmaps", kNs, BudgetConfigMapName(kPolicy));
    if (!copy || (*copy)["data"].size() != 1) return false;
    auto spend = ParseGlobalSpend(json::parse((*copy)["data"].value("spend.json", "null"), nullptr, false));
    return spend && spend->spend.size() == 1 && spend->spend[0].spent_usd == kSpent;
  }));
}

TEST_F(BudgetState, DeletingTheTenantsCopyResetsNothing) {
  ASSERT_TRUE(cluster_.server.Delete("configmaps", kNs, BudgetConfigMapName(kPolicy)));
  const size_t pushes = daemon_.spends().size();
  ASSERT_TRUE(WaitFor([&] { return daemon_.spends().size() >= pushes + 3; }, 20s));
  EXPECT_DOUBLE_EQ(LastSpend(daemon_), kSpent);
  EXPECT_DOUBLE_EQ(StatusSpent(), kSpent);
  EXPECT_EQ(receiver_.posts().size(), 3u);  // no threshold fired again
  EXPECT_TRUE(WaitFor([&] { return cluster_.server.Get("configmaps", kNs, BudgetConfigMapName(kPolicy)).has_value(); }));
}

}  // namespace
}  // namespace moeserve::op::testing
