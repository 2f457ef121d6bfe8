// charts/moeserve's Grafana dashboard (templates/grafana-dashboard.yaml):
// only with grafana.dashboard.enabled, a ConfigMap labelled for Grafana's
// sidecar that kubectl applies, covering spend, budgets, latency and caches
// with metrics moe-daemon exports. Every panel query, with Grafana's
// variables substituted (each template variable by the first value its own
// label_values query returns), must return data from a real Prometheus over
// two hours of series backfilled with promtool, with the recording rules of
// policies/alerts loaded.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <set>

#include "../support/prometheus_stack.hpp"
#include "chart_support.hpp"

namespace moeserve::op::testing {
namespace {

namespace ts = moeserve::test_support;

constexpr char kNamespace[] = "moeserve-system";

json DashboardConfigMap(bool enabled) {
  auto values = LoadValues();
  EXPECT_TRUE(values) << values.error().ToString();
  if (!values) return nullptr;
  SetValue(*values, "grafana.dashboard.enabled", enabled);
  auto chart = RenderChart(*values, {.name = "moeserve", .ns = kNamespace});
  EXPECT_TRUE(chart) << chart.error().ToString();
  if (!chart) return nullptr;
  return FindObject(chart->objects, "ConfigMap", "moeserve-dashboard");
}

json Dashboard() {
  const json cm = DashboardConfigMap(true);
  if (!cm.is_object()) return nullptr;
  return json::parse(cm["data"].value("moeserve.json", ""), nullptr, false);
}

// Every panel, rows' collapsed panels included.
void Panels(const json& list, std::vector<json>& out) {
  for (const auto& p : list) {
    out.push_back(p);
    Panels(p.value("panels", json::array()), out);
  }
}

// Metric families moe-daemon registers (prometheus-cpp's .Name("...")).
std::set<std::string> DaemonFamilies() {
  std::set<std::string> out;
  static const std::regex kName(R"re(\.Name\("(moe_[a-z0-9_]+)"\))re");
  const std::string source = ReadText(std::filesystem::path(SourceDir()) / "daemon/metrics.cpp");
  for (std::sregex_iterator it(source.begin(), source.end(), kName), end; it != end; ++it) out.insert((*it)[1]);
  return out;
}

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Family(const std::string& series_name) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s = suffix;
    if (series_name.size() > s.size() && series_name.ends_with(s)) return series_name.substr(0, series_name.size() - s.size());
  }
  return series_name;
}

