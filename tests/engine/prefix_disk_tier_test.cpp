// The prefix cache's tier on disk (engine/prefix_disk_tier.hpp): an entry
// evicted from memory, or left in memory at shutdown, is read back by a later
// prompt sharing its prefix, and the tokens and logprobs that follow are the
// bits a run that recomputed the prefix gets (deterministic mode). Files that
// are corrupt, truncated, another tenant's or another model's are refused,
// deleted and the prefix recomputed; the tier stays within its byte bound
// and its age bound (files unused for longer than max_age are deleted, at
// start by their mtime and as the tier runs by their last use).
#include "../../engine/prefix_disk_tier.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "moeserve/engine/engine.hpp"
#include "disk_tier_files.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;

constexpr int kPromptTokens = 70;  // the cache keeps its 64-token prefix (whole blocks, one token left to compute)
constexpr int kCached = 64;

struct Outcome {
  std::vector<int> tokens;
  std::vector<float> logprobs;
  int cached = -1;
  std::string error;
};

GenerationRequest Request(std::vector<int> prompt, const std::string& tenant, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.logprobs = 3;
  r.tenant = tenant;
  return r;
}

Outcome Generate(Engine& e, GenerationRequest r) {
  Outcome out;
  auto id = e.Submit(std::move(r));
  if (!id) {
    out.error = id.error().ToString();
    return out;
  }
  for (int guard = 0; e.HasWork() && guard < 10000; ++guard)
    for (const TokenEvent& ev : e.Step()) {
      if (ev.id != *id) continue;
      if (ev.token >= 0) out.tokens.push_back(ev.token);
      if (ev.logprob) out.logprobs.push_back(*ev.logprob);
      if (ev.finish != FinishReason::kNone) {
        out.cached = ev.usage.cached_tokens;
        out.error = ev.error;
      }
    }
  return out;
}

std::vector<int> Prompt(uint64_t seed) { return TestPrompt(kPromptTokens, seed); }
// A later turn: the prompt plus more tokens, sharing its 64-token prefix.
std::vector<int> NextTurn(uint64_t seed) {
  std::vector<int> p = Prompt(seed);
  for (int t : {65, 66, 67, 68, 69}) p.push_back(t);
  return p;
}

struct Fixture {
  std::string dir;
  EngineOptions options;
};

EngineOptions Options(const std::string& disk_dir) {
  EngineOptions o;
  o.cache_tokens = 4096;
  o.deterministic = true;  // a restored prefix gives the same bits as a recomputed one
  o.prefix_disk_dir = disk_dir;
  return o;
}

std::unique_ptr<Engine> Make(const std::string& model, const EngineOptions& o) {
  auto d = OpenModelDir(model);
  EXPECT_TRUE(d);
  if (!d) return nullptr;
  auto e = Engine::Create(*d, o);
  EXPECT_TRUE(e) << e.error().ToString();
  return e ? std::move(*e) : nullptr;
}

std::string FreshDir(const std::string& tag) {
  const std::string dir = TempPath("disk_" + tag);
  fs::remove_all(dir);
  return dir;
}

// The reference: the next turn computed from scratch (no prefix cache).
const Outcome& Recomputed(uint64_t seed) {
  static std::map<uint64_t, Outcome> runs;
  auto it = runs.find(seed);
  if (it != runs.end()) return it->second;
  EngineOptions o = Options("");
  o.prefix_cache = false;
  auto e = Make(TinyModel(1), o);
  Outcome r = e ? Generate(*e, Request(NextTurn(seed), "a", 6)) : Outcome{};
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.tokens.size(), 6u);
  return runs[seed] = r;
}

void ExpectSameBits(const Outcome& got, const Outcome& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i)
    EXPECT_EQ(std::memcmp(&got.logprobs[i], &want.logprobs[i], sizeof(float)), 0)
        << "logprob " << i << ": " << got.logprobs[i] << " vs " << want.logprobs[i];
}

