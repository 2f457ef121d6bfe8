// The MoE FFN across an expert-parallel group (model.md 6): every rank holds
// the same hidden states (attention and dense layers run replicated), owns
// experts [rank * E/W, (rank + 1) * E/W), and answers for a slice of the
// batch's tokens. Per layer:
//   1. route every token (replicated: the gate is small, and the per-expert
//      counts then agree on every rank);
//   2. shared experts (gated, where the family has a shared gate) for this
//      rank's token slice, on a helper thread that
//      overlaps the dispatch, the owners' compute and the combine;
//   3. dispatch: each (token, expert) pair of the slice goes, as the token's
//      row plus the expert id, to the rank that owns the expert;
//   4. each rank runs its experts over the rows it received;
//   5. combine: the expert outputs go back to the slice's rank, which adds
//      them weighted, in ascending expert order per token, exactly as the
//      single-process MoeFfn does;
//   6. all-gather the slices so every rank again holds all rows.
// Step 6 exists because attention is replicated; it is the price of keeping
// non-MoE layers identical on every rank.
#include <algorithm>
#include <exception>
#include <thread>

#include "layers.hpp"
#include "moeserve/common/exception_text.hpp"
#include "moe_parallel.hpp"
#include "moeserve/kernels/comm/exchange.hpp"
#include "moeserve/kernels/cpu_ops.hpp"

