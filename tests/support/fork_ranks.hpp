// Runs the ranks of a group as child processes of the test (fork), each
// calling body(rank) and exiting with its return value. Fork happens before
// the children start any thread, and the parent must not have started the
// kernel thread pool. A child still running after `limit` is killed
// (SIGKILL), so a hung collective fails the test instead of hanging it.
//
// No rank starts before every rank is forked: a thread of the parent (a
// rendezvous server) serving the first ranks could otherwise hold a library
// lock (OpenSSL's, stdio's) at the moment a later rank is forked, and that
// child would inherit the lock held forever (seen as one rank of four that
// never joined, under load).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

namespace moeserve::test_support {

// Exit codes per rank; 128 + signal for a child that was killed.
inline std::vector<int> ForkRanks(int n, const std::function<int(int)>& body,
                                  std::chrono::seconds limit = std::chrono::seconds(120)) {
  std::vector<pid_t> pids;
  int gate[2];  // closed by the parent once all ranks are forked: each child waits for its end of file
  if (::pipe(gate) != 0) return std::vector<int>(static_cast<size_t>(n), -2);
  for (int r = 0; r < n; ++r) {
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(gate[1]);
      char byte;
      while (::read(gate[0], &byte, 1) < 0 && errno == EINTR) {
      }
      ::close(gate[0]);
      int rc = 1;
      try {
        rc = body(r);
      } catch (...) {
        rc = 3;
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);
  std::vector<int> codes(static_cast<size_t>(n), -1);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (codes[static_cast<size_t>(r)] != -1) continue;
      int status = 0;
      if (::waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) == pids[static_cast<size_t>(r)]) {
        codes[static_cast<size_t>(r)] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (codes[static_cast<size_t>(r)] == -1) ::kill(pids[static_cast<size_t>(r)], SIGKILL);
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return codes;
}

}  // namespace moeserve::test_support
