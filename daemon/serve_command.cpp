// moe-daemon serve: parse the configuration, listen, load the model, serve
// until SIGTERM or SIGINT, then shut down gracefully.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "moeserve/common/log.hpp"
#include "moeserve/common/shutdown_signals.hpp"
#include "moeserve/daemon/commands.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/daemon.hpp"

namespace moeserve::daemon {

int RunServeCommand(int argc, char** argv) {
  if (auto st = InstallShutdownSignals(); !st) {
    std::cerr << "moe-daemon: " << st.error().message() << "\n";
    return 1;
  }
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
  const int sig = WaitForShutdownSignal();
  std::cerr << "moe-daemon: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining (up to "
            << config->shutdown_grace_seconds << " s)\n";
  (*daemon)->Shutdown(config->shutdown_grace_seconds);
  std::cerr << "moe-daemon: stopped\n";
  return 0;
}

}  // namespace moeserve::daemon
