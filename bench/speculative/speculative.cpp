// What a verified draft buys the engine, apart from how good the drafts are:
// decode tokens/s of `batch` sequences that copy a span of their own prompt
// (a grammar allows only the copy, so every lookup draft is right, or, with
// --mismatch N, every Nth copied token differs from the prompt and the
// draft covering it is cut short there), with speculation off and with
// lookup drafts, runs alternating so that load on the machine falls on both
// alike. On a model whose decode reads its weights from memory the ratio
// approaches the tokens a pass verifies; on one that fits the cache it is
// bounded by the extra rows' compute. Above speculative_max_batch decoding
// sequences (8) the scheduler verifies no drafts: the ratio is then 1.
//
//   bench_speculative --model DIR [--batch 1,8,32] [--copy 96] [--draft 3] [--mismatch 0] [--reps 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "../../tests/support/forced_tokens.hpp"
#include "../support/synthetic_prompt.hpp"

using namespace moeserve::engine;

namespace {

struct Result {
  double decode_tps = 0;
  DraftCounts drafts;
};

Result Run(const ModelDir& dir, SpeculativeMode mode, int batch, int copy, int draft, int mismatch) {
  EngineOptions o;
  o.speculative = mode;
  o.draft_tokens = draft;
  o.max_running = std::max(batch, 1);
  o.prefill_chunk_tokens = 1 << 16;
  o.cache_tokens = std::max<int64_t>(int64_t{1} << 14, int64_t{batch} * (3 * copy + 64));
  o.prefix_cache = false;
  auto engine = Engine::Create(dir, o);
  if (!engine) {
    std::fprintf(stderr, "bench_speculative: %s\n", engine.error().ToString().c_str());
    std::exit(1);
  }
  for (int b = 0; b < batch; ++b) {
    // The prompt holds the span, some filler, then the span's first 3
    // tokens: the completion is the span's rest (every `mismatch`th token
    // changed), which lookup finds in the prompt.
    const std::vector<int> span = moeserve::bench::SyntheticPrompt(copy + 3, 100 + static_cast<uint64_t>(b));
    GenerationRequest r;
    r.prompt = span;
    const std::vector<int> filler = moeserve::bench::SyntheticPrompt(16, 900 + static_cast<uint64_t>(b));
    r.prompt.insert(r.prompt.end(), filler.begin(), filler.end());
    r.prompt.insert(r.prompt.end(), span.begin(), span.begin() + 3);
    std::vector<int> out(span.begin() + 3, span.end());
    if (mismatch > 0)
      for (size_t i = static_cast<size_t>(mismatch) - 1; i < out.size(); i += static_cast<size_t>(mismatch))
        out[i] = out[i] == 33 ? 34 : 33;
    r.max_tokens = static_cast<int>(out.size());
    r.sampling.temperature = 0;
    r.stop_tokens = {-1};
    r.controller = std::make_shared<moeserve::test_support::ForcedTokens>(out);
    if (!(*engine)->Submit(std::move(r))) std::exit(1);
  }
  // The first step prefills every prompt and emits each sequence's first
  // token; the steps after it decode.
  (*engine)->Step();
  int emitted = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while ((*engine)->HasWork())
    for (const TokenEvent& e : (*engine)->Step()) emitted += e.token >= 0;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {emitted / secs, (*engine)->Metrics().drafts_lookup};
}

std::vector<int> Ints(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, batches = "1,8,32";
  int copy = 96, draft = 3, mismatch = 0, reps = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model = v;
    else if (a == "--batch") batches = v;
    else if (a == "--copy") copy = std::atoi(v.c_str());
    else if (a == "--draft") draft = std::atoi(v.c_str());
    else if (a == "--mismatch") mismatch = std::atoi(v.c_str());
    else if (a == "--reps") reps = std::atoi(v.c_str());
    else return std::fprintf(stderr, "bench_speculative: unknown option %s\n", a.c_str()), 2;
  }
  if (model.empty() || copy < 8 || draft < 1 || draft > 4 || reps < 1)
    return std::fprintf(stderr, "usage: bench_speculative --model DIR [--batch 1,8,32] [--copy N>=8] [--draft 1-4] "
                                "[--mismatch N] [--reps R]\n"), 2;
  auto dir = OpenModelDir(model);
  if (!dir) return std::fprintf(stderr, "bench_speculative: %s\n", dir.error().ToString().c_str()), 1;
  std::printf("model %s; %d copied tokens a sequence, drafts of %d, every %s token mismatched; best of %d\n",
              model.c_str(), copy, draft, mismatch > 0 ? std::to_string(mismatch).c_str() : "no", reps);
  std::printf("%6s %16s %16s %7s %10s\n", "batch", "off tok/s", "lookup tok/s", "ratio", "accepted");
  for (int batch : Ints(batches)) {
    Result off, on;
    for (int r = 0; r < reps; ++r) {  // alternating, best of each
      const Result a = Run(*dir, SpeculativeMode::kOff, batch, copy, draft, mismatch);
      const Result b = Run(*dir, SpeculativeMode::kLookup, batch, copy, draft, mismatch);
      if (a.decode_tps > off.decode_tps) off = a;
      if (b.decode_tps > on.decode_tps) on = b;
    }
    std::printf("%6d %16.1f %16.1f %6.2fx %9.0f%%\n", batch, off.decode_tps, on.decode_tps, on.decode_tps / off.decode_tps,
                on.drafts.proposed ? 100.0 * on.drafts.accepted / on.drafts.proposed : 0.0);
  }
  return 0;
}
