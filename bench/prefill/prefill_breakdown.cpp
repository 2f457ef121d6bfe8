// Prompt prefill, part by part, against this machine's ceilings.
//
// Generates the `small` preset (or loads --model), prefills prompts of the
// given lengths in chunks of --chunk tokens as the engine's scheduler does
// for a prompt alone (EngineOptions::prefill_chunk_tokens_idle, 2048; 512,
// prefill_chunk_tokens, beside decoding sequences), with a ForwardProfile
// (model.hpp) that times each layer kind's parts: the dense projections, the
// routed experts, MLA/DSA attention, the DSA indexer, the DeltaNet rule, and
// glue. Each part is compared with its own ceiling measured in the same run:
// the fp32 FMA peak and the BF16 dot-product peak (vdpbf16ps) for the
// products, read bandwidth for glue (over the hidden-state bytes its norms
// and residual adds touch, an estimate). FLOPs are the logical work (2 M N K
// for a product; the attention form that ran; see ForwardProfile). On the
// amx row the BF16-activation products are held to the fp32 FMA peak (the
// tiles have no probe of their own here): a share above 100% is how many
// times the fp32 bound they run.
//
// A gpt-oss directory (--model) runs gpt_oss_prefill.hpp's whole-prefill
// timing instead of the part-by-part breakdown. DeepSeek-V3.2 and Qwen3-Next
// directories load through their family (LoadLayerGraph: FP8 matrices kept,
// experts as stored) and get the breakdown, then the same by named part (q/kv
// projections, MLA attention, the indexer, DeltaNet's rule, gated attention,
// dense FFN, shared and routed experts, the head) against the fp32 FMA peak.
//
// Usage: bench_prefill [--model DIR] [--tokens 512,4096] [--chunk 2048]
//                      [--kernels fast|reference] [--bf16-activations] [--no-ceilings]
//                      [--per-chunk] [--repeat N] [--preset NAME] [--sequences N]
// --repeat N: each prefill N times; the breakdown of the median run, then
// every run's tokens/s and share of the bound.
// --bf16-activations: the prefill GEMMs with BF16-rounded activations
// (ModelOptions::bf16_activations).
// --sequences N (N >= 2): for each length T, N prompts of T tokens prefilled
// together as the engine's step lays them out and one after another, in
// --repeat alternating rounds (3 unless given); multi_sequence.hpp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <unistd.h>
#include <random>
#include <string>
#include <vector>

#include "../roofline/peaks.hpp"
#include "gpt_oss_prefill.hpp"
#include "multi_sequence.hpp"
#include "prefill_bound.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/read_bandwidth.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace me = moeserve::engine;
namespace mk = moeserve::kernels;
namespace mb = moeserve::bench;

namespace {

const auto& kRowNames = me::kProfileRowNames;
const auto& kPartNames = me::kProfilePartNames;

std::vector<int> ParseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    char* end;
    v.push_back(static_cast<int>(std::strtol(p, &end, 10)));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return v;
}

using mb::BoundSeconds;
using mb::Ceilings;

