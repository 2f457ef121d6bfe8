// Communicators for ranks that are threads of one process: unit tests of the
// exchanges and of the expert-parallel forward pass without sockets. Each
// collective is two barriers: every rank publishes its buffers, then each
// copies what is addressed to it, then all leave together.
#pragma once

#include <memory>
#include <vector>

#include "moeserve/kernels/comm/communicator.hpp"

namespace moeserve::kernels::comm {

// size communicators, rank i at index i, sharing one rendezvous. Each must be
// driven by its own thread.
std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int size);

}  // namespace moeserve::kernels::comm
