// What EngineOptions::deterministic costs: prefill and decode tokens/s of a
// batch of sequences through the engine, with the option off and on, runs
// alternating so that load on the machine falls on both alike.
//
//   bench_deterministic --model DIR [--batch 1,8,16] [--prompt 128]
//                       [--decode 32] [--reps 2]
//
// Each run submits `batch` greedy requests of `prompt` random tokens and
// `decode` completion tokens; the prefill budget covers every prompt, so the
// first step is the prefill of the whole batch (its time gives prefill
// tokens/s) and the steps after it decode (decode tokens/s: tokens emitted
// after each sequence's first, over their time). Best of `reps` runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "../support/synthetic_prompt.hpp"

using namespace moeserve::engine;

namespace {

struct Speed {
  double prefill = 0, decode = 0;  // tokens/s
};

Speed Run(const ModelDir& dir, bool deterministic, int batch, int prompt, int decode) {
  EngineOptions o;
  o.deterministic = deterministic;
  o.prefill_chunk_tokens = batch * prompt;
  o.max_running = std::max(batch, 1);
  o.cache_tokens = std::max<int64_t>(int64_t{1} << 14, int64_t{batch} * (prompt + decode + 32));
  o.prefix_cache = false;  // every run prefills its prompts in full
  auto engine = Engine::Create(dir, o);
  if (!engine) {
    std::fprintf(stderr, "bench_deterministic: %s\n", engine.error().ToString().c_str());
    std::exit(1);
  }
  for (int b = 0; b < batch; ++b) {
    GenerationRequest r;
    r.prompt = moeserve::bench::SyntheticPrompt(prompt, static_cast<uint64_t>(b + 1));
    r.max_tokens = decode;
    r.sampling.temperature = 0.0f;
    if (!(*engine)->Submit(r)) std::exit(1);
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  (*engine)->Step();  // the whole batch's prefill, and each sequence's first token
  const auto t1 = Clock::now();
  long long decoded = 0;
  while ((*engine)->HasWork())
    for (const TokenEvent& e : (*engine)->Step()) decoded += e.token >= 0;
  const auto t2 = Clock::now();
  Speed s;
  s.prefill = static_cast<double>(batch) * prompt / std::chrono::duration<double>(t1 - t0).count();
  s.decode = static_cast<double>(decoded) / std::chrono::duration<double>(t2 - t1).count();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  std::vector<int> batches = {1, 8, 16};
  int prompt = 128, decode = 32, reps = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model = v;
    else if (a == "--prompt") prompt = std::atoi(v.c_str());
    else if (a == "--decode") decode = std::atoi(v.c_str());
    else if (a == "--reps") reps = std::atoi(v.c_str());
    else if (a == "--batch") {
      batches.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) batches.push_back(std::atoi(x.c_str()));
    } else {
      std::fprintf(stderr, "bench_deterministic: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (model.empty() || prompt < 1 || decode < 2 || reps < 1 || batches.empty() ||
      *std::min_element(batches.begin(), batches.end()) < 1) {
    std::fprintf(stderr, "usage: bench_deterministic --model DIR [--batch 1,8,16] [--prompt N] [--decode N] [--reps N]\n");
    return 2;
  }
  auto dir = OpenModelDir(model);
  if (!dir) return std::fprintf(stderr, "bench_deterministic: %s\n", dir.error().ToString().c_str()), 1;
  std::printf("batch  prompt  decode | prefill tok/s off   on  (on/off) | decode tok/s off   on  (on/off)\n");
  for (int batch : batches) {
    Speed off, on;
    for (int r = 0; r < reps; ++r) {
      for (bool det : {false, true}) {
        const Speed s = Run(*dir, det, batch, prompt, decode);
        Speed& best = det ? on : off;
        best.prefill = std::max(best.prefill, s.prefill);
        best.decode = std::max(best.decode, s.decode);
      }
    }
    std::printf("%5d  %6d  %6d | %12.1f %8.1f  (%.2f) | %11.1f %8.1f  (%.2f)\n", batch, prompt, decode, off.prefill,
                on.prefill, on.prefill / off.prefill, off.decode, on.decode, on.decode / off.decode);
    std::fflush(stdout);
  }
  return 0;
}
