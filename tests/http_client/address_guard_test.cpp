// http_client.address_guard: the outgoing-address rule (address_guard.hpp)
// that hooks and image fetches share. Each refused range, IPv4 and IPv6
// (IPv4-mapped, compatible, NAT64, 6to4, Teredo forms included), is judged
// not public, and a guarded transfer refuses it at connect time: the URL
// names a host (never the address), which libcurl resolves to the address
// (CURLOPT_RESOLVE), and the socket callback refuses it before any packet
// leaves. A listener on loopback is reached by the same transfer unguarded
// and refused guarded; a host in the guard's allowed_hosts reaches it, and
// another name for the same address still does not.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "moeserve/http_client/address_guard.hpp"
#include "moeserve/http_client/curl_easy.hpp"
#include "moeserve/http_client/url_parts.hpp"

namespace moeserve::http_client {
namespace {

// Addresses of every range a guard refuses.
const char* const kRefused[] = {
    "127.0.0.1", "127.8.9.10", "169.254.169.254", "169.254.0.1", "10.1.2.3", "172.16.0.1", "172.31.255.255",
    "192.168.1.1", "100.64.0.1", "100.127.255.254", "0.0.0.0", "0.1.2.3", "192.0.0.8", "198.18.0.1",
    "198.19.255.255", "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
    // IPv6: loopback, unspecified, link-local, unique-local, site-local, multicast
    "::1", "::", "fe80::1", "febf::1", "fd00::1", "fc00::2", "fec0::1", "ff02::1",
    // IPv4-mapped, IPv4-compatible and NAT64 forms of refused IPv4 addresses
    "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1", "::ffff:192.168.0.1", "::ffff:100.64.0.1",
    "::127.0.0.1", "::169.254.169.254", "64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "64:ff9b::a00:1",
    // local-use NAT64, 6to4 and Teredo reach IPv4 through a relay
    "64:ff9b:1::a9fe:a9fe", "64:ff9b:1:ffff::808:808", "64:ff9b:1::808:808", "2002:a9fe:a9fe::1", "2002:7f00:1::",
    "2002:808:808::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001::1"};

// Public addresses, some just outside a refused range.
const char* const kPublic[] = {"8.8.8.8",        "172.32.0.1",       "172.15.255.255",       "192.169.0.1",
                               "100.128.0.1",    "169.255.0.1",      "198.20.0.1",           "223.255.255.255",
                               "1.0.0.1",        "2001:4860:4860::8888", "::ffff:8.8.8.8", "64:ff9b::808:808",
                               "2001:1::1",      "2003::1",          "fe7f::1"};

sockaddr_storage Addr(const std::string& text) {
  sockaddr_storage ss{};
  if (text.find(':') != std::string::npos) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    EXPECT_EQ(inet_pton(AF_INET6, text.c_str(), &a->sin6_addr), 1) << text;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    EXPECT_EQ(inet_pton(AF_INET, text.c_str(), &a->sin_addr), 1) << text;
  }
  return ss;
}

bool Public(const std::string& text) {
  const sockaddr_storage a = Addr(text);
  return IsPublicAddress(reinterpret_cast<const sockaddr*>(&a));
}

std::string Text(const std::string& text) {
  const sockaddr_storage a = Addr(text);
  return AddressText(reinterpret_cast<const sockaddr*>(&a));
}

// Counts the connections a loopback listener accepts.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 8);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        ++accepted_;
        char buf[4096];
        (void)::recv(c, buf, sizeof buf, 0);
        const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
        ::send(c, ok.data(), ok.size(), MSG_NOSIGNAL);
        ::close(c);
      }
    });
  }
  ~Listener() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

struct Outcome {
  CURLcode code = CURLE_OK;
  long status = 0;
  std::vector<std::string> refused;
};

// GET http://<host>:<port>/ with <host> resolved to `address` by libcurl
// itself (CURLOPT_RESOLVE), so only the connect-time check can see it.
Outcome Get(const std::string& host, const std::string& address, int port, const AddressGuard& guard) {
  CurlEasy easy;
  EXPECT_TRUE(easy.ok());
  CurlPolicy policy;
  policy.connect_timeout = std::chrono::seconds(3);  // a guard that failed to refuse must not hang the test
  policy.timeout = std::chrono::seconds(5);
  policy.guard = guard;
  easy.Prepare(policy);
  const std::string literal = address.find(':') != std::string::npos ? "[" + address + "]" : address;
  CurlStringList resolve;
  resolve.Add(host + ":" + std::to_string(port) + ":" + literal);
  curl_easy_setopt(easy.get(), CURLOPT_RESOLVE, resolve.get());
  const std::string url = "http://" + host + ":" + std::to_string(port) + "/";
  curl_easy_setopt(easy.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy.get(), CURLOPT_WRITEFUNCTION, +[](char*, size_t s, size_t n, void*) { return s * n; });
  Outcome o;
  o.code = easy.Perform();
  o.status = easy.ResponseCode();
  o.refused = easy.RefusedAddresses();
  return o;
}

