// The daemon settings of server-kept sessions (config.hpp lists them with the
// others; every one is a YAML key and a flag):
//
//   session_db_path: ""                 # SQLite; default
//   <state_dir>/sessions.sqlite3; neither: in memory session_idle_seconds:
//   86400         # a session unused this long is deleted
//   session_total_quota_bytes: 805306368    # every tenant's sessions together (507 past it);
//                                           # below the state volume, leaving the ledger room
//   session_tenant_quota_bytes: 268435456   # storage per tenant; a turn or
//   session past it is refused (403) session_context_tokens: 0           #
//   context budget of a session's prompt plus answer; 0: max_context
//   session_keep_exchanges: 2           # newest exchanges never compressed
//   (the new turn's included) session_summary_max_tokens: 256     # longest
//   summary (the model's, and the extractive one) session_replica: local # this
//   replica's name, encoded in the ids of the sessions it creates
//   session_peers: ""                   # other replicas:
//   "name=http://host:port,name=..."; a turn for a
//                                       # session of another replica is
//                                       forwarded to it
//   session_forward_max_in_flight: 32  # requests forwarded to peers at once
//                                       (a thread each); more: 503 at once
//   session_forward_deadline_seconds: 600 # one forward, connection to last
//                                       byte (a streamed turn included)
//   session_pin_share: 0.5              # share of prefix_cache_bytes active
//   sessions may keep pinned session_pin_seconds: 600            # a session is
//   active (its cache pinned) this long after a turn
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon {

struct SessionSettings {
  std::string db_path;
  double idle_seconds = 86400;
  int64_t tenant_quota_bytes = int64_t{256} << 20;
  // Every tenant's sessions together: below the state volume (1 GiB by
  // default) so that the usage ledger beside them always has room to commit.
  int64_t total_quota_bytes = int64_t{768} << 20;
  // Encoded bytes of the distinct images one session keeps
  // (session_image_max_bytes); a turn past it is refused (400).
  int64_t image_max_bytes = int64_t{64} << 20;
  int64_t context_tokens = 0;
  int keep_exchanges = 2;
  int summary_max_tokens = 256;
  std::string replica = "local";
  std::map<std::string, std::string> peers;  // replica name -> base URL
  int forward_max_in_flight = 32;             // forwards to peers at once; more: 503
  double forward_deadline_seconds = 600;      // one forward, connect to last byte
  double pin_share = 0.5;
  double pin_seconds = 600;
};

// A replica name as it may appear in a session id: 1-32 of [a-z0-9-].
bool ValidReplicaName(const std::string& name);

}  // namespace moeserve::daemon
