#include "moeserve/engine/model_dir.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "moeserve/engine/families/deepseek_v32.hpp"
#include "moeserve/engine/manifest.hpp"
#include "moeserve/engine/tensor_layout.hpp"

namespace moeserve::engine {

namespace fs = std::filesystem;

Result<ModelDir> OpenModelDir(const std::string& path, const OpenModelOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return Fail(Error::NotFound(path + ": not a model directory"));
  if (options.verify_manifest) {
    fs::path mpath = fs::path(path) / "manifest.json";
    std::ifstream in(mpath);
    if (!in) return Fail(Error::NotFound(mpath.string() + ": missing (needed to verify the model)"));
    std::stringstream ss;
    ss << in.rdbuf();
    MOE_ASSIGN_OR_RETURN(Manifest manifest, ParseManifest(ss.str(), mpath.string()));
    MOE_TRY(VerifyManifest(manifest, path));
  }
  if (deepseek_v32::IsModelDir(path)) return deepseek_v32::OpenDir(path);
  MOE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig((fs::path(path) / "config.json").string()));
  MOE_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(path));
  std::vector<std::string> warnings;
  MOE_TRY(ValidateCheckpoint(checkpoint, config, &warnings));
  MOE_ASSIGN_OR_RETURN(Tokenizer tokenizer,
                       Tokenizer::FromFile((fs::path(path) / "tokenizer.json").string(), config.vocab_size));
  // FromFile takes config.json's vocab_size as the vocabulary (ids past the
  // file's are padding); anything else is a bug, checked here once more.
  if (tokenizer.vocab_size() != config.vocab_size)
    return Fail(Error::Corruption((fs::path(path) / "tokenizer.json").string(),
                                  "vocabulary of " + std::to_string(tokenizer.vocab_size()) +
                                      " tokens but config.json vocab_size is " + std::to_string(config.vocab_size)));
  return ModelDir{path, std::move(config), std::move(checkpoint), std::move(tokenizer), std::move(warnings)};
}

}  // namespace moeserve::engine
