// moe-model-info: opens and validates a model directory and prints its
// summary (layers by kind, parameters total/active, bytes by dtype); for
// Qwen3-Next directories (Hugging Face layout) the family's own summary.
//
//   moe-model-info DIR [--verify]
#include <cstdio>
#include <string>

#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/qwen3_next_info.hpp"
#include "moeserve/engine/tensor_layout.hpp"

using namespace moeserve::engine;

int main(int argc, char** argv) {
  std::string dir;
  OpenModelOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--verify") options.verify_manifest = true;
    else if (!a.empty() && a[0] != '-' && dir.empty()) dir = a;
    else {
      std::fprintf(stderr, "usage: moe-model-info DIR [--verify]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: moe-model-info DIR [--verify]\n");
    return 2;
  }
  if (auto family = FindFamily(dir); family && std::string((*family)->name) == "qwen3_next") {
    auto text = DescribeQwen3Next(dir);
    if (!text) return std::fprintf(stderr, "moe-model-info: %s\n", text.error().ToString().c_str()), 1;
    std::printf("model          %s\n%s", dir.c_str(), text->c_str());
    return 0;
  }
  auto model = OpenModelDir(dir, options);
  if (!model) {
    std::fprintf(stderr, "moe-model-info: %s\n", model.error().ToString().c_str());
    return 1;
  }
  for (const auto& w : model->warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  std::printf("model          %s (%zu shard%s%s)\n", dir.c_str(), model->checkpoint.shards().size(),
              model->checkpoint.shards().size() == 1 ? "" : "s", options.verify_manifest ? ", sha256 verified" : "");
  if (model->family != "moe-dsa-v1")
    std::printf("family         %s (published layout, converted at load)\n", model->family.c_str());
  std::printf("%s", FormatSummary(Summarize(model->checkpoint, model->config), model->config).c_str());
  return 0;
}
