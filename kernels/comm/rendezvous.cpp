#include "moeserve/kernels/comm/rendezvous.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace moeserve::kernels::comm {
namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'R', 'D', 'V', '1', '\n'};
constexpr size_t kNonce = 32, kMac = 32;
constexpr uint32_t kMaxFrame = 1u << 20;
constexpr size_t kMaxKey = 1024;
constexpr size_t kMaxStoreBytes = size_t{64} << 20;
constexpr int kMaxConnections = 64;
// Per peer address, so that one address opening sockets and saying nothing
// (each held until the I/O timeout) cannot take every slot while the ranks,
// each on its own pod address, wait to form the group. A rank holds one
// connection at a time; ranks sharing an address (one node, loopback tests)
// stay well under this.
constexpr int kMaxConnectionsPerAddress = 8;

enum Op : uint8_t { kSet = 1, kGet = 2, kCheck = 3, kJoin = 4 };
enum Reply : uint8_t { kOk = 0, kNotYet = 1, kRefused = 2 };

void SetIoTimeout(int fd, std::chrono::milliseconds t) {
  timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool ReadFull(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void PutU32(std::vector<char>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

bool WriteFrame(int fd, uint8_t tag, const std::vector<char>& payload) {
  std::vector<char> f;
  f.reserve(5 + payload.size());
  f.push_back(static_cast<char>(tag));
  PutU32(f, static_cast<uint32_t>(payload.size()));
  f.insert(f.end(), payload.begin(), payload.end());
  return WriteFull(fd, f.data(), f.size());
}

// false: closed, timed out or oversized (too_large set).
bool ReadFrame(int fd, uint8_t* tag, std::vector<char>* payload, bool* too_large) {
  char head[5];
  if (!ReadFull(fd, head, 5)) return false;
  *tag = static_cast<uint8_t>(head[0]);
  uint32_t n = GetU32(head + 1);
  if (n > kMaxFrame) {
    *too_large = true;
    return false;
  }
  payload->resize(n);
  return n == 0 || ReadFull(fd, payload->data(), n);
}

std::vector<unsigned char> Mac(const std::string& secret, const char* label, const unsigned char* a,
                               const unsigned char* b) {
  std::vector<unsigned char> msg(label, label + std::strlen(label));
  msg.insert(msg.end(), a, a + kNonce);
  msg.insert(msg.end(), b, b + kNonce);
  std::vector<unsigned char> out(kMac);
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg.data(), msg.size(), out.data(), &len);
  return out;
}

std::vector<char> Text(const std::string& s) { return {s.begin(), s.end()}; }

// The peer's IP address as text (the port left out: one host, many sockets).
std::string PeerAddress(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  else if (ss.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  return buf;
}

}  // namespace

struct RendezvousServer::State {
  std::string secret;
  int world = 1;
  std::chrono::milliseconds io_timeout{10000};
  int listen_fd = -1;
  int port = 0;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rejected{0};
  std::thread acceptor;

  std::mutex mu;  // guards below
  uint64_t epoch = 1;
  std::vector<bool> joined;
  std::map<std::string, std::vector<char>> keys;
  size_t key_bytes = 0;
  std::set<int> open_fds;
  std::map<std::string, int> per_address;  // open connections by peer address
  // Handlers run detached (a long wait for a missing rank means many short
  // connections; none may linger as an unjoined thread), each holding the
  // state alive; the destructor waits for `active` to reach 0.
  std::weak_ptr<State> self;
  std::condition_variable idle;
  int active = 0;

  void Accept();
  void Serve(int fd, const std::string& address);
  // One request; false closes the connection.
  bool Handle(int fd, uint8_t op, const std::vector<char>& p);
  bool Refuse(int fd, const std::string& why) {
    rejected++;
    WriteFrame(fd, kRefused, Text(why));
    return false;
  }
};

void RendezvousServer::State::Accept() {
  while (!stop) {
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    int fd = ::accept(listen_fd, reinterpret_cast<sockaddr*>(&peer), &peer_len);
    if (fd < 0) continue;
    const std::string address = PeerAddress(peer);
    std::lock_guard<std::mutex> lock(mu);
    if (active >= kMaxConnections || per_address[address] >= kMaxConnectionsPerAddress) {
      rejected++;
      if (per_address[address] == 0) per_address.erase(address);
      ::close(fd);
      continue;
    }
    active++;
    per_address[address]++;
    open_fds.insert(fd);
    std::thread([keep = self.lock(), fd, address] { keep->Serve(fd, address); }).detach();
  }
}

void RendezvousServer::State::Serve(int fd, const std::string& address) {
  SetIoTimeout(fd, io_timeout);
  unsigned char nonce_s[kNonce], hello[sizeof(kMagic) + kNonce + kMac];
  RAND_bytes(nonce_s, kNonce);
  std::vector<char> greeting(kMagic, kMagic + sizeof(kMagic));
  greeting.insert(greeting.end(), nonce_s, nonce_s + kNonce);
  bool ok = WriteFull(fd, greeting.data(), greeting.size()) && ReadFull(fd, hello, sizeof(hello));
  if (!ok) {
    rejected++;
  } else if (std::memcmp(hello, kMagic, sizeof(kMagic)) != 0) {
    ok = Refuse(fd, "not a moeserve rendezvous client");
  } else {
    const unsigned char* nonce_c = hello + sizeof(kMagic);
    auto expect = Mac(secret, "moeserve-rendezvous client", nonce_s, nonce_c);
    if (CRYPTO_memcmp(expect.data(), nonce_c + kNonce, kMac) != 0) {
      ok = Refuse(fd, "authentication failed: the group secret does not match");
    } else {
      auto proof = Mac(secret, "moeserve-rendezvous server", nonce_c, nonce_s);
      ok = WriteFrame(fd, kOk, {proof.begin(), proof.end()});
    }
  }
  while (ok && !stop) {
    uint8_t op = 0;
    std::vector<char> payload;
    bool too_large = false;
    if (!ReadFrame(fd, &op, &payload, &too_large)) {
      if (too_large) Refuse(fd, "frame larger than 1 MiB");
      break;
    }
    ok = Handle(fd, op, payload);
  }
  std::lock_guard<std::mutex> lock(mu);
  open_fds.erase(fd);
  ::close(fd);
  if (--per_address[address] == 0) per_address.erase(address);
  active--;
  idle.notify_all();
}

bool RendezvousServer::State::Handle(int fd, uint8_t op, const std::vector<char>& p) {
  std::unique_lock<std::mutex> lock(mu);
  switch (op) {
    case kJoin: {
      if (p.size() != 4) return Refuse(fd, "join: malformed");
      uint32_t rank = GetU32(p.data());
      if (rank >= static_cast<uint32_t>(world)) return Refuse(fd, "join: rank " + std::to_string(rank) + " outside the group");
      if (joined[rank]) {
        lock.unlock();
        return WriteFrame(fd, kNotYet, {});
      }
      joined[rank] = true;
      std::vector<char> out;
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((epoch >> (8 * i)) & 0xff));
      lock.unlock();
      return WriteFrame(fd, kOk, out);
    }
    case kSet: {
      if (p.size() < 4) return Refuse(fd, "set: malformed");
      uint32_t kl = GetU32(p.data());
      if (kl > kMaxKey || kl > p.size() - 4) return Refuse(fd, "set: malformed or oversized key");
      std::string key(p.data() + 4, kl);
      std::vector<char> value(p.begin() + 4 + kl, p.end());
      auto it = keys.find(key);
      size_t after = key_bytes - (it == keys.end() ? 0 : it->second.size() + it->first.size()) + value.size() + key.size();
      if (after > kMaxStoreBytes) return Refuse(fd, "set: store full");
      key_bytes = after;
      keys[key] = std::move(value);
      lock.unlock();
      return WriteFrame(fd, kOk, {});
    }
    case kGet: {
      if (p.size() > kMaxKey) return Refuse(fd, "get: oversized key");
      auto it = keys.find(std::string(p.begin(), p.end()));
      if (it == keys.end()) {
        lock.unlock();
        return WriteFrame(fd, kNotYet, {});
      }
      std::vector<char> v = it->second;
      lock.unlock();
      return WriteFrame(fd, kOk, v);
    }
    case kCheck: {
      size_t at = 0;
      bool all = true;
      while (at < p.size()) {
        if (p.size() - at < 4) return Refuse(fd, "check: malformed");
        uint32_t kl = GetU32(p.data() + at);
        at += 4;
        if (kl > kMaxKey || kl > p.size() - at) return Refuse(fd, "check: malformed or oversized key");
        all = all && keys.count(std::string(p.data() + at, kl)) > 0;
        at += kl;
      }
      lock.unlock();
      return WriteFrame(fd, all ? kOk : kNotYet, {});
    }
    default:
      return Refuse(fd, "unknown operation " + std::to_string(op));
  }
}

CommResult<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(const std::string& host, int port, std::string secret,
                                                                        int world_size, std::chrono::milliseconds io_timeout) {
  if (secret.size() < 16) return CommFail("rendezvous: the group secret must be at least 16 bytes");
  if (world_size < 1) return CommFail("rendezvous: world size must be positive");
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res); rc != 0)
    return CommFail("rendezvous: cannot resolve " + host + ": " + gai_strerror(rc));
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) return CommFail("rendezvous: cannot listen on " + host + ":" + port_text + ": " + why);
  sockaddr_storage ss{};
  socklen_t sl = sizeof(ss);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl);
  auto st = std::make_shared<State>();
  st->secret = std::move(secret);
  st->world = world_size;
  st->io_timeout = io_timeout;
  st->listen_fd = fd;
  st->port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  st->joined.assign(static_cast<size_t>(world_size), false);
  st->self = st;
  st->acceptor = std::thread([s = st.get()] { s->Accept(); });
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(st));
}