namespace moeserve::engine {

namespace {

Error CommError(const char* step, const kernels::comm::CommError& e) {
  return Error::Unavailable(std::string("expert-parallel ") + step + ": " + e.message);
}

}  // namespace

Status MoeFfnParallel(const ModelConfig& cfg, const LayerWeights& w, const float* x, int n, float* out,
                      std::vector<uint64_t>* expert_tokens, const kernels::KernelSet& k, kernels::comm::Communicator& comm,
                      ExpertParallelStats& stats) {
  namespace comm_ns = kernels::comm;
  const MoeConfig& m = cfg.moe;
  const int D = cfg.hidden_size, E = m.num_experts, I = m.moe_intermediate_size;
  const int W = comm.size(), me = comm.rank(), per_rank = E / W;
  const int lo = static_cast<int>(static_cast<int64_t>(n) * me / W), hi = static_cast<int>(static_cast<int64_t>(n) * (me + 1) / W);
  const int ns = hi - lo;

  // 1. Routing of every token; only the slice's pairs are kept, per token in
  // ascending expert order (the order their outputs are added in).
  std::vector<float> logits(static_cast<size_t>(n) * E);
  Linear(w.gate, x, n, logits.data(), k);
  struct Pair {
    int t, e;
    float wt;
  };
  std::vector<Pair> pairs;
  std::vector<std::pair<int, float>> picks;
  for (int t = 0; t < n; ++t) {
    RouteToken(cfg, w, &logits[static_cast<size_t>(t) * E], picks);
    for (const auto& [e, wt] : picks) {
      if (expert_tokens) (*expert_tokens)[e]++;
      stats.rank_rows[static_cast<size_t>(e / per_rank)]++;
    }
    if (t < lo || t >= hi) continue;
    std::sort(picks.begin(), picks.end());
    for (const auto& [e, wt] : picks) pairs.push_back({t, e, wt});
  }

  // 2. Shared experts for the slice, on a helper thread while the routed
  // rows travel and the owners compute (the collectives mostly wait on
  // peers). It writes only `slice`, read after the join in step 5.
  std::vector<float> slice(static_cast<size_t>(ns) * D, 0.0f);
  std::exception_ptr shared_error;
  std::thread shared;
  if (m.num_shared_experts > 0 && ns > 0) {
    shared = std::thread([&] {
      try {
        const float* xs = x + static_cast<size_t>(lo) * D;
        std::vector<float> sh1(static_cast<size_t>(ns) * w.shared_w1.rows), sh3(sh1.size());
        LinearMany({{&w.shared_w1, xs, sh1.data()}, {&w.shared_w3, xs, sh3.data()}}, ns, k);
        k.silu_mul(sh1.data(), sh3.data(), sh1.data(), sh1.size());
        Linear(w.shared_w2, sh1.data(), ns, slice.data(), k);
        if (w.shared_gate.rows == 1) {
          // A gated shared expert (Qwen3-Next), as MoeFfn: out *= sigmoid(shared_gate x).
          std::vector<float> sg(static_cast<size_t>(ns));
          Linear(w.shared_gate, xs, ns, sg.data(), k);
          for (int t = 0; t < ns; ++t) {
            const float gt = kernels::Sigmoid(sg[static_cast<size_t>(t)]);
            for (int j = 0; j < D; ++j) slice[static_cast<size_t>(t) * D + j] *= gt;
          }
        }
      } catch (...) {
        shared_error = std::current_exception();
      }
    });
  }
  // Joined on every way out, errors included.
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{shared};

  // 3. Dispatch: row = [x_t | expert id].
  const size_t width = static_cast<size_t>(D) + 1;
  std::vector<int> dest(pairs.size());
  std::vector<float> rows(pairs.size() * width);
  for (size_t p = 0; p < pairs.size(); ++p) {
    dest[p] = pairs[p].e / per_rank;
    std::copy_n(x + static_cast<size_t>(pairs[p].t) * D, D, &rows[p * width]);
    rows[p * width + D] = static_cast<float>(pairs[p].e);
  }
  // What a peer may announce: its slice (at most ceil(n / W) tokens) times
  // the experts each token picks; more is a broken or hostile peer, refused
  // before the receive buffer is sized by it.
  const int64_t max_slice = (static_cast<int64_t>(n) + W - 1) / W;
  auto plan = comm_ns::PlanRows(comm, dest, max_slice * m.experts_per_token);
  if (!plan) return Fail(CommError("counts exchange", plan.error()));
  auto recv = comm_ns::DispatchRows(comm, *plan, rows.data(), width);
  if (!recv) return Fail(CommError("dispatch", recv.error()));

  // 4. This rank's experts over what it received, grouped by expert.
  const int64_t R = plan->total_recv();
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(per_rank));
  for (int64_t i = 0; i < R; ++i) {
    const float id = (*recv)[static_cast<size_t>(i) * width + D];
    const int e = static_cast<int>(id);
    if (static_cast<float>(e) != id || e < w.first_expert || e >= w.first_expert + per_rank)
      return Fail(Error::Internal("expert-parallel dispatch: rank " + std::to_string(me) + " received a row for expert " +
                                  std::to_string(id) + ", which it does not own"));
    by_expert[static_cast<size_t>(e - w.first_expert)].push_back(i);
  }
  std::vector<ExpertRows> work;
  std::vector<std::vector<float>> inputs;
  for (int le = 0; le < per_rank; ++le) {
    const auto& idx = by_expert[static_cast<size_t>(le)];
    if (idx.empty()) continue;
    inputs.emplace_back(idx.size() * static_cast<size_t>(D));
    for (size_t j = 0; j < idx.size(); ++j)
      std::copy_n(&(*recv)[static_cast<size_t>(idx[j]) * width], D, &inputs.back()[j * D]);
    work.push_back({w.first_expert + le, static_cast<int>(idx.size()), inputs.back().data(), {}, {}, {}});
  }
  RunExperts(w, work, D, I, k);
  std::vector<float> answers(static_cast<size_t>(R) * D);
  for (const ExpertRows& r : work) {
    const auto& idx = by_expert[static_cast<size_t>(r.e - w.first_expert)];
    for (size_t j = 0; j < idx.size(); ++j)
      std::copy_n(&r.ye[j * D], D, &answers[static_cast<size_t>(idx[j]) * D]);
  }
  stats.computed_rows += static_cast<uint64_t>(R);

  // 5. Combine: outputs back in pair order, added with the routing weights
  // onto the shared experts' output.
  auto back = comm_ns::CombineRows(comm, *plan, answers.data(), static_cast<size_t>(D));
  if (!back) return Fail(CommError("combine", back.error()));
  if (shared.joinable()) shared.join();
  if (shared_error) return Fail(Error::Internal("expert-parallel shared experts: " + ExceptionText(shared_error)));
  for (size_t p = 0; p < pairs.size(); ++p) {
    float* o = &slice[static_cast<size_t>(pairs[p].t - lo) * D];
    const float* y = &(*back)[p * D];
    for (int j = 0; j < D; ++j) o[j] += pairs[p].wt * y[j];
  }

  // 6. Every rank gets every slice, rank 0's first: the rows in batch order.
  auto all = comm_ns::AllGatherRows(comm, slice, static_cast<size_t>(D), max_slice);
  if (!all) return Fail(CommError("all-gather", all.error()));
  if (all->size() != static_cast<size_t>(n) * D)
    return Fail(Error::Internal("expert-parallel all-gather returned " + std::to_string(all->size() / D) + " rows, " +
                                std::to_string(n) + " expected"));
  std::copy(all->begin(), all->end(), out);
  stats.layers++;
  return Ok();
}

}  // namespace moeserve::engine
