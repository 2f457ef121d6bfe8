// Test peers for the weight puller, in-process and header-only:
//   RangeFileServer  a small HTTP/1.1 file server with byte ranges and keep-alive
//   FaultProxy       a TCP proxy that cuts, stalls or answers for the upstream
//   Subprocess       fork/exec with stdout captured (s3rver, the puller itself)
// plus helpers that write random model folders with a manifest.json.
#pragma once

#include "../support/loopback.hpp"
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "moeserve/engine/manifest.hpp"

namespace moeserve::testing {

using test_support::ConnectLoopback;

inline int ListenLoopback(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) std::abort();
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

inline bool SendAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Accepts connections on a loopback port and runs handler(fd) per connection
// on its own thread; the destructor shuts every connection down and joins.
class TcpServer {
 public:
  explicit TcpServer(std::function<void(int)> handler) : handler_(std::move(handler)) {
    listen_fd_ = ListenLoopback(&port_);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~TcpServer() { Stop(); }
  void Stop() {
    if (stopped_.exchange(true)) return;
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_thread_.join();
    {
      std::lock_guard lock(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : threads_) t.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  int connections() const { return connections_.load(); }

 private:
  void AcceptLoop() {
    for (;;) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (stopped_) return;
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      connections_++;
      std::lock_guard lock(mu_);
      open_.insert(fd);
      threads_.emplace_back([this, fd] {
        handler_(fd);
        std::lock_guard l(mu_);
        open_.erase(fd);
        ::close(fd);
      });
    }
  }
  std::function<void(int)> handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopped_{false};
  std::atomic<int> connections_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::set<int> open_;
  std::vector<std::thread> threads_;
};

// Reads one request head ("...\r\n\r\n") from fd; false on EOF.
inline bool ReadRequestHead(int fd, std::string& buffer, std::string& head) {
  for (;;) {
    size_t end = buffer.find("\r\n\r\n");
    if (end != std::string::npos) {
      head = buffer.substr(0, end + 4);
      buffer.erase(0, end + 4);
      return true;
    }
    char tmp[4096];
    ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buffer.append(tmp, static_cast<size_t>(n));
  }
}

inline std::string HeaderValue(const std::string& head, const std::string& name) {
  std::istringstream in(head);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > name.size() && strncasecmp(line.c_str(), name.c_str(), name.size()) == 0 &&
        line[name.size()] == ':') {
      std::string v = line.substr(name.size() + 1);
      while (!v.empty() && (v.front() == ' ')) v.erase(0, 1);
      while (!v.empty() && (v.back() == '\r' || v.back() == ' ')) v.pop_back();
      return v;
    }
  }
  return "";
}

inline std::string UrlDecode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Serves files under root with GET/HEAD, Range (bytes=a-b, bytes=a-) and keep-alive.
class RangeFileServer {
 public:
  explicit RangeFileServer(std::string root)
      : root_(std::move(root)), server_([this](int fd) { Serve(fd); }) {}
  int port() const { return server_.port(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()) + "/"; }
  uint64_t body_bytes() const { return body_bytes_.load(); }
  int requests() const { return requests_.load(); }