// Leaves the entry of Prompt(seed) for `tenant` on disk (written when the
// engine is destroyed) and returns its file.
std::string SpillOne(const std::string& dir, uint64_t seed, const std::string& tenant = "a",
                     const std::string& model = TinyModel(1)) {
  {
    auto e = Make(model, Options(dir));
    if (!e) return {};
    Outcome r = Generate(*e, Request(Prompt(seed), tenant, 1));
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(e->Metrics().prefix_cache.entries, 1);
  }
  const std::vector<std::string> files = Files(ModelFolder(dir));
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? std::string() : files[0];
}

TEST(DiskTier, EvictedEntryIsRestoredWithTheSameBitsAsARecompute) {
  const std::string dir = FreshDir("evict");
  // Measure one entry, then bound memory to one entry so the next prompt evicts it.
  int64_t one = 0;
  {
    EngineOptions probe = Options("");
    auto e = Make(TinyModel(1), probe);
    ASSERT_TRUE(e);
    Generate(*e, Request(Prompt(7), "a", 1));
    one = e->Metrics().prefix_cache.bytes;
    ASSERT_GT(one, 0);
  }
  EngineOptions o = Options(dir);
  o.prefix_cache_bytes = one + one / 2;
  auto e = Make(TinyModel(1), o);
  ASSERT_TRUE(e);
  Generate(*e, Request(Prompt(7), "a", 1));
  Generate(*e, Request(Prompt(99), "a", 1));  // evicts Prompt(7)'s entry to disk
  PrefixCacheStats s = e->Metrics().prefix_cache;
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.evicted_for_bytes, 1u);
  EXPECT_EQ(s.disk_writes, 1u);
  EXPECT_EQ(s.disk_entries, 1);
  EXPECT_GT(s.disk_bytes, kCached * 384 * 4);  // at least the rows
  EXPECT_EQ(Files(ModelFolder(dir)).size(), 1u);

  const Outcome restored = Generate(*e, Request(NextTurn(7), "a", 6));
  ASSERT_TRUE(restored.error.empty()) << restored.error;
  EXPECT_EQ(restored.cached, kCached);
  s = e->Metrics().prefix_cache;
  EXPECT_EQ(s.disk_hits, 1u);
  EXPECT_EQ(s.disk_hit_tokens, static_cast<uint64_t>(kCached));
  EXPECT_EQ(s.disk_refused, 0u);
  ExpectSameBits(restored, Recomputed(7));
}

TEST(DiskTier, ARestartedEngineReadsWhatTheLastOneLeft) {
  const std::string dir = FreshDir("restart");
  ASSERT_FALSE(SpillOne(dir, 11).empty());
  auto e = Make(TinyModel(1), Options(dir));  // a new engine over the same directory
  ASSERT_TRUE(e);
  const Outcome restored = Generate(*e, Request(NextTurn(11), "a", 6));
  ASSERT_TRUE(restored.error.empty()) << restored.error;
  EXPECT_EQ(restored.cached, kCached);
  const PrefixCacheStats s = e->Metrics().prefix_cache;
  EXPECT_EQ(s.disk_hits, 1u);
  EXPECT_EQ(s.disk_entries, 1);
  ExpectSameBits(restored, Recomputed(11));
}

TEST(DiskTier, StaysWithinItsBoundDroppingTheLeastRecentlyUsed) {
  const std::string dir = FreshDir("bound");
  const std::string first = SpillOne(dir, 21);
  ASSERT_FALSE(first.empty());
  const int64_t file = static_cast<int64_t>(fs::file_size(first));
  fs::remove_all(dir);

  int64_t one = 0;
  {
    auto e = Make(TinyModel(1), Options(""));
    ASSERT_TRUE(e);
    Generate(*e, Request(Prompt(21), "a", 1));
    one = e->Metrics().prefix_cache.bytes;
  }
  EngineOptions o = Options(dir);
  o.prefix_cache_bytes = one + one / 2;  // memory holds one entry
  o.prefix_disk_bytes = 2 * file + file / 2;  // disk holds two
  {
    auto e = Make(TinyModel(1), o);
    ASSERT_TRUE(e);
    for (uint64_t seed : {21, 22, 23, 24, 25}) Generate(*e, Request(Prompt(seed), "a", 1));
    const PrefixCacheStats s = e->Metrics().prefix_cache;
    EXPECT_EQ(s.disk_writes, 4u);  // 21..24 evicted from memory, 25 still there
    EXPECT_EQ(s.disk_evictions, 2u);
    EXPECT_EQ(s.disk_entries, 2);
    EXPECT_LE(s.disk_bytes, o.prefix_disk_bytes);
    EXPECT_EQ(Files(ModelFolder(dir)).size(), 2u);
    // The oldest is gone from disk, a recent one is there.
    EXPECT_EQ(Generate(*e, Request(NextTurn(21), "a", 1)).cached, 0);
    EXPECT_EQ(Generate(*e, Request(NextTurn(24), "a", 1)).cached, kCached);
  }
}

