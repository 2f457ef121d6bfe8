#include "moeserve/moectl/cli.hpp"

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <optional>

#include "moeserve/moectl/cluster_source.hpp"
#include "moeserve/moectl/daemon_source.hpp"
#include "moeserve/moectl/output.hpp"
#include "moeserve/moectl/spend_chart.hpp"

namespace moeserve::moectl {

namespace {

constexpr const char* kUsage = R"(moectl: spend, budgets and alerts of moeserve tenants

usage:
  moectl usage   [SOURCE] [-o table|json|yaml]
  moectl usage   --daemon URL --chart FILE.png [--tenant NAME] [--period day|month] [--size WxH]
  moectl budgets [CLUSTER] [-o table|json|yaml]
  moectl alerts  [CLUSTER] [-o table|json|yaml]
  moectl audit   --daemon URL [--tenant NAME] [--since TIME] [--limit N] [-o table|json]

SOURCE is a daemon or the cluster:
  --daemon URL          read GET /v1/usage of one moe-daemon (http://host:8000)
  --api-key KEY         its API key (default $MOECTL_API_KEY); an admin key sees every tenant
CLUSTER (the default source) reads QuotaPolicies as kubectl does:
  --kubeconfig PATH     default $KUBECONFIG, in-cluster, then ~/.kube/config
  -n, --namespace NS    default the context's namespace
  -A, --all-namespaces  every namespace
Other options:
  -o, --output FORMAT   table (default), json or yaml
  --timeout SECONDS     per request (default 10)
  --chart FILE.png      usage only: the tenant's cumulative spend over the current period
                        against its budget and thresholds (needs --daemon)
  --tenant NAME         the chart's tenant (an admin key must name one)
  --period day|month    the chart's period (default month)
  --size WxH            the chart's size in pixels (default 960x540)
  --since TIME          audit only: lines at or after TIME (RFC 3339 UTC, 2026-12-05T06:00:00Z)
  --limit N             audit only: the newest N lines (default 1000)
  audit reads GET /v1/admin/audit of one daemon with an admin key; -o json prints
  the lines as the daemon wrote them, one JSON object a line

exit status: 0 done, 1 the source failed, 2 a wrong command line
)";

struct Args {
  std::string command;
  std::string daemon, api_key, kubeconfig, ns, output = "table", chart, tenant, period = "month", since;
  int limit = 1000;
  bool all_namespaces = false;
  double timeout_s = 10;
  int width = 960, height = 540;
};

// The value after a flag (`--flag value` or `--flag=value`).
std::optional<std::string> Value(const std::vector<std::string>& args, size_t& i, const std::string& flag,
                                 std::string* error) {
  const std::string& a = args[i];
  if (a.size() > flag.size() && a.compare(0, flag.size() + 1, flag + "=") == 0) return a.substr(flag.size() + 1);
  if (i + 1 >= args.size()) {
    *error = flag + " needs a value";
    return std::nullopt;
  }
  return args[++i];
}

bool Matches(const std::string& a, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const std::string s(n);
    if (a == s || (s.rfind("--", 0) == 0 && a.rfind(s + "=", 0) == 0)) return true;
  }
  return false;
}

std::optional<Args> Parse(const std::vector<std::string>& args, std::string* error) {
  Args a;
  if (const char* k = std::getenv("MOECTL_API_KEY")) a.api_key = k;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& s = args[i];
    std::optional<std::string> v;
    auto take = [&](std::string& dst, const std::string& flag) {
      v = Value(args, i, flag, error);
      if (v) dst = *v;
      return v.has_value();
    };
    if (Matches(s, {"--daemon"})) {
      if (!take(a.daemon, "--daemon")) return std::nullopt;
    } else if (Matches(s, {"--api-key"})) {
      if (!take(a.api_key, "--api-key")) return std::nullopt;
    } else if (Matches(s, {"--kubeconfig"})) {
      if (!take(a.kubeconfig, "--kubeconfig")) return std::nullopt;
    } else if (Matches(s, {"-n", "--namespace"})) {
      if (!take(a.ns, s.rfind("--namespace", 0) == 0 ? "--namespace" : "-n")) return std::nullopt;
    } else if (s == "-A" || s == "--all-namespaces") {
      a.all_namespaces = true;
    } else if (Matches(s, {"-o", "--output"})) {
      if (!take(a.output, s.rfind("--output", 0) == 0 ? "--output" : "-o")) return std::nullopt;
    } else if (Matches(s, {"--chart"})) {
      if (!take(a.chart, "--chart")) return std::nullopt;
    } else if (Matches(s, {"--tenant"})) {
      if (!take(a.tenant, "--tenant")) return std::nullopt;
    } else if (Matches(s, {"--since"})) {
      if (!take(a.since, "--since")) return std::nullopt;
    } else if (Matches(s, {"--limit"})) {
      std::string t;
      if (!take(t, "--limit")) return std::nullopt;
      char* end = nullptr;
      const long n = std::strtol(t.c_str(), &end, 10);
      if (t.empty() || *end || n < 1 || n > 100000) {
        *error = "--limit must be an integer from 1 to 100000, not '" + t + "'";
        return std::nullopt;
      }
      a.limit = static_cast<int>(n);
    } else if (Matches(s, {"--period"})) {
      if (!take(a.period, "--period")) return std::nullopt;
    } else if (Matches(s, {"--timeout"})) {
      std::string t;
      if (!take(t, "--timeout")) return std::nullopt;
      char* end = nullptr;
      a.timeout_s = std::strtod(t.c_str(), &end);
      if (t.empty() || *end || !(a.timeout_s > 0) || a.timeout_s > 3600) {
        *error = "--timeout must be a number of seconds in (0, 3600], not '" + t + "'";
        return std::nullopt;
      }
    } else if (Matches(s, {"--size"})) {
      std::string t;
      if (!take(t, "--size")) return std::nullopt;
      if (std::sscanf(t.c_str(), "%dx%d", &a.width, &a.height) != 2) {
        *error = "--size must be WIDTHxHEIGHT, not '" + t + "'";
        return std::nullopt;
      }
    } else if (s == "-h" || s == "--help" || s == "help") {
      a.command = "help";
    } else if (!s.empty() && s[0] == '-') {
      *error = "unknown option " + s;
      return std::nullopt;
    } else if (a.command.empty()) {
      a.command = s;
    } else {
      *error = "unexpected argument '" + s + "'";
      return std::nullopt;
    }
  }
  if (a.output == "wide") a.output = "table";
  if (a.output != "table" && a.output != "json" && a.output != "yaml") {
    *error = "-o must be table, json or yaml, not '" + a.output + "'";
    return std::nullopt;
  }
  if (a.period != "day" && a.period != "month") {
    *error = "--period must be day or month, not '" + a.period + "'";
    return std::nullopt;
  }
  if (!a.daemon.empty() && (a.all_namespaces || !a.ns.empty() || !a.kubeconfig.empty())) {
    *error = "--daemon reads one daemon; --kubeconfig, --namespace and -A are for the cluster's QuotaPolicies";
    return std::nullopt;
  }
  return a;
}

