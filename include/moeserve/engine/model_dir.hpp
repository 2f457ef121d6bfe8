// Opens a model directory as the engine needs it: config.json parsed and
// validated, every checkpoint tensor present with the right dtype and shape,
// tokenizer.json consistent with the config. Optionally verifies manifest.json.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tensor_source.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::engine {

struct ModelDir {
  std::string path;
  ModelConfig config;
  Checkpoint checkpoint;
  Tokenizer tokenizer;
  std::vector<std::string> warnings;
  // "moe-dsa-v1", or the published family a directory was converted from
  // ("deepseek_v32": engine/families/deepseek_v32).
  std::string family = "moe-dsa-v1";
  // When set, Model::Load reads the weights from here instead of
  // `checkpoint` (then empty): a family converting its published checkpoint
  // tensor by tensor while the model loads (deepseek_v32::OpenDirStreamed).
  // Each request converts the tensor anew.
  std::shared_ptr<TensorSource> source = nullptr;
};

struct OpenModelOptions {
  bool verify_manifest = false;  // sha256 every file listed in manifest.json
};

// A directory whose config.json has model_type "deepseek_v32" opens through
// that family (families/deepseek_v32.hpp).
Result<ModelDir> OpenModelDir(const std::string& path, const OpenModelOptions& options = {});

}  // namespace moeserve::engine