TEST(DiskTier, ACorruptFileIsRefusedDeletedAndRecomputed) {
  const std::string dir = FreshDir("corrupt");
  const std::string file = SpillOne(dir, 31);
  ASSERT_FALSE(file.empty());
  {  // flip one byte in the middle (the rows)
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(file) / 2);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(at);
    f.write(&c, 1);
  }
  auto e = Make(TinyModel(1), Options(dir));
  ASSERT_TRUE(e);
  const Outcome r = Generate(*e, Request(NextTurn(31), "a", 6));
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.cached, 0);
  const PrefixCacheStats s = e->Metrics().prefix_cache;
  EXPECT_EQ(s.disk_refused, 1u);
  EXPECT_EQ(s.disk_hits, 0u);
  EXPECT_FALSE(fs::exists(file));
  ExpectSameBits(r, Recomputed(31));
}

TEST(DiskTier, ATruncatedFileIsRefusedAtStart) {
  const std::string dir = FreshDir("truncated");
  const std::string file = SpillOne(dir, 41);
  ASSERT_FALSE(file.empty());
  fs::resize_file(file, fs::file_size(file) - 100);
  auto e = Make(TinyModel(1), Options(dir));
  ASSERT_TRUE(e);
  EXPECT_FALSE(fs::exists(file));
  const Outcome r = Generate(*e, Request(NextTurn(41), "a", 6));
  EXPECT_EQ(r.cached, 0);
  EXPECT_EQ(e->Metrics().prefix_cache.disk_refused, 1u);
  ExpectSameBits(r, Recomputed(41));
}

TEST(DiskTier, HostileHeadersAreRefusedWithoutCrashing) {
  const std::string dir = FreshDir("hostile");
  const std::string file = SpillOne(dir, 51);
  ASSERT_FALSE(file.empty());
  const std::string folder = ModelFolder(dir);
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Header offsets: magic 0, version 8, block_tokens 12, floats_per_token 16,
  // model id 24, is_public 40, partition bytes 41, tokens 45, layers 53.
  auto planted = [&](const std::string& name, size_t at, uint64_t value, size_t width) {
    std::string b = bytes;
    std::memcpy(b.data() + at, &value, width);
    std::ofstream(folder + "/" + name, std::ios::binary) << b;
  };
  planted("0000000000000001.mpc", 45, uint64_t{1} << 60, 8);  // 2^60 tokens
  planted("0000000000000002.mpc", 41, 0xffffffffu, 4);       // a 4 GiB partition name
  planted("0000000000000003.mpc", 53, 0x7fffffffu, 4);       // 2^31 layers
  planted("0000000000000004.mpc", 16, uint64_t{1} << 62, 8);  // rows of 2^62 floats
  // A file of format 1, whose blocks held token rows (the pool now keeps
  // each cache part's rows together): its bytes would be misread.
  planted("0000000000000007.mpc", 8, 1, 4);
  std::ofstream(folder + "/0000000000000005.mpc", std::ios::binary) << "MOEPFXC1";  // a header cut short
  std::ofstream(folder + "/0000000000000006.mpc", std::ios::binary) << std::string(4096, '\xff');
  auto e = Make(TinyModel(1), Options(dir));
  ASSERT_TRUE(e);
  const Outcome r = Generate(*e, Request(NextTurn(51), "a", 6));
  EXPECT_EQ(r.cached, kCached);  // the genuine file still serves
  const PrefixCacheStats s = e->Metrics().prefix_cache;
  EXPECT_EQ(s.disk_refused, 7u);
  EXPECT_EQ(Files(folder).size(), 1u);
}