RendezvousServer::RendezvousServer(std::shared_ptr<State> state) : state_(std::move(state)) {}

RendezvousServer::~RendezvousServer() {
  state_->stop = true;
  state_->acceptor.join();
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    for (int fd : state_->open_fds) ::shutdown(fd, SHUT_RDWR);
    // Each handler notices its shut-down socket at once; the bound is a guard.
    state_->idle.wait_for(lock, std::chrono::seconds(10), [&] { return state_->active == 0; });
  }
  ::close(state_->listen_fd);
}

int RendezvousServer::port() const { return state_->port; }

void RendezvousServer::Reset() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->epoch++;
  state_->joined.assign(state_->joined.size(), false);
  state_->keys.clear();
  state_->key_bytes = 0;
}

uint64_t RendezvousServer::epoch() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->epoch;
}

uint64_t RendezvousServer::rejected() const { return state_->rejected; }

// ---- client ----------------------------------------------------------------

CommResult<std::unique_ptr<RendezvousClient>> RendezvousClient::Connect(const std::string& host, int port,
                                                                      const std::string& secret,
                                                                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto io_timeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(10));
  std::string last = "timed out";
  while (true) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int fd = -1;
    if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
      last = std::string("cannot resolve: ") + gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
        fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        SetIoTimeout(fd, io_timeout);
        if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
          last = std::strerror(errno);
          ::close(fd);
          fd = -1;
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd >= 0) {
      // Handshake: prove the secret over the server's nonce, then check the
      // server's proof over ours, so neither side trusts an impostor.
      unsigned char greet[sizeof(kMagic) + kNonce];
      if (!ReadFull(fd, greet, sizeof(greet)) || std::memcmp(greet, kMagic, sizeof(kMagic)) != 0) {
        ::close(fd);
        return CommFail("rendezvous at " + host + ":" + std::to_string(port) + " is not a moeserve rendezvous server");
      }
      unsigned char hello[sizeof(kMagic) + kNonce + kMac];
      std::memcpy(hello, kMagic, sizeof(kMagic));
      unsigned char* nonce_c = hello + sizeof(kMagic);
      RAND_bytes(nonce_c, kNonce);
      auto mac = Mac(secret, "moeserve-rendezvous client", greet + sizeof(kMagic), nonce_c);
      std::memcpy(nonce_c + kNonce, mac.data(), kMac);
      uint8_t tag = 0;
      std::vector<char> reply;
      bool too_large = false;
      if (!WriteFull(fd, hello, sizeof(hello)) || !ReadFrame(fd, &tag, &reply, &too_large)) {
        ::close(fd);
        return CommFail("rendezvous at " + host + ":" + std::to_string(port) + " closed the handshake");
      }
      if (tag != kOk) {
        ::close(fd);
        return CommFail("rendezvous refused us: " + std::string(reply.begin(), reply.end()).substr(0, 200));
      }
      auto expect = Mac(secret, "moeserve-rendezvous server", nonce_c, greet + sizeof(kMagic));
      if (reply.size() != kMac || CRYPTO_memcmp(expect.data(), reply.data(), kMac) != 0) {
        ::close(fd);
        return CommFail("rendezvous at " + host + ":" + std::to_string(port) +
                        " failed to prove the group secret (wrong secret or impostor)");
      }
      return std::unique_ptr<RendezvousClient>(new RendezvousClient(fd, io_timeout));
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return CommFail("rendezvous at " + host + ":" + std::to_string(port) + " unreachable: " + last);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

RendezvousClient::~RendezvousClient() { ::close(fd_); }

CommResult<std::pair<uint8_t, std::vector<char>>> RendezvousClient::Call(uint8_t op, const std::vector<char>& payload) {
  if (payload.size() > kMaxFrame) return CommFail("rendezvous: request larger than 1 MiB");
  uint8_t tag = 0;
  std::vector<char> reply;
  bool too_large = false;
  if (!WriteFrame(fd_, op, payload) || !ReadFrame(fd_, &tag, &reply, &too_large))
    return CommFail("rendezvous: connection lost or timed out");
  if (tag == kRefused) return CommFail("rendezvous refused: " + std::string(reply.begin(), reply.end()).substr(0, 200));
  return std::make_pair(tag, std::move(reply));
}

CommResult<uint64_t> RendezvousClient::Join(int rank, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<char> p;
  PutU32(p, static_cast<uint32_t>(rank));
  while (true) {
    auto r = Call(kJoin, p);
    if (!r) return std::unexpected(r.error());
    if (r->first == kOk && r->second.size() == 8) {
      uint64_t e = 0;
      for (int i = 0; i < 8; ++i) e |= static_cast<uint64_t>(static_cast<uint8_t>(r->second[i])) << (8 * i);
      return e;
    }
    if (std::chrono::steady_clock::now() >= deadline) return CommFail("rendezvous: rank 0 did not start a new epoch in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

CommResult<void> RendezvousClient::Set(const std::string& key, const std::vector<char>& value) {
  if (key.size() > kMaxKey) return CommFail("rendezvous: key too long");
  std::vector<char> p;
  PutU32(p, static_cast<uint32_t>(key.size()));
  p.insert(p.end(), key.begin(), key.end());
  p.insert(p.end(), value.begin(), value.end());
  auto r = Call(kSet, p);
  if (!r) return std::unexpected(r.error());
  return {};
}

CommResult<std::optional<std::vector<char>>> RendezvousClient::Get(const std::string& key) {
  auto r = Call(kGet, Text(key));
  if (!r) return std::unexpected(r.error());
  if (r->first != kOk) return std::optional<std::vector<char>>();
  return std::optional<std::vector<char>>(std::move(r->second));
}

CommResult<void> RendezvousClient::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<char> p;
  for (const auto& k : keys) {
    PutU32(p, static_cast<uint32_t>(k.size()));
    p.insert(p.end(), k.begin(), k.end());
  }
  auto pause = std::chrono::milliseconds(5);
  while (true) {
    auto r = Call(kCheck, p);
    if (!r) return std::unexpected(r.error());
    if (r->first == kOk) return {};
    if (std::chrono::steady_clock::now() >= deadline) return CommFail("rendezvous: peers did not publish in time");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace moeserve::kernels::comm
