// Reads a daemon's usage over its HTTP API (libcurl): GET /v1/usage and
// GET /v1/usage/history with a bearer key. Errors say what went wrong in the
// words an SRE acts on: the daemon cannot be reached, the key was refused
// (401) or may not read this (403), the answer is not the JSON expected or is
// too large. Text from the daemon in messages has its control bytes escaped.
//
// Thread safety: free functions, no shared state.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/moectl/usage_data.hpp"

namespace moeserve::moectl {

struct DaemonTarget {
  std::string url;      // http://host:port (a trailing /v1 or / is accepted)
  std::string api_key;  // empty: no Authorization header
  double timeout_s = 10;
  // An answer past this is refused rather than read into memory (a month of
  // rows for thousands of tenants is a few MiB).
  size_t max_body_bytes = 64 << 20;
};

Result<std::vector<UsageEntry>> FetchDaemonUsage(const DaemonTarget& target);
// tenant may be empty for a tenant's own key; period "day" or "month".
Result<SpendHistory> FetchDaemonHistory(const DaemonTarget& target, const std::string& tenant, const std::string& period);

// GET /v1/admin/audit (an admin key): the audit log's lines, oldest first;
// tenant and since (RFC 3339) may be empty; limit: the newest that many.
Result<std::vector<nlohmann::json>> FetchDaemonAudit(const DaemonTarget& target, const std::string& tenant,
                                                     const std::string& since, int limit);

// The parsers, apart so that tests can feed them bodies directly. `origin`
// names where the body came from in error messages.
Result<std::vector<UsageEntry>> ParseUsageBody(const std::string& body, const std::string& origin);
Result<SpendHistory> ParseHistoryBody(const std::string& body, const std::string& origin);

}  // namespace moeserve::moectl