TEST(DiskTier, AnotherTenantsFileIsNeverServed) {
  const std::string dir = FreshDir("tenant");
  const std::string file = SpillOne(dir, 61, "tenant-a");
  ASSERT_FALSE(file.empty());
  {
    auto e = Make(TinyModel(1), Options(dir));
    ASSERT_TRUE(e);
    const Outcome r = Generate(*e, Request(NextTurn(61), "tenant-b", 6));
    EXPECT_EQ(r.cached, 0);
    EXPECT_EQ(e->Metrics().prefix_cache.disk_hits, 0u);
  }
  // Tenant a's file renamed to the name tenant b's lookup reads: refused.
  const std::string folder = ModelFolder(dir);
  const std::vector<int> whole = Prompt(61);
  const std::vector<int> prefix(whole.begin(), whole.begin() + kCached);
  const std::string b_name =
      PrefixDiskTier::FileNameIn(fs::path(folder).filename().string(), 16, "tenant-b", false, prefix);
  ASSERT_FALSE(b_name.empty());
  ASSERT_NE(fs::path(file).filename().string(), b_name);  // the partition is in the key
  for (const std::string& f : Files(folder))  // tenant b's own entry, written when its engine stopped
    if (f != file) fs::remove(f);
  fs::rename(file, folder + "/" + b_name);
  auto e = Make(TinyModel(1), Options(dir));
  ASSERT_TRUE(e);
  const Outcome r = Generate(*e, Request(NextTurn(61), "tenant-b", 6));
  EXPECT_EQ(r.cached, 0);
  EXPECT_EQ(e->Metrics().prefix_cache.disk_refused, 1u);
  EXPECT_FALSE(fs::exists(folder + "/" + b_name));
  ExpectSameBits(r, Recomputed(61));
}

TEST(DiskTier, AnotherModelsFileIsRefused) {
  const std::string dir = FreshDir("model");
  const std::string file = SpillOne(dir, 71);
  ASSERT_FALSE(file.empty());
  const std::string other_model = TinyModel(1, 4);  // another config: index_topk 4
  const std::string ours = ModelFolder(dir);
  {
    auto e = Make(other_model, Options(dir));  // its own folder: nothing to find
    ASSERT_TRUE(e);
    EXPECT_EQ(Generate(*e, Request(NextTurn(71), "a", 1)).cached, 0);
  }
  std::string theirs;
  for (const auto& d : fs::directory_iterator(dir))
    if (d.is_directory() && d.path().string() != ours) theirs = d.path().string();
  ASSERT_FALSE(theirs.empty());
  for (const std::string& f : Files(theirs)) fs::remove(f);
  // The first model's file, planted in the other's folder under the name it would look up.
  const std::vector<int> whole = Prompt(71);
  const std::vector<int> prefix(whole.begin(), whole.begin() + kCached);
  const std::string planted =
      theirs + "/" + PrefixDiskTier::FileNameIn(fs::path(theirs).filename().string(), 16, "a", false, prefix);
  fs::copy_file(file, planted);
  auto e = Make(other_model, Options(dir));
  ASSERT_TRUE(e);
  EXPECT_EQ(Generate(*e, Request(NextTurn(71), "a", 1)).cached, 0);
  EXPECT_EQ(e->Metrics().prefix_cache.disk_refused, 1u);
  EXPECT_FALSE(fs::exists(planted));
  EXPECT_TRUE(fs::exists(file));  // the first model's own folder is untouched
}

TEST(DiskTier, AnUnwritableDirectoryIsRefusedAtCreate) {
  EngineOptions o = Options("/proc/moeserve-no-such-dir");
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  auto e = Engine::Create(*d, o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message().find("prefix_disk_dir"), std::string::npos) << e.error().ToString();
}

