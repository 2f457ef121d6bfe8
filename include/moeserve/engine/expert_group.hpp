// The life of one rank in an expert-parallel group: forming the group,
// noticing when it breaks, and forming it again.
//
// Rank 0 leads: it serves the authenticated rendezvous store
// (kernels/comm/rendezvous.hpp) on the rendezvous port, joins, hands the
// connected group to its Model (Model::SetGroup), and while connected sends
// a heartbeat every `heartbeat` so idle followers stay bounded and a dead one
// is noticed within about heartbeat + timeout. When a collective fails the
// group is degraded: the model is disconnected (forward passes, and so the
// requests in flight, fail with kUnavailable at once), the store starts a new
// epoch, and rank 0 waits for every rank to join again.
//
// The other ranks follow: join, run rank 0's passes (Model::Follow), and
// join again whenever the group fails or rank 0 stops them.
//
// Every transition is reported to the listener (on the group's thread).
//
// Thread safety: status() from any thread; Stop from the owner.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"

namespace moeserve::engine {

struct ExpertGroupSettings {
  int rank = 0;
  int world = 1;
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the rendezvous store
  int rendezvous_port = 29400;
  std::string secret;                      // shared by the group, at least 16 bytes
  std::string bind_addr = "127.0.0.1";     // this rank's address the others reach
  std::chrono::milliseconds timeout{5000};     // every collective and each join attempt
  std::chrono::milliseconds heartbeat{1000};  // rank 0's idle beat
  bool enabled() const { return world > 1; }
};

// From the operator's pod environment (docs/expert-parallel.md):
// MOE_NODE_RANK, MOE_NUM_NODES, MOE_MASTER_ADDR and
// MOE_LOCAL_RANKS; MOE_RENDEZVOUS_PORT, MOE_GROUP_SECRET_FILE (or
// MOE_GROUP_SECRET), MOE_POD_IP (the address to be reached at; default this
// host's name) and MOE_GROUP_TIMEOUT_MS. Without MOE_NUM_NODES, or with 1, the
// world is 1 and nothing else is read. The CPU engine runs one rank per pod,
// so MOE_LOCAL_RANKS above 1 in a multi-node group is refused.
Result<ExpertGroupSettings> ExpertGroupSettingsFromEnv();

struct ExpertGroupStatus {
  enum class State { kJoining, kConnected, kDegraded, kStopped };
  State state = State::kJoining;
  std::string detail;        // for /readyz and logs
  uint64_t epoch = 0;        // the store's epoch last joined
  uint64_t formations = 0;   // times the group connected
  uint64_t failures = 0;     // times it broke
  const char* name() const;  // joining | connected | degraded | stopped
};

class ExpertGroup {
 public:
  using Listener = std::function<void(const ExpertGroupStatus&)>;

  // Rank 0. Fails at once if the rendezvous port cannot be served.
  static Result<std::unique_ptr<ExpertGroup>> Lead(const ExpertGroupSettings& settings, const Model& model, Listener listener);
  // Ranks > 0; the pool has rank 0's geometry (same cache_tokens, block_tokens).
  static Result<std::unique_ptr<ExpertGroup>> Follow(const ExpertGroupSettings& settings, const Model& model, KvPool& pool,
                                                    Listener listener);
  // A follower for one run (moe-run's ranks > 0): joins (attempts repeated
  // until `wait` has passed), runs rank 0's passes, and returns Ok when rank
  // 0 stops the group; kUnavailable when it never formed or broke.
  static Status FollowOnce(const ExpertGroupSettings& settings, const Model& model, KvPool& pool,
                           std::chrono::milliseconds wait);
  ~ExpertGroup();
  // Rank 0 tells the followers to stop; then the thread ends. Idempotent.
  void Stop();
  ExpertGroupStatus status() const;
  // Blocks until the group is connected (true) or `wait` has passed (false).
  bool WaitConnected(std::chrono::milliseconds wait) const;

  struct Impl;

 private:
  explicit ExpertGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::engine
