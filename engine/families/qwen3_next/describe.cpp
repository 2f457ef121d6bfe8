// DescribeQwen3Next (qwen3_next_info.hpp).
#include <cstdio>
#include <map>

#include "families/qwen3_next/config.hpp"
#include "moeserve/engine/dtype.hpp"
#include "moeserve/engine/qwen3_next_info.hpp"
#include "moeserve/engine/safetensors.hpp"

namespace moeserve::engine {

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
    const double n = static_cast<double>(t->numel());
    bytes[std::string(DTypeName(t->dtype))] += n * static_cast<double>(DTypeSize(t->dtype));
    if (t->name.rfind("mtp.", 0) == 0) {
      mtp += n;
      continue;
    }
    total += n;
    if (t->name.find(".mlp.experts.") != std::string::npos) routed += n;
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
  std::snprintf(buf, sizeof buf, "parameters     %.3fB total, %.3fB active per token\n", total / 1e9, active / 1e9);
  out += buf;
  if (mtp > 0) {
    std::snprintf(buf, sizeof buf, "mtp            %.3fB parameters (multi-token prediction: speculative drafts when asked)\n", mtp / 1e9);
    out += buf;
  }
  for (const auto& [dtype, b] : bytes) {
    std::snprintf(buf, sizeof buf, "bytes %-8s %.3f GB\n", dtype.c_str(), b / 1e9);
    out += buf;
  }
  return out;
}

}  // namespace moeserve::engine
