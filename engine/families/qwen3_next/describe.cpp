// DescribeQwen3Next (qwen3_next_info.hpp).
#include <cstdio>
#include <map>

#include "families/qwen3_next/config.hpp"
#include "moeserve/engine/dtype.hpp"
#include "moeserve/engine/qwen3_next_info.hpp"
#include "moeserve/engine/safetensors.hpp"

namespace moeserve::engine {

// A published directory names each routed expert's matrices
// model.layers.N.mlp.experts.E.*; a converted one (WriteConverted) stacks
// them as layers.N.ffn.experts.w13 / w2 (.weight in BF16, .blocks and
// .scales in MXFP4).
bool IsQwen3NextRoutedExpert(std::string_view name) {
  return name.find(".mlp.experts.") != std::string_view::npos || name.find(".ffn.experts.") != std::string_view::npos;
}

// Parameters a tensor holds: its elements, except a converted directory's
// MXFP4 experts, whose .blocks bytes hold two 4-bit values each and whose
// .scales are per-block exponents, not parameters.
double Qwen3NextTensorParameters(std::string_view name, double elements) {
  if (name.find(".ffn.experts.") == std::string_view::npos) return elements;
  if (name.ends_with(".blocks")) return 2 * elements;
  if (name.ends_with(".scales")) return 0;
  return elements;
}

Result<std::string> DescribeQwen3Next(const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(qwen3_next::Config c, qwen3_next::LoadConfig(dir));
  MOE_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::Open(dir));
  int full = 0, moe = 0;
  for (int i = 0; i < c.num_layers; ++i) {
    full += c.full_attention[static_cast<size_t>(i)] ? 1 : 0;
    moe += c.sparse[static_cast<size_t>(i)] ? 1 : 0;
  }
  double total = 0, routed = 0, mtp = 0;
  std::map<std::string, double> bytes;
  for (const TensorView* t : ck.AllTensors()) {
    const double elements = static_cast<double>(t->numel());
    bytes[std::string(DTypeName(t->dtype))] += elements * static_cast<double>(DTypeSize(t->dtype));
    const double n = Qwen3NextTensorParameters(t->name, elements);
    if (t->name.rfind("mtp.", 0) == 0) {
      mtp += n;
      continue;
    }
    total += n;
    if (IsQwen3NextRoutedExpert(t->name)) routed += n;
  }
  const double active =
      total - (c.num_experts > 0 ? routed * (1.0 - static_cast<double>(c.experts_per_token) / c.num_experts) : 0.0);
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf, "family         qwen3_next (%zu shard%s)\n", ck.shards().size(),
                ck.shards().size() == 1 ? "" : "s");
  out += buf;
  std::snprintf(buf, sizeof buf, "layers         %d: %d Gated DeltaNet, %d gated attention; %d MoE, %d dense MLP\n",
                c.num_layers, c.num_layers - full, full, moe, c.num_layers - moe);
  out += buf;
  std::snprintf(buf, sizeof buf, "experts        %d, top-%d%s, shared expert %d wide\n", c.num_experts,
                c.experts_per_token, c.norm_topk_prob ? " (renormalised)" : "", c.shared_expert_intermediate_size);
  out += buf;
  std::snprintf(buf, sizeof buf, "hidden         %d, vocab %d, context %lld\n", c.hidden_size, c.vocab_size,
                static_cast<long long>(c.max_position_embeddings));
  out += buf;
  // Billions, millions, or the count itself (a test checkpoint's experts).
  const auto count = [](double x) {
    char c[32];
    if (x >= 1e9) std::snprintf(c, sizeof c, "%.3fB", x / 1e9);
    else if (x >= 1e6) std::snprintf(c, sizeof c, "%.3fM", x / 1e6);
    else std::snprintf(c, sizeof c, "%.0f", x);
    return std::string(c);
  };
  std::snprintf(buf, sizeof buf, "parameters     %s total, %s routed, %s active per token\n", count(total).c_str(),
                count(routed).c_str(), count(active).c_str());
  out += buf;
  if (mtp > 0) {
    std::snprintf(buf, sizeof buf, "mtp            %s parameters (multi-token prediction: speculative drafts when asked)\n",
                  count(mtp).c_str());
    out += buf;
  }
  for (const auto& [dtype, b] : bytes) {
    std::snprintf(buf, sizeof buf, "bytes %-8s %.3f GB\n", dtype.c_str(), b / 1e9);
    out += buf;
  }
  return out;
}

}  // namespace moeserve::engine
