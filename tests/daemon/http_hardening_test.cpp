// The daemon against hostile HTTP clients: oversized bodies (chunked or not,
// with and without a key), thousands of slow-header connections, clients that
// hang up on a running request. After each attack the daemon must answer a
// normal request, and its resident memory must stay within a stated bound.
#include <sys/resource.h>
#include <sys/wait.h>

#include <csignal>

#include <atomic>
#include <fstream>
#include <thread>

#include "daemon_harness.hpp"
#include "daemon_process.hpp"
#include "long_stream.hpp"
#include "../support/sanitized_build.hpp"
#include "moeserve/daemon/metrics.hpp"

namespace moeserve::daemon::testing {
namespace {

constexpr size_t kBodyLimit = 256 << 10;

// Resident set of this process (the daemon runs in it), in bytes.
size_t ResidentBytes() { return ResidentBytesOf("self"); }

std::string WriteKeys(const std::string& name) {
  std::string path = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid()) + ".yaml";
  std::ofstream(path) << "keys:\n  - key: sk-tenant-a-0123456789\n    tenant: team-a\n"
                         "  - key: sk-admin-0123456789abcdef\n    tenant: ops\n    role: admin\n";
  return path;
}

const std::map<std::string, std::string> kAuth = {{"Authorization", "Bearer sk-tenant-a-0123456789"}};

json SmallChat(int max_tokens = 4) {
  return {{"model", "tiny"}, {"messages", UserTurn("hello")}, {"max_tokens", max_tokens}};
}

// What one oversized upload achieved: the status the daemon answered and how
// many body bytes the client managed to push before the daemon stopped it.
struct UploadOutcome {
  int status = 0;
  size_t body_bytes_sent = 0;
  bool finished_sending = false;
};

// Sends a head, then up to `body_bytes` of body (chunked or with
// Content-Length) from one thread while another reads the answer.
UploadOutcome Upload(int port, size_t body_bytes, bool chunked, bool with_key) {
  UploadOutcome out;
  int fd = ConnectLoopback(port);
  if (fd < 0) return out;
  std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  if (with_key) head += "Authorization: Bearer sk-tenant-a-0123456789\r\n";
  head += chunked ? "Transfer-Encoding: chunked\r\n" : "Content-Length: " + std::to_string(body_bytes) + "\r\n";
  head += "\r\n";
  SendAll(fd, head);
  std::atomic<bool> stop{false};
  std::atomic<size_t> sent{0};
  std::thread sender([&] {
    const std::string piece(64 << 10, ' ');
    std::string chunk_head;
    char hex[16];
    std::snprintf(hex, sizeof hex, "%zx\r\n", piece.size());
    size_t total = 0;
    while (!stop.load() && total < body_bytes) {
      std::string frame = chunked ? std::string(hex) + piece + "\r\n" : piece;
      if (!SendAll(fd, frame)) return;
      total += piece.size();
      sent.store(total);
    }
    if (chunked) SendAll(fd, "0\r\n\r\n");
    out.finished_sending = total >= body_bytes;
  });
  std::string raw = ReadResponse(fd);
  stop.store(true);
  ::shutdown(fd, SHUT_RDWR);
  sender.join();
  ::close(fd);
  out.body_bytes_sent = sent.load();
  auto parsed = ParseResponse(raw);
  out.status = parsed.status;
  return out;
}

class HttpHardening : public SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    DaemonConfig c = TestConfig();
    c.max_body_bytes = kBodyLimit;
    c.api_keys_file = WriteKeys("hardening_keys");
    c.header_timeout_seconds = 3;
    StartShared(c);
  }
  void ExpectServesNormally() {
    auto r = Chat(port_, SmallChat(), kAuth);
    ASSERT_EQ(r.status, 200) << r.body << r.error;
    EXPECT_EQ(r.Json()["object"], "chat.completion");
  }
};

// Sizes relative to the limit; the 100x uploads would be 25.6 MiB.
struct UploadCase {
  double factor;
  bool chunked;
  bool with_key;
};

