// Row exchanges over a Communicator, shared by every backend: the engine's
// expert-parallel dispatch (token rows to the ranks that own their experts),
// combine (the answers back, in the caller's row order) and the all-gather
// that rebuilds the replicated hidden state. Rows are fixed-width fp32.
//
// Packing is stable: rows for one destination keep the caller's order, and
// the receiver sees source rank 0's rows first. Combine is Dispatch reversed,
// so a rank answers the rows it received in the order it received them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moeserve/kernels/comm/communicator.hpp"

namespace moeserve::kernels::comm {

struct RowExchange {
  int world = 1;
  std::vector<int64_t> send_rows;  // [world] rows this rank sends to each rank
  std::vector<int64_t> recv_rows;  // [world] rows each rank sends to this one
  std::vector<int64_t> order;      // packed position p holds the caller's row order[p]
  int64_t total_recv() const;
};

// The send side of a plan from each row's destination (no communication):
// recv_rows is left empty. Fails on a destination outside [0, world).
CommResult<RowExchange> PlanSend(std::span<const int> dest, int world);
// PlanSend, then the counts exchange that fills recv_rows. A peer that
// announces more than `max_rows_per_peer` rows (what the model's shapes
// allow it to send: its share of the batch times the experts per token) is
// an error before anything is allocated for them.
CommResult<RowExchange> PlanRows(Communicator& comm, std::span<const int> dest, int64_t max_rows_per_peer);

// rows [dest.size(), width] in the caller's order -> packed by destination.
void PackRows(const RowExchange& plan, const float* rows, size_t width, float* packed);
// packed [dest.size(), width] by destination -> the caller's order.
void UnpackRows(const RowExchange& plan, const float* packed, size_t width, float* rows);

// Sends each row to its destination; returns [total_recv(), width], by source rank.
CommResult<std::vector<float>> DispatchRows(Communicator& comm, const RowExchange& plan, const float* rows, size_t width);
// Sends answers [total_recv(), width] (in received order) back to where the
// rows came from; returns [dest.size(), width] in the caller's original order.
CommResult<std::vector<float>> CombineRows(Communicator& comm, const RowExchange& plan, const float* answers,
                                           size_t width);
// Every rank contributes its rows; returns all ranks' rows, rank 0's first.
// A peer announcing more than `max_rows_per_peer` rows is an error before
// anything is allocated for them.
CommResult<std::vector<float>> AllGatherRows(Communicator& comm, std::span<const float> rows, size_t width,
                                             int64_t max_rows_per_peer);

// A variable-length byte message from root to every rank (the size first).
CommResult<std::vector<uint8_t>> BroadcastBytes(Communicator& comm, std::vector<uint8_t> message, int root);

}  // namespace moeserve::kernels::comm
