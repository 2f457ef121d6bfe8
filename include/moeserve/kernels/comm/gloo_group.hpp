// Joins an expert-parallel group over Gloo's TCP transport: through the
// rendezvous store at the master (rank 0 serves it, see rendezvous.hpp), each
// rank publishes its collective endpoint and connects to every other rank.
// Every collective, and the mesh formation itself, is bounded by `timeout`:
// a dead or silent peer fails the call instead of hanging it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "moeserve/kernels/comm/communicator.hpp"

namespace moeserve::kernels::comm {

struct GlooGroupOptions {
  int rank = 0;
  int size = 1;
  std::string master_host = "127.0.0.1";
  int master_port = 0;
  std::string secret;
  // The address the other ranks reach this one at (a pod's IP or resolvable
  // hostname); Gloo listens on a free port there.
  std::string bind_host = "127.0.0.1";
  std::chrono::milliseconds timeout{10000};
};

// Connects to the store, joins the current epoch, publishes and connects.
// The returned communicator's backend() is "gloo"; epoch is set to the epoch joined.
CommResult<std::unique_ptr<Communicator>> JoinGlooGroup(const GlooGroupOptions& options, uint64_t* epoch = nullptr);

}  // namespace moeserve::kernels::comm
