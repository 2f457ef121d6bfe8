// moe-run: loads a model directory, renders a chat, generates, and prints the
// reasoning, the answer and the prefill/decode speeds.
//
//   moe-run --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--print-ids] [--system TEXT] [--max-tokens N]
//           [--temperature T] [--top-p P] [--top-k K] [--seed S]
//           [--reasoning-effort low|medium|high] [--thinking-budget N]
//           [--kernels fast|reference] [--bf16-activations] [--experts mxfp4|bf16] [--ignore-eos]
//           [--read-bw GBPS|auto] [--batch N]
//
// --experts mxfp4 requantises a DeepSeek-V3.2, Qwen3-Next or moe-dsa-v1 checkpoint's
// BF16 routed experts to MXFP4 at load (ModelOptions::experts); other families refuse a format
// other than the one they store. The summary line gives the process's peak
// resident memory.
// --bf16-activations (fast kernels only, every family): prefill products of
// 32 rows or more take BF16-rounded activations (ModelOptions).
// --indexer-scores int8 (models with DSA layers): the indexer's keys kept
// int8 in the cache and scored with integer dot products
// (ModelOptions::indexer_scores); exact, the default, keeps fp32.
//
// --prompt-ids gives the prompt as token ids, with no chat template, and
// --print-ids prints only the generated ids, as one comma-separated line, so
// that the engine can be compared with another implementation token for
// token. The model's family comes from the registry (family_registry.hpp);
// gpt-oss checkpoints (config.json model_type "gpt_oss") run greedy only and
// need --prompt-ids. With --batch N (gpt-oss, N >= 2) it then decodes N
// sequences together in the engine's batched steps, as the daemon does for
// concurrent requests: each is the prompt with a different last token (so
// that they route to different experts), and it prints the decode tokens/s
// of all of them together against the single sequence's.
//
// Expert parallelism (docs/expert-parallel.md) for models on the shared
// layer graph (moe-dsa-v1, DeepSeek-V3.2): the daemon's variables
// (MOE_NUM_NODES, MOE_NODE_RANK, MOE_MASTER_ADDR, MOE_GROUP_SECRET or
// MOE_GROUP_SECRET_FILE, MOE_RENDEZVOUS_PORT, MOE_POD_IP, ...) make each
// process one rank of a Gloo group, every rank given the same arguments.
// Rank 0 loads its slice of the experts, waits up to five minutes for the
// others, runs the prompt and prints as a single process does; the other
// ranks load their slices, run rank 0's passes and exit when it is done.
// Every rank prints on stderr the weight bytes it holds and how many of
// them are routed experts.
//
// With --read-bw (the machine's read bandwidth, as bench_roofline measures
// it) it also prints decode speed as a fraction of the memory roofline:
// read bandwidth / bytes of weights read per decoded token. "auto" measures
// it with passes over an array of kernels::ProbeArrayMiB() (at least 4x the
// last-level cache and 256 MiB, as bench_roofline's; the output says which
// size) before the prompt, between decode steps
// (one pass every 8 steps, its time not counted as decode) and after the last
// token, so that on a shared machine, whose bandwidth moves from one second to
// the next, the ceiling and the decode meet the same conditions; it compares
// with the best pass (the ceiling), the median pass (the typical moment) and
// the mean over passes (what the machine sustained meanwhile).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/expert_group.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/tokenizer.hpp"
#include "moeserve/kernels/read_bandwidth.hpp"
#include "moeserve/kernels/thread_pool.hpp"

using namespace moeserve;
using namespace moeserve::engine;

