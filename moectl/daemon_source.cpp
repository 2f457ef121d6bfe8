#include "moeserve/moectl/daemon_source.hpp"

#include <nlohmann/json.hpp>

#include "moeserve/common/rfc3339.hpp"
#include "moeserve/http_client/curl_easy.hpp"
#include "moeserve/moectl/output.hpp"

namespace moeserve::moectl {

namespace {

using nlohmann::json;

struct HttpAnswer {
  long status = 0;
  std::string body;
};

std::string BaseUrl(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.size() >= 3 && url.compare(url.size() - 3, 3, "/v1") == 0) url.resize(url.size() - 3);
  return url;
}

std::string Escape(const std::string& s) {
  char* e = curl_easy_escape(nullptr, s.c_str(), static_cast<int>(s.size()));
  std::string out = e ? e : "";
  curl_free(e);
  return out;
}

// The daemon's error object, when the body has one: "401 invalid_api_key: Missing or wrong API key".
std::string ErrorSummary(const HttpAnswer& a) {
  std::string s = std::to_string(a.status);
  auto j = json::parse(a.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const json& e = j["error"];
    if (e.contains("code") && e["code"].is_string()) s += " " + Printable(e["code"].get<std::string>());
    if (e.contains("message") && e["message"].is_string()) s += ": " + Printable(e["message"].get<std::string>());
  }
  return s;
}

std::string Snippet(const std::string& body) {
  std::string s = Printable(body.substr(0, 80));
  return body.size() > 80 ? s + "..." : s;
}

// GET base + path_and_query; the transport and HTTP status are checked here.
Result<std::string> Get(const DaemonTarget& t, const std::string& path_and_query) {
  const std::string base = BaseUrl(t.url);
  if (base.rfind("http://", 0) != 0 && base.rfind("https://", 0) != 0) {
    return Fail(Error::InvalidArgument("--daemon must be an http:// or https:// URL, not '" + t.url + "'"));
  }
  const std::string url = base + path_and_query;
  http_client::CurlCall call;
  call.url = url;
  if (!t.api_key.empty()) call.headers.push_back("Authorization: Bearer " + t.api_key);
  call.headers.push_back("Accept: application/json");
  call.max_answer_bytes = t.max_body_bytes;
  http_client::CurlPolicy policy;
  policy.timeout = policy.connect_timeout = std::chrono::milliseconds(static_cast<long>(t.timeout_s * 1000));
  policy.user_agent = "moectl";
  // The key goes to this daemon only: a redirect is reported, not followed.
  policy.max_redirects = 0;
  policy.proxy = http_client::Proxy::kFromEnvironment;  // an SRE's workstation may reach the daemon through one
  const http_client::CurlAnswer answer = http_client::CurlFetch(call, policy);
  HttpAnswer a{answer.status, answer.body};
  if (answer.too_large) {
    return Fail(Error::ResourceExhausted("the daemon at " + base + " answered more than " +
                                         std::to_string(t.max_body_bytes) + " bytes to GET " + path_and_query +
                                         "; refusing to read further"));
  }
  if (answer.code != CURLE_OK) {
    const std::string why = answer.detail.empty() ? answer.error : answer.detail;
    return Fail(Error::Unavailable("cannot reach the daemon at " + base + ": " + why +
                                   " (is it running, and is --daemon the right address?)"));
  }
  if (a.status == 401) {
    return Fail(Error::PermissionDenied("the daemon at " + base + " refused the API key (" + ErrorSummary(a) +
                                        "); check --api-key or $MOECTL_API_KEY"));
  }
  if (a.status == 403) {
    return Fail(Error::PermissionDenied("the daemon at " + base + " does not let this key read " + path_and_query +
                                        " (" + ErrorSummary(a) + "); a tenant's key reads only its own tenant, an "
                                        "admin key reads every tenant"));
  }
  if (a.status == 404) {
    return Fail(Error::NotFound("the daemon at " + base + " does not serve " + path_and_query + " (" +
                                ErrorSummary(a) + "); is it a moe-daemon of this version?"));
  }
  if (a.status != 200) {
    return Fail(Error::Unavailable("the daemon at " + base + " answered " + ErrorSummary(a) + " to GET " +
                                   path_and_query));
  }
  return a.body;
}

Result<json> ParseJson(const std::string& body, const std::string& origin) {
  try {
    return json::parse(body);
  } catch (const json::parse_error& e) {
    return Fail(Error::InvalidArgument(origin + " answered a body that is not JSON (" + e.what() + "): '" +
                                       Snippet(body) + "'"));
  }
}

Error Malformed(const std::string& origin, const std::string& what) {
  return Error::InvalidArgument(origin + " answered JSON of an unexpected shape: " + what);
}

Result<Tokens> ParseTokens(const json& t, const std::string& origin, const std::string& where) {
  if (!t.is_object()) return Fail(Malformed(origin, where + ".tokens is not an object"));
  Tokens out;
  std::pair<const char*, int64_t*> fields[] = {
      {"input", &out.input}, {"cached_input", &out.cached_input}, {"output", &out.output}, {"reasoning", &out.reasoning}};
  for (auto& [name, dst] : fields) {
    if (!t.contains(name)) continue;
    if (!t[name].is_number_integer()) return Fail(Malformed(origin, where + ".tokens." + name + " is not an integer"));
    *dst = t[name].get<int64_t>();
  }
  return out;
}

Result<std::string> Str(const json& o, const char* key, const std::string& origin, const std::string& where) {
  if (!o.contains(key) || !o[key].is_string()) return Fail(Malformed(origin, where + "." + key + " is not a string"));
  return o[key].get<std::string>();
}

Result<double> Num(const json& o, const char* key, const std::string& origin, const std::string& where) {
  if (!o.contains(key) || !o[key].is_number()) return Fail(Malformed(origin, where + "." + key + " is not a number"));
  return o[key].get<double>();
}

Result<int64_t> Time(const json& o, const char* key, const std::string& origin, const std::string& where) {
  MOE_ASSIGN_OR_RETURN(std::string s, Str(o, key, origin, where));
  const double t = ParseMicroTime(s);
  if (t < 0) return Fail(Malformed(origin, where + "." + key + " is not an RFC 3339 time: '" + s + "'"));
  return static_cast<int64_t>(t);
}

}  // namespace

