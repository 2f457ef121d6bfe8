// Writes a complete model directory (config.json, safetensors shards with
// MXFP4 experts, model.safetensors.index.json, tokenizer.json, manifest.json)
// for any valid configuration, deterministically from a seed: the same
// (config, seed) gives byte-identical files. Each tensor draws from its own
// stream keyed by (seed, tensor name), so changing one field that does not
// change a tensor's shape (index_topk, say) leaves that tensor's bytes alone.
#pragma once

#include <cstdint>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/model_config.hpp"

namespace moeserve::engine {

struct ModelGenOptions {
  ModelConfig config;
  uint64_t seed = 1;
  // A new shard starts when adding a tensor would pass this size.
  uint64_t max_shard_bytes = 64ull << 20;
};

// Generates into out_dir.partial and renames it to out_dir when complete, so
// a reader never sees a half-written model. Refuses an existing out_dir.
Status GenerateModel(const ModelGenOptions& options, const std::string& out_dir);

}  // namespace moeserve::engine
