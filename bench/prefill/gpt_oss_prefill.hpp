// bench_prefill on a gpt-oss checkpoint directory (config.json model_type
// "gpt_oss"), the model alone (no tokenizer needed), its kernels chosen as
// the engine's family load chooses them (the reference kernels stay fp32).
// It times whole prefills and holds them to the bound of their logical
// work: every product (attention
// and expert projections, the router, attention's scores and weighted sums
// over the keys each layer reads, the head on each chunk's last row) at the
// fp32 FMA peak, or at the BF16 dot-product peak with --bf16-activations;
// then the forward's own part timers (ForwardTrace::profile) summed over the
// timed runs: ms per token, share and GFLOP/s of the projections, attention,
// experts, glue and the head.
#pragma once

#include <string>
#include <vector>

namespace moeserve::bench {

struct GptOssPrefillArgs {
  std::string model;
  std::vector<int> lengths;
  int chunk = 0;  // 0: the engine's block for a prompt alone (GptOssModel::idle_prefill_rows)
  int repeat = 1;
  bool reference = false, bf16_activations = false, ceilings = true;
};

// Prints each length's tokens/s (every run, then the median) and its share of
// the bound; 0, or 1 with the error on stderr.
int RunGptOssPrefill(const GptOssPrefillArgs& args);

}  // namespace moeserve::bench
