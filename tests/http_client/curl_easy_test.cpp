// http_client.curl_easy: what a CurlPolicy makes a transfer do, against a
// local listener that answers each connection with a canned response:
// redirects answered, not followed, unless allowed (and then only as far as
// max_redirects); an answer past max_answer_bytes stops the transfer; the
// transfer's time limit holds against a server that never answers; a scheme
// outside `protocols` is refused before any connection; a proxy from the
// environment is ignored under Proxy::kNever; headers and the body go out
// as given.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moeserve/http_client/curl_easy.hpp"

namespace moeserve::http_client {
namespace {

// Accepts connections on 127.0.0.1 and answers each request with
// respond(request text); records every request it read.
class Listener {
 public:
  explicit Listener(std::function<std::string(const std::string&)> respond) : respond_(std::move(respond)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 8);
    thread_ = std::thread([this] { Serve(); });
  }
  ~Listener() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string Url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  std::vector<std::string> Requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  void Serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string request;
      char buf[4096];
      // Headers, then as many body bytes as Content-Length says.
      for (;;) {
        const size_t end = request.find("\r\n\r\n");
        if (end != std::string::npos) {
          size_t want = 0;
          if (auto at = request.find("Content-Length: "); at != std::string::npos && at < end)
            want = std::stoul(request.substr(at + 16));
          if (request.size() >= end + 4 + want) break;
        }
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      {
        std::lock_guard lock(mu_);
        requests_.push_back(request);
      }
      const std::string answer = respond_(request);
      if (!answer.empty()) ::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      ::close(c);
    }
  }

  std::function<std::string(const std::string&)> respond_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> requests_;
  std::thread thread_;
};

std::string Ok(const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

TEST(CurlEasy, SendsTheMethodHeadersAndBodyAndReturnsTheAnswer) {
  Listener server([](const std::string&) { return Ok("{\"ok\":true}"); });
  CurlCall call;
  call.method = "PUT";
  call.url = server.Url("/v1/thing");
  call.headers = {"X-Test: yes", "Content-Type: application/json"};
  call.body = "{\"a\":1}";
  CurlPolicy policy;
  policy.user_agent = "moeserve-test/1";
  const CurlAnswer a = CurlFetch(call, policy);
  ASSERT_EQ(a.code, CURLE_OK) << a.error << " " << a.detail;
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "{\"ok\":true}");
  const auto requests = server.Requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].rfind("PUT /v1/thing HTTP/1.1\r\n", 0), 0u) << requests[0];
  EXPECT_NE(requests[0].find("X-Test: yes\r\n"), std::string::npos);
  EXPECT_NE(requests[0].find("User-Agent: moeserve-test/1\r\n"), std::string::npos);
  EXPECT_EQ(requests[0].substr(requests[0].size() - 7), "{\"a\":1}");
}

TEST(CurlEasy, ARedirectIsTheAnswerUnlessRedirectsAreAllowed) {
  Listener server([](const std::string& request) {
    if (request.rfind("GET /moved ", 0) == 0)
      return std::string("HTTP/1.1 302 Found\r\nLocation: /there\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    return Ok("arrived");
  });
  CurlCall call;
  call.url = server.Url("/moved");
  CurlPolicy policy;  // max_redirects 0
  CurlAnswer a = CurlFetch(call, policy);
  ASSERT_EQ(a.code, CURLE_OK) << a.error;
  EXPECT_EQ(a.status, 302);
  EXPECT_EQ(server.Requests().size(), 1u);

  policy.max_redirects = 3;
  policy.redirect_protocols = "http";
  a = CurlFetch(call, policy);
  ASSERT_EQ(a.code, CURLE_OK) << a.error;
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "arrived");
  EXPECT_EQ(server.Requests().size(), 3u);
}

TEST(CurlEasy, AnAnswerPastTheCapStopsTheTransfer) {
  Listener server([](const std::string&) { return Ok(std::string(4096, 'x')); });
  CurlCall call;
  call.url = server.Url("/big");
  call.max_answer_bytes = 1000;
  const CurlAnswer a = CurlFetch(call, CurlPolicy{});
  EXPECT_TRUE(a.too_large);
  EXPECT_EQ(a.code, CURLE_WRITE_ERROR);
  EXPECT_LE(a.body.size(), 1000u);
}

TEST(CurlEasy, TheTimeLimitHoldsAgainstAServerThatNeverAnswers) {
  std::atomic<bool> release{false};
  Listener server([&](const std::string&) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return std::string();
  });
  CurlCall call;
  call.url = server.Url("/slow");
  CurlPolicy policy;
  policy.timeout = std::chrono::milliseconds(300);
  const CurlAnswer a = CurlFetch(call, policy);
  release = true;
  EXPECT_EQ(a.code, CURLE_OPERATION_TIMEDOUT) << a.error;
  EXPECT_EQ(a.status, 0);
}

TEST(CurlEasy, ASchemeOutsideTheProtocolsIsRefusedBeforeConnecting) {
  Listener server([](const std::string&) { return Ok("should not be asked"); });
  CurlCall call;
  call.url = server.Url("/plain");
  CurlPolicy policy;
  policy.protocols = "https";
  const CurlAnswer a = CurlFetch(call, policy);
  EXPECT_EQ(a.code, CURLE_UNSUPPORTED_PROTOCOL) << a.error;
  EXPECT_TRUE(server.Requests().empty());
}

TEST(CurlEasy, ProxyNeverIgnoresTheEnvironmentsProxy) {
  Listener target([](const std::string&) { return Ok("direct"); });
  Listener proxy([](const std::string&) { return Ok("via proxy"); });
  ::setenv("http_proxy", proxy.Url("").c_str(), 1);
  ::unsetenv("no_proxy");
  ::unsetenv("NO_PROXY");
  CurlCall call;
  call.url = target.Url("/p");
  CurlPolicy policy;
  policy.proxy = Proxy::kNever;
  CurlAnswer a = CurlFetch(call, policy);
  ASSERT_EQ(a.code, CURLE_OK) << a.error;
  EXPECT_EQ(a.body, "direct");
  policy.proxy = Proxy::kFromEnvironment;
  a = CurlFetch(call, policy);
  ::unsetenv("http_proxy");
  ASSERT_EQ(a.code, CURLE_OK) << a.error;
  EXPECT_EQ(a.body, "via proxy");
  EXPECT_EQ(proxy.Requests().size(), 1u);
}

}  // namespace
}  // namespace moeserve::http_client
