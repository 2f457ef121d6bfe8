#include "moeserve/engine/context_bytes.hpp"

#include <algorithm>
#include <cstdio>

#include "moeserve/engine/family.hpp"

namespace moeserve::engine {

int64_t RecurrentStateBytes(const SequenceCache& fresh) {
  int64_t floats = 0;
  for (const DeltaLayerState& d : fresh.delta)
    floats += static_cast<int64_t>(d.conv_tail.size() + d.S.size());
  return floats * static_cast<int64_t>(sizeof(float));
}

ContextBytes ContextCost(size_t floats_per_token, int block_tokens, int64_t state_bytes, int64_t tokens) {
  ContextBytes c;
  c.tokens = std::max<int64_t>(tokens, 0);
  c.blocks = block_tokens > 0 ? (c.tokens + block_tokens - 1) / block_tokens : 0;
  c.pool_bytes = c.blocks * block_tokens * static_cast<int64_t>(floats_per_token) * static_cast<int64_t>(sizeof(float));
  c.state_bytes = state_bytes;
  return c;
}

ContextBytes ContextCost(const FamilyModel& model, int block_tokens, int64_t tokens) {
  const SequenceCache fresh = model.NewSequence();
  return ContextCost(model.cache_floats_per_token(), block_tokens, RecurrentStateBytes(fresh), tokens);
}

int64_t PoolTokensFor(int64_t budget_bytes, size_t floats_per_token, int block_tokens, int64_t state_bytes,
                      int sequences) {
  const int64_t block_bytes =
      static_cast<int64_t>(block_tokens) * static_cast<int64_t>(std::max<size_t>(floats_per_token, 1)) *
      static_cast<int64_t>(sizeof(float));
  const int64_t for_blocks = budget_bytes - state_bytes * std::max(sequences, 0);
  const int64_t blocks = std::max<int64_t>(for_blocks / std::max<int64_t>(block_bytes, 1), 1);
  return blocks * block_tokens;
}

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace moeserve::engine
