// Shared helpers for engine tests: generated model directories (cached per
// test process) and the PyTorch reference runner.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::engine::testing_util {

inline std::string TempPath(const std::string& tag) {
  return ::testing::TempDir() + "/moe_" + tag + "_" + std::to_string(::getpid());
}

// A tiny-preset model with the given seed, index_topk and expert format
// (model.md 1.2), generated once per process.
inline const std::string& TinyModel(uint64_t seed = 1, int index_topk = 2048, ExpertFormat experts = ExpertFormat::kMxfp4) {
  static std::map<std::tuple<uint64_t, int, ExpertFormat>, std::string> dirs;
  auto key = std::make_tuple(seed, index_topk, experts);
  auto it = dirs.find(key);
  if (it != dirs.end()) return it->second;
  std::string dir = TempPath("tiny_s" + std::to_string(seed) + "_k" + std::to_string(index_topk) + "_" +
                             std::string(ExpertFormatName(experts)));
  std::filesystem::remove_all(dir);
  ModelGenOptions o;
  o.config = *PresetConfig("tiny");
  o.config.dsa.index_topk = index_topk;
  o.config.expert_format = experts;
  o.seed = seed;
  auto st = GenerateModel(o, dir);
  if (!st) ADD_FAILURE() << st.error().ToString();
  return dirs[key] = dir;
}

// The tiny preset with moe-model-gen --vision's tower (model.md 14.1),
// generated once per process.
inline const std::string& TinyVisionModel(uint64_t seed = 3) {
  static std::map<uint64_t, std::string> dirs;
  auto it = dirs.find(seed);
  if (it != dirs.end()) return it->second;
  std::string dir = TempPath("tiny_vision_s" + std::to_string(seed));
  std::filesystem::remove_all(dir);
  ModelGenOptions o;
  o.config = *PresetConfig("tiny");
  o.config.vision = TinyVisionConfig();
  o.seed = seed;
  auto st = GenerateModel(o, dir);
  if (!st) ADD_FAILURE() << st.error().ToString();
  return dirs[seed] = dir;
}

struct ReferenceRun {
  int prompt_len = 0, positions = 0, vocab = 0;
  std::vector<float> logits;  // [positions, vocab]
  std::vector<int> tokens, greedy;
  std::vector<double> top2_margin;
  std::vector<std::vector<float>> images;  // per --image: the tower's rows [tokens, hidden]
  nlohmann::json meta;
};

// Runs tools/reference/reference.py; returns false (with a test failure) if it fails.
// image_files: one per run of image placeholders in the prompt (reference.py
// --image); the tower's rows come back in out->images.
inline bool RunReference(const std::string& model, const std::vector<int>& prompt, int decode, ReferenceRun* out,
                         const std::vector<std::string>& image_files = {}) {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  std::string root = src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
  std::string outdir = TempPath("ref_" + std::to_string(decode) + "_" + std::to_string(prompt.size()));
  std::filesystem::remove_all(outdir);
  std::string toks;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i) toks += ',';
    toks += std::to_string(prompt[i]);
  }
  std::string cmd = "/usr/bin/python3 " + root + "/tools/reference/reference.py --model " + model + " --tokens " + toks +
                    " --decode " + std::to_string(decode) + " --out " + outdir + " --threads 1";
  for (const std::string& f : image_files) cmd += " --image " + f;
  cmd += " 2>&1";
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "reference failed (" << rc << "): " << cmd.substr(0, 200);
    return false;
  }
  std::ifstream mf(outdir + "/meta.json");
  out->meta = nlohmann::json::parse(mf);
  out->prompt_len = out->meta["prompt_len"];
  out->positions = out->meta["positions"];
  out->vocab = out->meta["vocab_size"];
  out->tokens = out->meta["tokens"].get<std::vector<int>>();
  out->greedy = out->meta["greedy_tokens"].get<std::vector<int>>();
  out->top2_margin = out->meta["top2_margin"].get<std::vector<double>>();
  out->logits.resize(static_cast<size_t>(out->positions) * out->vocab);
  std::ifstream lf(outdir + "/logits.f32", std::ios::binary);
  lf.read(reinterpret_cast<char*>(out->logits.data()), static_cast<std::streamsize>(out->logits.size() * 4));
  out->images.clear();
  for (size_t k = 0; k < image_files.size(); ++k) {
    const std::string path = outdir + "/vision_" + std::to_string(k) + ".f32";
    std::vector<float> rows(std::filesystem::file_size(path) / 4);
    std::ifstream vf(path, std::ios::binary);
    vf.read(reinterpret_cast<char*>(rows.data()), static_cast<std::streamsize>(rows.size() * 4));
    if (!vf) {
      ADD_FAILURE() << "cannot read " << path;
      return false;
    }
    out->images.push_back(std::move(rows));
  }
  std::filesystem::remove_all(outdir);
  return static_cast<bool>(lf);
}

// A deterministic 300-ish token prompt: a rendered-looking chat with bytes.
inline std::vector<int> TestPrompt(int n, uint64_t seed = 5) {
  std::vector<int> p = {256, 258};
  uint64_t s = seed;
  while (static_cast<int>(p.size()) < n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int r = static_cast<int>((s >> 33) % 300);
    p.push_back(r < 256 ? (r % 95) + 32 : 256 + (r % 12));
  }
  return p;
}

// A w x h RGB picture of pseudo-random pixels: a different seed gives a
// different image (and content hash) of the same size.
inline ImageInput Pattern(uint32_t w, uint32_t h, uint64_t seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
  for (auto& b : rgb) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(s >> 56);
  }
  auto in = MakeImageInput(w, h, std::move(rgb));
  EXPECT_TRUE(in);
  return *in;
}

}  // namespace moeserve::engine::testing_util
