// moe-daemon serve: parse the configuration, listen, load the model, serve
// until SIGTERM or SIGINT, then shut down gracefully.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "moeserve/common/log.hpp"
#include "moeserve/daemon/commands.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/daemon.hpp"

namespace moeserve::daemon {

namespace {

// SIGTERM/SIGINT write one byte here; the main thread waits on the read end.
// A handler (not a blocked mask + sigwait) because threads started by static
// initialisers before main() would not inherit the mask, and a signal
// delivered to one of them would kill the process without draining.
int g_signal_pipe[2] = {-1, -1};

void OnShutdownSignal(int sig) {
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
}

}  // namespace

int RunServeCommand(int argc, char** argv) {
  if (::pipe(g_signal_pipe) != 0) {
    std::cerr << "moe-daemon: cannot create the signal pipe\n";
    return 1;
  }
  struct sigaction action {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a vanished client must not kill the daemon

  auto config = ParseServeArgs(argc, argv);
  if (!config) {
    std::cerr << "moe-daemon: " << config.error().message() << "\n";
    return 2;
  }
  auto daemon = Daemon::Create(*config);
  if (!daemon) {
    std::cerr << "moe-daemon: " << daemon.error().message() << "\n";
    return 2;
  }
  if (auto st = (*daemon)->Start(); !st) {
    std::cerr << "moe-daemon: " << st.error().message() << "\n";
    return 1;
  }
  std::cerr << "moe-daemon: listening on " << (*daemon)->url() << "\n";
  if (auto st = (*daemon)->LoadModel(); !st) {
    std::cerr << "moe-daemon: " << st.error().message() << "\n";
    (*daemon)->Shutdown(0);
    return 1;
  }
  std::cerr << "moe-daemon: ready\n";
  char sig = 0;
  while (::read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
  }
  std::cerr << "moe-daemon: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining (up to "
            << config->shutdown_grace_seconds << " s)\n";
  (*daemon)->Shutdown(config->shutdown_grace_seconds);
  std::cerr << "moe-daemon: stopped\n";
  return 0;
}

}  // namespace moeserve::daemon