void PrintTable(const me::ForwardProfile& p, double total_s, int tokens, const Ceilings& c, bool dot_products) {
  std::printf("%-6s %-12s %9s %6s %9s %9s %8s %8s  %s\n", "kind", "part", "ms", "share", "GFLOP", "GFLOP/s",
              "of fp32", "of bf16", "(glue: GB/s, of read bw)");
  double part_s[me::kProfileParts] = {}, part_f[me::kProfileParts] = {}, part_b[me::kProfileParts] = {};
  double timed = 0;
  auto row = [&](const char* kind, const char* part, double s, double f, double b, bool glue) {
    std::printf("%-6s %-12s %9.1f %5.1f%% ", kind, part, s * 1e3, 100.0 * s / total_s);
    if (glue && c.bw > 0)
      std::printf("%9s %9s %8s %8s  %.2f GB/s, %.1f%% of %.1f GB/s\n", "-", "-", "-", "-", b / s / 1e9,
                  100.0 * b / s / c.bw, c.bw / 1e9);
    else if (glue)
      std::printf("%9s %9s %8s %8s  %.2f GB/s\n", "-", "-", "-", "-", b / s / 1e9);
    else if (f > 0 && c.fma > 0)
      std::printf("%9.2f %9.1f %7.1f%% %7.1f%%\n", f / 1e9, f / s / 1e9, 100.0 * f / s / c.fma,
                  c.dot > 0 ? 100.0 * f / s / c.dot : 0.0);
    else if (f > 0)  // --no-ceilings
      std::printf("%9.2f %9.1f %8s %8s\n", f / 1e9, f / s / 1e9, "-", "-");
    else
      std::printf("%9s\n", "-");
  };
  for (int r = 0; r < me::kProfileRows; ++r)
    for (int i = 0; i < me::kProfileParts; ++i) {
      const double s = p.seconds[r][i];
      if (s <= 0) continue;
      timed += s;
      part_s[i] += s;
      part_f[i] += p.flops[r][i];
      part_b[i] += p.bytes[r][i];
      row(kRowNames[r], kPartNames[i], s, p.flops[r][i], p.bytes[r][i], i == static_cast<int>(me::ProfilePart::kGlue));
    }
  std::printf("-- by part, all kinds --\n");
  for (int i = 0; i < me::kProfileParts; ++i)
    if (part_s[i] > 0)
      row("all", kPartNames[i], part_s[i], part_f[i], part_b[i], i == static_cast<int>(me::ProfilePart::kGlue));
  double all_f = 0;
  for (int i = 0; i < me::kProfileParts; ++i) all_f += part_f[i];
  std::printf("total %.1f ms (%.1f%% timed by parts), %.1f GFLOP (%.1f MFLOP/token), %.1f tokens/s",
              total_s * 1e3, 100.0 * timed / total_s, all_f / 1e9, all_f / tokens / 1e6, tokens / total_s);
  if (c.fma <= 0 || c.bw <= 0) {  // --no-ceilings: no bound to hold it to
    std::printf("\n");
    return;
  }
  std::printf("; fp32 bound %.1f tokens/s\n", c.fma / (all_f / tokens));
  const double bound_s = BoundSeconds(p, c, dot_products);
  std::printf("bound of the work as it ran (%s; indexer, delta rule at the fp32 peak; glue at read bandwidth): "
              "%.1f tokens/s; this run reached %.1f%% of it\n",
              dot_products ? "projections, experts, attention at the BF16 dot peak" : "products and attention at the fp32 peak",
              tokens / bound_s, 100.0 * bound_s / total_s);
}

