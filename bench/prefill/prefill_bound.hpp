// The ceilings bench_prefill measures at start, and the bound of a prefill's
// work as it ran: each part of the forward pass's profile at its own ceiling.
// Shared by the part-by-part breakdown and the multi-sequence comparison, so
// both hold their runs to the same bound.
#pragma once

#include "moeserve/engine/model.hpp"

namespace moeserve::bench {

struct Ceilings {
  double fma = 0, dot = 0, bw = 0;  // FLOP/s, FLOP/s, bytes/s
};

// Seconds the profiled work would take at its ceilings. dot_products: the
// projections, experts and attention ran as BF16 dot products (their ceiling
// is then the BF16 dot peak; the indexer and the delta rule stay fp32 FMAs;
// glue is bound by read bandwidth).
inline double BoundSeconds(const engine::ForwardProfile& p, const Ceilings& c, bool dot_products) {
  namespace me = engine;
  double bound_s = 0;
  for (int i = 0; i < me::kProfileParts; ++i) {
    const auto part = static_cast<me::ProfilePart>(i);
    double work = 0;
    for (int r = 0; r < me::kProfileRows; ++r) work += part == me::ProfilePart::kGlue ? p.bytes[r][i] : p.flops[r][i];
    if (part == me::ProfilePart::kGlue) {
      bound_s += work / c.bw;
      continue;
    }
    const bool dot = dot_products && c.dot > 0 &&
                     (part == me::ProfilePart::kProjections || part == me::ProfilePart::kExperts ||
                      part == me::ProfilePart::kAttention || part == me::ProfilePart::kSharedExperts ||
                      part == me::ProfilePart::kDenseFfn);
    bound_s += work / (dot ? c.dot : c.fma);
  }
  return bound_s;
}

}  // namespace moeserve::bench
