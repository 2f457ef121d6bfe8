// moe-daemon as its own process for tests that need one: to count its
// threads in /proc, or to kill it with SIGKILL. It serves the tiny model with
// the extra flags a test gives, on a port it binds itself (--port 0) and
// names on its standard error ("moe-daemon: listening on http://...:PORT"):
// a port picked free here and bound there later could be taken in between
// by another test process (ctest runs two at a time), whose daemon would
// then answer this test's requests. A thread reads the daemon's standard
// error to its end (a pipe nobody read would stop the daemon once full),
// and DaemonProcess's destructor kills one still running; a daemon a failed
// test left behind finds its pipe closed, which it ignores (SIGPIPE).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {

// Resident set of /proc/<proc> ("self" or a pid), in bytes; 0 if unreadable.
inline size_t ResidentBytesOf(const std::string& proc) {
  std::ifstream in("/proc/" + proc + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// A moe-daemon child started with `args` (after the executable; they must
// say --port 0), its standard error read by a thread for the port it binds.
class DaemonChild {
 public:
  explicit DaemonChild(std::vector<std::string> args) {
    const char* bin = std::getenv("MOESERVE_BINARY_DIR");
    const std::string exe = std::string(bin ? bin : MOESERVE_BINARY_DIR_DEFAULT) + "/daemon/moe-daemon";
    args.insert(args.begin(), exe);
    int err[2];
    if (::pipe2(err, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return;
    }
    // Everything the child needs is made before the fork: after it the child
    // only calls what is safe while other threads of this process may hold
    // locks (no allocation).
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::dup2(err[1], 2);  // dup2 clears close-on-exec on the copy
      ::execv(exe.c_str(), argv.data());
      std::_Exit(127);
    }
    ::close(err[1]);
    reader_ = std::thread([this, fd = err[0]] { Read(fd); });
  }
  ~DaemonChild() {
    Kill();
    stop_ = true;
    if (reader_.joinable()) reader_.join();
  }
  DaemonChild(const DaemonChild&) = delete;
  DaemonChild& operator=(const DaemonChild&) = delete;

  // The port the daemon named, waiting up to `limit` for it; 0 if it exited
  // or said nothing in time.
  int WaitPort(std::chrono::seconds limit) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, limit, [&] { return port_ != 0 || ended_; });
    return port_;
  }
  // Whether it has exited (reaped here).
  bool Exited() {
    if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = 0;
    return pid_ <= 0;
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  pid_t pid() const { return pid_; }

 private:
  // Reads fd until its end (every copy of the write end closed: the daemon
  // gone) or the destructor's stop, noting the port of the first
  // "listening on" line. Polls, so that a write end a forked but not exec'd
  // process still holds cannot keep the destructor waiting.
  void Read(int fd) {
    std::string seen;
    char buf[4096];
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      if (port_ != 0) continue;
      seen.append(buf, static_cast<size_t>(n));
      const std::string mark = "listening on http://";
      const size_t at = seen.find(mark);
      const size_t eol = at == std::string::npos ? at : seen.find('\n', at);
      if (eol == std::string::npos) continue;
      const std::string url = seen.substr(at + mark.size(), eol - at - mark.size());
      const int port = std::atoi(url.substr(url.rfind(':') + 1).c_str());
      std::lock_guard lock(mu_);
      port_ = port;
      cv_.notify_all();
    }
    ::close(fd);
    std::lock_guard lock(mu_);
    ended_ = true;
    cv_.notify_all();
  }

  pid_t pid_ = -1;
  std::thread reader_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  int port_ = 0;
  bool ended_ = false;
};

class DaemonProcess {
 public:
  explicit DaemonProcess(const std::vector<std::string>& extra_flags) : child_(Args(extra_flags)) {}

  // Whether /readyz answered 200 within 30 s (false at once if it exited).
  bool WaitReady() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    port_ = child_.WaitPort(std::chrono::seconds(30));
    if (port_ == 0) return false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Http(port_, "GET", "/readyz").status == 200) return true;
      if (child_.Exited()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  void Kill() { child_.Kill(); }

  // Threads of the process now, from /proc/<pid>/task.
  int Threads() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e :
         std::filesystem::directory_iterator("/proc/" + std::to_string(child_.pid()) + "/task"))
      ++n;
    return n;
  }

  size_t ResidentBytes() const { return ResidentBytesOf(std::to_string(child_.pid())); }
  int port() const { return port_; }
  pid_t pid() const { return child_.pid(); }

 private:
  static std::vector<std::string> Args(const std::vector<std::string>& extra_flags) {
    std::vector<std::string> args = {"serve", "--model", TinyModelDir(), "--port", "0", "--served-model-name", "tiny",
                                     "--max-context", "4096", "--threads", "1", "--default-reasoning-effort", "low",
                                     "--thinking-budgets.low", "2"};
    args.insert(args.end(), extra_flags.begin(), extra_flags.end());
    return args;
  }
  DaemonChild child_;
  int port_ = 0;
};

}  // namespace moeserve::daemon::testing
