#include "http/route_table.hpp"

namespace moeserve::daemon {

std::string_view RouteAuthName(RouteAuth auth) {
  switch (auth) {
    case RouteAuth::kPublic: return "public";
    case RouteAuth::kMetrics: return "metrics";
    case RouteAuth::kTenant: return "tenant";
    case RouteAuth::kAdmin: return "admin";
  }
  return "?";
}

bool MatchesRoutePattern(std::string_view pattern, std::string_view path) {
  while (!pattern.empty() || !path.empty()) {
    if (pattern.empty() || path.empty() || pattern.front() != '/' || path.front() != '/') return false;
    pattern.remove_prefix(1);
    path.remove_prefix(1);
    const std::string_view want = pattern.substr(0, pattern.find('/'));
    const std::string_view got = path.substr(0, path.find('/'));
    const bool wildcard = want.size() >= 2 && want.front() == '{' && want.back() == '}';
    if (wildcard ? got.empty() : want != got) return false;
    pattern.remove_prefix(want.size());
    path.remove_prefix(got.size());
  }
  return true;
}

std::string PathParam(std::string_view pattern, std::string_view path) {
  while (!pattern.empty()) {
    if (pattern.front() == '/') {
      pattern.remove_prefix(1);
      path.remove_prefix(path.empty() ? 0 : 1);
      continue;
    }
    const std::string_view want = pattern.substr(0, pattern.find('/'));
    const std::string_view got = path.substr(0, path.find('/'));
    if (want.size() >= 2 && want.front() == '{' && want.back() == '}') return std::string(got);
    pattern.remove_prefix(want.size());
    path.remove_prefix(got.size());
  }
  return "";
}

RouteMatch FindRoute(const std::vector<Route>& routes, std::string_view method, std::string_view path) {
  RouteMatch m;
  for (const Route& r : routes) {
    if (!MatchesRoutePattern(r.pattern, path)) continue;
    m.path_known = true;
    if (r.method == method) {
      m.route = &r;
      return m;
    }
  }
  return m;
}

}  // namespace moeserve::daemon
