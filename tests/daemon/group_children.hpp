// What the multi-process expert-parallel tests share: child processes (moe-run
// and moe-daemon ranks) whose output goes to files, the operator's group
// variables for a rank, and readings of what a rank reports (the routed
// expert bytes moe-run prints, a daemon's /readyz and /metrics).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {

using Env = std::vector<std::pair<std::string, std::string>>;

inline std::string BinaryDir() {
  const char* bin = std::getenv("MOESERVE_BINARY_DIR");
  return bin ? bin : MOESERVE_BINARY_DIR_DEFAULT;
}

// A child process whose stdout and stderr go to files; killed when it goes
// out of scope still running (a failed assertion leaves nothing behind).
struct Child {
  pid_t pid = -1;
  std::string out, err;

  Child() = default;
  Child(Child&& o) noexcept : pid(o.pid), out(std::move(o.out)), err(std::move(o.err)) { o.pid = -1; }
  Child& operator=(Child&&) = delete;
  ~Child() { Kill(); }

  static Child Spawn(std::vector<std::string> args, const Env& env, const std::string& prefix) {
    Child c;
    c.out = prefix + ".out";
    c.err = prefix + ".err";
    c.pid = ::fork();
    if (c.pid == 0) {
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      const int o = ::open(c.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(c.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(args[0].c_str(), argv.data());
      std::_Exit(127);
    }
    return c;
  }
  // The exit code, or -1 when it did not end within `wait` (then killed).
  int Wait(std::chrono::seconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Kill();
    return -1;
  }
  void Kill() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  std::string Out() const { return Slurp(out); }
  std::string Err() const { return Slurp(err); }
  static std::string Slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

// The operator's variables for rank `rank` of a group of two on loopback.
inline Env GroupEnv(int rank, int rendezvous_port, const std::string& secret) {
  return {{"MOE_NUM_NODES", "2"},          {"MOE_NODE_RANK", std::to_string(rank)},
          {"MOE_MASTER_ADDR", "127.0.0.1"}, {"MOE_LOCAL_RANKS", "1"},
          {"MOE_RENDEZVOUS_PORT", std::to_string(rendezvous_port)},
          {"MOE_GROUP_SECRET", secret},     {"MOE_POD_IP", "127.0.0.1"},
          {"MOE_GROUP_TIMEOUT_MS", "20000"}};
}

// "moe-run: ...weights held: A bytes, of which routed experts B bytes" -> B.
inline uint64_t RoutedBytes(const std::string& err) {
  std::smatch m;
  static const std::regex re("routed experts ([0-9]+) bytes");
  if (!std::regex_search(err, m, re)) return 0;
  return std::stoull(m[1]);
}

// Polls until /readyz answers 200 (true) or the process exits or 120 s pass.
inline bool WaitReady(int port, Child& c) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Http(port, "GET", "/readyz").status == 200) return true;
    if (::waitpid(c.pid, nullptr, WNOHANG) == c.pid) return c.pid = -1, false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A metric's value from /metrics (-1 when absent).
inline double Metric(int port, const std::string& name) {
  auto r = Http(port, "GET", "/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

}  // namespace moeserve::daemon::testing
