// The budget-burn rules of policies/alerts, end to end through the stack
// SREs run: a real Prometheus loads moeserve-alerts.yaml over seven hours of
// spend history backfilled with promtool, sends what fires to a real
// Alertmanager (grouping waits and Prometheus's resend delay shortened to a
// second), which posts it to a webhook receiver here. hot burns its day
// budget 28.8 times too fast, warm 7.2 times, cool under its pace: the
// receiver must get the fast burn for hot (and the slow burn for warm, not a
// fast one), and nothing for cool.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <tuple>

#include "../support/prometheus_stack.hpp"
#include "http_server.hpp"

namespace moeserve::test_support {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr double kDayBudgetUsd = 100;

// USD a minute per tenant, on each of the pods listed.
struct Spender {
  std::string tenant;
  double usd_per_minute;
  std::vector<std::string> pods;
};

std::string History(const std::vector<Spender>& spenders, int64_t now) {
  const int64_t from = now - 7 * 3600, step = 15;
  std::string om;
  for (const auto& s : spenders)
    for (const auto& pod : s.pods)
      AppendSeries(om,
                   "moe_cost_usd_total{namespace=\"team-a\",pod=\"" + pod + "\",tenant=\"" + s.tenant +
                       "\",tier=\"high\"}",
                   from, now, step, [&](int64_t t) { return s.usd_per_minute * static_cast<double>(t - from) / 60; });
  for (const auto& s : spenders)
    for (const auto& pod : s.pods)
      AppendSeries(om,
                   "moe_budget_limit_usd{namespace=\"team-a\",pod=\"" + pod + "\",tenant=\"" + s.tenant +
                       "\",period=\"day\"}",
                   from, now, step, [](int64_t) { return kDayBudgetUsd; });
  return om;
}

// What the webhook receiver was sent: (alertname, tenant, status) per alert.
class Receiver {
 public:
  Receiver()
      : server_([this](const fakes::HttpRequest& req, fakes::HttpResponseWriter& w) {
          const json body = json::parse(req.body, nullptr, false);
          std::lock_guard lock(mu_);
          if (req.method != "POST" || req.path != "/alerts" || !body.is_object()) {
            bad_.push_back(req.method + " " + req.target + " " + req.body);
          } else {
            for (const auto& a : body.value("alerts", json::array()))
              got_.insert({a["labels"].value("alertname", ""), a["labels"].value("tenant", ""), a.value("status", "")});
            receivers_.insert(body.value("receiver", ""));
          }
          w.Send(200, "text/plain", "ok");
        }) {}
  int Start() { return server_.Start(0); }
  bool Got(const std::string& alert, const std::string& tenant) {
    std::lock_guard lock(mu_);
    return got_.count({alert, tenant, "firing"}) > 0;
  }
  std::set<std::string> Tenants() {
    std::lock_guard lock(mu_);
    std::set<std::string> out;
    for (const auto& [alert, tenant, status] : got_) out.insert(tenant);
    return out;
  }
  size_t Count() {
    std::lock_guard lock(mu_);
    return got_.size();
  }
  std::string Dump() {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& [alert, tenant, status] : got_) out += alert + "{tenant=" + tenant + "} " + status + "\n";
    for (const auto& b : bad_) out += "unexpected request: " + b + "\n";
    return out;
  }
  std::vector<std::string> Bad() {
    std::lock_guard lock(mu_);
    return bad_;
  }
  std::set<std::string> ReceiverNames() {
    std::lock_guard lock(mu_);
    return receivers_;
  }

 private:
  std::mutex mu_;
  std::set<std::tuple<std::string, std::string, std::string>> got_;
  std::set<std::string> receivers_;
  std::vector<std::string> bad_;
  fakes::HttpServer server_;
};

bool WaitUntil(const std::function<bool()>& pred, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return pred();
}

// Prometheus's value of an instant query for one tenant, or NaN.
double TenantValue(Prometheus& prometheus, const std::string& query, const std::string& tenant) {
  const json r = prometheus.Api("query", {{"query", query}});
  if (!r.is_object()) return std::nan("");
  for (const auto& s : r["data"]["result"])
    if (s["metric"].value("tenant", "") == tenant) return std::stod(s["value"][1].get<std::string>());
  return std::nan("");
}

