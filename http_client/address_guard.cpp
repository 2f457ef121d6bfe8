#include "moeserve/http_client/address_guard.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstring>

namespace moeserve::http_client {

namespace {

bool V4Public(uint32_t a) {  // host byte order
  auto in = [a](uint32_t net, int bits) { return (a >> (32 - bits)) == (net >> (32 - bits)); };
  return !(in(0x00000000, 8) ||   // "this network", 0.0.0.0
           in(0x0A000000, 8) ||   // 10/8
           in(0x64400000, 10) ||  // 100.64/10 carrier-grade NAT
           in(0x7F000000, 8) ||   // loopback
           in(0xA9FE0000, 16) ||  // link-local, 169.254.169.254 metadata
           in(0xAC100000, 12) ||  // 172.16/12
           in(0xC0000000, 24) ||  // 192.0.0/24 protocol assignments
           in(0xC0A80000, 16) ||  // 192.168/16
           in(0xC6120000, 15) ||  // 198.18/15 benchmarking
           in(0xE0000000, 4) ||   // multicast
           in(0xF0000000, 4));    // reserved, broadcast
}

bool V6Public(const in6_addr& a) {
  const uint8_t* b = a.s6_addr;
  static const uint8_t kZero[16] = {};
  if (std::memcmp(b, kZero, 15) == 0 && (b[15] == 0 || b[15] == 1)) return false;  // :: and ::1
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return false;                        // fe80::/10 link-local
  if ((b[0] & 0xfe) == 0xfc) return false;                                        // fc00::/7 unique-local
  if (b[0] == 0xff) return false;                                                 // multicast
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return false;                        // fec0::/10 site-local
  // IPv4 inside IPv6 (mapped ::ffff:0:0/96, compatible ::/96, NAT64
  // 64:ff9b::/96): judged as the IPv4 address, which is where it ends up.
  const bool mapped = std::memcmp(b, kZero, 10) == 0 && b[10] == 0xff && b[11] == 0xff;
  const bool compatible = std::memcmp(b, kZero, 12) == 0;
  const bool nat64 = b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && std::memcmp(b + 4, kZero, 8) == 0;
  if (mapped || compatible || nat64) {
    const uint32_t v4 = (uint32_t{b[12]} << 24) | (uint32_t{b[13]} << 16) | (uint32_t{b[14]} << 8) | b[15];
    return V4Public(v4);
  }
  // Translation and tunnel prefixes whose IPv4 end point is not at a fixed
  // place (local-use NAT64 64:ff9b:1::/48 may embed it at any RFC 6052
  // offset; Teredo 2001::/32 carries it obfuscated next to a relay) or which
  // deliver to whatever IPv4 address they embed (6to4 2002::/16): a relay
  // in the cluster network may forward them anywhere, so they are refused
  // outright rather than guessed at.
  if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b) return false;  // rest of 64:ff9b::/32
  if (b[0] == 0x20 && b[1] == 0x02) return false;                                  // 2002::/16 6to4
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x00 && b[3] == 0x00) return false;  // 2001::/32 Teredo
  return true;
}

}  // namespace

bool IsPublicAddress(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) return V4Public(ntohl(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr));
  if (addr->sa_family == AF_INET6) return V6Public(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  return false;  // unix sockets and the rest
}

std::string AddressText(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, buf, sizeof buf);
  else if (addr->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, buf, sizeof buf);
  return buf;
}

}  // namespace moeserve::http_client