TEST(DiskTier, AFileUnusedForLongerThanTheMaxAgeIsDeletedAtStart) {
  const std::string old_dir = FreshDir("age_old"), recent_dir = FreshDir("age_recent");
  const std::string old_file = SpillOne(old_dir, 81), recent_file = SpillOne(recent_dir, 82);
  ASSERT_FALSE(old_file.empty());
  ASSERT_FALSE(recent_file.empty());
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(old_file, now - std::chrono::hours(72));
  fs::last_write_time(recent_file, now - std::chrono::hours(3));
  EngineOptions o = Options(old_dir);
  o.prefix_disk_max_age_seconds = 86400;
  {
    auto e = Make(TinyModel(1), o);
    ASSERT_TRUE(e);
    EXPECT_FALSE(fs::exists(old_file));
    EXPECT_EQ(Generate(*e, Request(NextTurn(81), "a", 1)).cached, 0);
    const PrefixCacheStats s = e->Metrics().prefix_cache;  // published by a step
    EXPECT_EQ(s.disk_expired, 1u);
    EXPECT_EQ(s.disk_hits, 0u);
    EXPECT_EQ(s.disk_refused, 0u);
  }
  o.prefix_disk_dir = recent_dir;  // within the bound: kept and served
  auto e = Make(TinyModel(1), o);
  ASSERT_TRUE(e);
  EXPECT_TRUE(fs::exists(recent_file));
  const Outcome r = Generate(*e, Request(NextTurn(82), "a", 6));
  EXPECT_EQ(r.cached, kCached);
  EXPECT_EQ(e->Metrics().prefix_cache.disk_expired, 0u);
  EXPECT_EQ(e->Metrics().prefix_cache.disk_hits, 1u);
  ExpectSameBits(r, Recomputed(82));
}

TEST(DiskTier, ANegativeMaxAgeIsRefusedAtCreate) {
  EngineOptions o = Options(FreshDir("age_negative"));
  o.prefix_disk_max_age_seconds = -1;
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  auto e = Engine::Create(*d, o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message().find("prefix_disk_max_age_seconds"), std::string::npos) << e.error().ToString();
}

// The tier alone, on a clock the test sets: a file's age runs from its last
// use (a hit), not its write, and that use outlives a restart in its mtime.
TEST(DiskTier, FilesExpireByLastUseAsTheTierRuns) {
  const std::string dir = FreshDir("age_clock");
  int64_t now = 1'000'000;
  auto open = [&]() {
    PrefixDiskTier::Options o;
    o.dir = dir;
    o.max_bytes = int64_t{1} << 30;
    o.model_identity = "age-test";
    o.block_tokens = 16;
    o.floats_per_token = 4;
    o.delta_shape = {{3, 5}};
    o.max_age_seconds = 1000;
    o.clock = [&now] { return now; };
    auto t = PrefixDiskTier::Open(std::move(o));
    EXPECT_TRUE(t) << t.error().ToString();
    return t ? std::move(*t) : nullptr;
  };
  KvPool pool(16, 16, 4);
  const std::vector<DeltaLayerState> delta = {DeltaLayerState{std::vector<float>(3, 1.f), std::vector<float>(5, 2.f)}};
  auto tokens = [](int first) {
    std::vector<int> t(32);
    for (int i = 0; i < 32; ++i) t[static_cast<size_t>(i)] = first + i;
    return t;
  };
  const std::vector<int> a = tokens(100), b = tokens(200), c = tokens(300);
  std::vector<int> blocks;
  for (int i = 0; i < 2; ++i) blocks.push_back(*pool.Allocate());
  auto found = [&](PrefixDiskTier& t, const std::vector<int>& p) { return t.Find(p, 32, "x", 0, 0).has_value(); };
  {
    auto tier = open();
    ASSERT_TRUE(tier);
    ASSERT_TRUE(tier->Write(pool, a, blocks, delta, "x", false));  // used at 1'000'000
    now += 500;
    ASSERT_TRUE(tier->Write(pool, b, blocks, delta, "x", false));  // used at 1'000'500
    now += 400;
    auto hit = tier->Find(a, 32, "x", 0, 0);
    ASSERT_TRUE(hit);
    auto restored = tier->Read(pool, *hit, a, "x");  // a used again at 1'000'900
    ASSERT_TRUE(restored) << restored.error().ToString();
    for (int blk : restored->blocks) pool.Unref(blk);
    now += 700;  // 1'001'600: b is 1100 s unused, a 700 s
    EXPECT_FALSE(found(*tier, b));  // past the bound: never served, even before it is deleted
    ASSERT_TRUE(tier->Write(pool, c, blocks, delta, "x", false));
    PrefixCacheStats s;
    tier->FillStats(s);
    EXPECT_EQ(s.disk_expired, 1u);
    EXPECT_EQ(s.disk_entries, 2);
    EXPECT_EQ(s.disk_evictions, 0u);
    EXPECT_FALSE(fs::exists(tier->folder() + "/" + tier->FileName("x", false, b)));
    EXPECT_TRUE(found(*tier, a));
    EXPECT_TRUE(found(*tier, c));
    struct stat st {};
    ASSERT_EQ(::stat((tier->folder() + "/" + tier->FileName("x", false, a)).c_str(), &st), 0);
    EXPECT_EQ(st.st_mtim.tv_sec, 1'000'900);  // the hit, kept for a restart
  }
  now = 1'001'950;  // a restart: a (1'000'900) is 1050 s unused, c (1'001'600) 350 s
  auto tier = open();
  ASSERT_TRUE(tier);
  PrefixCacheStats s;
  tier->FillStats(s);
  EXPECT_EQ(s.disk_expired, 1u);
  EXPECT_EQ(s.disk_entries, 1);
  EXPECT_FALSE(found(*tier, a));
  EXPECT_TRUE(found(*tier, c));
}

