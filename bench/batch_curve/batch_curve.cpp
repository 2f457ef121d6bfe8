// Decode through the engine at several batch sizes, each against the two
// bounds of its step measured in the same run: the bytes the step must read
// over the machine's read bandwidth, and the work of its tokens over the
// fp32 FMA peak. Says which one binds each batch size.
//
//   bench_batch_curve [--model DIR | --preset small] [--batch 1,8,32,64]
//                     [--prompt 32] [--decode 16] [--reps 2]
//
// DIR is a model directory of any family the engine serves (the registry,
// family_registry.hpp, picks it: moe-dsa-v1, gpt-oss, DeepSeek-V3.2,
// Qwen3-Next); --preset generates a moe-dsa-v1 model (moe-model-gen's
// presets) in a temporary directory. The runs are on token ids: gpt-oss is
// loaded as moe-run --prompt-ids loads it (no harmony, no tokenizer needed).
// make_models.py beside this file writes small random checkpoints of the
// three Hugging Face families.
//
// One engine serves every run (an untimed round at the largest batch
// first). Each run submits `batch` greedy requests of `prompt` random tokens and
// `decode` completion tokens (prefix cache off, the prefill budget covering
// every prompt): the first step prefills them all, the later steps decode,
// one token per sequence. Decode tokens/s is the tokens emitted after each
// sequence's first over those steps' time.
//
// Bytes a decode step must read, from the loaded model
// (FamilyModel::decode_weight_bytes, the same accounting for every family):
// the weights every token reads (dense and shared, as the engine holds
// them: BF16 matrices as BF16, fp32 vectors), one embedding row per
// sequence, every routed expert the step's tokens touched (counted from the
// engine's expert_tokens metric, step by step, at the bytes of one expert),
// and each sequence's cached rows (every layer's, FamilyModel::
// cache_floats_per_token; gpt-oss's banded layers read at most their window
// of them). Recurrent (DeltaNet) state is not counted. Work per decoded
// token: the logical FLOPs of one profiled decode step of the model at batch
// 1 after `prompt` tokens (ForwardProfile; attention over a longer context
// adds little at these lengths); for a family whose forward fills no
// profile (gpt-oss), 2 FLOPs per weight its products multiply (attention
// not counted: the output says so).
//
// Ceilings: the read bandwidth's median pass over kernels::ProbeArrayMiB()
// (at least 4x the last-level cache and 256 MiB, bench_roofline's size),
// measured before and after each batch size (the higher kept: a probe that
// lands in a busy moment would flatter every fraction), and the fp32 FMA
// peak at start, before each batch size and at the end (the highest kept).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "../roofline/peaks.hpp"
#include "../support/synthetic_prompt.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/read_bandwidth.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace me = moeserve::engine;
namespace mk = moeserve::kernels;
namespace mb = moeserve::bench;

