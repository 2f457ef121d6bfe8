#include "moeserve/moectl/output.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace moeserve::moectl {

namespace {

using nlohmann::json;

json TokensJson(const Tokens& t) {
  return {{"input", t.input}, {"cachedInput", t.cached_input}, {"output", t.output}, {"reasoning", t.reasoning}};
}

void Locate(json& o, const std::string& ns, const std::string& policy) {
  if (!ns.empty()) o["namespace"] = ns;
  if (!policy.empty()) o["policy"] = policy;
}

// kubectl's printer: each column as wide as its widest cell, three spaces apart.
std::string Table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::string out;
  std::vector<std::vector<std::string>> printable;
  for (const auto& r : rows) {
    printable.emplace_back();
    for (const auto& cell : r) printable.back().push_back(Printable(cell));
  }
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : printable)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l;
    for (size_t c = 0; c < cells.size(); ++c) {
      l += cells[c];
      if (c + 1 < cells.size()) l += std::string(width[c] - cells[c].size() + 3, ' ');
    }
    out += l + "\n";
  };
  line(header);
  for (const auto& r : printable) line(r);
  return out;
}

std::string Percent(double fraction) {
  char buf[32];
  const double p = fraction * 100;
  if (std::fabs(p - std::round(p)) < 1e-9) {
    std::snprintf(buf, sizeof buf, "%.0f%%", p);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f%%", p);
  }
  return buf;
}

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

bool NeedsQuotes(const std::string& s) {
  if (s.empty()) return true;
  // Plain scalars that YAML would read back as something else than this string.
  static const char* kWords[] = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"};
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* w : kWords)
    if (lower == w) return true;
  auto parsed = json::parse(s, nullptr, false);
  if (!parsed.is_discarded() && !parsed.is_string()) return true;
  // Timestamps, octal and hex forms, versions: YAML 1.1 readers may take
  // anything that starts like a number for one, so quote it as kubectl does.
  const size_t first = (s[0] == '-' || s[0] == '+' || s[0] == '.') ? 1 : 0;
  return first < s.size() && std::isdigit(static_cast<unsigned char>(s[first]));
}

void Emit(YAML::Emitter& e, const json& v) {
  if (v.is_object()) {
    e << YAML::BeginMap;
    for (auto it = v.begin(); it != v.end(); ++it) {
      e << YAML::Key << it.key() << YAML::Value;
      Emit(e, it.value());
    }
    e << YAML::EndMap;
  } else if (v.is_array()) {
    e << YAML::BeginSeq;
    for (const json& x : v) Emit(e, x);
    e << YAML::EndSeq;
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (NeedsQuotes(s)) e << YAML::DoubleQuoted;
    e << s;
  } else if (v.is_null()) {
    e << YAML::Null;
  } else {
    e << v.dump();  // numbers and booleans as JSON writes them (shortest exact form)
  }
}

}  // namespace

std::string Printable(const std::string& text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string FormatUsd(double usd) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", usd);
  return buf;
}

json UsageListJson(const std::vector<UsageEntry>& rows) {
  json items = json::array();
  for (const auto& r : rows) {
    json o = json::object();
    Locate(o, r.ns, r.policy);
    o["tenant"] = r.tenant;
    if (!r.tier.empty()) o["tier"] = r.tier;
    o["period"] = r.period;
    o["periodStart"] = r.period_start;
    if (r.requests) o["requests"] = *r.requests;
    o["spentUSD"] = r.spent_usd;
    o["tokens"] = TokensJson(r.tokens);
    items.push_back(std::move(o));
  }
  return {{"kind", "UsageList"}, {"items", std::move(items)}};
}

json AlertListJson(const std::vector<AlertEntry>& rows) {
  json items = json::array();
  for (const auto& r : rows) {
    json o = json::object();
    Locate(o, r.ns, r.policy);
    o["tenant"] = r.tenant;
    o["period"] = r.period;
    o["periodStart"] = r.period_start;
    o["threshold"] = r.threshold;
    o["firedAt"] = r.fired_at;
    o["deliveryId"] = r.delivery_id;
    o["delivered"] = r.delivered;
    items.push_back(std::move(o));
  }
  return {{"kind", "AlertList"}, {"items", std::move(items)}};
}

