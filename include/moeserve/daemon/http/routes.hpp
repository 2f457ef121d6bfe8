// What each of the daemon's HTTP routes is, for docs and tests: the table
// itself lives in the daemon (route_table.hpp).
#pragma once

#include <string>
#include <string_view>

namespace moeserve::daemon {

// kPublic: anyone (probes). kMetrics: the metrics token or an admin key.
// kTenant: any valid API key. kAdmin: a key with the admin role.
enum class RouteAuth { kPublic, kMetrics, kTenant, kAdmin };
std::string_view RouteAuthName(RouteAuth auth);

struct RouteDescription {
  std::string method;
  std::string pattern;
  RouteAuth auth = RouteAuth::kTenant;
};

}  // namespace moeserve::daemon
