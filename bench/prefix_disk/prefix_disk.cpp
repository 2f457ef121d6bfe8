// The prefix cache's tier on disk against recomputing: the time to first
// token of a prompt whose long prefix an earlier engine left on disk
// (EngineOptions::prefix_disk_dir), against the same prompt prefilled in
// full, runs alternating so that load on the machine falls on both alike.
//
//   bench_prefix_disk [--model DIR | --preset tiny|small] [--prefix 4096]
//                     [--reps 3] [--dir PATH]
//
// The prompt is `prefix` tokens (a multiple of 16, the block size) and 8
// more. "restore, page cache" reads a file the kernel still caches;
// "restore, cold" first drops the file from the page cache
// (posix_fadvise DONTNEED after fdatasync), so it reads the disk. Each
// engine is created before the clock starts. Best of `reps`.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"

using namespace moeserve::engine;
namespace fs = std::filesystem;

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_prefix_disk: %s\n", what.c_str());
  std::exit(1);
}

std::vector<int> Prompt(int n) {
  std::vector<int> p;
  uint64_t s = 12345;
  while (static_cast<int>(p.size()) < n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p.push_back(static_cast<int>((s >> 33) % 95) + 32);  // printable bytes
  }
  return p;
}

EngineOptions Options(const std::string& disk_dir, int64_t tokens) {
  EngineOptions o;
  o.cache_tokens = std::max<int64_t>(tokens + 1024, int64_t{1} << 14);
  o.prefix_disk_dir = disk_dir;
  o.prefix_cache = !disk_dir.empty();
  o.prefix_cache_bytes = int64_t{8} << 30;
  return o;
}

std::unique_ptr<Engine> Make(const ModelDir& dir, const EngineOptions& o) {
  auto e = Engine::Create(dir, o);
  if (!e) Die(e.error().ToString());
  return std::move(*e);
}

// Seconds from Submit to the first token; the cached tokens through `cached`.
double TimeToFirstToken(Engine& e, const std::vector<int>& prompt, int* cached) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = 1;
  r.sampling.temperature = 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (!e.Submit(r)) Die("submit refused");
  double first = -1;
  while (e.HasWork())
    for (const TokenEvent& ev : e.Step()) {
      if (ev.token >= 0 && first < 0)
        first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (ev.finish != FinishReason::kNone) {
        if (!ev.error.empty()) Die(ev.error);
        *cached = ev.usage.cached_tokens;
      }
    }
  return first;
}

void DropFromPageCache(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

int64_t DirBytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, preset = "tiny", disk = (fs::temp_directory_path() / "moe_bench_prefix_disk").string();
  int prefix = 4096, reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") model = value();
    else if (a == "--preset") preset = value();
    else if (a == "--prefix") prefix = std::atoi(value().c_str());
    else if (a == "--reps") reps = std::atoi(value().c_str());
    else if (a == "--dir") disk = value();
    else Die("unknown argument " + a);
  }
  if (prefix < 16 || prefix % 16 != 0) Die("--prefix must be a positive multiple of 16");
  if (model.empty()) {
    model = (fs::temp_directory_path() / ("moe_bench_prefix_disk_" + preset)).string();
    if (!fs::exists(model + "/config.json")) {
      ModelGenOptions g;
      auto config = PresetConfig(preset);
      if (!config) Die(config.error().ToString());
      g.config = *config;
      if (auto st = GenerateModel(g, model); !st) Die(st.error().ToString());
    }
  }
  auto dir = OpenModelDir(model);
  if (!dir) Die(dir.error().ToString());
  if (prefix + 8 > dir->config.max_position_embeddings) Die("--prefix is past the model's max_position_embeddings");
  const std::vector<int> first_turn = [&] {
    std::vector<int> p = Prompt(prefix);
    p.push_back(33);  // one token past the prefix: the cache keeps the whole prefix
    return p;
  }();
  std::vector<int> prompt = first_turn;
  for (int t : {40, 41, 42, 43, 44, 45, 46}) prompt.push_back(t);

  // The prefix on disk, left by an engine that prefilled it.
  fs::remove_all(disk);
  {
    auto e = Make(*dir, Options(disk, prompt.size()));
    int cached = 0;
    TimeToFirstToken(*e, first_turn, &cached);
  }
  const int64_t bytes = DirBytes(disk);
  double recompute = 1e30, warm = 1e30, cold = 1e30;
  for (int r = 0; r < reps; ++r) {
    int cached = -1;
    {
      auto e = Make(*dir, Options("", prompt.size()));
      recompute = std::min(recompute, TimeToFirstToken(*e, prompt, &cached));
      if (cached != 0) Die("the recompute run used a cache");
    }
    {
      auto e = Make(*dir, Options(disk, prompt.size()));
      warm = std::min(warm, TimeToFirstToken(*e, prompt, &cached));
      if (cached != prefix) Die("the restore run did not restore the prefix (" + std::to_string(cached) + " cached)");
    }
    DropFromPageCache(disk);
    {
      auto e = Make(*dir, Options(disk, prompt.size()));
      cold = std::min(cold, TimeToFirstToken(*e, prompt, &cached));
      if (cached != prefix) Die("the cold restore run did not restore the prefix");
    }
  }
  std::printf("model %s, prompt %zu tokens, prefix %d on disk (%.1f MiB in %s)\n", model.c_str(), prompt.size(), prefix,
              static_cast<double>(bytes) / (1 << 20), disk.c_str());
  std::printf("time to first token, best of %d:\n", reps);
  std::printf("  recompute             %8.3f s\n", recompute);
  std::printf("  restore, page cache   %8.3f s   %6.1fx faster\n", warm, recompute / warm);
  std::printf("  restore, cold         %8.3f s   %6.1fx faster\n", cold, recompute / cold);
  fs::remove_all(disk);
  return 0;
}
