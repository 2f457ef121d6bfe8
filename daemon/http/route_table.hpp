// The daemon's HTTP routes, each declared once: method, path pattern, who
// may call it, what the head alone must show before the body is read, the
// body limit and the handler. Admission (before the body) and dispatch
// (after it) both walk the same table, so a route cannot be admitted by one
// and missed by the other, and a test can walk every route
// (daemon.route_table).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/http/http_server.hpp"
#include "moeserve/daemon/http/routes.hpp"

namespace moeserve::daemon {

struct Route {
  std::string method;   // GET, POST, PUT, DELETE
  std::string pattern;  // "/v1/sessions/{id}": a {name} segment matches one non-empty path segment
  RouteAuth auth = RouteAuth::kTenant;
  // What else the head decides once method and key are right (draining,
  // readiness); empty: nothing.
  std::function<ApiResult<void>(const HttpHead&)> admit;
  std::function<size_t()> body_limit;
  // Chat and session requests: every answer is an audit line, refusals from
  // the head included.
  bool audited = false;
  // Refusals from the head count in moe_requests_total (chat completions).
  bool counted = false;
  // who: the caller for kTenant and kAdmin routes (checked again after the
  // body, in case the keys changed), null for the others.
  std::function<void(const HttpHead& head, std::string body, std::shared_ptr<HttpExchange> exchange,
                     const Principal* who)>
      handle;
};

// Whether `path` (no query) matches `pattern`, segment by segment.
bool MatchesRoutePattern(std::string_view pattern, std::string_view path);

// The segment of `path` that `pattern`'s {name} segment matched (the first
// one); empty when the pattern has none. `path` must match `pattern`.
std::string PathParam(std::string_view pattern, std::string_view path);

struct RouteMatch {
  const Route* route = nullptr;  // the route for this method and path
  bool path_known = false;       // some route has this path (another method: 405, else 404)
};
RouteMatch FindRoute(const std::vector<Route>& routes, std::string_view method, std::string_view path);

}  // namespace moeserve::daemon