// Two hours of what two daemons of namespace team-a export, every 15 s,
// for tenants acme and globex. Names of every series it wrote go to `names`.
std::string SeededSeries(int64_t now, std::set<std::string>& names) {
  const int64_t from = now - 2 * 3600, step = 15;
  std::string om;
  auto minutes = [from](int64_t t) { return static_cast<double>(t - from) / 60; };
  auto add = [&](const std::string& name, const std::string& labels, auto value) {
    names.insert(name);
    ts::AppendSeries(om, name + "{job=\"moe-daemon\",namespace=\"team-a\"," + labels + "}", from, now, step, value);
  };
  for (const std::string pod : {"ultra-r0-0", "ultra-r1-0"}) {
    const std::string p = "pod=\"" + pod + "\"";
    add("moe_requests_total", p + ",status=\"200\"", [&](int64_t t) { return 30 * minutes(t); });
    add("moe_requests_total", p + ",status=\"503\"", [&](int64_t t) { return 0.5 * minutes(t); });
    // Histograms: 30 observations a minute, spread over the buckets.
    const std::vector<std::pair<std::string, double>> buckets = {
        {"0.05", 0.1}, {"0.5", 0.5}, {"1", 0.8}, {"5", 0.95}, {"30", 1}, {"+Inf", 1}};
    for (const std::string h : {"moe_time_to_first_token_seconds", "moe_request_duration_seconds",
                                "moe_inter_token_latency_seconds"}) {
      for (const auto& [le, share] : buckets)
        add(h + "_bucket", p + ",le=\"" + le + "\"", [&, share](int64_t t) { return share * 30 * minutes(t); });
      add(h + "_count", p, [&](int64_t t) { return 30 * minutes(t); });
      add(h + "_sum", p, [&](int64_t t) { return 0.9 * 30 * minutes(t); });
    }
    for (const std::string tenant : {"acme", "globex"}) {
      const std::string pt = p + ",tenant=\"" + tenant + "\"";
      for (const std::string tier : {"high", "low"}) {
        add("moe_cost_usd_total", pt + ",tier=\"" + tier + "\"", [&](int64_t t) { return 0.2 * minutes(t); });
        for (const std::string kind : {"input", "cached_input", "output", "reasoning"})
          add("moe_tokens_total", pt + ",tier=\"" + tier + "\",kind=\"" + kind + "\"",
              [&](int64_t t) { return 1000 * minutes(t); });
      }
      add("moe_budget_limit_usd", pt + ",period=\"day\"", [](int64_t) { return 500.0; });
      add("moe_budget_remaining_ratio", pt + ",period=\"day\"",
          [&](int64_t t) { return std::max(0.0, 0.9 - 0.8 * minutes(t) / 500); });
    }
    add("moe_requests_running", p, [](int64_t t) { return static_cast<double>(8 + t % 5); });
    add("moe_requests_waiting", p, [](int64_t t) { return static_cast<double>(t % 3); });
    add("moe_kv_cache_usage_ratio", p, [](int64_t t) { return 0.5 + 0.01 * static_cast<double>(t % 20); });
    add("moe_prefix_cache_hit_ratio", p, [](int64_t) { return 0.42; });
    add("moe_prefix_cache_bytes", p, [](int64_t) { return 3.0e9; });
    add("moe_prefix_cache_limit_bytes", p, [](int64_t) { return 4.0e9; });
    add("moe_prefix_cache_entries", p, [](int64_t) { return 120.0; });
    for (const std::string reason : {"bytes", "entries", "pool"})
      add("moe_prefix_cache_evictions_total", p + ",reason=\"" + reason + "\"", [&](int64_t t) { return 2 * minutes(t); });
    add("moe_alert_deliveries_total", p + ",result=\"delivered\"", [&](int64_t t) { return std::floor(minutes(t) / 20); });
  }
  return om;
}

// Grafana's own variables, as Grafana fills them for a 1 h range at a 15 s
// scrape interval.
const std::vector<std::pair<std::string, std::string>> kBuiltins = {
    {"__rate_interval", "1m"}, {"__interval", "30s"}, {"__range", "1h"}};

std::string Substitute(std::string text, const std::vector<std::pair<std::string, std::string>>& vars) {
  // Longest names first: $namespace before a $name would match inside it.
  auto sorted = vars;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [name, value] : sorted)
    for (const std::string form : {"${" + name + "}", "[[" + name + "]]", "$" + name})
      for (size_t at; (at = text.find(form)) != std::string::npos;) text.replace(at, form.size(), value);
  return text;
}

// Whether Prometheus returns at least one number (not NaN) for the query
// over the last hour; `why` says what came back otherwise.
bool ReturnsData(ts::Prometheus& prometheus, const std::string& query, bool instant, int64_t now, std::string& why) {
  const json r = instant ? prometheus.Api("query", {{"query", query}, {"time", std::to_string(now)}})
                         : prometheus.Api("query_range", {{"query", query},
                                                          {"start", std::to_string(now - 3600)},
                                                          {"end", std::to_string(now)},
                                                          {"step", "60"}});
  why = r.is_null() ? "the query failed (see Prometheus's log)" : r.dump().substr(0, 400);
  if (!r.is_object() || r.value("status", "") != "success") return false;
  for (const auto& s : r["data"]["result"]) {
    if (s.contains("value") && s["value"][1] != "NaN") return true;
    for (const auto& v : s.value("values", json::array()))
      if (v[1] != "NaN") return true;
  }
  return false;
}