TEST_F(HttpHardening, OversizedBodiesAreRefusedBeforeTheyAreBuffered) {
  ASSERT_NE(daemon_, nullptr);
  // One request served first, so that what a first request maps for good
  // (the KV pool's first page of each of its stripes, 2 MiB each where the
  // kernel gives huge pages; the step's scratch) is in both measures.
  ExpectServesNormally();
  const size_t rss_before = ResidentBytes();
  const UploadCase cases[] = {{1.5, false, true}, {2, false, true},  {100, false, true}, {1.5, true, true},
                              {2, true, true},    {100, true, true}, {2, false, false},  {100, true, false}};
  for (const auto& c : cases) {
    SCOPED_TRACE("factor " + std::to_string(c.factor) + (c.chunked ? " chunked" : " content-length") +
                 (c.with_key ? " with key" : " without key"));
    const size_t size = static_cast<size_t>(c.factor * kBodyLimit);
    auto r = Upload(port_, size, c.chunked, c.with_key);
    EXPECT_EQ(r.status, c.with_key ? 413 : 401);
    if (c.factor >= 100) {
      // The daemon stopped reading near the limit: what got through is the
      // limit, the drain allowance and the kernel's socket buffers, far
      // below the 25.6 MiB the client wanted to send.
      EXPECT_FALSE(r.finished_sending);
      EXPECT_LT(r.body_bytes_sent, size / 2);
    }
    ExpectServesNormally();
  }
  const size_t rss_after = ResidentBytes();
  // Buffering any of the 100x uploads whole would add 25 MiB.
  if (!test_support::kSanitizedBuild) {  // shadow memory and quarantine inflate resident memory
    EXPECT_LT(rss_after, rss_before + (16u << 20)) << "resident memory grew from " << rss_before << " to " << rss_after;
  }
}

TEST_F(HttpHardening, BodyExactlyAtTheLimitIsRead) {
  ASSERT_NE(daemon_, nullptr);
  // A valid body padded with spaces to exactly the limit: read and served.
  std::string body = SmallChat().dump();
  body.append(kBodyLimit - body.size(), ' ');
  auto r = Http(port_, "POST", "/v1/chat/completions", body, kAuth);
  EXPECT_EQ(r.status, 200) << r.body;
  body.push_back(' ');
  r = Http(port_, "POST", "/v1/chat/completions", body, kAuth);
  EXPECT_EQ(r.status, 413) << r.body;
}

