// The exchange checks every communicator backend must pass, run by one rank:
// a counts exchange, a dispatch with an uneven destination pattern (some
// ranks get nothing from some others), a combine that must bring each row's
// answer back to its original position, an all-gather, a broadcast and a
// barrier. Returns "" when everything matched, else what did not.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "moeserve/kernels/comm/exchange.hpp"

namespace moeserve::kernels::comm::testing {

// Row i of rank r: width values encoding (r, i, column).
inline float Cell(int r, int i, size_t c) { return static_cast<float>(r * 100000 + i * 10 + static_cast<int>(c % 10)); }
// The uneven pattern: rank r sends row i to dest(r, i); rank W-1 gets most.
inline int Dest(int r, int i, int W) { return (i % 3 == 0) ? (r + i) % W : W - 1; }

inline std::string RunExchangeChecks(Communicator& comm) {
  const int W = comm.size(), me = comm.rank();
  const size_t width = 6;
  const int rows = 5 + 3 * me;  // ranks hold different numbers of rows
  std::vector<int> dest(static_cast<size_t>(rows));
  std::vector<float> x(static_cast<size_t>(rows) * width);
  for (int i = 0; i < rows; ++i) {
    dest[static_cast<size_t>(i)] = Dest(me, i, W);
    for (size_t c = 0; c < width; ++c) x[static_cast<size_t>(i) * width + c] = Cell(me, i, c);
  }
  const int64_t most = 5 + 3 * (W - 1);  // the most rows any rank holds
  auto plan = PlanRows(comm, dest, most);
  if (!plan) return "plan: " + plan.error().message;
  // What each source sends here, recomputed independently.
  std::vector<float> expect;
  for (int r = 0; r < W; ++r) {
    const int n = 5 + 3 * r;
    int64_t count = 0;
    for (int i = 0; i < n; ++i)
      if (Dest(r, i, W) == me) {
        ++count;
        for (size_t c = 0; c < width; ++c) expect.push_back(Cell(r, i, c));
      }
    if (plan->recv_rows[static_cast<size_t>(r)] != count)
      return "counts from rank " + std::to_string(r) + ": " + std::to_string(plan->recv_rows[static_cast<size_t>(r)]) +
             " != " + std::to_string(count);
  }
  auto got = DispatchRows(comm, *plan, x.data(), width);
  if (!got) return "dispatch: " + got.error().message;
  if (*got != expect) return "dispatch delivered different rows";
  // The owner answers 2v + its rank; the source must see that per row, in place.
  std::vector<float> answers(got->size());
  for (size_t k = 0; k < got->size(); ++k) answers[k] = 2 * (*got)[k] + static_cast<float>(me);
  auto back = CombineRows(comm, *plan, answers.data(), width);
  if (!back) return "combine: " + back.error().message;
  if (back->size() != x.size()) return "combine returned the wrong number of rows";
  for (int i = 0; i < rows; ++i)
    for (size_t c = 0; c < width; ++c) {
      const float want = 2 * Cell(me, i, c) + static_cast<float>(dest[static_cast<size_t>(i)]);
      if ((*back)[static_cast<size_t>(i) * width + c] != want) return "combine: row " + std::to_string(i) + " came back wrong";
    }
  auto all = AllGatherRows(comm, x, width, most);
  if (!all) return "all-gather: " + all.error().message;
  std::vector<float> all_expect;
  for (int r = 0; r < W; ++r)
    for (int i = 0; i < 5 + 3 * r; ++i)
      for (size_t c = 0; c < width; ++c) all_expect.push_back(Cell(r, i, c));
  if (*all != all_expect) return "all-gather delivered different rows";
  const int root = W - 1;
  std::vector<uint8_t> msg;
  if (me == root) msg = {1, 2, 3, static_cast<uint8_t>(W)};
  auto b = BroadcastBytes(comm, msg, root);
  if (!b) return "broadcast: " + b.error().message;
  if (*b != std::vector<uint8_t>{1, 2, 3, static_cast<uint8_t>(W)}) return "broadcast delivered different bytes";
  if (auto st = comm.Barrier(); !st) return "barrier: " + st.error().message;
  return "";
}

}  // namespace moeserve::kernels::comm::testing