TEST(ChartDashboard, OnlyWhenEnabledAndLabelledForTheSidecar) {
  EXPECT_TRUE(DashboardConfigMap(false).is_null()) << "grafana.dashboard.enabled is false by default";
  const json cm = DashboardConfigMap(true);
  ASSERT_TRUE(cm.is_object());
  EXPECT_EQ(cm["metadata"]["namespace"], kNamespace);
  EXPECT_EQ(cm["metadata"]["labels"]["grafana_dashboard"], "1");
  const json d = Dashboard();
  ASSERT_TRUE(d.is_object()) << "data.moeserve.json is not a JSON object";
  EXPECT_FALSE(d.value("uid", "").empty());
  EXPECT_FALSE(d.value("title", "").empty());
  std::vector<json> panels;
  Panels(d["panels"], panels);
  std::set<int> ids;
  for (const auto& p : panels) {
    EXPECT_TRUE(ids.insert(p.value("id", -1)).second) << "panel id repeated: " << p.dump().substr(0, 200);
    std::set<std::string> refs;
    for (const auto& t : p.value("targets", json::array()))
      EXPECT_TRUE(refs.insert(t.value("refId", "")).second) << p.value("title", "") << ": refId repeated";
  }
}

TEST(ChartDashboard, ConfigMapAppliesWithKubectl) {
  if (!HaveKubectl()) GTEST_FAIL() << "kubectl is not installed (scripts/setup installs it)";
  fakes::FakeApiServer server;
  ASSERT_GT(server.Start(0), 0);
  ASSERT_TRUE(server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                           {"metadata", {{"name", kNamespace}}}}));
  auto values = LoadValues();
  ASSERT_TRUE(values);
  SetValue(*values, "grafana.dashboard.enabled", true);
  auto chart = RenderChart(*values, {.name = "moeserve", .ns = kNamespace});
  ASSERT_TRUE(chart) << chart.error().ToString();
  Kubectl kubectl(server);
  ASSERT_EQ(InstallChart(kubectl, *chart, {.name = "moeserve", .ns = kNamespace}), "");
  auto cm = server.Get("configmaps", kNamespace, "moeserve-dashboard");
  ASSERT_TRUE(cm);
  EXPECT_EQ((*cm)["metadata"]["labels"]["grafana_dashboard"], "1");
  EXPECT_EQ(json::parse((*cm)["data"].value("moeserve.json", ""), nullptr, false), Dashboard());
}