AddressGuard PublicOnly() {
  AddressGuard g;
  g.public_only = true;
  return g;
}

TEST(AddressGuard, EveryRefusedRangeIsNotPublic) {
  for (const char* a : kRefused) EXPECT_FALSE(Public(a)) << a;
  for (const char* a : kPublic) EXPECT_TRUE(Public(a)) << a;
  sockaddr_storage unix_socket{};
  unix_socket.ss_family = AF_UNIX;
  EXPECT_FALSE(IsPublicAddress(reinterpret_cast<const sockaddr*>(&unix_socket)));
}

TEST(AddressGuard, AddressTextNamesTheAddress) {
  EXPECT_EQ(Text("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(Text("::FFFF:169.254.169.254"), "::ffff:169.254.169.254");
  EXPECT_EQ(Text("fe80:0::1"), "fe80::1");
}

TEST(AddressGuard, AGuardedTransferRefusesEveryRangeAtConnectTime) {
  for (const char* a : kRefused) {
    // Port 9 (discard): nothing is expected to answer; the guard must refuse
    // before trying.
    const Outcome o = Get("target.example", a, 9, PublicOnly());
    EXPECT_EQ(o.code, CURLE_COULDNT_CONNECT) << a << ": " << curl_easy_strerror(o.code);
    EXPECT_EQ(o.refused, std::vector<std::string>{Text(a)}) << a;
  }
}

TEST(AddressGuard, ALoopbackListenerIsReachedUnguardedAndRefusedGuarded) {
  Listener server;
  Outcome o = Get("receiver.example", "127.0.0.1", server.port(), AddressGuard{});
  ASSERT_EQ(o.code, CURLE_OK) << curl_easy_strerror(o.code);
  EXPECT_EQ(o.status, 200);
  EXPECT_TRUE(o.refused.empty());
  EXPECT_EQ(server.accepted(), 1);

  o = Get("receiver.example", "127.0.0.1", server.port(), PublicOnly());
  EXPECT_EQ(o.code, CURLE_COULDNT_CONNECT);
  EXPECT_EQ(o.refused, std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(server.accepted(), 1) << "the guard let a connection through";

  // The same listener through its IPv4-mapped IPv6 form.
  o = Get("receiver.example", "::ffff:127.0.0.1", server.port(), PublicOnly());
  EXPECT_EQ(o.code, CURLE_COULDNT_CONNECT);
  EXPECT_EQ(o.refused, std::vector<std::string>{"::ffff:127.0.0.1"});
  EXPECT_EQ(server.accepted(), 1) << "the guard let a connection through";
}

TEST(AddressGuard, AnExplicitlyAllowedHostIsReachedAndNoOtherNameForItsAddress) {
  Listener server;
  AddressGuard guard = PublicOnly();
  guard.allowed_hosts = {"receiver.internal"};
  Outcome o = Get("receiver.internal", "127.0.0.1", server.port(), guard);
  ASSERT_EQ(o.code, CURLE_OK) << curl_easy_strerror(o.code);
  EXPECT_EQ(o.status, 200);
  EXPECT_TRUE(o.refused.empty());
  EXPECT_EQ(server.accepted(), 1);

  o = Get("other.internal", "127.0.0.1", server.port(), guard);
  EXPECT_EQ(o.code, CURLE_COULDNT_CONNECT);
  EXPECT_EQ(o.refused, std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(server.accepted(), 1);
}

TEST(AddressGuard, CurlFetchReportsTheRefusedAddresses) {
  Listener server;
  CurlCall call;
  call.url = "http://127.0.0.1:" + std::to_string(server.port()) + "/";
  CurlPolicy policy;
  policy.guard = PublicOnly();
  policy.connect_timeout = std::chrono::seconds(3);
  CurlAnswer a = CurlFetch(call, policy);
  EXPECT_EQ(a.code, CURLE_COULDNT_CONNECT);
  EXPECT_EQ(a.refused_addresses, std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(server.accepted(), 0);
  policy.guard.public_only = false;
  a = CurlFetch(call, policy);
  EXPECT_EQ(a.code, CURLE_OK) << a.error;
  EXPECT_TRUE(a.refused_addresses.empty());
  EXPECT_EQ(server.accepted(), 1);
}

TEST(UrlParts, SchemeHostAndPortAsLibcurlReadsThem) {
  auto p = ParseUrl("HTTPS://Hooks.Example.COM/path?token=1");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->scheme, "https");
  EXPECT_EQ(p->host, "hooks.example.com");
  EXPECT_EQ(p->port, "443");
  p = ParseUrl("http://[::1]:8080/");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->host, "::1");
  EXPECT_EQ(p->port, "8080");
  EXPECT_FALSE(ParseUrl("http://exa mple/").has_value());
}

}  // namespace
}  // namespace moeserve::http_client