TEST_F(HttpHardening, RequestWithoutKeyIsRefusedWithoutReadingItsBody) {
  ASSERT_NE(daemon_, nullptr);
  // The head promises a body that never comes: the answer must not wait for it.
  int fd = ConnectLoopback(port_);
  ASSERT_GE(fd, 0);
  SendAll(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{");
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto r = ParseResponse(ReadResponse(fd));
  ::close(fd);
  EXPECT_EQ(r.status, 401);
  ExpectServesNormally();
}

TEST_F(HttpHardening, NonStreamingClientThatHangsUpStopsItsSequence) {
  ASSERT_NE(daemon_, nullptr);
  auto count_499 = [&] {
    auto m = Http(port_, "GET", "/metrics", "", {{"Authorization", "Bearer sk-admin-0123456789abcdef"}});
    const std::string needle = "moe_requests_total{status=\"499\"} ";
    auto at = m.body.find(needle);
    return at == std::string::npos ? 0.0 : std::stod(m.body.substr(at + needle.size()));
  };
  const double before = count_499();
  int fd = ConnectLoopback(port_);
  ASSERT_GE(fd, 0);
  // The answer is held to more than 3,500 tokens, so it cannot end before
  // the hang-up is seen. Left free, the random model sometimes drew an end
  // token within its first tokens, finished as 200 and left nothing to
  // cancel (8 runs in 3,000).
  std::string body = json{{"model", "tiny"},
                          {"messages", UserTurn("write a long story")},
                          {"max_tokens", 3500},
                          {"reasoning_effort", "low"},
                          {"response_format", LongAnswerFormat()}}
                         .dump();
  SendAll(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-tenant-a-0123456789\r\n"
              "Content-Type: application/json\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body);
  // Wait until the sequence runs, then hang up without reading.
  const auto start = std::chrono::steady_clock::now();
  while (daemon_->InFlight() == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(daemon_->InFlight(), 1u);
  ::close(fd);
  // The sequence is cancelled and reported as 499 (client closed request);
  // had it run on, it would end as 200.
  while (daemon_->InFlight() > 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(daemon_->InFlight(), 0u);
  // The status is recorded once the request's tokens are charged, which
  // completes after the engine lets the sequence go: wait for it (a busy
  // machine widened that gap past a single read).
  double after = count_499();
  while (after < before + 1 && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    after = count_499();
  }
  EXPECT_EQ(after, before + 1);
  ExpectServesNormally();
}

TEST_F(HttpHardening, MetricsNeedTheMetricsTokenOrAnAdminKey) {
  ASSERT_NE(daemon_, nullptr);
  EXPECT_EQ(Http(port_, "GET", "/metrics").status, 401);
  EXPECT_EQ(Http(port_, "GET", "/metrics", "", kAuth).status, 401);  // a tenant key sees no tenant names
  auto admin = Http(port_, "GET", "/metrics", "", {{"Authorization", "Bearer sk-admin-0123456789abcdef"}});
  EXPECT_EQ(admin.status, 200);
  EXPECT_NE(admin.body.find("moe_http_open_connections"), std::string::npos);
}

TEST(HttpSlowClients, TenThousandSlowHeaderConnectionsDoNotStopService) {
  constexpr int kConnections = 10000;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < kConnections + 512) {
    rlimit want{std::min<rlim_t>(lim.rlim_max, kConnections + 512), lim.rlim_max};
    ::setrlimit(RLIMIT_NOFILE, &want);
    ::getrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < kConnections + 512) {
    GTEST_SKIP() << "the open-file limit here is " << lim.rlim_cur << " (hard " << lim.rlim_max
                 << "); each side of this test needs " << kConnections + 512;
  }
  const std::string keys = WriteKeys("slowloris_keys");
  // Its own process, so that its resident memory is its own.
  DaemonProcess daemon({"--api-keys-file", keys, "--header-timeout-seconds", "5"});
  ASSERT_TRUE(daemon.WaitReady()) << "moe-daemon did not become ready";
  const int port = daemon.port();
  // One request served first: what a first request maps for good (the KV
  // pool's first page of each stripe, the step's scratch) is not the
  // connections' memory.
  auto first = Chat(port, SmallChat(), kAuth);
  ASSERT_EQ(first.status, 200) << first.body << first.error;
  const size_t rss_before = daemon.ResidentBytes();
  ASSERT_GT(rss_before, 0u);
  std::vector<int> fds;
  fds.reserve(kConnections);
  for (int i = 0; i < kConnections; ++i) {
    int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0) << "connection " << i;
    // A head that never ends: each connection holds what it sent, nothing more.
    SendAll(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    fds.push_back(fd);
  }
  auto r = Chat(port, SmallChat(), kAuth);
  EXPECT_EQ(r.status, 200) << r.body << r.error;
  const size_t rss_held = daemon.ResidentBytes();
  // The stated bound: under 8 KiB of the daemon's memory per idle connection
  // (socket, parser, buffer, strand, timer).
  if (!test_support::kSanitizedBuild) {  // shadow memory and quarantine inflate resident memory
    EXPECT_LT(rss_held, rss_before + kConnections * size_t{8 << 10})
        << "resident memory grew from " << rss_before << " to " << rss_held;
  }
  // The header deadline closes them: each client end sees EOF.
  size_t closed = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int fd : fds) {
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = ::recv(fd, &c, 1, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        ++closed;
        break;
      }
    }
    ::close(fd);
  }
  EXPECT_EQ(closed, fds.size());
  r = Chat(port, SmallChat(), kAuth);
  EXPECT_EQ(r.status, 200) << r.body << r.error;
  std::printf("slow-header connections: %d; daemon resident %zu KiB before, %zu KiB holding them\n", kConnections,
              rss_before >> 10, rss_held >> 10);
}

TEST(HttpKeys, MetricsTokenFileOpensMetricsToThatTokenOnly) {
  DaemonConfig c = TestConfig();
  c.api_keys_file = WriteKeys("metrics_token_keys");
  c.metrics_token_file = ::testing::TempDir() + "/metrics_token_" + std::to_string(::getpid());
  std::ofstream(c.metrics_token_file) << "mt-0123456789abcdef0123\n";
  auto d = Daemon::Create(c);
  ASSERT_TRUE(d) << d.error().ToString();
  ASSERT_TRUE((*d)->Start());
  const int port = PortOf(**d);
  EXPECT_EQ(Http(port, "GET", "/metrics", "", {{"Authorization", "Bearer mt-0123456789abcdef0123"}}).status, 200);
  EXPECT_EQ(Http(port, "GET", "/metrics", "", {{"Authorization", "Bearer mt-0123456789abcdef0124"}}).status, 401);
  EXPECT_EQ(Http(port, "GET", "/metrics").status, 401);
  EXPECT_EQ(Http(port, "GET", "/healthz").status, 200);  // probes need no key
  (*d)->Shutdown(0);
}

TEST(HttpKeys, WithoutKeysTheDaemonListensOnLoopbackOnly) {
  DaemonConfig c = TestConfig();
  c.host = "0.0.0.0";
  auto refused = Daemon::Create(c);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("without API keys"), std::string::npos) << refused.error().message();
  c.allow_unauthenticated = true;
  EXPECT_TRUE(Daemon::Create(c));
  c.allow_unauthenticated = false;
  c.host = "127.0.0.1";
  EXPECT_TRUE(Daemon::Create(c));
}

}  // namespace
}  // namespace moeserve::daemon::testing