TEST(ChartDashboard, EveryQueryReturnsDataFromPrometheus) {
  ASSERT_EQ(ts::Shell("promtool --version").rc, 0) << "promtool is missing (scripts/setup installs prometheus)";
  const json d = Dashboard();
  ASSERT_TRUE(d.is_object());
  std::vector<json> panels;
  Panels(d["panels"], panels);

  struct Query {
    std::string panel, expr;
    bool instant;
  };
  std::vector<Query> queries;
  std::set<std::string> titles;
  for (const auto& p : panels) {
    titles.insert(p.value("title", ""));
    for (const auto& t : p.value("targets", json::array()))
      queries.push_back({p.value("title", ""), t.value("expr", ""), t.value("instant", false)});
  }
  ASSERT_GE(queries.size(), 15u);
  for (const char* row : {"Spend and budgets", "Latency", "Cache"}) EXPECT_TRUE(titles.count(row)) << row;

  // Metrics: each one moe-daemon exports, or one recorded by policies/alerts;
  // spend, budget, latency and cache are all there.
  const std::set<std::string> families = DaemonFamilies();
  ASSERT_TRUE(families.count("moe_cost_usd_total")) << "daemon/metrics.cpp no longer reads as expected";
  const std::string rules = ReadText(std::filesystem::path(SourceDir()) / "policies/alerts/moeserve-alerts.yaml");
  static const std::regex kMetric(R"((^|[^a-zA-Z0-9_:])(moe_[a-z0-9_]+)(?![a-zA-Z0-9_:]))");
  static const std::regex kRecorded(R"([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*)");
  std::set<std::string> used;
  for (const auto& q : queries) {
    for (std::sregex_iterator it(q.expr.begin(), q.expr.end(), kMetric), end; it != end; ++it) {
      used.insert((*it)[2].str());
      EXPECT_TRUE(families.count(Family((*it)[2].str()))) << q.panel << ": " << (*it)[2] << " is not a moe-daemon metric";
    }
    for (std::sregex_iterator it(q.expr.begin(), q.expr.end(), kRecorded), end; it != end; ++it)
      EXPECT_NE(rules.find("record: " + it->str()), std::string::npos)
          << q.panel << ": " << it->str() << " is recorded by no rule of policies/alerts";
  }
  for (const char* m : {"moe_cost_usd_total", "moe_budget_limit_usd", "moe_time_to_first_token_seconds_bucket",
                        "moe_request_duration_seconds_bucket", "moe_prefix_cache_hit_ratio", "moe_kv_cache_usage_ratio"})
    EXPECT_TRUE(used.count(m)) << "the dashboard shows nothing of " << m;

  // Seed Prometheus: the generator writes only what moe-daemon exports.
  const auto dir = ts::FreshDir("dashboard");
  const int64_t now = NowSeconds();
  std::set<std::string> seeded;
  const auto backfill = ts::Backfill(SeededSeries(now, seeded), dir / "data");
  ASSERT_EQ(backfill.rc, 0) << backfill.output;
  for (const auto& s : seeded) EXPECT_TRUE(families.count(Family(s))) << "seeded " << s << ", not a moe-daemon metric";
  ts::Prometheus prometheus(dir, "global:\n  evaluation_interval: 1s\nrule_files:\n  - " + SourceDir() +
                                     "/policies/alerts/moeserve-alerts.yaml\n");
  ASSERT_TRUE(prometheus.ready()) << prometheus.LogTail();
  std::string why;
  // The recording rules have run once Prometheus has evaluated them.
  ASSERT_TRUE(WaitFor(
      [&] { return ReturnsData(prometheus, "tenant_period:moe_budget_burn_rate:rate6h", true, NowSeconds(), why); }, 20s))
      << why;
  const int64_t at = NowSeconds();
  // The check itself tells an empty answer from data.
  EXPECT_FALSE(ReturnsData(prometheus, "sum(rate(moe_not_exported_total[1m]))", false, at, why));

  // Template variables in order, each from its label_values query with the
  // ones before it filled in; its first value stands for it.
  std::vector<std::pair<std::string, std::string>> vars = kBuiltins;
  static const std::regex kLabelValues(R"(^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$)");
  int variables = 0;
  for (const auto& v : d["templating"]["list"]) {
    if (v.value("type", "") != "query") continue;
    variables++;
    const json q = v["query"];
    const std::string text = Substitute(q.is_object() ? q.value("query", "") : q.get<std::string>(), vars);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, kLabelValues)) << v.value("name", "") << ": " << text;
    const json r = prometheus.Api("label/" + m[2].str() + "/values", {{"match[]", m[1].str()}});
    ASSERT_TRUE(r.is_object() && r["data"].is_array() && !r["data"].empty())
        << "variable " << v.value("name", "") << " (" << text << ") has no values: " << r.dump();
    vars.push_back({v.value("name", ""), r["data"][0].get<std::string>()});
  }
  EXPECT_GE(variables, 3);

  for (const auto& q : queries) {
    const std::string expr = Substitute(q.expr, vars);
    EXPECT_EQ(expr.find('$'), std::string::npos) << q.panel << ": a variable left unfilled in " << expr;
    EXPECT_TRUE(ReturnsData(prometheus, expr, q.instant, at, why)) << q.panel << ": " << expr << "\n -> " << why;
  }
}

}  // namespace
}  // namespace moeserve::op::testing
