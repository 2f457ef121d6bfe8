// The expert-parallel MoE FFN (see moe_parallel.cpp for the steps).
#pragma once

#include <cstdint>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/comm/communicator.hpp"
#include "weights.hpp"

namespace moeserve::kernels {
struct KernelSet;
}

namespace moeserve::engine {

// Same result as MoeFfn (model.md 10: 1e-4 * max|ref|) on every rank.
// Errors: kUnavailable when a collective fails (the group must re-form).
Status MoeFfnParallel(const ModelConfig& config, const LayerWeights& w, const float* x, int n, float* out,
                      std::vector<uint64_t>* expert_tokens, const kernels::KernelSet& k, kernels::comm::Communicator& comm,
                      ExpertParallelStats& stats);

}  // namespace moeserve::engine