// The flagship families' parts by name (DeepSeek-V3.2: MLA/DSA layers, a
// dense FFN, shared and routed experts; Qwen3-Next: DeltaNet and gated
// attention layers, gated shared and routed experts), each against the fp32
// FMA peak: the profile's (row, part) cells each name gathers. Parts no
// layer ran are left out.
void PrintNamedParts(const me::ForwardProfile& p, double total_s, int tokens, const Ceilings& c) {
  using P = me::ProfilePart;
  constexpr int kMla = 0, kDsa = 1, kDelta = 2, kGqa = 3, kModel = me::kProfileModelRow;
  struct Cell {
    int row;
    P part;
  };
  struct Named {
    const char* name;
    std::vector<Cell> cells;
  };
  const Named named[] = {
      {"q/kv/o projections (MLA, DSA; indexer q/k)", {{kMla, P::kProjections}, {kDsa, P::kProjections}}},
      {"MLA attention", {{kMla, P::kAttention}, {kDsa, P::kAttention}}},
      {"indexer scores + top-k", {{kDsa, P::kIndexer}, {kMla, P::kIndexer}}},
      {"DeltaNet projections (in, out)", {{kDelta, P::kProjections}}},
      {"DeltaNet chunked rule", {{kDelta, P::kDeltaRule}}},
      {"gated attention projections", {{kGqa, P::kProjections}}},
      {"gated attention", {{kGqa, P::kAttention}}},
      {"dense FFN", {{kMla, P::kDenseFfn}, {kDsa, P::kDenseFfn}, {kDelta, P::kDenseFfn}, {kGqa, P::kDenseFfn}}},
      {"shared experts + router", {{kMla, P::kSharedExperts}, {kDsa, P::kSharedExperts}, {kDelta, P::kSharedExperts},
                                   {kGqa, P::kSharedExperts}}},
      {"routed experts", {{kMla, P::kExperts}, {kDsa, P::kExperts}, {kDelta, P::kExperts}, {kGqa, P::kExperts}}},
      {"head", {{kModel, P::kProjections}}},
      {"glue (norms, RoPE, routing, cache)", {{kMla, P::kGlue}, {kDsa, P::kGlue}, {kDelta, P::kGlue}, {kGqa, P::kGlue},
                                              {kModel, P::kGlue}}},
  };
  std::printf("-- by named part, against the fp32 FMA peak (%.1f GFLOP/s) --\n", c.fma / 1e9);
  std::printf("%-44s %9s %6s %9s %9s %8s\n", "part", "ms", "share", "GFLOP", "GFLOP/s", "of fp32");
  double all_s = 0, all_f = 0;
  for (const Named& n : named) {
    double s = 0, f = 0;
    for (const Cell& cell : n.cells) {
      s += p.seconds[cell.row][static_cast<int>(cell.part)];
      f += p.flops[cell.row][static_cast<int>(cell.part)];
    }
    if (s <= 0) continue;
    all_s += s;
    all_f += f;
    std::printf("%-44s %9.1f %5.1f%% ", n.name, s * 1e3, 100.0 * s / total_s);
    if (f > 0)
      std::printf("%9.2f %9.1f %7.1f%%\n", f / 1e9, f / s / 1e9, c.fma > 0 ? 100.0 * f / s / c.fma : 0.0);
    else
      std::printf("%9s %9s %8s\n", "-", "-", "-");
  }
  std::printf("%-44s %9.1f %5.1f%% %9.2f %9.1f %7.1f%%  (%.1f tokens/s; %.1f%% of the time in named parts)\n",
              "total", total_s * 1e3, 100.0, all_f / 1e9, all_f / total_s / 1e9,
              c.fma > 0 ? 100.0 * all_f / total_s / c.fma : 0.0, tokens / total_s, 100.0 * all_s / total_s);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, preset = "small";
  std::string layer_graph_family;  // a family other than moe-dsa-v1 on the layer graph (loaded by its family)
  std::vector<int> lengths = {512, 4096};
  bool per_chunk = false, chunk_given = false, repeat_given = false;
  int chunk = 2048, repeat = 1, sequences = 0;
  bool reference = false, ceilings = true, bf16act = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) model_path = argv[++i];
    else if (a == "--tokens" && i + 1 < argc) lengths = ParseList(argv[++i]);
    else if (a == "--chunk" && i + 1 < argc) chunk = std::atoi(argv[++i]), chunk_given = true;
    else if (a == "--kernels" && i + 1 < argc) reference = std::string(argv[++i]) == "reference";
    else if (a == "--no-ceilings") ceilings = false;
    else if (a == "--bf16-activations") bf16act = true;
    else if (a == "--per-chunk") per_chunk = true;
    else if (a == "--repeat" && i + 1 < argc) repeat = std::atoi(argv[++i]), repeat_given = true;
    else if (a == "--sequences" && i + 1 < argc) sequences = std::atoi(argv[++i]);
    else if (a == "--preset" && i + 1 < argc) preset = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_prefill [--model DIR] [--tokens 512,4096] [--chunk 2048] "
                           "[--kernels fast|reference] [--bf16-activations] [--no-ceilings] [--per-chunk] "
                           "[--repeat N] [--preset tiny|small|...] [--sequences N]\n");
      return 2;
    }
  }
  if (chunk < 1 || repeat < 1 || lengths.empty() || *std::min_element(lengths.begin(), lengths.end()) < 1) {
    std::fprintf(stderr, "bench_prefill: --chunk, --repeat and --tokens must be positive\n");
    return 2;
  }
  if (sequences != 0 && (sequences < 2 || sequences > 256)) {
    std::fprintf(stderr, "bench_prefill: --sequences must be from 2 to 256 (got %d)\n", sequences);
    return 2;
  }
  if (sequences != 0 && per_chunk) {
    std::fprintf(stderr, "bench_prefill: --sequences and --per-chunk time different things; give one\n");
    return 2;
  }
  if (sequences != 0 && !repeat_given) repeat = 3;
  // Other families load through the registry; gpt-oss has its own run
  // (gpt_oss_prefill.hpp: whole prefills against the bound of their work).
  if (!model_path.empty()) {
    auto family = me::FindFamily(model_path);
    if (!family) {
      std::fprintf(stderr, "bench_prefill: %s\n", family.error().ToString().c_str());
      return 1;
    }
    const std::string name = (*family)->name;
    if (name == "gpt-oss" && sequences != 0) {
      std::fprintf(stderr, "bench_prefill: --sequences takes a moe-dsa-v1 model (the part timers it holds to the "
                           "bound); %s is gpt-oss\n", model_path.c_str());
      return 2;
    }
    if (name == "gpt-oss")
      return mb::RunGptOssPrefill({model_path, lengths, chunk_given ? chunk : 0, repeat, reference, bf16act, ceilings});
    // DeepSeek-V3.2 and Qwen3-Next run on the shared layer graph: loaded by
    // their family (as the engine loads them: FP8 matrices kept, experts as
    // stored), then timed part by part like moe-dsa-v1.
    if (name != "moe-dsa-v1") layer_graph_family = name;
  }
  std::filesystem::path tmp;
  if (model_path.empty()) {
    tmp = std::filesystem::temp_directory_path() / ("bench_prefill_" + preset + "_" + std::to_string(getpid()));
    auto cfg = me::PresetConfig(preset);
    if (!cfg) {
      std::fprintf(stderr, "preset: %s\n", cfg.error().ToString().c_str());
      return 2;
    }
    me::ModelGenOptions go;
    go.config = *cfg;
    go.seed = 1;
    if (auto st = me::GenerateModel(go, tmp.string()); !st) {
      std::fprintf(stderr, "generate: %s\n", st.error().ToString().c_str());
      return 1;
    }
    model_path = tmp.string();
  }
  me::ModelOptions mo;
  mo.kernels = reference ? me::KernelChoice::kReference : me::KernelChoice::kFast;
  mo.bf16_activations = bf16act;
  const auto load_start = std::chrono::steady_clock::now();
  auto model = [&]() -> moeserve::Result<std::unique_ptr<me::Model>> {
    if (!layer_graph_family.empty()) return me::LoadLayerGraph(model_path, mo);
    auto dir = me::OpenModelDir(model_path);
    if (!dir) return std::unexpected(dir.error());
    return me::Model::Load(*dir, mo);
  }();
  if (!model) {
    std::fprintf(stderr, "load: %s\n", model.error().ToString().c_str());
    return 1;
  }
  if (!layer_graph_family.empty())
    std::printf("bench_prefill: %s loaded as %s in %.1f s\n", model_path.c_str(), layer_graph_family.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count());
  const int threads = mk::DefaultThreadPool().size();
  Ceilings c;
  size_t bw_mib = 0;  // the probe's array (kernels::ProbeArrayMiB)
  if (ceilings) {
    c.fma = mb::FmaPeak(threads, mk::IsaSupported(mk::Isa::kAvx512));
    c.dot = mb::Bf16DotPeak(threads);
    const mk::ReadBandwidth r = mk::MeasureReadBandwidth(mk::ProbeArrayMiB(), 1.0, 12);
    c.bw = r.best_bytes_per_s;
    bw_mib = r.array_bytes >> 20;
  }
  const mk::KernelSet& ks = reference ? mk::Kernels(mk::Isa::kReference)
                            : bf16act  ? mk::KernelsWithBf16Activations(mk::BestIsa())
                                       : mk::Kernels(mk::BestIsa());
  std::printf("bench_prefill: %s, %d threads, kernels %s (%s, %s); chunks of %d tokens\n", model_path.c_str(), threads,
              mk::IsaName(ks.isa), ks.matmul_mxfp4.name, ks.matmul_bf16.name, chunk);
  std::printf("ceilings: fp32 FMA peak %.1f GFLOP/s, BF16 dot peak %.1f GFLOP/s, read bandwidth %.1f GB/s (best pass "
              "over %zu MiB)\n", c.fma / 1e9, c.dot / 1e9, c.bw / 1e9, bw_mib);
  const int V = (*model)->vocab_size();
  // One untimed chunk first: the first pass pays for page faults on the
  // weights and the kernels' scratch, which would land on the first layer.
  bool warm = false;
  std::vector<float> logits;
  for (int L : lengths) {
    constexpr int kBlockTokens = 16;
    me::KvPool pool((L + kBlockTokens - 1) / kBlockTokens + 1, kBlockTokens, (*model)->cache_floats_per_token(),
                    (*model)->cache_stripes());
    std::mt19937 rng(7);
    std::vector<int> prompt(static_cast<size_t>(L));
    for (int& t : prompt) t = static_cast<int>(rng() % static_cast<unsigned>(V));
    if (!warm) {
      me::KvPool wp((chunk + kBlockTokens - 1) / kBlockTokens + 1, kBlockTokens, (*model)->cache_floats_per_token(),
                    (*model)->cache_stripes());
      me::SequenceCache wc = (*model)->NewSequence();
      const int n = std::min(chunk, L);
      if (!me::EnsureBlocks(wp, wc, n)) return 1;
      me::ForwardSegment seg{&wc, std::span<const int>(prompt.data(), static_cast<size_t>(n)), false};
      if (!(*model)->Forward(wp, std::span(&seg, 1), &logits)) return 1;
      me::ReleaseBlocks(wp, wc);
      warm = true;
    }
    if (sequences != 0) {
      mb::MultiSequenceArgs ms;
      ms.tokens = L;
      ms.sequences = sequences;
      ms.chunk = chunk;
      ms.rounds = repeat;
      ms.vocab = V;
      ms.ceilings = c;
      ms.dot_products = bf16act && ks.isa == mk::Isa::kAvx512;
      if (int rc = mb::RunMultiSequencePrefill(**model, ms); rc != 0) return rc;
      continue;
    }
    // --repeat: the same prefill again from an empty cache; the breakdown is
    // the run of median time's (a shared machine's busy moments move single
    // runs by a tenth), and every run's figures are listed after it.
    const bool dot = bf16act && ks.isa == mk::Isa::kAvx512;
    std::vector<me::ForwardProfile> profiles(static_cast<size_t>(repeat));
    std::vector<double> seconds(static_cast<size_t>(repeat));
    for (int rep = 0; rep < repeat; ++rep) {
      me::SequenceCache cache = (*model)->NewSequence();
      me::ForwardProfile& profile = profiles[static_cast<size_t>(rep)];
      me::ForwardTrace trace;
      trace.record_dsa = false;
      trace.profile = &profile;
      // --per-chunk: each chunk is new tokens against all the earlier ones
      // cached, as one turn of a growing session; its logical work, GFLOP/s
      // and efficiency (the share of its own work's bound it reached: a
      // longer context shifts the work towards attention and the indexer,
      // whose ceilings differ), and that efficiency against the second
      // chunk's.
      auto total_flops = [](const me::ForwardProfile& pr) {
        double f = 0;
        for (int r = 0; r < me::kProfileRows; ++r)
          for (int i = 0; i < me::kProfileParts; ++i) f += pr.flops[r][i];
        return f;
      };
      const bool bounded = c.fma > 0 && c.bw > 0;
      if (per_chunk)
        std::printf("\nprefill of %d tokens, chunk by chunk:\n%8s %8s %9s %9s %9s %9s %10s\n", L, "cached", "new", "ms",
                    "GFLOP", "GFLOP/s", "of bound", "vs chunk 2");
      double second_efficiency = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (int p = 0; p < L; p += chunk) {
        const int n = std::min(chunk, L - p);
        const me::ForwardProfile before = profile;
        const auto c0 = std::chrono::steady_clock::now();
        if (auto st = me::EnsureBlocks(pool, cache, p + n); !st) {
          std::fprintf(stderr, "blocks: %s\n", st.error().ToString().c_str());
          return 1;
        }
        me::ForwardSegment seg{&cache, std::span<const int>(prompt.data() + p, static_cast<size_t>(n)), false};
        if (auto st = (*model)->Forward(pool, std::span(&seg, 1), &logits, &trace); !st) {
          std::fprintf(stderr, "forward: %s\n", st.error().ToString().c_str());
          return 1;
        }
        if (per_chunk) {
          const double cs = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
          me::ForwardProfile work;  // this chunk's alone
          for (int r = 0; r < me::kProfileRows; ++r)
            for (int i = 0; i < me::kProfileParts; ++i) {
              work.flops[r][i] = profile.flops[r][i] - before.flops[r][i];
              work.bytes[r][i] = profile.bytes[r][i] - before.bytes[r][i];
            }
          const double cf = total_flops(work);
          const double efficiency = bounded ? BoundSeconds(work, c, dot) / cs : 0.0;
          if (p / chunk == 1) second_efficiency = efficiency;
          std::printf("%8d %8d %9.1f %9.2f %9.1f %8.1f%% %10s\n", p, n, cs * 1e3, cf / 1e9, cf / cs / 1e9,
                      100.0 * efficiency,
                      second_efficiency > 0
                          ? (std::to_string(static_cast<int>(100.0 * efficiency / second_efficiency + 0.5)) + "%").c_str()
                          : "-");
        }
      }
      seconds[static_cast<size_t>(rep)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      me::ReleaseBlocks(pool, cache);
    }
    std::vector<int> order(static_cast<size_t>(repeat));
    for (int i = 0; i < repeat; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int x, int y) { return seconds[static_cast<size_t>(x)] < seconds[static_cast<size_t>(y)]; });
    const size_t median = static_cast<size_t>(order[static_cast<size_t>(repeat / 2)]);
    std::printf("\nprefill of %d tokens%s:\n", L, repeat > 1 ? " (the run of median time)" : "");
    // The peak again after the runs: on a shared machine the load moves it
    // (112 to 175 GFLOP/s within one run was seen), and the tables hold the
    // work to the higher of the two, the stricter bound.
    Ceilings held = c;
    if (ceilings) {
      const double after = mb::FmaPeak(threads, mk::IsaSupported(mk::Isa::kAvx512));
      held.fma = std::max(c.fma, after);
      std::printf("fp32 FMA peak %.1f GFLOP/s at the start, %.1f after the runs: the tables use %.1f\n", c.fma / 1e9,
                  after / 1e9, held.fma / 1e9);
    }
    PrintTable(profiles[median], seconds[median], L, held, dot);
    PrintNamedParts(profiles[median], seconds[median], L, held);
    if (repeat > 1) {
      std::printf("runs, tokens/s%s:", c.fma > 0 && c.bw > 0 ? " (share of the bound)" : "");
      for (int i = 0; i < repeat; ++i) {
        const size_t r = static_cast<size_t>(i);
        std::printf(" %.1f", L / seconds[r]);
        if (c.fma > 0 && c.bw > 0) std::printf(" (%.1f%%)", 100.0 * BoundSeconds(profiles[r], held, dot) / seconds[r]);
      }
      std::printf("\n");
    }
  }
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  return 0;
}