json BudgetListJson(const std::vector<BudgetEntry>& rows) {
  json items = json::array();
  for (const auto& r : rows) {
    json o = json::object();
    Locate(o, r.ns, r.policy);
    o["tenant"] = r.tenant;
    o["budgetTenant"] = r.budget_tenant;
    o["period"] = r.period;
    if (!r.period_start.empty()) o["periodStart"] = r.period_start;
    o["limitUSD"] = r.limit_usd;
    o["spentUSD"] = r.spent_usd;
    o["remainingUSD"] = r.remaining_usd();
    o["thresholds"] = r.thresholds;
    o["action"] = r.action;
    items.push_back(std::move(o));
  }
  return {{"kind", "BudgetList"}, {"items", std::move(items)}};
}

std::string UsageTable(const std::vector<UsageEntry>& rows, bool with_namespace) {
  const bool cluster = std::any_of(rows.begin(), rows.end(), [](const UsageEntry& r) { return !r.policy.empty(); });
  std::vector<std::string> header;
  if (with_namespace) header.push_back("NAMESPACE");
  if (cluster) header.push_back("POLICY");
  for (const char* h : {"TENANT", "TIER", "PERIOD", "PERIOD-START", "REQUESTS", "INPUT", "CACHED-INPUT", "OUTPUT",
                        "REASONING", "SPENT-USD"})
    header.push_back(h);
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows) {
    std::vector<std::string> c;
    if (with_namespace) c.push_back(OrDash(r.ns));
    if (cluster) c.push_back(OrDash(r.policy));
    c.push_back(r.tenant);
    c.push_back(r.tier.empty() ? "all" : r.tier);
    c.push_back(r.period);
    c.push_back(OrDash(r.period_start));
    c.push_back(r.requests ? std::to_string(*r.requests) : "-");
    c.push_back(std::to_string(r.tokens.input));
    c.push_back(std::to_string(r.tokens.cached_input));
    c.push_back(std::to_string(r.tokens.output));
    c.push_back(std::to_string(r.tokens.reasoning));
    c.push_back(FormatUsd(r.spent_usd));
    cells.push_back(std::move(c));
  }
  return Table(header, cells);
}

std::string AlertTable(const std::vector<AlertEntry>& rows, bool with_namespace) {
  std::vector<std::string> header;
  if (with_namespace) header.push_back("NAMESPACE");
  for (const char* h : {"POLICY", "TENANT", "PERIOD", "PERIOD-START", "THRESHOLD", "FIRED-AT", "DELIVERED", "DELIVERY-ID"})
    header.push_back(h);
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows) {
    std::vector<std::string> c;
    if (with_namespace) c.push_back(OrDash(r.ns));
    c.push_back(r.policy);
    c.push_back(r.tenant);
    c.push_back(r.period);
    c.push_back(OrDash(r.period_start));
    c.push_back(Percent(r.threshold));
    c.push_back(OrDash(r.fired_at));
    c.push_back(r.delivered ? "true" : "false");
    c.push_back(OrDash(r.delivery_id));
    cells.push_back(std::move(c));
  }
  return Table(header, cells);
}

std::string BudgetTable(const std::vector<BudgetEntry>& rows, bool with_namespace) {
  std::vector<std::string> header;
  if (with_namespace) header.push_back("NAMESPACE");
  for (const char* h : {"POLICY", "TENANT", "PERIOD", "LIMIT-USD", "SPENT-USD", "REMAINING-USD", "USED", "ACTION",
                        "THRESHOLDS"})
    header.push_back(h);
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : rows) {
    std::vector<std::string> c;
    if (with_namespace) c.push_back(OrDash(r.ns));
    c.push_back(r.policy);
    c.push_back(r.tenant);
    c.push_back(r.period);
    c.push_back(FormatUsd(r.limit_usd));
    c.push_back(FormatUsd(r.spent_usd));
    c.push_back(FormatUsd(r.remaining_usd()));
    c.push_back(r.limit_usd > 0 ? Percent(r.spent_usd / r.limit_usd) : "-");
    c.push_back(r.action);
    std::string t;
    for (double x : r.thresholds) {
      if (!t.empty()) t += ',';
      t += Percent(x);
    }
    c.push_back(OrDash(t));
    cells.push_back(std::move(c));
  }
  return Table(header, cells);
}

std::string ToYaml(const json& value) {
  YAML::Emitter e;
  Emit(e, value);
  return std::string(e.c_str()) + "\n";
}

}  // namespace moeserve::moectl
