// daemon.session_forward_bound: moe-daemon (its own process) forwards
// session requests to a peer that accepts connections and never answers.
// With session_forward_max_in_flight 4 and a 2 s deadline, twelve concurrent
// requests hold at most four forwarding threads (counted in
// /proc/<pid>/task), the eight past the limit are refused at once with 503
// naming the limit, the four forwarded get 503 naming the deadline, and the
// slots come back: the next request is forwarded again.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include "daemon_process.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/config_settings.hpp"

namespace moeserve::daemon::testing {
namespace {

constexpr int kLimit = 4;
constexpr int kRequests = 12;
const std::string kPath = "/v1/sessions/sess_s_AAAAAAAAAAAAAAAAAAAAAAAA";

// A peer that completes the TCP handshake and then says nothing: the test
// accepts its connections only to count them.
class StalledPeer {
 public:
  StalledPeer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 128), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~StalledPeer() {
    for (int c : accepted_) ::close(c);
    ::close(fd_);
  }
  int port() const { return port_; }
  // Accepts what arrives within `ms`; returns how many are held in all.
  int AcceptFor(int ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) == 1) accepted_.push_back(::accept(fd_, nullptr, nullptr));
    }
    return static_cast<int>(accepted_.size());
  }

 private:
  int fd_ = -1, port_ = 0;
  std::vector<int> accepted_;
};

int SendRequest(int port) {
  int fd = ConnectLoopback(port);
  if (fd < 0) return fd;
  timeval tv{30, 0};  // a forward that never ends fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  SendAll(fd, "GET " + kPath + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  return fd;
}

HttpResponse ReadAndClose(int fd) {
  HttpResponse r = ParseResponse(ReadResponse(fd));
  ::close(fd);
  return r;
}

TEST(SessionForwardBound, StalledPeerHoldsAtMostTheLimitAndEveryRequestIsAnswered) {
  StalledPeer peer;
  DaemonProcess d({"--session-replica", "a", "--session-peers", "s=http://127.0.0.1:" + std::to_string(peer.port()),
                   "--session-forward-max-in-flight", std::to_string(kLimit), "--session-forward-deadline-seconds",
                   "2"});
  ASSERT_TRUE(d.WaitReady()) << "moe-daemon did not become ready";
  const int idle_threads = d.Threads();

  std::vector<int> fds;
  for (int i = 0; i < kRequests; ++i) fds.push_back(SendRequest(d.port()));
  // The forwards that run reach the peer; give the rest time to try.
  const int reached = peer.AcceptFor(1000);
  const int busy_threads = d.Threads();
  EXPECT_EQ(reached, kLimit) << "forwards that reached the stalled peer";
  EXPECT_LE(busy_threads - idle_threads, kLimit) << "threads while " << kRequests << " forwards were asked for";

  int refused_at_limit = 0, past_deadline = 0;
  for (int fd : fds) {
    ASSERT_GE(fd, 0);
    const HttpResponse r = ReadAndClose(fd);
    ASSERT_EQ(r.status, 503) << "every request gets an answer: " << r.error << r.body;
    EXPECT_EQ(r.Json()["error"]["code"], "unavailable");
    const std::string message = r.Json()["error"]["message"];
    if (message.find("session_forward_max_in_flight") != std::string::npos) ++refused_at_limit;
    if (message.find("did not answer within 2 s") != std::string::npos) ++past_deadline;
    EXPECT_TRUE(r.headers.contains("retry-after"));
  }
  EXPECT_EQ(refused_at_limit, kRequests - kLimit);
  EXPECT_EQ(past_deadline, kLimit);

  // The slots are given back: the next forward runs (and passes its deadline).
  const HttpResponse again = ReadAndClose(SendRequest(d.port()));
  EXPECT_EQ(again.status, 503);
  EXPECT_NE(again.body.find("did not answer within"), std::string::npos) << again.body;
}

TEST(SessionForwardBound, SettingsOutOfRangeAreRefusedNamingTheKey) {
  DaemonConfig c;
  auto apply = [&](const char* key, const char* value) {
    return ApplySettingValue(c, *FindDaemonSetting(key), value, "flags");
  };
  auto st = apply("session_forward_max_in_flight", "0");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("session_forward_max_in_flight"), std::string::npos);
  EXPECT_FALSE(apply("session_forward_deadline_seconds", "0"));
  EXPECT_FALSE(apply("session_forward_deadline_seconds", "x"));
  ASSERT_TRUE(apply("session_forward_deadline_seconds", "30"));
  EXPECT_EQ(c.sessions.forward_deadline_seconds, 30);
}

}  // namespace
}  // namespace moeserve::daemon::testing