Result<std::vector<UsageEntry>> ParseUsageBody(const std::string& body, const std::string& origin) {
  MOE_ASSIGN_OR_RETURN(json j, ParseJson(body, origin));
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array()) {
    return Fail(Malformed(origin, "no \"data\" array"));
  }
  std::vector<UsageEntry> out;
  for (size_t i = 0; i < j["data"].size(); ++i) {
    const json& r = j["data"][i];
    const std::string where = "data[" + std::to_string(i) + "]";
    if (!r.is_object()) return Fail(Malformed(origin, where + " is not an object"));
    UsageEntry e;
    MOE_ASSIGN_OR_RETURN(e.tenant, Str(r, "tenant", origin, where));
    MOE_ASSIGN_OR_RETURN(e.tier, Str(r, "tier", origin, where));
    MOE_ASSIGN_OR_RETURN(e.period, Str(r, "period", origin, where));
    MOE_ASSIGN_OR_RETURN(e.period_start, Str(r, "period_start", origin, where));
    MOE_ASSIGN_OR_RETURN(e.spent_usd, Num(r, "cost_usd", origin, where));
    if (r.contains("requests")) {
      if (!r["requests"].is_number_integer()) return Fail(Malformed(origin, where + ".requests is not an integer"));
      e.requests = r["requests"].get<int64_t>();
    }
    MOE_ASSIGN_OR_RETURN(e.tokens, ParseTokens(r.value("tokens", json()), origin, where));
    out.push_back(std::move(e));
  }
  return out;
}

