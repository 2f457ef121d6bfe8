// The bounded HTTP front on its own, with small handlers: streamed answers to
// a client that never reads, pipelined requests, Expect: 100-continue, chunk
// framing, and hang-up notice.
#include "moeserve/daemon/http/http_server.hpp"

#include <atomic>
#include <condition_variable>
#include <future>
#include <thread>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

// The server's response type (the harness has its own HttpResponse for what a client reads).
using ServerResponse = ::moeserve::daemon::HttpResponse;

struct Started {
  std::unique_ptr<HttpServer> server;
  int port = 0;
};

Started StartServer(HttpServerOptions o, std::function<void(HttpHead, std::string, std::shared_ptr<HttpExchange>)> handle,
                    size_t body_limit = 1 << 20) {
  o.port = 0;
  HttpServerHooks hooks;
  hooks.admit = [body_limit](const HttpHead&) { return HttpAdmission::Accept(body_limit); };
  hooks.handle = std::move(handle);
  auto s = HttpServer::Start(std::move(o), std::move(hooks));
  if (!s) {
    ADD_FAILURE() << s.error().ToString();
    return {};
  }
  Started out;
  out.port = (*s)->port();
  out.server = std::move(*s);
  return out;
}

TEST(HttpServer, ClientThatNeverReadsAStreamIsCutOffAtTheBound) {
  constexpr size_t kBound = 64 << 10;
  constexpr size_t kPiece = 4 << 10;
  constexpr size_t kWanted = 256u << 20;  // far more than any socket buffer holds
  std::atomic<size_t> queued{0};
  std::atomic<int> result{-1};
  std::atomic<bool> gone_callback{false};
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  HttpServerOptions o;
  o.max_stream_buffer_bytes = kBound;
  auto s = StartServer(o, [&](HttpHead, std::string, std::shared_ptr<HttpExchange> ex) {
    ex->OnClientGone([&] { gone_callback.store(true); });
    std::thread([&, ex] {
      ex->BeginStream(200, "text/event-stream", {});
      const std::string piece(kPiece, 'x');
      size_t sent = 0;
      HttpExchange::WriteResult r = HttpExchange::WriteResult::kQueued;
      while (sent < kWanted) {
        r = ex->Write(piece);
        if (r != HttpExchange::WriteResult::kQueued) break;
        sent += piece.size();
      }
      queued.store(sent);
      result.store(static_cast<int>(r));
      std::lock_guard lock(mu);
      done = true;
      cv.notify_all();
    }).detach();
  });
  ASSERT_TRUE(s.server);
  int fd = ConnectLoopback(s.port);
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  }
  EXPECT_EQ(result.load(), static_cast<int>(HttpExchange::WriteResult::kTooSlow));
  EXPECT_TRUE(gone_callback.load());
  // What was accepted is the bound plus what the kernel took off our hands.
  EXPECT_LT(queued.load(), size_t{64} << 20);
  EXPECT_EQ(s.server->stats().slow_readers_cut, 1u);
  ::close(fd);
  s.server->Stop();
}

TEST(HttpServer, HangUpDuringAHandlerIsNoticedAtOnce) {
  std::promise<void> gone;
  std::shared_ptr<HttpExchange> held;
  std::promise<void> handled;
  auto s = StartServer({}, [&](HttpHead, std::string, std::shared_ptr<HttpExchange> ex) {
    held = ex;  // answered never: the request "runs" until the client leaves
    ex->OnClientGone([&] { gone.set_value(); });
    handled.set_value();
  });
  ASSERT_TRUE(s.server);
  int fd = ConnectLoopback(s.port);
  SendAll(fd, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  ASSERT_EQ(handled.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(held->client_gone());
  ::close(fd);
  EXPECT_EQ(gone.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(held->client_gone());
  EXPECT_EQ(held->Write("late"), HttpExchange::WriteResult::kClientGone);
  s.server->Stop();
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  auto s = StartServer({}, [](HttpHead head, std::string body, std::shared_ptr<HttpExchange> ex) {
    ex->Reply(ServerResponse{200, "text/plain", {}, head.path + ":" + body});
  });
  ASSERT_TRUE(s.server);
  int fd = ConnectLoopback(s.port);
  SendAll(fd,
          "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"
          "POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n22\r\n0\r\n\r\n"
          "GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::string raw;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  auto a = raw.find("/a:1"), b = raw.find("/b:22"), c = raw.find("/c:");
  ASSERT_NE(a, std::string::npos) << raw;
  ASSERT_NE(b, std::string::npos) << raw;
  ASSERT_NE(c, std::string::npos) << raw;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  s.server->Stop();
}

TEST(HttpServer, ExpectContinueGetsAnInterimAnswerBeforeTheBody) {
  auto s = StartServer({}, [](HttpHead, std::string body, std::shared_ptr<HttpExchange> ex) {
    ex->Reply(ServerResponse{200, "text/plain", {}, "got " + std::to_string(body.size())});
  });
  ASSERT_TRUE(s.server);
  int fd = ConnectLoopback(s.port);
  SendAll(fd, "POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  char buf[256];
  ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u);
  SendAll(fd, "hello");
  auto r = ParseResponse(ReadResponse(fd));
  ::close(fd);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "got 5");
  s.server->Stop();
}

TEST(HttpServer, OversizedHeadIsRefusedWith431) {
  HttpServerOptions o;
  o.max_header_bytes = 4096;
  auto s = StartServer(o, [](HttpHead, std::string, std::shared_ptr<HttpExchange> ex) { ex->Reply({}); });
  ASSERT_TRUE(s.server);
  int fd = ConnectLoopback(s.port);
  SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(8192, 'a') + "\r\n\r\n");
  auto r = ParseResponse(ReadResponse(fd));
  ::close(fd);
  EXPECT_EQ(r.status, 431);
  s.server->Stop();
}

TEST(HttpServer, ConnectionsPastTheLimitAreClosedAtAccept) {
  HttpServerOptions o;
  o.max_connections = 4;
  auto s = StartServer(o, [](HttpHead, std::string, std::shared_ptr<HttpExchange> ex) {
    ex->Reply(ServerResponse{200, "text/plain", {}, "ok"});
  });
  ASSERT_TRUE(s.server);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(ConnectLoopback(s.port));
  // Let the server accept the four before the fifth arrives.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (s.server->stats().open_connections < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  int extra = ConnectLoopback(s.port);
  SendAll(extra, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  auto refused = ParseResponse(ReadResponse(extra));
  EXPECT_EQ(refused.status, 0);  // closed without an answer
  ::close(extra);
  for (int fd : held) ::close(fd);
  EXPECT_GE(s.server->stats().refused_connections, 1u);
  s.server->Stop();
}

}  // namespace
}  // namespace moeserve::daemon::testing