TEST(BudgetAlertsFire, FastBurnReachesTheWebhookForTheBurningTenantOnly) {
  ASSERT_EQ(Shell("promtool --version").rc, 0) << "promtool is missing (scripts/setup installs prometheus)";
  ASSERT_EQ(Shell("prometheus-alertmanager --version").rc, 0)
      << "prometheus-alertmanager is missing (scripts/setup installs it)";
  const auto dir = FreshDir("budget-alerts");
  const char* source = std::getenv("MOESERVE_SOURCE_DIR");
  const std::string rules = std::string(source ? source : ".") + "/policies/alerts/moeserve-alerts.yaml";

  // Burn rates against $100 a day: hot 2 x $1/min = 28.8, warm 7.2, cool 0.72.
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  const auto backfill = Backfill(History({{"hot", 1.0, {"ultra-r0-0", "ultra-r1-0"}},
                                          {"warm", 0.5, {"ultra-r0-0"}},
                                          {"cool", 0.05, {"ultra-r1-0"}}},
                                         now),
                                 dir / "data");
  ASSERT_EQ(backfill.rc, 0) << backfill.output;

  Receiver receiver;
  const int hook_port = receiver.Start();
  ASSERT_GT(hook_port, 0);
  Alertmanager alertmanager(dir, R"(route:
  receiver: budget-hook
  group_by: [alertname, tenant]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: budget-hook
    webhook_configs:
      - url: http://127.0.0.1:)" + std::to_string(hook_port) + "/alerts\n");
  ASSERT_TRUE(alertmanager.ready()) << alertmanager.LogTail();
  Prometheus prometheus(dir, R"(global:
  evaluation_interval: 1s
rule_files:
  - )" + rules + R"(
alerting:
  alertmanagers:
    - static_configs:
        - targets: ['127.0.0.1:)" + std::to_string(alertmanager.port()) + "']\n",
                        // An alert that fired before the Alertmanager was
                        // discovered is sent again after this, not after 1 m.
                        {"--rules.alert.resend-delay=1s"});
  ASSERT_TRUE(prometheus.ready()) << prometheus.LogTail();

  EXPECT_TRUE(WaitUntil([&] { return receiver.Got("MoeServeBudgetFastBurn", "hot"); }, 30s))
      << receiver.Dump() << "\nprometheus:\n" << prometheus.LogTail() << "\nalertmanager:\n" << alertmanager.LogTail();
  EXPECT_TRUE(WaitUntil([&] { return receiver.Got("MoeServeBudgetSlowBurn", "warm"); }, 30s)) << receiver.Dump();

  // Prometheus read cool's spend and budget: its burn rate is there, under
  // both thresholds.
  const double cool = TenantValue(prometheus, "tenant_period:moe_budget_burn_rate:rate1h", "cool");
  EXPECT_NEAR(cool, 0.72, 0.05);
  EXPECT_NEAR(TenantValue(prometheus, "tenant_period:moe_budget_burn_rate:rate1h", "hot"), 28.8, 1);

  // Everything Alertmanager holds has reached the receiver (one group per
  // alert and tenant, sent within a second), so what is missing there was
  // never sent.
  size_t held = 0;
  EXPECT_TRUE(WaitUntil([&] {
    const json alerts = alertmanager.Api("alerts");
    held = alerts.is_array() ? alerts.size() : 0;
    return held >= 3 && receiver.Count() >= held;
  }, 20s)) << held << " alerts in Alertmanager\n" << receiver.Dump();
  EXPECT_TRUE(receiver.Got("MoeServeBudgetSlowBurn", "hot")) << receiver.Dump();
  EXPECT_FALSE(receiver.Got("MoeServeBudgetFastBurn", "warm")) << receiver.Dump();
  EXPECT_EQ(receiver.Tenants(), (std::set<std::string>{"hot", "warm"})) << receiver.Dump();
  EXPECT_TRUE(receiver.Bad().empty()) << receiver.Dump();
  EXPECT_EQ(receiver.ReceiverNames(), std::set<std::string>{"budget-hook"});
  const json firing = prometheus.Api("alerts");
  ASSERT_TRUE(firing.is_object());
  for (const auto& a : firing["data"]["alerts"])
    EXPECT_NE(a["labels"].value("tenant", ""), "cool") << a.dump();
}

}  // namespace
}  // namespace moeserve::test_support
