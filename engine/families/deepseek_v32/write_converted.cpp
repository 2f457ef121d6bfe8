// A DeepSeek-V3.2 directory written converted (deepseek_v32::WriteConverted):
// the engine's tensors in safetensors shards, each written one recipe at a
// time (the largest: one layer's stacked routed experts), so that converting
// the release needs no more memory than loading one layer of it.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "conversion.hpp"
#include "families/converted_dir.hpp"
#include "moeserve/common/durable_file.hpp"
#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/families/deepseek_v32.hpp"

namespace moeserve::engine::deepseek_v32 {
namespace {

namespace fs = std::filesystem;
using detail::Conversion;
using detail::Output;
using detail::Recipe;

// Consecutive recipes that go into one shard.
struct Shard {
  size_t first = 0, end = 0;
  std::string file;
};

std::vector<Shard> Shards(const std::vector<Recipe>& recipes, uint64_t max_bytes) {
  std::vector<Shard> out;
  uint64_t bytes = 0;
  for (size_t r = 0; r < recipes.size(); ++r) {
    uint64_t n = 0;
    for (const Output& o : recipes[r].outs) n += o.nbytes();
    if (out.empty() || (bytes > 0 && bytes + n > max_bytes)) {
      out.push_back({r, r, ""});
      bytes = 0;
    }
    out.back().end = r + 1;
    bytes += n;
  }
  char name[64];
  for (size_t k = 0; k < out.size(); ++k) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, out.size());
    out[k].file = name;
  }
  return out;
}

Status WriteAll(std::FILE* f, const uint8_t* data, size_t n, const std::string& path) {
  if (std::fwrite(data, 1, n, f) != n) return Fail(Error::Io(path + ": write failed"));
  return Ok();
}

// One shard: the header (every output's offsets, known from the plan), then
// each recipe made into a buffer of its own size and appended.
Status WriteShard(const std::vector<Recipe>& recipes, const Shard& shard, const std::string& path) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t data = 0;
  for (size_t r = shard.first; r < shard.end; ++r)
    for (const Output& o : recipes[r].outs) {
      header[o.name] = {{"dtype", DTypeName(o.dtype)}, {"shape", o.shape}, {"data_offsets", {data, data + o.nbytes()}}};
      data += o.nbytes();
    }
  std::string text = header.dump();
  while ((8 + text.size()) % 8) text.push_back(' ');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return Fail(Error::Io(path + ": cannot create"));
  const auto close_with = [&](Status st) {
    if (std::fclose(f) != 0 && st) st = Fail(Error::Io(path + ": close failed"));
    return st;
  };
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  Status st = WriteAll(f, length, 8, path);
  if (st) st = WriteAll(f, reinterpret_cast<const uint8_t*>(text.data()), text.size(), path);
  for (size_t r = shard.first; st && r < shard.end; ++r) {
    const Recipe& recipe = recipes[r];
    std::vector<std::vector<uint8_t>> made(recipe.outs.size());
    std::vector<uint8_t*> dst;
    for (size_t o = 0; o < made.size(); ++o) {
      made[o].resize(recipe.outs[o].nbytes());
      dst.push_back(made[o].data());
    }
    st = recipe.fill(dst);
    for (size_t o = 0; st && o < made.size(); ++o) st = WriteAll(f, made[o].data(), made[o].size(), path);
  }
  if (st && std::fflush(f) != 0) st = Fail(Error::Io(path + ": flush failed"));
  st = close_with(std::move(st));
  if (st) st = FsyncPath(path);
  return st;
}

// config.json as published plus the marker that it is converted.
Result<std::string> ConvertedConfig(const std::string& dir, ExpertFormat experts) {
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return Fail(Error::NotFound(path + ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  MOE_ASSIGN_OR_RETURN(nlohmann::ordered_json j,
                       ParseJsonBounded<nlohmann::ordered_json>(ss.str(), {.max_bytes = 1 << 20, .max_depth = kMaxJsonDepth},
                                                                path));
  j["moeserve_converted"] = {{"routed_experts", std::string(ExpertFormatName(experts))}};
  return j.dump(2) + "\n";
}

}  // namespace

Status WriteConverted(const std::string& dir, const std::string& out, ExpertFormat experts, uint64_t max_shard_bytes) {
  std::error_code ec;
  if (fs::exists(out, ec)) return Fail(Error::InvalidArgument(out + ": already exists (a converted directory is written anew)"));
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<Conversion> cv, detail::PlanDir(dir, experts));
  MOE_ASSIGN_OR_RETURN(std::string config, ConvertedConfig(dir, experts));
  const std::string partial = out + ".partial";
  fs::remove_all(partial, ec);
  if (!fs::create_directories(partial, ec) || ec) return Fail(Error::Io(partial + ": cannot create: " + ec.message()));

  const std::vector<Shard> shards = Shards(cv->recipes, max_shard_bytes);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total = 0;
  for (const Shard& shard : shards) {
    MOE_TRY(WriteShard(cv->recipes, shard, (fs::path(partial) / shard.file).string()));
    for (size_t r = shard.first; r < shard.end; ++r)
      for (const Output& o : cv->recipes[r].outs) {
        weight_map[o.name] = shard.file;
        total += o.nbytes();
      }
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  MOE_TRY(WriteFileDurably((fs::path(partial) / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  MOE_TRY(WriteFileDurably((fs::path(partial) / "config.json").string(), config));
  MOE_TRY(families::CopySideFiles(dir, partial));
  fs::rename(partial, out, ec);
  if (ec) return Fail(Error::Io(out + ": cannot rename " + partial + " into place: " + ec.message()));
  return FsyncPath(fs::path(out).parent_path().empty() ? "." : fs::path(out).parent_path().string());
}

}  // namespace moeserve::engine::deepseek_v32
