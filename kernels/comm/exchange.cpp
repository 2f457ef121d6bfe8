#include "moeserve/kernels/comm/exchange.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

namespace moeserve::kernels::comm {

int64_t RowExchange::total_recv() const { return std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0}); }

CommResult<RowExchange> PlanSend(std::span<const int> dest, int world) {
  RowExchange plan;
  plan.world = world;
  plan.send_rows.assign(static_cast<size_t>(world), 0);
  for (size_t i = 0; i < dest.size(); ++i) {
    if (dest[i] < 0 || dest[i] >= world)
      return CommFail("row " + std::to_string(i) + " is sent to rank " + std::to_string(dest[i]) + ", outside a world of " +
                      std::to_string(world));
    plan.send_rows[static_cast<size_t>(dest[i])]++;
  }
  // Counting sort by destination, stable.
  std::vector<int64_t> next(static_cast<size_t>(world), 0);
  for (int r = 1; r < world; ++r) next[static_cast<size_t>(r)] = next[static_cast<size_t>(r) - 1] + plan.send_rows[static_cast<size_t>(r) - 1];
  plan.order.resize(dest.size());
  for (size_t i = 0; i < dest.size(); ++i) plan.order[static_cast<size_t>(next[static_cast<size_t>(dest[i])]++)] = static_cast<int64_t>(i);
  return plan;
}

CommResult<RowExchange> PlanRows(Communicator& comm, std::span<const int> dest, int64_t max_rows_per_peer) {
  auto plan = PlanSend(dest, comm.size());
  if (!plan) return plan;
  auto recv = comm.ExchangeCounts(plan->send_rows);
  if (!recv) return std::unexpected(recv.error());
  for (size_t r = 0; r < recv->size(); ++r) {
    const int64_t n = (*recv)[r];
    if (n < 0) return CommFail("counts exchange: a peer announced a negative row count");
    if (n > max_rows_per_peer)
      return CommFail("counts exchange: rank " + std::to_string(r) + " announced " + std::to_string(n) +
                      " rows, more than the " + std::to_string(max_rows_per_peer) + " the batch allows");
  }
  plan->recv_rows = std::move(*recv);
  return plan;
}

void PackRows(const RowExchange& plan, const float* rows, size_t width, float* packed) {
  for (size_t p = 0; p < plan.order.size(); ++p)
    std::memcpy(packed + p * width, rows + static_cast<size_t>(plan.order[p]) * width, width * sizeof(float));
}

void UnpackRows(const RowExchange& plan, const float* packed, size_t width, float* rows) {
  for (size_t p = 0; p < plan.order.size(); ++p)
    std::memcpy(rows + static_cast<size_t>(plan.order[p]) * width, packed + p * width, width * sizeof(float));
}

namespace {

std::vector<int64_t> Bytes(const std::vector<int64_t>& rows, size_t width) {
  std::vector<int64_t> b(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) b[i] = rows[i] * static_cast<int64_t>(width * sizeof(float));
  return b;
}

}  // namespace

CommResult<std::vector<float>> DispatchRows(Communicator& comm, const RowExchange& plan, const float* rows, size_t width) {
  std::vector<float> packed(plan.order.size() * width);
  PackRows(plan, rows, width, packed.data());
  std::vector<float> recv(static_cast<size_t>(plan.total_recv()) * width);
  auto st = comm.AllToAllV(packed.data(), Bytes(plan.send_rows, width), recv.data(), Bytes(plan.recv_rows, width));
  if (!st) return std::unexpected(st.error());
  return recv;
}

CommResult<std::vector<float>> CombineRows(Communicator& comm, const RowExchange& plan, const float* answers,
                                           size_t width) {
  std::vector<float> packed(plan.order.size() * width);
  auto st = comm.AllToAllV(answers, Bytes(plan.recv_rows, width), packed.data(), Bytes(plan.send_rows, width));
  if (!st) return std::unexpected(st.error());
  std::vector<float> rows(packed.size());
  UnpackRows(plan, packed.data(), width, rows.data());
  return rows;
}

CommResult<std::vector<float>> AllGatherRows(Communicator& comm, std::span<const float> rows, size_t width,
                                             int64_t max_rows_per_peer) {
  const int W = comm.size();
  if (width == 0 || rows.size() % width != 0) return CommFail("all-gather: rows are not a whole number of rows");
  const int64_t n = static_cast<int64_t>(rows.size() / width);
  auto recv_rows = comm.ExchangeCounts(std::vector<int64_t>(static_cast<size_t>(W), n));
  if (!recv_rows) return std::unexpected(recv_rows.error());
  for (size_t r = 0; r < recv_rows->size(); ++r) {
    const int64_t c = (*recv_rows)[r];
    if (c < 0) return CommFail("all-gather: a peer announced a negative row count");
    if (c > max_rows_per_peer)
      return CommFail("all-gather: rank " + std::to_string(r) + " announced " + std::to_string(c) + " rows, more than the " +
                      std::to_string(max_rows_per_peer) + " the batch allows");
  }
  std::vector<float> send(rows.size() * static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) std::copy(rows.begin(), rows.end(), send.begin() + static_cast<ptrdiff_t>(rows.size()) * r);
  std::vector<int64_t> send_bytes(static_cast<size_t>(W), n * static_cast<int64_t>(width * sizeof(float)));
  std::vector<int64_t> recv_bytes = Bytes(*recv_rows, width);
  int64_t total = std::accumulate(recv_rows->begin(), recv_rows->end(), int64_t{0});
  std::vector<float> out(static_cast<size_t>(total) * width);
  auto st = comm.AllToAllV(send.data(), send_bytes, out.data(), recv_bytes);
  if (!st) return std::unexpected(st.error());
  return out;
}

CommResult<std::vector<uint8_t>> BroadcastBytes(Communicator& comm, std::vector<uint8_t> message, int root) {
  uint64_t size = message.size();
  auto st = comm.Broadcast(&size, sizeof(size), root);
  if (!st) return std::unexpected(st.error());
  // A bound on what a follower allocates for a message it has not seen yet.
  constexpr uint64_t kMaxMessage = uint64_t{1} << 30;
  if (size > kMaxMessage) return CommFail("broadcast: announced message of " + std::to_string(size) + " bytes is too large");
  message.resize(size);
  if (size > 0) {
    st = comm.Broadcast(message.data(), size, root);
    if (!st) return std::unexpected(st.error());
  }
  return message;
}

}  // namespace moeserve::kernels::comm
