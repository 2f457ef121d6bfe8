// moe-daemon as its own process for tests that need one: to count its
// threads in /proc, or to kill it with SIGKILL. It serves the tiny model on a
// free loopback port with the extra flags a test gives; its output goes to
// /dev/null so ctest never waits on a daemon a failed assertion left behind,
// and DaemonProcess's destructor kills one still running.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {

class DaemonProcess {
 public:
  explicit DaemonProcess(const std::vector<std::string>& extra_flags) : port_(FreeLoopbackPort()) {
    const char* bin = std::getenv("MOESERVE_BINARY_DIR");
    const std::string exe = std::string(bin ? bin : MOESERVE_BINARY_DIR_DEFAULT) + "/daemon/moe-daemon";
    std::vector<std::string> args = {exe,     "serve",           "--model",           TinyModelDir(),
                                     "--port", std::to_string(port_), "--served-model-name", "tiny",
                                     "--max-context", "4096",    "--threads",         "1",
                                     "--default-reasoning-effort", "low", "--thinking-budgets.low", "2"};
    args.insert(args.end(), extra_flags.begin(), extra_flags.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      ::execv(exe.c_str(), argv.data());
      std::_Exit(127);
    }
  }
  ~DaemonProcess() { Kill(); }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Whether /readyz answered 200 within 30 s (false at once if it exited).
  bool WaitReady() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Http(port_, "GET", "/readyz").status == 200) return true;
      if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

  // Threads of the process now, from /proc/<pid>/task.
  int Threads() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task"))
      ++n;
    return n;
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace moeserve::daemon::testing
