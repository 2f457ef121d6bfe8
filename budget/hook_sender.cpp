#include "moeserve/budget/hook_sender.hpp"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>

#include "moeserve/http_client/curl_easy.hpp"

namespace moeserve {

namespace {

bool V4Allowed(uint32_t a) {  // host byte order
  auto in = [a](uint32_t net, int bits) { return bits == 0 || (a >> (32 - bits)) == (net >> (32 - bits)); };
  return !(in(0x00000000, 8) ||     // "this network", 0.0.0.0
           in(0x0A000000, 8) ||     // 10/8
           in(0x64400000, 10) ||    // 100.64/10 carrier-grade NAT
           in(0x7F000000, 8) ||     // loopback
           in(0xA9FE0000, 16) ||    // link-local, 169.254.169.254 metadata
           in(0xAC100000, 12) ||    // 172.16/12
           in(0xC0000000, 24) ||    // 192.0.0/24 protocol assignments
           in(0xC0A80000, 16) ||    // 192.168/16
           in(0xC6120000, 15) ||    // 198.18/15 benchmarking
           in(0xE0000000, 4) ||     // multicast
           in(0xF0000000, 4));      // reserved, broadcast
}

bool V6Allowed(const in6_addr& a) {
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
    uint32_t v4 = (uint32_t{b[12]} << 24) | (uint32_t{b[13]} << 16) | (uint32_t{b[14]} << 8) | b[15];
    return V4Allowed(v4);
  }
  // Translation and tunnel prefixes whose IPv4 end point is not at a fixed
  // place (local-use NAT64 64:ff9b:1::/48 may embed it at any RFC 6052
  // offset; Teredo 2001::/32 carries it obfuscated next to a relay) or which
  // deliver to whatever IPv4 address they embed (6to4 2002::/16): a relay
  // in the cluster network may forward them anywhere, so they are refused
  // outright rather than guessed at.
  if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b) return false;  // rest of 64:ff9b::/32, 64:ff9b:1::/48 in it
  if (b[0] == 0x20 && b[1] == 0x02) return false;                                  // 2002::/16 6to4
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x00 && b[3] == 0x00) return false;  // 2001::/32 Teredo
  return true;
}

std::string AddressText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

// curl opens every socket through here: the last word on where it connects.
curl_socket_t OpenCheckedSocket(void* clientp, curlsocktype purpose, curl_sockaddr* address) {
  auto* check = static_cast<GuardedSocket::Check*>(clientp);
  if (purpose != CURLSOCKTYPE_IPCXN || !HookAddressAllowed(&address->addr, check->allow_private)) {
    check->refused = true;
    check->refused_address = AddressText(&address->addr);
    return CURL_SOCKET_BAD;
  }
  return ::socket(address->family, address->socktype, address->protocol);
}

size_t Discard(char*, size_t size, size_t n, void*) { return size * n; }

struct UrlParts {
  std::string scheme, host, port;
};

bool ParseUrl(const std::string& url, UrlParts& out) {
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> u(curl_url(), curl_url_cleanup);
  if (!u || curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return false;
  auto get = [&](CURLUPart part, std::string& into, unsigned flags) {
    char* v = nullptr;
    if (curl_url_get(u.get(), part, &v, flags) != CURLUE_OK) return false;
    into = v;
    curl_free(v);
    return true;
  };
  return get(CURLUPART_SCHEME, out.scheme, 0) && get(CURLUPART_HOST, out.host, 0) &&
         get(CURLUPART_PORT, out.port, CURLU_DEFAULT_PORT);
}

}  // namespace

bool HookAddressAllowed(const sockaddr* addr, bool allow_private) {
  if (addr->sa_family == AF_INET) {
    if (allow_private) return true;
    return V4Allowed(ntohl(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr));
  }
  if (addr->sa_family == AF_INET6) return allow_private || V6Allowed(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  return false;  // unix sockets and the rest
}

std::string HmacSha256Hex(const std::string& secret, const std::string& body) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(body.data()),
       body.size(), mac, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) out += {kHex[mac[i] >> 4], kHex[mac[i] & 15]};
  return out;
}

std::string HookSignature(const std::string& secret, int64_t timestamp, const std::string& delivery_id,
                          const std::string& body) {
  return "sha256=" + HmacSha256Hex(secret, std::to_string(timestamp) + "." + delivery_id + "." + body);
}