// The restored rows and DeltaNet state must be the ones a recompute builds,
// on a model where both matter: DeltaNet layers carry the prefix in their
// state, and DSA layers whose indexer picks 16 of the 64 cached keys (the
// tests above use index_topk 2048, where every key is picked and a wrong
// indexer key would go unseen). Each of 6 steps' 20 most likely tokens and
// their log-probabilities, bit for bit.
TEST(DiskTier, ARestoredPrefixGivesTheRecomputedLogitsWhereTheIndexerSelects) {
  const std::string& model = TinyModel(1, 16);
  struct Steps {
    std::vector<std::vector<TokenLogprob>> top;
    int cached = -1;
  };
  auto run = [&](const EngineOptions& o, const std::vector<int>& prompt, int max_tokens) {
    Steps out;
    auto e = Make(model, o);
    if (!e) return out;
    GenerationRequest r = Request(prompt, "a", max_tokens);
    r.logprobs = 20;
    auto id = e->Submit(std::move(r));
    EXPECT_TRUE(id) << id.error().ToString();
    if (!id) return out;
    for (int guard = 0; e->HasWork() && guard < 10000; ++guard)
      for (const TokenEvent& ev : e->Step()) {
        if (ev.id != *id) continue;
        if (ev.token >= 0) out.top.push_back(ev.top_logprobs);
        if (ev.finish != FinishReason::kNone) out.cached = ev.usage.cached_tokens;
      }
    return out;
  };
  const std::string dir = FreshDir("indexer");
  ASSERT_FALSE(SpillOne(dir, 91, "a", model).empty());
  const Steps restored = run(Options(dir), NextTurn(91), 6);  // a new engine: the prefix comes from disk
  EngineOptions plain = Options("");
  plain.prefix_cache = false;
  const Steps recomputed = run(plain, NextTurn(91), 6);
  EXPECT_EQ(restored.cached, kCached);
  EXPECT_EQ(recomputed.cached, 0);
  ASSERT_EQ(restored.top.size(), 6u);
  ASSERT_EQ(recomputed.top.size(), 6u);
  for (size_t step = 0; step < 6; ++step) {
    ASSERT_EQ(restored.top[step].size(), 20u);
    ASSERT_EQ(recomputed.top[step].size(), 20u);
    for (size_t k = 0; k < 20; ++k) {
      EXPECT_EQ(restored.top[step][k].token, recomputed.top[step][k].token) << "step " << step << " rank " << k;
      EXPECT_EQ(std::memcmp(&restored.top[step][k].logprob, &recomputed.top[step][k].logprob, sizeof(float)), 0)
          << "step " << step << " rank " << k << ": " << restored.top[step][k].logprob << " vs "
          << recomputed.top[step][k].logprob;
    }
  }
}

}  // namespace
}  // namespace moeserve::engine
