// Which addresses an outgoing call that a client can aim (hook deliveries,
// image URLs) may connect to: the one statement of that rule. CurlPolicy's
// `guard` applies it to every socket a transfer opens (curl_easy.hpp), so it
// judges the address really connected to, after libcurl's own resolution: a
// name that resolves to a public address when checked and to a private one
// when connected (DNS rebinding) gains nothing, and so does a redirect.
//
// Not public, so refused by a guard: loopback, link-local (the cloud metadata
// address 169.254.169.254 among them), private (RFC 1918, unique-local
// fc00::/7, site-local fec0::/10), carrier-grade NAT 100.64/10, "this
// network" 0/8 and ::, 192.0.0/24, benchmarking 198.18/15, multicast,
// reserved and broadcast; IPv4 written inside IPv6 (mapped ::ffff:0:0/96,
// compatible ::/96, NAT64 64:ff9b::/96) is judged as the IPv4 address it
// reaches; the translation and tunnel prefixes that reach an IPv4 address
// through a relay without it at a fixed place (the rest of 64:ff9b::/32 with
// local-use NAT64 64:ff9b:1::/48, 6to4 2002::/16, Teredo 2001::/32) are
// refused outright rather than decoded. Sockets of other families (unix) are
// not public either.
//
// Thread safety: pure functions.
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

namespace moeserve::http_client {

// What a CurlPolicy's guard allows.
struct AddressGuard {
  // false: any address (the caller trusts where its URLs point, or its
  // configuration explicitly allows private addresses).
  bool public_only = false;
  // Hosts whose connections skip the check (as libcurl parses them from the
  // URL connected to: lower case, an IPv6 literal without brackets): an
  // explicit exception for a named receiver on a private address, which
  // still refuses every other name that resolves there.
  std::vector<std::string> allowed_hosts;
};

// Whether a guarded transfer may connect to `addr` (any family; only
// AF_INET and AF_INET6 can be public).
bool IsPublicAddress(const sockaddr* addr);

// `addr` as text ("127.0.0.1", "::ffff:169.254.169.254"); "" for a family
// other than AF_INET and AF_INET6.
std::string AddressText(const sockaddr* addr);

}  // namespace moeserve::http_client