std::string Rfc3339(int64_t unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int Failed(std::ostream& err, const Error& e) {
  err << "moectl: " << e.message() << "\n";
  return 1;
}

template <class Rows>
void Print(std::ostream& out, const Args& a, const Rows& rows, nlohmann::json (*to_json)(const Rows&),
           std::string (*to_table)(const Rows&, bool)) {
  if (a.output == "json") {
    out << to_json(rows).dump(4) << "\n";
  } else if (a.output == "yaml") {
    out << ToYaml(to_json(rows));
  } else if (rows.empty()) {
    out << "No resources found.\n";
  } else {
    out << to_table(rows, a.all_namespaces);
  }
}

int Usage(const Args& a, std::ostream& out, std::ostream& err) {
  DaemonTarget daemon{a.daemon, a.api_key, a.timeout_s};
  if (!a.chart.empty()) {
    if (a.daemon.empty()) {
      err << "moectl: --chart needs --daemon URL: spend over time is kept by the daemon's ledger "
             "(GET /v1/usage/history); QuotaPolicies hold only each period's total\n";
      return 2;
    }
    auto history = FetchDaemonHistory(daemon, a.tenant, a.period);
    if (!history) return Failed(err, history.error());
    ChartLayout layout;
    layout.width = a.width;
    layout.height = a.height;
    if (Status st = DrawSpendChart(*history, layout, a.chart); !st) return Failed(err, st.error());
    out << "wrote " << a.chart << ": spend of tenant " << history->tenant << " in the " << history->period
        << " from " << Rfc3339(history->period_start) << " (" << history->points.size() << " hour(s) with usage, "
        << history->budgets.size() << " budget(s))\n";
    return 0;
  }
  Result<std::vector<UsageEntry>> rows = std::vector<UsageEntry>{};
  if (!a.daemon.empty()) {
    rows = FetchDaemonUsage(daemon);
  } else {
    auto policies = ListQuotaPolicies({a.kubeconfig, a.ns, a.all_namespaces, a.timeout_s});
    if (!policies) return Failed(err, policies.error());
    rows = UsageFromPolicies(*policies);
  }
  if (!rows) return Failed(err, rows.error());
  Print(out, a, *rows, &UsageListJson, &UsageTable);
  return 0;
}

// moectl audit: the daemon's audit lines, as a table or as JSON lines.
int Audit(const Args& a, std::ostream& out, std::ostream& err) {
  if (a.daemon.empty()) {
    err << "moectl: audit needs --daemon URL (and an admin --api-key): the audit log is kept by each daemon "
           "on its state volume\n";
    return 2;
  }
  if (a.output != "table" && a.output != "json") {
    err << "moectl: audit prints -o table or -o json, not '" << a.output << "'\n";
    return 2;
  }
  auto lines = FetchDaemonAudit({a.daemon, a.api_key, a.timeout_s}, a.tenant, a.since, a.limit);
  if (!lines) return Failed(err, lines.error());
  if (a.output == "json") {
    for (const auto& l : *lines) out << l.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  if (lines->empty()) {
    out << "No audit lines found.\n";
    return 0;
  }
  auto text = [](const nlohmann::json& l, const char* k) {
    auto it = l.find(k);
    if (it == l.end() || it->is_null()) return std::string("-");
    return Printable(it->is_string() ? it->get<std::string>() : it->dump());
  };
  std::vector<std::vector<std::string>> rows = {
      {"TIME", "TENANT", "KEY", "METHOD", "ENDPOINT", "STATUS", "TIER", "PROMPT", "COMPLETION", "SESSION", "REQUEST"}};
  for (const auto& l : *lines) {
    const nlohmann::json tokens = l.value("tokens", nlohmann::json::object());
    rows.push_back({text(l, "time"), text(l, "tenant"), text(l, "key_id"), text(l, "method"), text(l, "endpoint"),
                    text(l, "status"), text(l, "tier"), text(tokens, "prompt"), text(tokens, "completion"),
                    text(l, "session_id"), text(l, "request_id")});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) {
      out << r[i];
      if (i + 1 < r.size()) out << std::string(width[i] - r[i].size() + 3, ' ');
    }
    out << "\n";
  }
  return 0;
}

}  // namespace

