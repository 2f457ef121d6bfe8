// One signed POST of an alert body to a hook, over libcurl.
//
// The body goes out with `Content-Type: application/json`,
// `X-MoE-Timestamp: <unix seconds of this attempt>`, `X-MoE-Delivery: <id>`
// and `X-MoE-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<id>.<body>"
// keyed by the hook's secret>` (HookSignature): the timestamp and id are
// signed with the body so a captured delivery cannot be replayed outside the
// receiver's tolerance window nor under a fresh id. A 2xx answer is a
// delivery, anything else (a redirect included: redirects are not followed)
// is a failure.
//
// Where it may connect is decided by http_client's address guard
// (address_guard.hpp) on the address really connected, at connect time, so
// a name that resolves differently the second time (DNS rebinding) gains
// nothing: without `allowPrivateAddresses` loopback, link-local (the cloud
// metadata address 169.254.169.254 among them), private, carrier-grade NAT,
// unspecified, multicast and reserved addresses, IPv4 inside IPv6 that
// reaches one of them, and the translation and tunnel prefixes are refused,
// and the result is `refused`. Without `allowHTTP` only https is spoken.
// Proxies from the environment are not used. Messages name the hook and the
// host, never the URL's path or query (webhook URLs often carry a token)
// nor the secret.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "moeserve/budget/budget_policy.hpp"

namespace moeserve {

struct HookSendResult {
  bool delivered = false;
  bool refused = false;  // the address or scheme is not allowed (no request was sent)
  int http_status = 0;   // 0: no answer
  std::string error;     // for logs: hook name, host, what failed
};

HookSendResult SendHook(const HookConfig& hook, const std::string& delivery_id, const std::string& body,
                        double timeout_seconds = 10);

// The X-MoE-Signature value: "sha256=" + HmacSha256Hex(secret,
// "<timestamp>.<delivery_id>.<body>"), timestamp in decimal unix seconds.
std::string HookSignature(const std::string& secret, int64_t timestamp, const std::string& delivery_id,
                          const std::string& body);

// Lowercase hex HMAC-SHA256 of `body` keyed by `secret`.
std::string HmacSha256Hex(const std::string& secret, const std::string& body);

}  // namespace moeserve
