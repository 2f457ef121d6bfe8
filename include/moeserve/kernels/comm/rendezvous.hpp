// The rendezvous store that lets the ranks of an expert-parallel group find
// each other: a small key-value service served by rank 0 (at MOE_MASTER_ADDR)
// in which each rank publishes its collective endpoint and reads the others'.
// Debian's Gloo ships no TCP store, and a store open to anyone would let any
// pod in the cluster redirect a group's activations, so every connection
// proves knowledge of the group's shared secret both ways (HMAC-SHA256 over
// fresh nonces, compared in constant time) before any key is read or written.
//
// Epochs: the group forms in epochs. Each rank joins the current epoch once;
// a rank asking to join an epoch it already joined (it lost its peers) waits
// until rank 0 starts the next one (Reset), so all ranks meet in one epoch.
// Keys are per epoch.
//
// Limits (hostile peers): frames above 1 MiB, keys above 1 KiB, more than
// 64 MiB of values, 64 connections, or 8 connections from one peer address
// are refused (an error reply, or a connection closed at accept); a
// connection idle past the I/O timeout is closed. The per-address limit
// keeps an anonymous peer that opens sockets and says nothing from holding
// every slot while the ranks form the group.
//
// Thread safety: the server is internally synchronised; a client is used by
// one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/kernels/comm/communicator.hpp"

namespace moeserve::kernels::comm {

class RendezvousServer {
 public:
  // Listens on host:port (port 0: any free port, see port()). The secret must
  // be at least 16 bytes.
  static CommResult<std::unique_ptr<RendezvousServer>> Start(const std::string& host, int port, std::string secret,
                                                             int world_size,
                                                             std::chrono::milliseconds io_timeout = std::chrono::seconds(10));
  ~RendezvousServer();
  int port() const;
  // Starts the next epoch: the keys go, every rank must join again.
  void Reset();
  uint64_t epoch() const;
  // Connections refused so far (failed authentication, malformed or oversized frames).
  uint64_t rejected() const;

  struct State;

 private:
  explicit RendezvousServer(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

class RendezvousClient {
 public:
  // Connects (retrying until timeout passes, the server may not be up yet)
  // and authenticates. A wrong secret on either side fails with a message
  // that says so.
  static CommResult<std::unique_ptr<RendezvousClient>> Connect(const std::string& host, int port, const std::string& secret,
                                                              std::chrono::milliseconds timeout);
  ~RendezvousClient();

  // Joins the current epoch as `rank`; returns the epoch. Waits (polling)
  // while the server holds this rank as already joined.
  CommResult<uint64_t> Join(int rank, std::chrono::milliseconds timeout);
  CommResult<void> Set(const std::string& key, const std::vector<char>& value);
  CommResult<std::optional<std::vector<char>>> Get(const std::string& key);
  // Until every key exists, or timeout.
  CommResult<void> Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

 private:
  RendezvousClient(int fd, std::chrono::milliseconds io_timeout) : fd_(fd), io_timeout_(io_timeout) {}
  CommResult<std::pair<uint8_t, std::vector<char>>> Call(uint8_t op, const std::vector<char>& payload);
  int fd_;
  std::chrono::milliseconds io_timeout_;
};

}  // namespace moeserve::kernels::comm
