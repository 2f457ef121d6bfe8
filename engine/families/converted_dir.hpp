// A converted model directory written tensor by tensor (`moe-daemon publish
// --experts`, FamilyEntry::write_converted) for the families whose
// converted tensors come from a TensorSource (moe-dsa-v1, qwen3_next): each
// tensor is made, appended to its shard and dropped before the next, so
// converting needs no more memory than the largest tensor (one layer's
// stacked routed experts). Internal to the families.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/tensor_source.hpp"

namespace moeserve::engine::families {

struct ConvertedDirPlan {
  std::vector<std::string> names;     // the tensors, written in this order
  TensorSource* source = nullptr;     // makes each of them
  std::string config_json;            // the converted directory's config.json
  uint64_t max_shard_bytes = 4ull << 30;
};

// Writes OUT: shards model-NNNNN-of-MMMMM.safetensors and their index, the
// plan's config.json, and DIR's other regular files copied as they are
// (tokenizer, chat template; not DIR's *.safetensors, index, config.json or
// manifest.json). Refused if OUT exists; written into OUT.partial and
// renamed when complete, so an OUT that exists is whole.
Status WriteConvertedDir(const std::string& dir, const std::string& out, const ConvertedDirPlan& plan);

// Copies DIR's regular files other than the checkpoint itself (tokenizer
// files, chat templates, generation config: what the model's other readers
// need, as published) into `partial`, each fsynced; not *.safetensors, the
// index, config.json or manifest.json, which a converted directory writes
// anew. Used by every family's converted-directory writer.
Status CopySideFiles(const std::string& dir, const std::string& partial);

// DIR/config.json (key order kept) with the marker a converted directory
// carries: "moeserve_converted": {"routed_experts": "mxfp4" | "bf16"}.
Result<nlohmann::ordered_json> ConvertedConfig(const std::string& dir, ExpertFormat experts);

// The marker of DIR/config.json (nullopt when it has none); an unknown format
// or a marker of the wrong kind is refused, naming the field.
Result<std::optional<ExpertFormat>> ConvertedMarker(const std::string& dir);

}  // namespace moeserve::engine::families
