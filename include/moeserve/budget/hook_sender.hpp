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
// Where it may connect is decided on the address really connected, not on
// the name in the URL: the host is resolved here, every address is checked,
// the request is pinned to an allowed one (CURLOPT_RESOLVE), and curl's
// socket callback checks the address of every socket it opens again, so a
// name that resolves differently the second time (DNS rebinding) gains
// nothing. Without `allowPrivateAddresses` these are refused: loopback,
// link-local (the cloud metadata address 169.254.169.254 among them),
// private (RFC 1918, unique-local fc00::/7), carrier-grade NAT, unspecified,
// multicast and reserved addresses, IPv4 written inside IPv6 (mapped,
// compatible, NAT64 64:ff9b::/96: judged as the IPv4 address), and the
// translation and tunnel prefixes that reach an IPv4 address through a relay
// (the rest of 64:ff9b::/32 with local-use NAT64 64:ff9b:1::/48, 6to4
// 2002::/16, Teredo 2001::/32: refused, not decoded). Without
// `allowHTTP` only https is spoken. Proxies from the environment are not
// used. Messages name the hook and the host, never the URL's path or query
// (webhook URLs often carry a token) nor the secret.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <sys/socket.h>

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

// Whether a hook may connect to `addr` (AF_INET or AF_INET6).
bool HookAddressAllowed(const sockaddr* addr, bool allow_private_addresses);

// The address policy above for any outgoing call a client can aim (hooks,
// image URLs): ResolveGuardedTarget parses the URL with libcurl's parser,
// checks the scheme, resolves the host and picks the first allowed address;
// GuardedSocket then pins a prepared handle to it (CURLOPT_RESOLVE) and
// checks every socket the transfer opens.
struct GuardedTarget {
  bool ok = false;
  bool refused = false;       // scheme or address not allowed (nothing was sent)
  std::string error;          // names `who` and the host, never the path or query
  std::string host;           // as libcurl parsed it (IPv6 without brackets)
  std::string resolve_entry;  // "host:port:address" for CURLOPT_RESOLVE
};
// `private_hint` ends the message when only private addresses were found
// (the setting that would allow them).
GuardedTarget ResolveGuardedTarget(const std::string& url, bool allow_http, bool allow_private_addresses,
                                   const std::string& who, const std::string& private_hint);

class GuardedSocket {
 public:
  // Sets CURLOPT_RESOLVE and the socket check on `curl`; this object must
  // outlive the transfer.
  GuardedSocket(void* curl, const GuardedTarget& target, bool allow_private_addresses);
  GuardedSocket(const GuardedSocket&) = delete;
  GuardedSocket& operator=(const GuardedSocket&) = delete;
  ~GuardedSocket();
  bool refused() const { return check_.refused; }
  const std::string& refused_address() const { return check_.refused_address; }

  struct Check {  // what the socket callback reads and writes
    bool allow_private = false;
    bool refused = false;
    std::string refused_address;
  };

 private:
  Check check_;
  void* resolve_ = nullptr;  // curl_slist*
};

// The X-MoE-Signature value: "sha256=" + HmacSha256Hex(secret,
// "<timestamp>.<delivery_id>.<body>"), timestamp in decimal unix seconds.
std::string HookSignature(const std::string& secret, int64_t timestamp, const std::string& delivery_id,
                          const std::string& body);

// Lowercase hex HMAC-SHA256 of `body` keyed by `secret`.
std::string HmacSha256Hex(const std::string& secret, const std::string& body);

}  // namespace moeserve
