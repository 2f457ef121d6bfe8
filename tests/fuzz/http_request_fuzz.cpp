// The daemon's HTTP front (HttpServer: Beast's parser plus our head, limit
// and admission handling), fed raw bytes over loopback as a client would
// send them: one connection per input, written and then half-closed. Every
// byte sequence must be answered with well-formed HTTP responses or a closed
// connection; ASan and UBSan watch the server threads, and a server that
// stopped accepting fails the next input.
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "../support/loopback.hpp"
#include "fuzz_check.hpp"
#include "moeserve/daemon/http/http_server.hpp"

using namespace moeserve;
using namespace moeserve::daemon;

namespace {

// Small limits, so that inputs of a few KB reach the 413 and 431 paths.
HttpServer& Server() {
  static std::unique_ptr<HttpServer> server = [] {
    HttpServerOptions o;
    o.port = 0;
    o.threads = 2;
    o.max_header_bytes = 1024;
    o.header_timeout_seconds = 5;
    o.body_timeout_seconds = 5;
    o.write_timeout_seconds = 5;
    HttpServerHooks hooks;
    hooks.admit = [](const HttpHead& head) {
      if (head.path == "/refuse") return HttpAdmission::Refuse(HttpResponse{.status = 401, .body = "no"});
      return HttpAdmission::Accept(512);
    };
    hooks.handle = [](HttpHead head, std::string body, std::shared_ptr<HttpExchange> exchange) {
      if (head.path == "/stream") {
        exchange->BeginStream(200, "text/event-stream", {});
        (void)exchange->Write("data: " + std::to_string(body.size()) + "\n\n");
        exchange->EndStream();
        return;
      }
      exchange->Reply(HttpResponse{.body = head.method + " " + head.path + " " + std::to_string(body.size())});
    };
    auto s = HttpServer::Start(std::move(o), std::move(hooks));
    FUZZ_CHECK(s.has_value(), s ? "" : s.error().ToString());
    return std::move(*s);
  }();
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = test_support::ConnectLoopback(Server().port());
  FUZZ_CHECK(fd >= 0, std::string("the server no longer accepts connections: ") + std::strerror(errno));
  timeval timeout{.tv_sec = 20, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  // The server may answer (400, 413, 431) and close before reading it all:
  // a failed send is then expected, not a finding.
  for (size_t sent = 0; sent < size;) {
    ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string reply;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EAGAIN) FUZZ_CHECK(false, "no answer and no close within 20 s");
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  // Close with a reset, not a FIN: a fuzzer opens hundreds of thousands of
  // connections, and sockets left in TIME_WAIT would use up the loopback's
  // ephemeral ports long before the server had anything to do with it.
  const linger reset{.l_onoff = 1, .l_linger = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  ::close(fd);
  if (!reply.empty()) {
    FUZZ_CHECK(reply.starts_with("HTTP/1.1 ") && reply.size() >= 12, "not an HTTP response: " + reply.substr(0, 80));
    const std::string_view code = std::string_view(reply).substr(9, 3);
    FUZZ_CHECK(code.find_first_not_of("0123456789") == std::string_view::npos, "status: " + std::string(code));
  }
  return 0;
}
