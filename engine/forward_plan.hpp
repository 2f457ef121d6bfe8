// What rank 0 of an expert-parallel group tells its followers before each
// forward pass, so that they run the same pass on their replicas of the
// attention state: per segment the sequence's key, its position, its tokens
// (the sampled ones included: followers never sample, so ranks never
// diverge) and its cache block table; plus the sequences that ended since.
// Heartbeats keep idle followers (and rank 0's view of them) alive; Stop
// ends following.
//
// The wire format is little-endian and bounds-checked on decode: a message
// that does not parse is an error, never a crash.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::engine {

struct ForwardPlan {
  enum class Kind : uint8_t { kForward = 1, kHeartbeat = 2, kStop = 3 };
  struct Segment {
    uint64_t key = 0;
    int64_t pos0 = 0;  // the cache length before this segment
    bool all_logits = false;
    std::vector<int> tokens;
    std::vector<int> blocks;
  };
  Kind kind = Kind::kHeartbeat;
  std::vector<uint64_t> retired;
  std::vector<Segment> segments;
};

std::vector<uint8_t> EncodeForwardPlan(const ForwardPlan& plan);
Result<ForwardPlan> DecodeForwardPlan(std::span<const uint8_t> bytes);

}  // namespace moeserve::engine
