// The collectives expert parallelism needs, behind one interface: a counts
// exchange, an all-to-all-v of bytes, a barrier and a broadcast. Three
// implementations: in-process threads (unit tests), Gloo over TCP (processes
// and nodes without GPUs), NCCL (GPUs). What the engine does with them (which
// rows go where, and how they come back) lives in exchange.hpp, shared by all
// three, so that the part the tests exercise on CPUs is the part GPUs run.
//
// Errors are values. A communicator whose collective failed (a peer died, a
// timeout passed) is broken for good: every later call fails at once with the
// first error, because the peers may be at different points of the
// collective sequence and nothing can resynchronise them but a new group.
//
// Thread safety: one thread calls a communicator's collectives; every rank
// must call the same collectives in the same order (as MPI).
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <vector>

namespace moeserve::kernels::comm {

struct CommError {
  std::string message;
};

template <typename T>
using CommResult = std::expected<T, CommError>;

inline std::unexpected<CommError> CommFail(std::string message) { return std::unexpected(CommError{std::move(message)}); }

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Which implementation, for logs: "in-process", "gloo", "nccl".
  virtual const char* backend() const = 0;

  // send_counts[r]: what this rank will send to rank r. Returns what each
  // rank will send to this one (recv[r] = rank r's send_counts[this rank]).
  virtual CommResult<std::vector<int64_t>> ExchangeCounts(std::span<const int64_t> send_counts) = 0;

  // send holds the bytes for rank 0, then rank 1, ... (send_bytes[r] each);
  // recv receives rank 0's bytes for this rank, then rank 1's ... (recv_bytes
  // from ExchangeCounts). Zero-length parts are allowed. For NCCL the
  // buffers are device memory.
  virtual CommResult<void> AllToAllV(const void* send, std::span<const int64_t> send_bytes, void* recv,
                                     std::span<const int64_t> recv_bytes) = 0;

  virtual CommResult<void> Barrier() = 0;

  // root's bytes replace every other rank's; all ranks pass the same size.
  virtual CommResult<void> Broadcast(void* data, size_t bytes, int root) = 0;

  // Bytes this rank has sent through AllToAllV and Broadcast (as root), for
  // the traffic figures.
  virtual uint64_t bytes_sent() const = 0;
};

}  // namespace moeserve::kernels::comm