namespace {

int Usage(const std::string& msg) {
  if (!msg.empty()) std::fprintf(stderr, "moe-run: %s\n", msg.c_str());
  std::fprintf(stderr,
               "usage: moe-run --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [--print-ids] [--system TEXT]\n"
               "               [--max-tokens N] [--temperature T]\n"
               "               [--system TEXT] [--max-tokens N] [--temperature T]\n"
               "               [--top-p P] [--top-k K] [--seed S] [--reasoning-effort low|medium|high]\n"
               "               [--thinking-budget N] [--kernels fast|reference] [--experts mxfp4|bf16] [--bf16-activations] [--ignore-eos]\n"
               "               [--read-bw GBPS|auto] [--deterministic] [--batch N] [--decode-activation-bits 21|16|8]\n"
               "               [--speculative off|mtp|lookup|auto] [--draft-tokens 1-4] [--indexer-scores exact|int8]\n");
  return 2;
}

// The drafts a run verified, per kind (--speculative).
void PrintDrafts(const EngineMetrics& m) {
  for (const auto& [kind, c] : {std::pair<const char*, DraftCounts>{"mtp", m.drafts_mtp}, {"lookup", m.drafts_lookup}}) {
    if (c.drafts == 0) continue;
    std::printf("speculative %s: %llu drafts, %llu tokens proposed, %llu accepted (%.1f%%), %.2f accepted per draft\n",
                kind, static_cast<unsigned long long>(c.drafts), static_cast<unsigned long long>(c.proposed),
                static_cast<unsigned long long>(c.accepted), c.proposed ? 100.0 * c.accepted / c.proposed : 0.0,
                static_cast<double>(c.accepted) / c.drafts);
  }
}

bool ToInt(const std::string& s, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool ToFloat(const std::string& s, double lo, double hi, double* out) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

// "1,2,3" -> ids; false on anything else (empty items, signs, overflow).
bool ParseIds(const std::string& s, std::vector<int>* out) {
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    long long v;
    if (!ToInt(s.substr(at, comma - at), 0, (1ll << 31) - 1, &v)) return false;
    out->push_back(static_cast<int>(v));
    at = comma + 1;
  }
  return !out->empty();
}

void PrintIds(const std::vector<int>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ',';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
}

// The process's peak resident memory (VmHWM), in bytes; 0 when unknown.
double PeakRssBytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// How long rank 0 waits for the others to load and join, and a follower
// for rank 0 to form the group.
constexpr std::chrono::minutes kGroupWait{5};

// What this rank's model holds (stderr: --print-ids keeps stdout one line).
void PrintHeld(const Model& model) {
  std::string who;
  if (model.ep_world() > 1)
    who = "expert-parallel rank " + std::to_string(model.ep_rank()) + " of " + std::to_string(model.ep_world()) + ": ";
  std::fprintf(stderr, "moe-run: %sweights held: %zu bytes, of which routed experts %zu bytes\n", who.c_str(),
               model.resident_weight_bytes(), model.routed_expert_bytes());
}

// Ranks > 0: this rank's slice, loaded as rank 0's engine loads the model,
// and rank 0's passes until it stops the group.
int RunFollower(const std::string& dir, const EngineOptions& eo, const ExpertGroupSettings& group) {
  kernels::RequestDefaultThreadPoolSize(eo.threads);
  auto model = LoadLayerGraph(dir, ModelOptionsFor(eo));
  if (!model) return std::fprintf(stderr, "moe-run: %s\n", model.error().ToString().c_str()), 1;
  PrintHeld(**model);
  KvPool pool(eo.cache_tokens / eo.block_tokens, eo.block_tokens, (*model)->cache_floats_per_token(),
              (*model)->cache_stripes());
  auto st = ExpertGroup::FollowOnce(group, **model, pool, kGroupWait);
  if (!st) return std::fprintf(stderr, "moe-run: %s\n", st.error().ToString().c_str()), 1;
  return 0;
}

// Rank 0 of a group: leads once every rank joined (null without a group).
// Destroying the result stops the followers, so it must go before the engine.
Result<std::unique_ptr<ExpertGroup>> LeadGroup(const Engine& engine, const ExpertGroupSettings& group) {
  const Model* model = engine.model();  // null for a family with its own forward pass
  if (model) PrintHeld(*model);
  if (!group.enabled()) return std::unique_ptr<ExpertGroup>();
  if (!model) return Fail(Error::InvalidArgument("expert parallelism needs a model on the shared layer graph"));
  MOE_ASSIGN_OR_RETURN(auto lead, ExpertGroup::Lead(group, *model, nullptr));
  if (!lead->WaitConnected(kGroupWait))
    return Fail(Error::Unavailable("expert-parallel group: not every one of the " + std::to_string(group.world) +
                                   " ranks joined within " + std::to_string(kGroupWait.count()) + " minutes (" +
                                   lead->status().detail + ")"));
  return lead;
}

// gpt-oss: greedy decode of max_tokens after the prompt on the serving
// engine, stopping at an end token of config.json unless ignore_eos; then
// (without --print-ids) load time, memory, prefill and decode speed, and
// decode against the memory roofline when a read bandwidth is given or
// measured. --batch N: then N sequences decode together in the engine's
// batched steps, each the prompt with a different last token (so that they
// route to different experts), max_tokens each.
struct GptOssRun {
  std::vector<int> tokens;
  double prefill_s = 0, decode_s = 0;  // to the first token; the rest
  int decoded = 0;                      // tokens after each sequence's first, together
  std::string error;
};

GptOssRun GenerateGptOss(Engine& engine, const std::vector<std::vector<int>>& prompts, int max_tokens,
                         const std::vector<int>& stops) {
  GptOssRun run;
  std::map<SequenceId, int> firsts;
  for (const auto& p : prompts) {
    GenerationRequest req;
    req.prompt = p;
    req.max_tokens = max_tokens;
    req.sampling.temperature = 0;
    req.stop_tokens = stops;
    auto id = engine.Submit(req);
    if (!id) return run.error = id.error().ToString(), run;
    firsts[*id] = 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto t_first = t0;
  size_t first_seen = 0;
  while (engine.HasWork()) {
    for (const TokenEvent& e : engine.Step()) {
      if (e.finish == FinishReason::kError) run.error = e.error;
      if (e.token < 0) continue;
      if (e.id == firsts.begin()->first) run.tokens.push_back(e.token);
      if (firsts[e.id]++ == 0) {
        if (++first_seen == prompts.size()) t_first = std::chrono::steady_clock::now();
      } else if (first_seen == prompts.size()) {
        ++run.decoded;
      }
    }
  }
  const auto t_end = std::chrono::steady_clock::now();
  run.prefill_s = std::chrono::duration<double>(t_first - t0).count();
  run.decode_s = std::chrono::duration<double>(t_end - t_first).count();
  return run;
}

int RunGptOss(const std::string& dir, const std::vector<int>& prompt, int max_tokens, bool ignore_eos, bool print_ids,
              KernelChoice kernels, bool bf16_activations, double read_bw, bool read_bw_auto, int batch) {
  const auto t0 = std::chrono::steady_clock::now();
  EngineOptions eo;
  eo.kernels = kernels;
  eo.max_running = std::max(batch, 1);
  eo.cache_tokens = std::max<int64_t>(int64_t{1} << 15, (static_cast<int64_t>(prompt.size()) + max_tokens + 16) * (batch + 1));
  eo.prefix_cache = false;  // every run prefills its prompt, as a first request does
  // Ids in, ids out: no harmony (its tokenizer may define more ids than a
  // cut-down reference checkpoint's embedding).
  auto loaded = GptOssModel::Load(dir, kernels == KernelChoice::kFast ? kernels::BestIsa() : kernels::Isa::kReference,
                                  bf16_activations);
  if (!loaded) return std::fprintf(stderr, "moe-run: %s\n", loaded.error().ToString().c_str()), 1;
  const GptOssModel* model = loaded->get();
  FamilyParts parts;
  parts.chat = GptOssIdsOnlyChat(model->config());
  parts.model = std::move(*loaded);
  auto engine = Engine::Create(std::move(parts), eo);
  if (!engine) return std::fprintf(stderr, "moe-run: %s\n", engine.error().ToString().c_str()), 1;
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::unique_ptr<kernels::ReadBandwidthProbe> probe;
  if (read_bw_auto) {
    probe = std::make_unique<kernels::ReadBandwidthProbe>(kernels::ProbeArrayMiB());
    for (int i = 0; i < 8; ++i) probe->Pass();
  }
  // config.json's end tokens only (GptOssIdsOnlyChat): the ids compare with the reference's greedy loop.
  const std::vector<int> stops = ignore_eos ? std::vector<int>{-1} : std::vector<int>{};
  GptOssRun one = GenerateGptOss(**engine, {prompt}, max_tokens, stops);
  if (!one.error.empty()) return std::fprintf(stderr, "moe-run: %s\n", one.error.c_str()), 1;
  const std::vector<int>& out = one.tokens;
  if (print_ids) return PrintIds(out), 0;
  std::printf("generated %zu tokens after a prompt of %zu:\n", out.size(), prompt.size());
  PrintIds(out);
  // FamilyModel::decode_weight_bytes, as for every family: the dense
  // matrices, norms and biases, the head, one embedding row and
  // experts_per_token experts per layer.
  const double bytes = model->decode_weight_bytes().PerToken();
  const double decode_tps = one.decoded > 0 ? one.decoded / one.decode_s : 0.0;
  std::printf("load %.1f s; weights held %.2f GB; peak resident memory %.2f GB\n", load_s,
              static_cast<double>(model->weight_bytes()) / 1e9, PeakRssBytes() / 1e9);
  std::printf("prefill %.1f tokens/s, decode %.2f tokens/s (kernels: %s; %s, %s)\n",
              static_cast<double>(prompt.size()) / one.prefill_s, decode_tps,
              kernels == KernelChoice::kFast ? kernels::IsaName(kernels::BestIsa()) : "reference",
              model->kernels().matmul_mxfp4.name, model->kernels().matmul_bf16.name);
  std::printf("weights read per decoded token: %.1f MB\n", bytes / 1e6);
  if (read_bw_auto) {
    for (int i = 0; i < 8; ++i) probe->Pass();
    read_bw = probe->result().best_bytes_per_s / 1e9;
    std::printf("read bandwidth, best of %d passes over %zu MiB before and after decode: %.2f GB/s\n",
                probe->result().passes, probe->result().array_bytes >> 20, read_bw);
  }
  if (read_bw > 0 && decode_tps > 0) {
    const double roof = read_bw * 1e9 / bytes;
    std::printf("roofline %.2f tokens/s (%.2f GB/s / %.1f MB); decode reached %.1f%% of it\n", roof, read_bw,
                bytes / 1e6, 100.0 * decode_tps / roof);
  }
  if (batch > 1) {
    std::vector<std::vector<int>> prompts(static_cast<size_t>(batch), prompt);
    const int vocab = model->config().vocab;
    for (int i = 1; i < batch; ++i)
      prompts[static_cast<size_t>(i)].back() = static_cast<int>((prompt.back() + static_cast<long long>(i) * 7919) % vocab);
    GptOssRun many = GenerateGptOss(**engine, prompts, max_tokens, {-1});
    if (!many.error.empty()) return std::fprintf(stderr, "moe-run: %s\n", many.error.c_str()), 1;
    const double tps = many.decoded > 0 ? many.decoded / many.decode_s : 0.0;
    std::printf("batched decode: %d sequences together, %.2f tokens/s in all (%.2f per sequence); %.2fx the single "
                "sequence's %.2f tokens/s\n",
                batch, tps, tps / batch, decode_tps > 0 ? tps / decode_tps : 0.0, decode_tps);
  }
  return 0;
}

// A registered family other than moe-dsa-v1 (Hugging Face checkpoints such
// as Qwen3-Next): the shared engine on token ids, greedy or sampled; prints
// the ids, or the text-free summary with prefill and decode speeds.
int RunFamily(const std::string& dir, const std::string& family, const std::vector<int>& prompt, int max_tokens,
              bool ignore_eos, bool print_ids, const EngineOptions& eo, const SamplingParams& sampling,
              const ExpertGroupSettings& group) {
  const auto t0 = std::chrono::steady_clock::now();
  auto engine = Engine::Open(dir, eo);
  if (!engine) return std::fprintf(stderr, "moe-run: %s\n", engine.error().ToString().c_str()), 1;
  auto lead = LeadGroup(**engine, group);
  if (!lead) return std::fprintf(stderr, "moe-run: %s\n", lead.error().ToString().c_str()), 1;
  const auto t_loaded = std::chrono::steady_clock::now();
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = max_tokens;
  req.sampling = sampling;
  if (ignore_eos) req.stop_tokens = {-1};
  auto id = (*engine)->Submit(req);
  if (!id) return std::fprintf(stderr, "moe-run: %s\n", id.error().ToString().c_str()), 1;
  std::vector<int> generated;
  FinishReason finish = FinishReason::kNone;
  std::chrono::steady_clock::time_point t_first;
  bool first = true;
  while ((*engine)->HasWork())
    for (const TokenEvent& e : (*engine)->Step()) {
      if (e.token >= 0) {
        if (first) t_first = std::chrono::steady_clock::now(), first = false;
        generated.push_back(e.token);
      }
      if (e.finish != FinishReason::kNone) {
        finish = e.finish;
        if (e.finish == FinishReason::kError) std::fprintf(stderr, "moe-run: %s\n", e.error.c_str());
      }
    }
  const auto t_end = std::chrono::steady_clock::now();
  if (finish == FinishReason::kError) return 1;
  if (print_ids) {
    PrintIds(generated);
    return 0;
  }
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  const double prefill_s = first ? secs(t_loaded, t_end) : secs(t_loaded, t_first);
  const double decode_s = first ? 0 : secs(t_first, t_end);
  // Peak resident memory of the process (loading included): the figure
  // docs/model-format.md quotes for DeepSeek-V3.2's streamed conversion.
  std::printf("family %s; prompt %zu tokens, completion %zu tokens; load %.2fs; peak resident memory %.1f MiB\n",
              family.c_str(), prompt.size(), generated.size(), secs(t0, t_loaded), PeakRssBytes() / (1 << 20));
  std::printf("prefill %.1f tokens/s, decode %.1f tokens/s\n", static_cast<double>(prompt.size()) / prefill_s,
              generated.size() > 1 ? static_cast<double>(generated.size() - 1) / decode_s : 0.0);
  PrintDrafts((*engine)->Metrics());
  // As the engine holds the weights (decode_weight_bytes): what
  // bench/deepseek_v32/run.sh reports beside its model of the bytes.
  std::printf("weights read per decoded token: %.1f MB\n",
              (*engine)->family_model().decode_weight_bytes().PerToken() / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, prompt, system, effort = "medium", kernels = "fast", experts, indexer_scores = "exact";
  long long max_tokens = 128, seed = 0, top_k = 0, budget = -1;
  double temperature = 0.0, top_p = 1.0, read_bw = 0.0;
  bool read_bw_auto = false;
  long long batch = 1, decode_bits = 21, draft_tokens = 3;
  SpeculativeMode speculative = SpeculativeMode::kOff;
  bool ignore_eos = false, print_ids = false, bf16_activations = false, deterministic = false;
  std::vector<int> prompt_ids;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : std::string("\x01"); };
    std::string v;
    if (a == "--ignore-eos") { ignore_eos = true; continue; }
    if (a == "--print-ids") { print_ids = true; continue; }
    if (a == "--bf16-activations") { bf16_activations = true; continue; }
    if (a == "--deterministic") { deterministic = true; continue; }
    if (a == "--help" || a == "-h") return Usage("");
    v = next();
    if (v == "\x01") return Usage(a + " needs a value");
    if (a == "--model") model_path = v;
    else if (a == "--prompt") prompt = v;
    else if (a == "--prompt-ids") { if (!ParseIds(v, &prompt_ids)) return Usage("--prompt-ids must be comma-separated token ids"); }
    else if (a == "--system") system = v;
    else if (a == "--reasoning-effort") effort = v;
    else if (a == "--kernels") kernels = v;
    else if (a == "--experts") experts = v;
    else if (a == "--indexer-scores") indexer_scores = v;
    else if (a == "--max-tokens") { if (!ToInt(v, 1, 1 << 24, &max_tokens)) return Usage("--max-tokens must be a positive integer"); }
    else if (a == "--seed") { if (!ToInt(v, 0, (1ll << 62), &seed)) return Usage("--seed must be a non-negative integer"); }
    else if (a == "--top-k") { if (!ToInt(v, 0, 1 << 20, &top_k)) return Usage("--top-k must be a non-negative integer"); }
    else if (a == "--thinking-budget") { if (!ToInt(v, 0, 1 << 24, &budget)) return Usage("--thinking-budget must be a non-negative integer"); }
    else if (a == "--temperature") { if (!ToFloat(v, 0, 100, &temperature)) return Usage("--temperature must be in [0, 100]"); }
    else if (a == "--read-bw") {
      if (v == "auto") read_bw_auto = true;
      else if (!ToFloat(v, 0.001, 1e6, &read_bw)) return Usage("--read-bw must be 'auto' or a positive number of GB/s");
    }
    else if (a == "--decode-activation-bits") {
      if (!ToInt(v, 8, 21, &decode_bits) || (decode_bits != 8 && decode_bits != 16 && decode_bits != 21))
        return Usage("--decode-activation-bits must be 21, 16 or 8");
    }
    else if (a == "--speculative") {
      const std::optional<SpeculativeMode> mode = ParseSpeculativeMode(v);
      if (!mode) return Usage("--speculative must be off, mtp, lookup or auto");
      speculative = *mode;
    }
    else if (a == "--draft-tokens") { if (!ToInt(v, 1, 4, &draft_tokens)) return Usage("--draft-tokens must be 1 to 4"); }
    else if (a == "--batch") { if (!ToInt(v, 1, 1024, &batch)) return Usage("--batch must be 1 to 1024 sequences"); }
    else if (a == "--top-p") { if (!ToFloat(v, 0, 1, &top_p) || top_p == 0) return Usage("--top-p must be in (0, 1]"); }
    else return Usage("unknown argument '" + a + "'");
  }
  if (model_path.empty() || (prompt.empty() == prompt_ids.empty()))
    return Usage("--model and one of --prompt or --prompt-ids are required");
  if (effort != "low" && effort != "medium" && effort != "high") return Usage("--reasoning-effort must be low, medium or high");
  if (kernels != "fast" && kernels != "reference") return Usage("--kernels must be fast or reference");
  if (!experts.empty() && experts != "mxfp4" && experts != "bf16") return Usage("--experts must be mxfp4 or bf16");
  if (indexer_scores != "exact" && indexer_scores != "int8") return Usage("--indexer-scores must be exact or int8");
  std::optional<ExpertFormat> expert_format;
  if (!experts.empty()) expert_format = experts == "mxfp4" ? ExpertFormat::kMxfp4 : ExpertFormat::kBf16;
  // The reference kernels are fp32 only: refuse rather than run fp32 unasked.
  if (bf16_activations && kernels == "reference") return Usage("--bf16-activations needs --kernels fast");

  auto family = FindFamily(model_path);
  if (!family) return std::fprintf(stderr, "moe-run: %s\n", family.error().ToString().c_str()), 1;
  const bool gpt_oss = std::string((*family)->name) == "gpt-oss";
  if (batch > 1 && !gpt_oss) return Usage("--batch is for gpt-oss models");
  if (gpt_oss) {
    if (std::getenv("MOE_NUM_NODES") && std::string(std::getenv("MOE_NUM_NODES")) != "1")
      return Usage("expert parallelism is not supported for gpt-oss models (MOE_NUM_NODES is set)");
    if (prompt_ids.empty()) return Usage("gpt-oss models take --prompt-ids (no chat template here)");
    if (temperature != 0.0) return Usage("gpt-oss models decode greedily only (--temperature 0)");
    if (deterministic) return Usage("--deterministic is not available for gpt-oss models");
    if (expert_format) return Usage("--experts is not available for gpt-oss models (their experts are MXFP4 as published)");
    if (decode_bits != 21) return Usage("--decode-activation-bits is not available for gpt-oss models");
    if (indexer_scores != "exact") return Usage("--indexer-scores is for models with DSA layers, not gpt-oss");
    if (speculative != SpeculativeMode::kOff) return Usage("--speculative is not available here for gpt-oss models");
    return RunGptOss(model_path, prompt_ids, static_cast<int>(max_tokens), ignore_eos, print_ids,
                     kernels == "fast" ? KernelChoice::kFast : KernelChoice::kReference, bf16_activations, read_bw,
                     read_bw_auto, static_cast<int>(batch));
  }
  // The same options on every rank of a group: the followers' cache pool
  // must have rank 0's geometry.
  EngineOptions eo;
  eo.kernels = kernels == "fast" ? KernelChoice::kFast : KernelChoice::kReference;
  eo.bf16_activations = bf16_activations;
  eo.decode_activation_bits = static_cast<int>(decode_bits);
  eo.indexer_scores = indexer_scores == "int8" ? IndexerScores::kInt8 : IndexerScores::kExact;
  eo.deterministic = deterministic;
  eo.experts = expert_format;
  eo.cache_tokens = 1 << 15;
  eo.speculative = speculative;
  eo.draft_tokens = static_cast<int>(draft_tokens);
  auto group = ExpertGroupSettingsFromEnv();
  if (!group) return std::fprintf(stderr, "moe-run: expert-parallel settings: %s\n", group.error().ToString().c_str()), 1;
  eo.ep_rank = group->rank;
  eo.ep_world = group->world;
  if (group->enabled() && deterministic) return Usage("--deterministic is not available with expert parallelism");
  if (group->enabled() && group->rank > 0) return RunFollower(model_path, eo, *group);
  if (std::string((*family)->name) != "moe-dsa-v1") {
    if (prompt_ids.empty()) return Usage(std::string((*family)->name) + " models take --prompt-ids (no chat template here)");
    SamplingParams sp;
    sp.temperature = static_cast<float>(temperature);
    sp.top_p = static_cast<float>(top_p);
    sp.top_k = static_cast<int>(top_k);
    sp.seed = static_cast<uint64_t>(seed);
    return RunFamily(model_path, (*family)->name, prompt_ids, static_cast<int>(max_tokens), ignore_eos, print_ids, eo, sp,
                     *group);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto dir = OpenModelDir(model_path);
  if (!dir) return std::fprintf(stderr, "moe-run: %s\n", dir.error().ToString().c_str()), 1;
  // Through the family registry, which requantises BF16 experts for --experts mxfp4.
  auto engine = Engine::Open(model_path, eo);
  if (!engine) return std::fprintf(stderr, "moe-run: %s\n", engine.error().ToString().c_str()), 1;
  auto lead = LeadGroup(**engine, *group);
  if (!lead) return std::fprintf(stderr, "moe-run: %s\n", lead.error().ToString().c_str()), 1;
  std::unique_ptr<kernels::ReadBandwidthProbe> probe;
  constexpr int kProbeEverySteps = 8;
  const auto probe_for = [&](double seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    do probe->Pass();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds);
  };
  if (read_bw_auto) {
    probe = std::make_unique<kernels::ReadBandwidthProbe>(kernels::ProbeArrayMiB());
    probe_for(0.5);
  }
  auto t_loaded = std::chrono::steady_clock::now();

  std::vector<ChatMessage> messages;
  if (!system.empty()) messages.push_back({ChatRole::kSystem, system, std::nullopt, {}, ""});
  messages.push_back({ChatRole::kUser, prompt, std::nullopt, {}, ""});
  auto ids = prompt_ids.empty() ? RenderChat(messages, nullptr, true) : Result<std::vector<int>>(prompt_ids);
  if (!ids) return std::fprintf(stderr, "moe-run: %s\n", ids.error().ToString().c_str()), 1;

  const auto& tb = dir->config.thinking_budgets;
  int tier_budget = effort == "low" ? tb.low : effort == "medium" ? tb.medium : tb.high;
  GenerationRequest req;
  req.prompt = *ids;
  req.max_tokens = static_cast<int>(max_tokens);
  req.thinking_budget = budget >= 0 ? std::min<int>(static_cast<int>(budget), tier_budget) : tier_budget;
  req.sampling.temperature = static_cast<float>(temperature);
  req.sampling.top_p = static_cast<float>(top_p);
  req.sampling.top_k = static_cast<int>(top_k);
  req.sampling.seed = static_cast<uint64_t>(seed);
  if (ignore_eos) req.stop_tokens = {-1};  // benchmark mode: always run max_tokens
  auto id = (*engine)->Submit(req);
  if (!id) return std::fprintf(stderr, "moe-run: %s\n", id.error().ToString().c_str()), 1;

  std::vector<int> reasoning, answer, generated;
  SequenceUsage usage;
  FinishReason finish = FinishReason::kNone;
  std::chrono::steady_clock::time_point t_first;
  bool first = true;
  kernels::ThreadPool::Stats pool_at_first;
  // Probe passes taken during decode: their time and pool use are not decode's.
  double probe_s = 0, probe_pool_s = 0;
  uint64_t probe_regions = 0;
  int steps_since_probe = 0;
  while ((*engine)->HasWork()) {
    if (probe && !first && ++steps_since_probe == kProbeEverySteps) {
      steps_since_probe = 0;
      const auto t0 = std::chrono::steady_clock::now();
      const kernels::ThreadPool::Stats p0 = kernels::DefaultThreadPool().stats();
      probe->Pass();
      const kernels::ThreadPool::Stats p1 = kernels::DefaultThreadPool().stats();
      probe_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      probe_pool_s += p1.seconds - p0.seconds;
      probe_regions += p1.regions - p0.regions;
    }
    for (const TokenEvent& e : (*engine)->Step()) {
      if (e.token >= 0 && first) {
        t_first = std::chrono::steady_clock::now();
        pool_at_first = kernels::DefaultThreadPool().stats();
        first = false;
      }
      if (e.token >= 0) (e.reasoning ? reasoning : answer).push_back(e.token);
      if (e.token >= 0) generated.push_back(e.token);
      if (e.finish != FinishReason::kNone) {
        usage = e.usage;
        finish = e.finish;
        if (e.finish == FinishReason::kError) std::fprintf(stderr, "moe-run: %s\n", e.error.c_str());
      }
    }
  }
  auto t_end = std::chrono::steady_clock::now();
  const kernels::ThreadPool::Stats pool_at_end = kernels::DefaultThreadPool().stats();
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  if (print_ids) {
    if (finish == FinishReason::kError) return 1;
    PrintIds(generated);
    return 0;
  }
  const Tokenizer& tk = dir->tokenizer;
  std::printf("reasoning (%d tokens): %s\n", usage.reasoning_tokens, tk.Decode(reasoning, true).c_str());
  std::printf("answer: %s\n", tk.Decode(answer, true).c_str());
  const char* why = finish == FinishReason::kStop     ? "stop"
                    : finish == FinishReason::kLength ? "length"
                    : finish == FinishReason::kError  ? "error"
                                                      : "cancelled";
  double prefill_s = first ? secs(t_loaded, t_end) : secs(t_loaded, t_first);
  double decode_s = first ? 0 : secs(t_first, t_end) - probe_s;
  std::printf("finish %s; prompt %d tokens, completion %d tokens; load %.2fs\n", why, usage.prompt_tokens,
              usage.completion_tokens, secs(t0, t_loaded));
  std::printf("prefill %.1f tokens/s, decode %.1f tokens/s (kernels: %s)\n", usage.prompt_tokens / prefill_s,
              usage.completion_tokens > 1 ? (usage.completion_tokens - 1) / decode_s : 0.0, kernels.c_str());
  PrintDrafts((*engine)->Metrics());
  // Weights one decoded token reads, as the engine holds them in memory
  // (FamilyModel::decode_weight_bytes, bench_batch_curve's accounting):
  // BF16 matrices as BF16 (the conv weights widened to fp32), F32
  // vectors, one embedding row, and of the routed experts only
  // experts_per_token per MoE layer (MXFP4 blocks + scales, or BF16).
  const double bytes = (*engine)->family_model().decode_weight_bytes().PerToken();
  double decode_tps = usage.completion_tokens > 1 ? (usage.completion_tokens - 1) / decode_s : 0.0;
  if (usage.completion_tokens > 1 && decode_s > 0) {
    // Where decode's time went: parallel regions on the kernel pool, or work
    // the stepping thread did alone (glue between kernels, sampling, the
    // engine's bookkeeping, kernels too small to hand off).
    const double tokens = usage.completion_tokens - 1;
    const double in_pool = pool_at_end.seconds - pool_at_first.seconds - probe_pool_s;
    std::printf("decode step: %.0f parallel regions, %.3f ms in them, %.3f ms on the stepping thread alone (%.1f%%)\n",
                static_cast<double>(pool_at_end.regions - pool_at_first.regions - probe_regions) / tokens,
                1e3 * in_pool / tokens,
                1e3 * (decode_s - in_pool) / tokens, 100.0 * (decode_s - in_pool) / decode_s);
  }
  std::printf("weights read per decoded token: %.1f MB\n", bytes / 1e6);
  if (read_bw > 0) {
    double roof = read_bw * 1e9 / bytes;
    std::printf("roofline %.1f tokens/s (%.2f GB/s / %.1f MB); decode reached %.1f%% of it\n", roof, read_bw, bytes / 1e6,
                100.0 * decode_tps / roof);
  }
  if (read_bw_auto) {
    probe_for(0.5);
    const kernels::ReadBandwidth& bw = probe->result();
    const double best = bw.best_bytes_per_s, median = bw.median_bytes_per_s, mean = bw.mean_bytes_per_s;
    std::printf("read bandwidth measured before, during and after decode (%d passes over %zu MiB): best pass %.2f GB/s, "
                "median pass %.2f GB/s, mean over passes %.2f GB/s\n",
                bw.passes, bw.array_bytes >> 20, best / 1e9, median / 1e9, mean / 1e9);
    std::printf("roofline %.1f tokens/s (best pass %.2f GB/s / %.1f MB); decode reached %.1f%% of it\n",
                best / bytes, best / 1e9, bytes / 1e6, 100.0 * decode_tps * bytes / best);
    std::printf("median roofline %.1f tokens/s (median pass %.2f GB/s / %.1f MB); decode reached %.1f%% of it\n",
                median / bytes, median / 1e9, bytes / 1e6, 100.0 * decode_tps * bytes / median);
    std::printf("sustained roofline %.1f tokens/s (mean %.2f GB/s / %.1f MB); decode reached %.1f%% of it\n",
                mean / bytes, mean / 1e9, bytes / 1e6, 100.0 * decode_tps * bytes / mean);
  }
  return 0;
}