int RunMoectl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string error;
  auto a = Parse(args, &error);
  if (!a) {
    err << "moectl: " << error << "\n(moectl --help for usage)\n";
    return 2;
  }
  if (a->command.empty() || a->command == "help") {
    (a->command.empty() ? err : out) << kUsage;
    return a->command.empty() ? 2 : 0;
  }
  if (a->command == "usage") return Usage(*a, out, err);
  if (a->command == "audit") return Audit(*a, out, err);
  if (a->command == "alerts" || a->command == "budgets") {
    if (!a->daemon.empty() || !a->chart.empty()) {
      err << "moectl: " << a->command << " reads the cluster's QuotaPolicies (status.alerts, spec.budgets); "
          << "--daemon and --chart apply to usage only\n";
      return 2;
    }
    auto policies = ListQuotaPolicies({a->kubeconfig, a->ns, a->all_namespaces, a->timeout_s});
    if (!policies) return Failed(err, policies.error());
    if (a->command == "alerts") {
      auto rows = AlertsFromPolicies(*policies);
      if (!rows) return Failed(err, rows.error());
      Print(out, *a, *rows, &AlertListJson, &AlertTable);
    } else {
      auto rows = BudgetsFromPolicies(*policies);
      if (!rows) return Failed(err, rows.error());
      Print(out, *a, *rows, &BudgetListJson, &BudgetTable);
    }
    return 0;
  }
  err << "moectl: unknown command '" << a->command << "' (usage, budgets, alerts, audit)\n";
  return 2;
}

}  // namespace moeserve::moectl
