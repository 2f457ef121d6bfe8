// Opens a model directory as the engine needs it: config.json parsed and
// validated, every checkpoint tensor present with the right dtype and shape,
// tokenizer.json consistent with the config. Optionally verifies manifest.json.
#pragma once

#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::engine {

struct ModelDir {
  std::string path;
  ModelConfig config;
  Checkpoint checkpoint;
  Tokenizer tokenizer;
  std::vector<std::string> warnings;
};

struct OpenModelOptions {
  bool verify_manifest = false;  // sha256 every file listed in manifest.json
};

Result<ModelDir> OpenModelDir(const std::string& path, const OpenModelOptions& options = {});

}  // namespace moeserve::engine