GuardedTarget ResolveGuardedTarget(const std::string& url_text, bool allow_http, bool allow_private,
                                   const std::string& who, const std::string& private_hint) {
  GuardedTarget t;
  UrlParts url;
  if (!ParseUrl(url_text, url)) {
    t.refused = true;
    t.error = who + ": the URL does not parse";
    return t;
  }
  const std::string where = who + " (" + url.host + ")";
  if (url.scheme != "https" && !(url.scheme == "http" && allow_http)) {
    t.refused = true;
    t.error = where + ": scheme " + url.scheme + " is not allowed";
    return t;
  }
  std::string host = url.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  t.host = host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), url.port.c_str(), &hints, &found); rc != 0) {
    t.error = where + ": cannot resolve: " + gai_strerror(rc);
    return t;
  }
  std::string pinned, refused_list;
  for (addrinfo* ai = found; ai; ai = ai->ai_next) {
    const std::string text = AddressText(ai->ai_addr);
    if (HookAddressAllowed(ai->ai_addr, allow_private)) {
      pinned = ai->ai_family == AF_INET6 ? "[" + text + "]" : text;
      break;
    }
    refused_list += (refused_list.empty() ? "" : ", ") + text;
  }
  ::freeaddrinfo(found);
  if (pinned.empty()) {
    t.refused = true;
    t.error = where + ": resolves only to addresses it may not reach (" + refused_list + "; " + private_hint + ")";
    return t;
  }
  t.ok = true;
  t.resolve_entry = host + ":" + url.port + ":" + pinned;
  return t;
}

GuardedSocket::GuardedSocket(void* curl, const GuardedTarget& target, bool allow_private) {
  check_.allow_private = allow_private;
  resolve_ = curl_slist_append(nullptr, target.resolve_entry.c_str());
  curl_easy_setopt(static_cast<CURL*>(curl), CURLOPT_RESOLVE, static_cast<curl_slist*>(resolve_));
  curl_easy_setopt(static_cast<CURL*>(curl), CURLOPT_OPENSOCKETFUNCTION, OpenCheckedSocket);
  curl_easy_setopt(static_cast<CURL*>(curl), CURLOPT_OPENSOCKETDATA, &check_);
}

GuardedSocket::~GuardedSocket() { curl_slist_free_all(static_cast<curl_slist*>(resolve_)); }

HookSendResult SendHook(const HookConfig& hook, const std::string& delivery_id, const std::string& body,
                        double timeout_seconds) {
  HookSendResult r;
  const GuardedTarget target =
      ResolveGuardedTarget(hook.url, hook.allow_http, hook.allow_private_addresses, "hook '" + hook.name + "'",
                           "loopback, link-local and private addresses need allowPrivateAddresses");
  if (!target.ok) {
    r.refused = target.refused;
    r.error = target.error + (target.error.find("scheme ") != std::string::npos ? " (https, or http with allowHTTP)" : "");
    return r;
  }
  const std::string where = "hook '" + hook.name + "' (" + target.host + ")";
  http_client::CurlEasy curl;
  if (!curl.ok()) {
    r.error = where + ": curl_easy_init failed";
    return r;
  }
  http_client::CurlPolicy policy;
  policy.protocols = hook.allow_http ? "http,https" : "https";
  policy.max_redirects = 0;
  policy.proxy = http_client::Proxy::kNever;
  policy.user_agent = "moeserve-hooks/1";
  policy.timeout = std::chrono::milliseconds(static_cast<long>(timeout_seconds * 1000));
  policy.connect_timeout = std::chrono::milliseconds(static_cast<long>(std::min(timeout_seconds, 5.0) * 1000));
  curl.Prepare(policy);
  CURL* c = curl.get();
  GuardedSocket guard(c, target, hook.allow_private_addresses);
  http_client::CurlStringList headers;
  headers.Add("Content-Type: application/json");
  // Each attempt is signed afresh at its own time: a receiver that keeps a
  // tolerance window and the ids it has seen refuses a captured delivery
  // played again.
  const int64_t timestamp = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
  headers.Add("X-MoE-Timestamp: " + std::to_string(timestamp));
  headers.Add("X-MoE-Delivery: " + delivery_id);
  headers.Add("X-MoE-Signature: " + HookSignature(hook.secret, timestamp, delivery_id, body));
  headers.Add("Expect:");
  curl_easy_setopt(c, CURLOPT_URL, hook.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Discard);
  const CURLcode rc = curl.Perform();
  const long status = curl.ResponseCode();
  r.http_status = static_cast<int>(status);
  if (guard.refused()) {
    r.refused = true;
    r.error = where + ": refused to connect to " + guard.refused_address();
    return r;
  }
  if (rc != CURLE_OK) {
    r.error = where + ": " + curl_easy_strerror(rc);
    return r;
  }
  r.delivered = status >= 200 && status < 300;
  if (!r.delivered) r.error = where + ": answered HTTP " + std::to_string(status) + (status >= 300 && status < 400 ? " (redirects are not followed)" : "");
  return r;
}

}  // namespace moeserve
