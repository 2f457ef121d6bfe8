// The rendezvous store against honest and hostile peers: keys and epochs
// work for clients that know the secret; a wrong secret, an impostor server,
// garbage and oversized frames get a clear error (and are counted) while the
// server keeps serving honest clients.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "moeserve/kernels/comm/rendezvous.hpp"

namespace moeserve::kernels::comm {
namespace {

const std::string kSecret = "rendezvous-secret-0123456789abcdef";
constexpr auto kTimeout = std::chrono::seconds(5);

std::unique_ptr<RendezvousServer> StartServer(int world = 2) {
  auto s = RendezvousServer::Start("127.0.0.1", 0, kSecret, world, std::chrono::seconds(2));
  EXPECT_TRUE(s) << s.error().message;
  return s ? std::move(*s) : nullptr;
}

int RawConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Reads until the server closes; returns what it said.
std::string Drain(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

void ExpectServerStillServes(RendezvousServer& server) {
  auto c = RendezvousClient::Connect("127.0.0.1", server.port(), kSecret, kTimeout);
  ASSERT_TRUE(c) << c.error().message;
  ASSERT_TRUE((*c)->Set("still", {'o', 'k'}));
  auto v = (*c)->Get("still");
  ASSERT_TRUE(v && *v);
  EXPECT_EQ(**v, (std::vector<char>{'o', 'k'}));
}

TEST(Rendezvous, KeysAndEpochs) {
  auto server = StartServer(2);
  ASSERT_TRUE(server);
  auto a = RendezvousClient::Connect("127.0.0.1", server->port(), kSecret, kTimeout);
  auto b = RendezvousClient::Connect("127.0.0.1", server->port(), kSecret, kTimeout);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*(*a)->Join(0, kTimeout), 1u);
  EXPECT_EQ(*(*b)->Join(1, kTimeout), 1u);
  auto missing = (*a)->Get("k");
  ASSERT_TRUE(missing);
  EXPECT_FALSE(*missing);
  EXPECT_FALSE((*a)->Wait({"k"}, std::chrono::milliseconds(100)));
  ASSERT_TRUE((*b)->Set("k", {'v'}));
  EXPECT_TRUE((*a)->Wait({"k"}, kTimeout));
  // Joining twice in one epoch waits for the next one.
  EXPECT_FALSE((*a)->Join(0, std::chrono::milliseconds(200)));
  server->Reset();
  EXPECT_EQ(*(*a)->Join(0, kTimeout), 2u);
  auto gone = (*a)->Get("k");
  ASSERT_TRUE(gone);
  EXPECT_FALSE(*gone) << "keys are per epoch";
  auto bad_rank = (*b)->Join(7, kTimeout);
  ASSERT_FALSE(bad_rank);
  EXPECT_NE(bad_rank.error().message.find("outside the group"), std::string::npos) << bad_rank.error().message;
}

TEST(Rendezvous, ShortSecretIsRefused) {
  auto s = RendezvousServer::Start("127.0.0.1", 0, "short", 1);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("16 bytes"), std::string::npos);
}

TEST(Rendezvous, WrongSecretIsRefusedWithAClearError) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  auto c = RendezvousClient::Connect("127.0.0.1", server->port(), "not-the-group-secret-at-all!!", kTimeout);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("group secret does not match"), std::string::npos) << c.error().message;
  EXPECT_EQ(server->rejected(), 1u);
  ExpectServerStillServes(*server);
}

TEST(Rendezvous, ImpostorServerIsDetectedByTheClient) {
  // A server with another secret: it cannot prove ours, and refuses us too.
  auto other = RendezvousServer::Start("127.0.0.1", 0, "impostor-secret-0123456789abcdef", 1);
  ASSERT_TRUE(other);
  auto c = RendezvousClient::Connect("127.0.0.1", (*other)->port(), kSecret, kTimeout);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("secret"), std::string::npos) << c.error().message;
}

TEST(Rendezvous, GarbageInsteadOfAHandshakeIsRefused) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  int fd = RawConnect(server->port());
  std::mt19937 rng(7);
  std::vector<char> junk(72);
  for (auto& ch : junk) ch = static_cast<char>(rng());
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  std::string said = Drain(fd);
  EXPECT_NE(said.find("not a moeserve rendezvous client"), std::string::npos);
  EXPECT_EQ(server->rejected(), 1u);
  ExpectServerStillServes(*server);
}

TEST(Rendezvous, SilentOrTruncatedPeersAreDroppedAfterTheTimeout) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  int fd = RawConnect(server->port());
  ASSERT_EQ(::send(fd, "MOERDV1\n", 8, MSG_NOSIGNAL), 8);  // then nothing
  Drain(fd);  // returns once the server gives up (2 s io timeout)
  EXPECT_EQ(server->rejected(), 1u);
  ExpectServerStillServes(*server);
}