 private:
  void Serve(int fd) {
    std::string buffer, head;
    while (ReadRequestHead(fd, buffer, head)) {
      requests_++;
      std::istringstream first(head);
      std::string method, target;
      first >> method >> target;
      std::string path = root_ + UrlDecode(target.substr(0, target.find('?')));
      std::ifstream in(path, std::ios::binary);
      if (!in || std::filesystem::is_directory(path)) {
        std::string body = "no such file\n";
        std::string resp = "HTTP/1.1 404 Not Found\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        if (!SendAll(fd, resp.data(), resp.size())) return;
        continue;
      }
      std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      uint64_t begin = 0, end = data.size();  // [begin, end)
      std::string range = HeaderValue(head, "Range");
      std::string status = "200 OK", extra;
      if (range.rfind("bytes=", 0) == 0) {
        std::string spec = range.substr(6);
        size_t dash = spec.find('-');
        begin = std::stoull(spec.substr(0, dash));
        if (dash + 1 < spec.size()) end = std::min<uint64_t>(data.size(), std::stoull(spec.substr(dash + 1)) + 1);
        if (begin >= data.size()) {
          std::string resp = "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n";
          if (!SendAll(fd, resp.data(), resp.size())) return;
          continue;
        }
        status = "206 Partial Content";
        extra = "Content-Range: bytes " + std::to_string(begin) + "-" + std::to_string(end - 1) + "/" +
                std::to_string(data.size()) + "\r\n";
      }
      std::string resp = "HTTP/1.1 " + status + "\r\nContent-Length: " + std::to_string(end - begin) + "\r\n" + extra +
                         "Accept-Ranges: bytes\r\n\r\n";
      if (!SendAll(fd, resp.data(), resp.size())) return;
      if (method == "HEAD") continue;
      if (!SendAll(fd, data.data() + begin, end - begin)) return;
      body_bytes_ += end - begin;
    }
  }
  std::string root_;
  std::atomic<uint64_t> body_bytes_{0};
  std::atomic<int> requests_{0};
  TcpServer server_;  // last: its threads use the members above
};

// What the proxy does to a connection.
struct FaultPlan {
  uint64_t cut_after_bytes = 0;    // close after this many upstream->client bytes (0: never)
  uint64_t stall_after_bytes = 0;  // stop forwarding (keep the socket open) after this many (0: never)
  std::string canned_response;     // reply this instead of forwarding, then close
  uint64_t corrupt_at_byte = 0;    // flip the byte at this upstream->client offset (0: never)
  int faulty_connections = -1;     // the first N connections get the fault; -1: every one
};

class FaultProxy {
 public:
  FaultProxy(int upstream_port, FaultPlan plan)
      : upstream_port_(upstream_port), plan_(std::move(plan)), server_([this](int fd) { Handle(fd); }) {}
  int port() const { return server_.port(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }
  uint64_t bytes_to_client() const { return to_client_.load(); }
  int faults() const { return faults_.load(); }
  void SetPlan(FaultPlan plan) {
    std::lock_guard lock(mu_);
    plan_ = std::move(plan);
    seen_ = 0;
  }

 private:
  void Handle(int client) {
    FaultPlan plan;
    bool faulty;
    {
      std::lock_guard lock(mu_);
      plan = plan_;
      faulty = plan.faulty_connections < 0 || seen_ < plan.faulty_connections;
      seen_++;
    }
    if (faulty && !plan.canned_response.empty()) {
      std::string buffer, head;
      if (ReadRequestHead(client, buffer, head)) {
        faults_++;
        SendAll(client, plan.canned_response.data(), plan.canned_response.size());
      }
      return;
    }
    int upstream = ConnectLoopback(upstream_port_);
    if (upstream < 0) return;
    uint64_t forwarded = 0;
    bool stalled = false;
    char buf[16384];
    for (;;) {
      pollfd fds[2] = {{client, POLLIN, 0}, {upstream, static_cast<short>(stalled ? 0 : POLLIN), 0}};
      int r = ::poll(fds, 2, 200);
      if (r < 0) break;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = ::recv(client, buf, sizeof(buf), 0);
        if (n <= 0) break;
        if (!SendAll(upstream, buf, static_cast<size_t>(n))) break;
      }
      if (!stalled && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
        size_t want = sizeof(buf);
        uint64_t limit = 0;
        if (faulty && plan.cut_after_bytes) limit = plan.cut_after_bytes;
        if (faulty && plan.stall_after_bytes) limit = plan.stall_after_bytes;
        if (limit) want = static_cast<size_t>(std::min<uint64_t>(want, limit - forwarded));
        ssize_t n = ::recv(upstream, buf, want, 0);
        if (n <= 0) break;
        if (faulty && plan.corrupt_at_byte > 0 && plan.corrupt_at_byte >= forwarded && plan.corrupt_at_byte < forwarded + static_cast<uint64_t>(n)) {
          buf[plan.corrupt_at_byte - forwarded] ^= 0x20;
          faults_++;
        }
        if (!SendAll(client, buf, static_cast<size_t>(n))) break;
        forwarded += static_cast<uint64_t>(n);
        to_client_ += static_cast<uint64_t>(n);
        if (limit && forwarded >= limit) {
          faults_++;
          if (plan.cut_after_bytes) break;  // a reset in the middle of a body
          stalled = true;                   // hold the socket until the client gives up
        }
      }
    }
    ::close(upstream);
  }
  int upstream_port_;
  std::mutex mu_;
  FaultPlan plan_;
  int seen_ = 0;
  std::atomic<uint64_t> to_client_{0};
  std::atomic<int> faults_{0};
  TcpServer server_;
};

// A child process; stdout is readable line by line. Killed (SIGKILL) on destruction.
class Subprocess {
 public:
  Subprocess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {}) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      for (const auto& e : extra_env) ::putenv(const_cast<char*>(e.c_str()));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    ::close(out[1]);
    out_fd_ = out[0];
  }
  ~Subprocess() {
    Kill();
    if (out_fd_ >= 0) ::close(out_fd_);
  }
  // Reads stdout until a line containing needle or timeout; returns that line ("" on failure).
  std::string WaitForLine(const std::string& needle, std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      size_t nl;
      while ((nl = buffer_.find('\n')) != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (line.find(needle) != std::string::npos) return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd p{out_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
      char tmp[4096];
      ssize_t n = ::read(out_fd_, tmp, sizeof(tmp));
      if (n <= 0) return "";
      buffer_.append(tmp, static_cast<size_t>(n));
    }
  }
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  // Exit code, or 128 + signal.
  int Wait() {
    if (pid_ <= 0) return exit_code_;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_code_;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int exit_code_ = -1;
  std::string buffer_;
};

inline std::string MakeTempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("moe-" + tag + "-XXXXXX")).string();
  return ::mkdtemp(tmpl.data());
}

// Writes random files of the given sizes plus manifest.json; returns the total size.
inline uint64_t WriteRandomModel(const std::string& dir, const std::vector<std::pair<std::string, size_t>>& files,
                                 uint64_t seed = 1) {
  std::filesystem::create_directories(dir);
  std::mt19937_64 rng(seed);
  uint64_t total = 0;
  for (const auto& [name, size] : files) {
    std::filesystem::create_directories(std::filesystem::path(dir + "/" + name).parent_path());
    std::string data(size, '\0');
    for (auto& c : data) c = static_cast<char>(rng());
    std::ofstream(dir + "/" + name, std::ios::binary) << data;
    total += size;
  }
  auto manifest = engine::BuildManifest(dir);
  if (!manifest) std::abort();
  std::ofstream(dir + "/manifest.json") << manifest->ToJson();
  return total;
}

inline std::string SourceDir() {
  const char* s = std::getenv("MOESERVE_SOURCE_DIR");
  // tests/daemon/storage/test_servers.hpp -> the source root
  return s ? s : std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().parent_path().string();
}

inline std::string BinaryDir() {
  const char* s = std::getenv("MOESERVE_BINARY_DIR");
  return s ? s : "";
}

}  // namespace moeserve::testing