namespace {

// Printable bytes (ids 32-126), or any id below `vocab` when it is smaller.
// Logical FLOPs of one decoded token: a profiled forward pass of one token
// after `prompt` tokens, at batch 1, on the engine's model (its own KvPool;
// nothing else runs meanwhile). 0 when the family fills no profile.
double DecodeFlopsPerToken(const me::FamilyModel& model, int prompt) {
  constexpr int kBlock = 16;
  me::KvPool pool((prompt + 1 + kBlock - 1) / kBlock + 1, kBlock, model.cache_floats_per_token(), model.cache_stripes());
  me::SequenceCache cache = model.NewSequence();
  const std::vector<int> tokens = moeserve::bench::SyntheticPrompt(prompt + 1, 99, model.vocab_size());
  std::vector<float> logits;
  me::ForwardProfile profile;
  me::ForwardTrace trace;
  trace.record_dsa = false;
  for (int pass = 0; pass < 2; ++pass) {
    const int start = pass == 0 ? 0 : prompt, n = pass == 0 ? prompt : 1;
    if (auto st = me::EnsureBlocks(pool, cache, start + n); !st) std::exit(1);
    trace.profile = pass == 0 ? nullptr : &profile;
    me::ForwardSegment seg{&cache, std::span<const int>(tokens.data() + start, static_cast<size_t>(n)), false};
    if (auto st = model.Forward(pool, std::span(&seg, 1), &logits, &trace); !st) {
      std::fprintf(stderr, "bench_batch_curve: forward: %s\n", st.error().ToString().c_str());
      std::exit(1);
    }
  }
  double f = 0;
  for (int r = 0; r < me::kProfileRows; ++r)
    for (int i = 0; i < me::kProfileParts; ++i) f += profile.flops[r][i];
  return f;
}

struct DecodeRun {
  double tokens_per_s = 0;
  double bytes_per_step = 0;       // mean over the decode steps
  double experts_per_layer = 0;    // routed experts a step touched, mean per MoE layer
};

DecodeRun Run(me::Engine& engine, const me::DecodeWeightBytes& w, size_t cache_bytes_per_token, int batch, int prompt,
              int decode) {
  const int moe_layers = w.moe_layers;
  for (int b = 0; b < batch; ++b) {
    me::GenerationRequest r;
    r.prompt = moeserve::bench::SyntheticPrompt(prompt, static_cast<uint64_t>(b + 1), engine.family_model().vocab_size());
    r.max_tokens = decode;
    r.sampling.temperature = 0.0f;
    r.stop_tokens = {-1};  // every sequence decodes `decode` tokens
    if (!engine.Submit(r)) std::exit(1);
  }
  engine.Step();  // the prefill of every prompt, and each one's first token
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<uint64_t>> before = engine.Metrics().expert_tokens;
  long long decoded = 0;
  int steps = 0;
  double bytes = 0, touched = 0, seconds = 0;
  while (engine.HasWork()) {
    const auto t0 = Clock::now();
    int emitted = 0;
    for (const me::TokenEvent& e : engine.Step()) emitted += e.token >= 0;
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    // Outside the timed step: which experts this step's tokens reached.
    std::vector<std::vector<uint64_t>> after = engine.Metrics().expert_tokens;
    int step_experts = 0;
    for (size_t l = 0; l < after.size(); ++l)
      for (size_t e = 0; e < after[l].size(); ++e) step_experts += after[l][e] != before[l][e];
    before = std::move(after);
    if (emitted == 0) continue;
    ++steps;
    decoded += emitted;
    touched += step_experts;
    // Each sequence reads its cached rows: the prompt, and one more per step.
    const double context = prompt + steps;
    bytes += w.dense + emitted * w.embed_row + step_experts * w.expert +
             static_cast<double>(emitted) * context * static_cast<double>(cache_bytes_per_token);
  }
  DecodeRun r;
  r.tokens_per_s = static_cast<double>(decoded) / seconds;
  r.bytes_per_step = steps > 0 ? bytes / steps : 0;
  r.experts_per_layer = steps > 0 && moe_layers > 0 ? touched / steps / moe_layers : 0;
  return r;
}

// The probe's median pass over kernels::ProbeArrayMiB() (bench_roofline's
// and moe-run --read-bw auto's array).
double MedianBandwidth() { return mk::MeasureReadBandwidth(mk::ProbeArrayMiB(), 0.5, 8).median_bytes_per_s; }

// DIR's model in the engine, as the registry loads it; gpt-oss on token ids
// (GptOssIdsOnlyChat, as moe-run --prompt-ids: no tokenizer needed).
moeserve::Result<std::unique_ptr<me::Engine>> OpenEngine(const std::string& dir, const std::string& family,
                                                         const me::EngineOptions& o) {
  if (family != "gpt-oss") return me::Engine::Open(dir, o);
  auto model = me::GptOssModel::Load(dir, mk::BestIsa());
  if (!model) return moeserve::Fail(model.error());
  me::FamilyParts parts;
  parts.chat = me::GptOssIdsOnlyChat((*model)->config());
  parts.model = std::move(*model);
  return me::Engine::Create(std::move(parts), o);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, preset = "small";
  std::vector<int> batches = {1, 8, 32, 64};
  int prompt = 32, decode = 16, reps = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_batch_curve: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--model") model = v;
    else if (a == "--preset") preset = v;
    else if (a == "--prompt") prompt = std::atoi(v.c_str());
    else if (a == "--decode") decode = std::atoi(v.c_str());
    else if (a == "--reps") reps = std::atoi(v.c_str());
    else if (a == "--batch") {
      batches.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) batches.push_back(std::atoi(x.c_str()));
    } else {
      std::fprintf(stderr, "bench_batch_curve: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (prompt < 1 || decode < 2 || reps < 1 || batches.empty() || *std::min_element(batches.begin(), batches.end()) < 1 ||
      *std::max_element(batches.begin(), batches.end()) > 1024) {
    std::fprintf(stderr, "usage: bench_batch_curve [--model DIR | --preset NAME] [--batch 1,8,32,64 (1 to 1024)] "
                         "[--prompt N>=1] [--decode N>=2] [--reps N>=1]\n");
    return 2;
  }
  std::filesystem::path tmp;
  if (model.empty()) {
    auto cfg = me::PresetConfig(preset);
    if (!cfg) return std::fprintf(stderr, "bench_batch_curve: preset: %s\n", cfg.error().ToString().c_str()), 2;
    tmp = std::filesystem::temp_directory_path() / ("bench_batch_curve_" + preset + "_" + std::to_string(getpid()));
    me::ModelGenOptions go;
    go.config = *cfg;
    go.seed = 1;
    if (auto st = me::GenerateModel(go, tmp.string()); !st)
      return std::fprintf(stderr, "bench_batch_curve: generate: %s\n", st.error().ToString().c_str()), 1;
    model = tmp.string();
  }
  auto family = me::FindFamily(model);
  if (!family) return std::fprintf(stderr, "bench_batch_curve: %s\n", family.error().ToString().c_str()), 1;
  const std::string family_name = (*family)->name;
  const int threads = mk::DefaultThreadPool().size();
  const bool avx512 = mk::IsaSupported(mk::Isa::kAvx512);
  // The FMA peak is measured before every batch size and at the end, the
  // highest kept: a pass that shares a core with another process reads half.
  double peak = mb::FmaPeak(threads, avx512);
  // One engine for every batch size (loaded once), sized for the largest;
  // an untimed round at the largest batch first, so every expert's pages
  // are in memory before any step is timed.
  const int most = *std::max_element(batches.begin(), batches.end());
  me::EngineOptions o;
  o.prefill_chunk_tokens = most * prompt;
  o.prefill_chunk_tokens_idle = most * prompt;
  o.max_running = most;
  o.cache_tokens = std::max<int64_t>(int64_t{1} << 14, int64_t{most} * (prompt + decode + 32));
  o.prefix_cache = false;  // every round prefills its prompts in full
  auto engine = OpenEngine(model, family_name, o);
  if (!engine) return std::fprintf(stderr, "bench_batch_curve: %s\n", engine.error().ToString().c_str()), 1;
  const me::FamilyModel& fm = (*engine)->family_model();
  const me::DecodeWeightBytes w = fm.decode_weight_bytes();
  if (w.dense <= 0)
    return std::fprintf(stderr, "bench_batch_curve: the %s family reports no decode weight bytes "
                                "(FamilyModel::decode_weight_bytes)\n", family_name.c_str()), 1;
  const size_t cache_bytes_per_token = fm.cache_floats_per_token() * sizeof(float);
  double flops = DecodeFlopsPerToken(fm, prompt);
  const bool profiled = flops > 0;
  if (!profiled)
    flops = 2.0 * (w.dense_weights + static_cast<double>(w.moe_layers) * w.experts_per_token * w.expert_weights);
  int expert_count = 0;
  for (int e : fm.ExpertCounts()) expert_count = std::max(expert_count, e);
  const size_t probe_mib = mk::ProbeArrayMiB();
  std::printf("bench_batch_curve: %s (family %s), %d threads; %d-token prompts, %d decoded tokens each, median of %d "
              "runs\n", model.c_str(), family_name.c_str(), threads, prompt, decode, reps);
  std::printf("a step reads %.1f MB of dense and shared weights, %.2f KB of embedding per sequence, %.3f MB per routed "
              "expert touched (%d per token of %d, %d MoE layers), %.1f KB per cached row; a token alone reads "
              "%.1f MB of weights; a decoded token is %.1f MFLOP (%s)\n",
              w.dense / 1e6, w.embed_row / 1e3, w.expert / 1e6, w.experts_per_token, expert_count, w.moe_layers,
              cache_bytes_per_token / 1e3, w.PerToken() / 1e6, flops / 1e6,
              profiled ? "profiled decode step" : "2 per multiplied weight; this family's forward has no profile, "
                                                  "attention not counted");
  std::printf("read bandwidth probe: median pass over %zu MiB (kernels::ProbeArrayMiB: at least 4x the %.1f MiB "
              "last-level cache, at least 256 MiB)\n", probe_mib, mk::LastLevelCacheBytes() / 1048576.0);
  struct Row {
    int batch;
    double tps, bytes, experts, bw;
  };
  std::vector<Row> rows;
  Run(**engine, w, cache_bytes_per_token, most, prompt, decode);
  for (int batch : batches) {
    peak = std::max(peak, mb::FmaPeak(threads, avx512));
    const double bw_before = MedianBandwidth();
    std::vector<DecodeRun> runs;
    for (int r = 0; r < reps; ++r) runs.push_back(Run(**engine, w, cache_bytes_per_token, batch, prompt, decode));
    const double bw = std::max(bw_before, MedianBandwidth());
    std::sort(runs.begin(), runs.end(), [](const DecodeRun& a, const DecodeRun& b) { return a.tokens_per_s < b.tokens_per_s; });
    const DecodeRun& m = runs[runs.size() / 2];
    rows.push_back({batch, m.tokens_per_s, m.bytes_per_step, m.experts_per_layer, bw});
  }
  peak = std::max(peak, mb::FmaPeak(threads, avx512));
  std::printf("fp32 FMA peak %.1f GFLOP/s (the highest of passes at start, before each batch size and at the end): "
              "compute bound %.1f tokens/s at any batch\n", peak / 1e9, peak / flops);
  std::printf("%5s %11s %8s %8s %9s %11s %12s %12s %8s %8s\n", "batch", "tok/s", "per seq", "experts", "MB/step",
              "median GB/s", "memory bound", "compute bnd", "binds", "reached");
  for (const Row& r : rows) {
    const double memory_bound = r.bw / r.bytes * r.batch;  // steps/s x tokens a step
    const double compute_bound = peak / flops;
    const bool memory_binds = memory_bound < compute_bound;
    std::printf("%5d %11.1f %8.1f %8.1f %9.1f %11.2f %12.1f %12.1f %8s %7.1f%%\n", r.batch, r.tps, r.tps / r.batch,
                r.experts, r.bytes / 1e6, r.bw / 1e9, memory_bound, compute_bound, memory_binds ? "memory" : "compute",
                100.0 * r.tps / std::min(memory_bound, compute_bound));
  }
  std::printf("(experts: routed experts a decode step touched, mean per MoE layer; memory bound: median read bandwidth "
              "of the passes over %zu MiB around that batch / bytes a step reads x batch)\n", probe_mib);
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  return 0;
}