// Performs the client side of the handshake by hand (as the protocol is
// documented in rendezvous.cpp), so that the test can then send frames the
// real client never would.
int AuthenticatedRawConnection(int port) {
  int fd = RawConnect(port);
  unsigned char greet[8 + 32];
  EXPECT_EQ(::recv(fd, greet, sizeof(greet), MSG_WAITALL), static_cast<ssize_t>(sizeof(greet)));
  unsigned char hello[8 + 32 + 32];
  std::memcpy(hello, "MOERDV1\n", 8);
  for (int i = 0; i < 32; ++i) hello[8 + i] = static_cast<unsigned char>(i);
  std::vector<unsigned char> msg;
  const char* label = "moeserve-rendezvous client";
  msg.insert(msg.end(), label, label + std::strlen(label));
  msg.insert(msg.end(), greet + 8, greet + 40);
  msg.insert(msg.end(), hello + 8, hello + 40);
  unsigned int len = 0;
  HMAC(EVP_sha256(), kSecret.data(), static_cast<int>(kSecret.size()), msg.data(), msg.size(), hello + 40, &len);
  EXPECT_EQ(::send(fd, hello, sizeof(hello), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(hello)));
  unsigned char reply[5 + 32];
  EXPECT_EQ(::recv(fd, reply, sizeof(reply), MSG_WAITALL), static_cast<ssize_t>(sizeof(reply)));
  EXPECT_EQ(reply[0], 0) << "handshake refused";
  return fd;
}

std::string SendFrame(int port, uint8_t op, uint32_t declared_len, const std::string& payload) {
  int fd = AuthenticatedRawConnection(port);
  std::string f(1, static_cast<char>(op));
  for (int i = 0; i < 4; ++i) f.push_back(static_cast<char>((declared_len >> (8 * i)) & 0xff));
  f += payload;
  ::send(fd, f.data(), f.size(), MSG_NOSIGNAL);
  return Drain(fd);
}

TEST(Rendezvous, HostileFramesAfterAuthenticationAreRefused) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const int port = server->port();
  EXPECT_NE(SendFrame(port, 1, 2u << 20, "").find("frame larger than 1 MiB"), std::string::npos);
  EXPECT_NE(SendFrame(port, 99, 0, "").find("unknown operation 99"), std::string::npos);
  // A SET whose key length points past the frame.
  std::string bad_set = std::string("\xff\xff\x00\x00", 4) + "k";
  EXPECT_NE(SendFrame(port, 1, static_cast<uint32_t>(bad_set.size()), bad_set).find("set: malformed"), std::string::npos);
  std::string bad_check = std::string("\x05\x00", 2);
  EXPECT_NE(SendFrame(port, 3, static_cast<uint32_t>(bad_check.size()), bad_check).find("check: malformed"), std::string::npos);
  EXPECT_EQ(server->rejected(), 4u);
  // The honest client's own limits.
  auto c = RendezvousClient::Connect("127.0.0.1", port, kSecret, kTimeout);
  ASSERT_TRUE(c);
  auto big = (*c)->Set(std::string(2000, 'k'), {'v'});
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().message.find("key too long"), std::string::npos);
  ExpectServerStillServes(*server);
}

// 64 sockets from one address that connect and never speak (each would be
// held until the 10 s I/O timeout) no longer fill every slot: the ranks,
// from another address, still form the group at once.
TEST(Rendezvous, SilentSocketsFromOneAddressDoNotBlockTheGroup) {
  auto server = RendezvousServer::Start("127.0.0.1", 0, kSecret, 2, std::chrono::seconds(10));
  ASSERT_TRUE(server) << server.error().message;
  std::vector<int> silent;
  for (int i = 0; i < 64; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(0x7F000002);  // 127.0.0.2: another host, as far as the server can tell
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>((*server)->port()));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    silent.push_back(fd);
  }
  // The server has seen them all once it has turned away those past the limit.
  for (int i = 0; i < 200 && (*server)->rejected() < 56; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ((*server)->rejected(), 56u) << "8 held for 127.0.0.2, the rest closed at accept";
  // The ranks give up after 2 s; the silent sockets would hold for 10.
  auto a = RendezvousClient::Connect("127.0.0.1", (*server)->port(), kSecret, std::chrono::seconds(2));
  auto b = RendezvousClient::Connect("127.0.0.1", (*server)->port(), kSecret, std::chrono::seconds(2));
  ASSERT_TRUE(a) << a.error().message;
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ(*(*a)->Join(0, kTimeout), 1u);
  EXPECT_EQ(*(*b)->Join(1, kTimeout), 1u);
  for (int fd : silent) ::close(fd);
}

// Memory mappings of this process (/proc/self/maps lines): every thread
// stack that is never released stays one (plus its guard page).
long Mappings() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  long n = 0;
  while (std::getline(in, line)) ++n;
  return n;
}

TEST(Rendezvous, ManyShortConnectionsLeaveNothingBehind) {
  // A rank waiting for a missing peer reconnects again and again; a handler
  // thread kept per connection would keep its stack (8 MiB each) mapped.
  auto server = StartServer();
  ASSERT_TRUE(server);
  const long before = Mappings();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 200; ++i) {
    auto c = RendezvousClient::Connect("127.0.0.1", server->port(), kSecret, kTimeout);
    ASSERT_TRUE(c) << c.error().message;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the last handlers notice their closed sockets
  const long grown = Mappings() - before;
  EXPECT_LT(grown, 100) << "200 connections left " << grown << " more mappings";
}

}  // namespace
}  // namespace moeserve::kernels::comm