Result<SpendHistory> ParseHistoryBody(const std::string& body, const std::string& origin) {
  MOE_ASSIGN_OR_RETURN(json j, ParseJson(body, origin));
  if (!j.is_object()) return Fail(Malformed(origin, "not an object"));
  SpendHistory h;
  MOE_ASSIGN_OR_RETURN(h.tenant, Str(j, "tenant", origin, "history"));
  MOE_ASSIGN_OR_RETURN(h.period, Str(j, "period", origin, "history"));
  MOE_ASSIGN_OR_RETURN(h.period_start, Time(j, "period_start", origin, "history"));
  MOE_ASSIGN_OR_RETURN(h.period_end, Time(j, "period_end", origin, "history"));
  MOE_ASSIGN_OR_RETURN(h.now, Time(j, "now", origin, "history"));
  if (!j.contains("data") || !j["data"].is_array()) return Fail(Malformed(origin, "no \"data\" array"));
  for (size_t i = 0; i < j["data"].size(); ++i) {
    const std::string where = "data[" + std::to_string(i) + "]";
    const json& p = j["data"][i];
    if (!p.is_object()) return Fail(Malformed(origin, where + " is not an object"));
    MOE_ASSIGN_OR_RETURN(int64_t hour, Time(p, "hour_start", origin, where));
    MOE_ASSIGN_OR_RETURN(double usd, Num(p, "cumulative_usd", origin, where));
    h.points.emplace_back(hour, usd);
  }
  if (j.contains("budgets")) {
    if (!j["budgets"].is_array()) return Fail(Malformed(origin, "budgets is not an array"));
    for (size_t i = 0; i < j["budgets"].size(); ++i) {
      const std::string where = "budgets[" + std::to_string(i) + "]";
      const json& b = j["budgets"][i];
      if (!b.is_object()) return Fail(Malformed(origin, where + " is not an object"));
      BudgetLine line;
      MOE_ASSIGN_OR_RETURN(line.limit_usd, Num(b, "limit_usd", origin, where));
      if (b.contains("thresholds")) {
        if (!b["thresholds"].is_array()) return Fail(Malformed(origin, where + ".thresholds is not an array"));
        for (const json& t : b["thresholds"]) {
          if (!t.is_number()) return Fail(Malformed(origin, where + ".thresholds holds a non-number"));
          line.thresholds.push_back(t.get<double>());
        }
      }
      line.action = b.value("action", "");
      h.budgets.push_back(std::move(line));
    }
  }
  return h;
}

Result<std::vector<UsageEntry>> FetchDaemonUsage(const DaemonTarget& target) {
  MOE_ASSIGN_OR_RETURN(std::string body, Get(target, "/v1/usage"));
  return ParseUsageBody(body, "the daemon at " + BaseUrl(target.url) + " (GET /v1/usage)");
}

Result<SpendHistory> FetchDaemonHistory(const DaemonTarget& target, const std::string& tenant,
                                        const std::string& period) {
  std::string query = "/v1/usage/history?period=" + Escape(period);
  if (!tenant.empty()) query += "&tenant=" + Escape(tenant);
  MOE_ASSIGN_OR_RETURN(std::string body, Get(target, query));
  return ParseHistoryBody(body, "the daemon at " + BaseUrl(target.url) + " (GET /v1/usage/history)");
}

Result<std::vector<json>> FetchDaemonAudit(const DaemonTarget& target, const std::string& tenant,
                                           const std::string& since, int limit) {
  std::string query = "/v1/admin/audit?limit=" + std::to_string(limit);
  if (!tenant.empty()) query += "&tenant=" + Escape(tenant);
  if (!since.empty()) query += "&since=" + Escape(since);
  MOE_ASSIGN_OR_RETURN(std::string body, Get(target, query));
  const std::string origin = "the daemon at " + BaseUrl(target.url) + " (GET /v1/admin/audit)";
  MOE_ASSIGN_OR_RETURN(json j, ParseJson(body, origin));
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array())
    return Fail(Error::InvalidArgument(origin + " answered JSON without a \"data\" list: '" + Snippet(body) + "'"));
  std::vector<json> lines;
  for (auto& line : j["data"])
    if (line.is_object()) lines.push_back(std::move(line));
  return lines;
}

}  // namespace moeserve::moectl
