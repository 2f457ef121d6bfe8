// FairShareOrder (engine.hpp): admission round-robin across tenants.
#include <algorithm>
#include <map>
#include <numeric>

#include "moeserve/engine/engine.hpp"

namespace moeserve::engine {

std::vector<size_t> FairShareOrder(const std::vector<std::string>& tenants) {
  // A sequence's rank is how many of its tenant's sequences arrived before
  // it; admission goes by rank, and within a rank by arrival.
  std::vector<size_t> rank(tenants.size());
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < tenants.size(); ++i) rank[i] = seen[tenants[i]]++;
  std::vector<size_t> order(tenants.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank[a] < rank[b]; });
  return order;
}

}  // namespace moeserve::engine
