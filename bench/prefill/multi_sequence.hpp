// bench_prefill --sequences N: N prompts of the same length prefilled as the
// engine's step lays them out (engine.cpp Advance: with nothing decoding,
// each forward pass gives the prompts, in order, up to `chunk` rows in all,
// one segment per prompt) against the same prompts one after another (each
// alone in passes of up to `chunk` rows), in alternating rounds. Prints each
// round's tokens/s and share of the bound of its work (prefill_bound.hpp),
// the medians, their ratio, and how far the last-row logits of the two
// layouts differ (they are the same computation, batched).
#pragma once

#include "moeserve/engine/family.hpp"
#include "prefill_bound.hpp"

namespace moeserve::bench {

struct MultiSequenceArgs {
  int tokens = 512;    // each prompt's length
  int sequences = 4;   // N prompts
  int chunk = 2048;    // rows a forward pass takes at most (the engine's prefill budget)
  int rounds = 3;      // each round runs both layouts, the order alternating
  int vocab = 0;
  Ceilings ceilings;   // all zero: no bound printed
  bool dot_products = false;
};

// 0, or 1 with the error on stderr.
int RunMultiSequencePrefill(const engine::FamilyModel& model, const MultiSequenceArgs& args);

}  // namespace moeserve::bench
