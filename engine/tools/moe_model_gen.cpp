// moe-model-gen: writes a complete, deterministic moe-dsa-v1 model directory.
//
//   moe-model-gen --preset tiny|small|long [--config FILE] [--seed N] [--index-topk N]
//                 [--shard-mb N] [--expert-format mxfp4|bf16] [--vision] [--mtp N] --out DIR
//
// --mtp 1 adds a random multi-token-prediction module (model.md 15:
// num_nextn_predict_layers and the mtp.0.* tensors); --mtp 0 leaves it out
// whatever the config says.
// --expert-format bf16 writes the routed experts as BF16 tensors (model.md
// 1.2); for one seed they hold the values the MXFP4 checkpoint encodes.
// Without it the config's quantization.format decides (the presets: mxfp4).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_gen.hpp"

using namespace moeserve;
using namespace moeserve::engine;

namespace {

int Usage(const char* msg) {
  if (msg) std::fprintf(stderr, "moe-model-gen: %s\n", msg);
  std::fprintf(stderr,
               "usage: moe-model-gen (--preset tiny|small|long | --config FILE) --out DIR\n"
               "                     [--seed N] [--index-topk N] [--shard-mb N] [--expert-format mxfp4|bf16]\n"
               "                     [--vision]   (adds the small random vision tower of model.md 14.1)\n"
               "                     [--mtp 0|1]  (a multi-token-prediction module, model.md 15)\n");
  return 2;
}

bool ParseUint(const std::string& s, uint64_t* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 18) return false;
  *out = std::stoull(s);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset, config_path, out, expert_format;
  bool vision = false;
  uint64_t seed = 1, index_topk = 0, shard_mb = 0;
  int mtp = -1;  // unset: as the config says
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) return nullptr;
      (void)name;
      return argv[++i];
    };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") return Usage(nullptr);
    if (a == "--vision") {
      vision = true;
      continue;
    }
    if (a == "--preset" && (v = value("--preset"))) preset = v;
    else if (a == "--config" && (v = value("--config"))) config_path = v;
    else if (a == "--out" && (v = value("--out"))) out = v;
    else if (a == "--expert-format" && (v = value("--expert-format"))) {
      expert_format = v;
      if (expert_format != "mxfp4" && expert_format != "bf16") return Usage("--expert-format needs mxfp4 or bf16");
    }
    else if (a == "--mtp" && (v = value("--mtp"))) {
      uint64_t n = 0;
      if (!ParseUint(v, &n) || n > 1) return Usage("--mtp needs 0 or 1 (one module, chained for longer drafts)");
      mtp = static_cast<int>(n);
    }
    else if (a == "--seed" && (v = value("--seed"))) { if (!ParseUint(v, &seed)) return Usage("--seed needs a non-negative integer"); }
    else if (a == "--index-topk" && (v = value("--index-topk"))) { if (!ParseUint(v, &index_topk) || index_topk == 0) return Usage("--index-topk needs a positive integer"); }
    else if (a == "--shard-mb" && (v = value("--shard-mb"))) { if (!ParseUint(v, &shard_mb) || shard_mb == 0) return Usage("--shard-mb needs a positive integer"); }
    else return Usage(("unknown or incomplete argument '" + a + "'").c_str());
  }
  if (out.empty()) return Usage("--out is required");
  if (preset.empty() == config_path.empty()) return Usage("give exactly one of --preset and --config");

  Result<ModelConfig> config = preset.empty() ? LoadModelConfig(config_path) : PresetConfig(preset);
  if (!config) {
    std::fprintf(stderr, "moe-model-gen: %s\n", config.error().ToString().c_str());
    return 1;
  }
  ModelGenOptions options;
  options.config = *config;
  options.seed = seed;
  if (index_topk) options.config.dsa.index_topk = static_cast<int>(index_topk);
  if (vision && !options.config.vision) {
    options.config.vision = TinyVisionConfig();
    if (auto st = ValidateModelConfig(options.config, "generator config"); !st) {
      std::fprintf(stderr, "moe-model-gen: --vision: %s\n", st.error().ToString().c_str());
      return 1;
    }
  }
  if (mtp >= 0) {
    options.config.num_nextn_predict_layers = mtp;
    if (auto st = ValidateModelConfig(options.config, "generator config"); !st) {
      std::fprintf(stderr, "moe-model-gen: --mtp: %s\n", st.error().ToString().c_str());
      return 1;
    }
  }
  if (!expert_format.empty())
    options.config.expert_format = expert_format == "bf16" ? ExpertFormat::kBf16 : ExpertFormat::kMxfp4;
  // The tiny preset is split in several shards so the index path is always exercised.
  options.max_shard_bytes = shard_mb ? shard_mb << 20 : (preset == "tiny" ? (2ull << 20) : (64ull << 20));
  if (auto st = GenerateModel(options, out); !st) {
    std::fprintf(stderr, "moe-model-gen: %s\n", st.error().ToString().c_str());
    return 1;
  }
  std::printf("wrote %s (seed %llu, %s experts%s%s)\n", out.c_str(), static_cast<unsigned long long>(seed),
              std::string(ExpertFormatName(options.config.expert_format)).c_str(),
              options.config.vision ? ", vision tower" : "",
              options.config.num_nextn_predict_layers > 0 ? ", multi-token-prediction module" : "");
  return 0;
}
