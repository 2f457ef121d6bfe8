#include "moeserve/common/shutdown_signals.hpp"

#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace moeserve {
namespace {

int g_pipe[2] = {-1, -1};

void OnShutdownSignal(int sig) {
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &byte, 1);
}

}  // namespace

Status InstallShutdownSignals() {
  if (g_pipe[0] < 0 && ::pipe(g_pipe) != 0) return Fail(Error::Io("cannot create the signal pipe"));
  struct sigaction action {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGTERM, &action, nullptr) != 0 || sigaction(SIGINT, &action, nullptr) != 0) {
    return Fail(Error::Io("cannot install the SIGTERM/SIGINT handlers"));
  }
  return Ok();
}

int WaitForShutdownSignal() {
  char sig = 0;
  while (::read(g_pipe[0], &sig, 1) < 0 && errno == EINTR) {
  }
  return sig;
}

void WakeShutdownWaiter() {
  const char wake = 0;
  [[maybe_unused]] ssize_t n = ::write(g_pipe[1], &wake, 1);
}

}  // namespace moeserve
