// Expert parallelism across processes: ranks of a Gloo group on loopback
// (rank 0 serving the authenticated rendezvous store), one kernel thread per
// rank, each holding only its experts. At world sizes 1, 2 and 4 a batch of
// two sequences (prefill, then batched greedy decode with the token broadcast
// from rank 0) must give the single-process logits within model.md section
// 10 (1e-4 * max|ref| per row) and identical tokens, on every rank: for the
// tiny preset, a 32-expert variant, a gate bias that sends most pairs to
// the last rank's experts, BF16 experts (world 2), a DeepSeek-V3.2
// directory as published (world 2) and a Qwen3-Next one (worlds 2 and 4:
// gated GQA, DeltaNet, softmax routing, a gated shared expert), loaded
// through its family as the daemon's followers load it. Every rank holds
// exactly 1/world of the routed experts' bytes.
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../support/fork_ranks.hpp"
#include "../support/loopback.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/kernels/comm/exchange.hpp"
#include "moeserve/kernels/comm/gloo_group.hpp"
#include "moeserve/kernels/comm/in_process.hpp"
#include "moeserve/kernels/comm/rendezvous.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

namespace comm = kernels::comm;
const std::string kSecret = "expert-parallel-test-secret-0123";
constexpr int kDecode = 6;

struct RankOutput {
  std::vector<float> logits;  // prefill rows of both sequences, then each decode step's two rows
  std::vector<int> tokens;    // decoded tokens, both sequences interleaved
  uint64_t resident = 0;
  uint64_t routed = 0;  // routed-expert bytes held
  std::vector<uint64_t> rank_rows;
};

std::string OutPath(const std::string& tag, int world, int rank) {
  return testing_util::TempPath("ep_" + tag + "_w" + std::to_string(world) + "_r" + std::to_string(rank));
}

void Write(const std::string& path, const RankOutput& o) {
  nlohmann::json j;
  j["tokens"] = o.tokens;
  j["resident"] = o.resident;
  j["routed"] = o.routed;
  j["rank_rows"] = o.rank_rows;
  std::ofstream(path + ".json") << j.dump();
  std::ofstream(path + ".f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(o.logits.data()), static_cast<std::streamsize>(o.logits.size() * 4));
}

RankOutput Read(const std::string& path) {
  RankOutput o;
  std::ifstream jf(path + ".json");
  if (!jf) return o;
  auto j = nlohmann::json::parse(jf);
  o.tokens = j["tokens"].get<std::vector<int>>();
  o.resident = j["resident"];
  o.routed = j["routed"];
  o.rank_rows = j["rank_rows"].get<std::vector<uint64_t>>();
  std::ifstream lf(path + ".f32", std::ios::binary | std::ios::ate);
  o.logits.resize(static_cast<size_t>(lf.tellg()) / 4);
  lf.seekg(0);
  lf.read(reinterpret_cast<char*>(o.logits.data()), static_cast<std::streamsize>(o.logits.size() * 4));
  return o;
}

int Argmax(const float* row, int V) {
  int best = 0;
  for (int v = 1; v < V; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

// How a rank loads the model: the directory opened (OpenModelDir) and
// Model::Load, or through its family in the registry (LoadLayerGraph).
enum class Load { kOpenDir, kFamily };

// One rank (world 0: a plain single process without a group). Returns an exit code.
int RunRank(const std::string& model_path, int world, int rank, int port, const std::string& out, Load load) {
  kernels::RequestDefaultThreadPoolSize(1);
  std::unique_ptr<comm::RendezvousServer> server;
  std::unique_ptr<comm::Communicator> group;
  if (world > 0) {
    if (rank == 0) {
      auto s = comm::RendezvousServer::Start("127.0.0.1", port, kSecret, world);
      if (!s) return std::fprintf(stderr, "rank 0: %s\n", s.error().message.c_str()), 10;
      server = std::move(*s);
    }
    comm::GlooGroupOptions o;
    o.rank = rank;
    o.size = world;
    o.master_port = port;
    o.secret = kSecret;
    o.timeout = std::chrono::seconds(30);
    auto g = comm::JoinGlooGroup(o);
    if (!g) return std::fprintf(stderr, "rank %d: %s\n", rank, g.error().message.c_str()), 11;
    group = std::move(*g);
  }
  ModelOptions mo;
  mo.comm = group.get();
  Result<std::unique_ptr<Model>> model = Fail(Error::Internal("not loaded"));
  if (load == Load::kFamily) {
    model = LoadLayerGraph(model_path, mo);
  } else {
    auto dir = OpenModelDir(model_path);
    if (!dir) return 12;
    model = Model::Load(*dir, mo);
  }
  if (!model) return std::fprintf(stderr, "rank %d: %s\n", rank, model.error().ToString().c_str()), 13;
  const int V = (*model)->config().vocab_size;
  KvPool pool(64, 16, (*model)->cache_floats_per_token());
  SequenceCache a = (*model)->NewSequence(), b = (*model)->NewSequence();
  std::vector<int> pa = testing_util::TestPrompt(37, 3), pb = testing_util::TestPrompt(20, 9);
  RankOutput res;
  auto step = [&](std::vector<int> ta, std::vector<int> tb, bool all) -> bool {
    if (!EnsureBlocks(pool, a, a.length + static_cast<int64_t>(ta.size())) ||
        !EnsureBlocks(pool, b, b.length + static_cast<int64_t>(tb.size())))
      return false;
    std::vector<ForwardSegment> segs = {{&a, ta, all}, {&b, tb, all}};
    std::vector<float> logits;
    if (!(*model)->Forward(pool, segs, &logits)) return false;
    res.logits.insert(res.logits.end(), logits.begin(), logits.end());
    // Rank 0 samples (greedy); its choice is what every rank feeds back.
    const size_t rows = logits.size() / static_cast<size_t>(V);
    std::vector<uint8_t> msg(8);
    int na = Argmax(&logits[(all ? ta.size() - 1 : 0) * V], V), nb = Argmax(&logits[(rows - 1) * V], V);
    std::memcpy(msg.data(), &na, 4);
    std::memcpy(msg.data() + 4, &nb, 4);
    if (group) {
      auto got = comm::BroadcastBytes(*group, msg, 0);
      if (!got || got->size() != 8) return false;
      msg = *got;
    }
    std::memcpy(&na, msg.data(), 4);
    std::memcpy(&nb, msg.data() + 4, 4);
    res.tokens.push_back(na);
    res.tokens.push_back(nb);
    return true;
  };
  if (!step(pa, pb, true)) return 14;
  for (int i = 0; i < kDecode; ++i) {
    std::vector<int> ta = {res.tokens[res.tokens.size() - 2]}, tb = {res.tokens.back()};
    if (!step(ta, tb, false)) return 15;
  }
  res.resident = (*model)->resident_weight_bytes();
  res.routed = (*model)->routed_expert_bytes();
  res.rank_rows = (*model)->expert_parallel_stats().rank_rows;
  Write(out, res);
  return 0;
}

std::string GenerateVariant(const std::string& tag, int experts) {
  std::string dir = testing_util::TempPath("ep_model_" + tag);
  std::filesystem::remove_all(dir);
  ModelGenOptions o;
  o.config = *PresetConfig("tiny");
  o.config.moe.num_experts = experts;
  o.seed = 11;
  auto st = GenerateModel(o, dir);
  EXPECT_TRUE(st) << st.error().ToString();
  return dir;
}

// Adds `delta` to ffn.gate.bias of experts [first, E) in every MoE layer, in
// place in the safetensors files (the bias is F32 and only selects experts).
void BiasTowardsLastExperts(const std::string& dir, int first, float delta) {
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors") continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    io.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    io.read(header.data(), static_cast<std::streamsize>(n));
    auto j = nlohmann::json::parse(header);
    for (auto& [name, t] : j.items()) {
      if (name.find("ffn.gate.bias") == std::string::npos) continue;
      ASSERT_EQ(t["dtype"], "F32");
      const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
      std::vector<float> bias((end - begin) / 4);
      io.seekg(static_cast<std::streamoff>(8 + n + begin));
      io.read(reinterpret_cast<char*>(bias.data()), static_cast<std::streamsize>(end - begin));
      for (size_t e = static_cast<size_t>(first); e < bias.size(); ++e) bias[e] += delta;
      io.seekp(static_cast<std::streamoff>(8 + n + begin));
      io.write(reinterpret_cast<const char*>(bias.data()), static_cast<std::streamsize>(end - begin));
    }
  }
}

RankOutput RunGroup(const std::string& model, const std::string& tag, int world, Load load) {
  const int port = world > 0 ? test_support::FreeLoopbackPort() : 0;
  const int ranks = std::max(world, 1);
  // Paths name the parent's pid (TempPath), so they are fixed before the fork.
  std::vector<std::string> outs;
  for (int r = 0; r < ranks; ++r) outs.push_back(OutPath(tag, world, r));
  auto codes = test_support::ForkRanks(ranks, [&](int r) { return RunRank(model, world, r, port, outs[static_cast<size_t>(r)], load); });
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << tag << " world " << world << " rank " << r;
  RankOutput root = Read(OutPath(tag, world, 0));
  for (int r = 1; r < ranks; ++r) {
    RankOutput other = Read(OutPath(tag, world, r));
    EXPECT_EQ(other.routed, root.routed) << "rank " << r << " holds another share of the routed experts than rank 0";
    EXPECT_EQ(other.tokens, root.tokens) << "rank " << r << " decoded differently from rank 0";
    EXPECT_EQ(other.logits, root.logits) << "rank " << r << " computed other logits than rank 0";
  }
  return root;
}

void ExpectSameAsOneProcess(const RankOutput& ref, const RankOutput& got, int V, const std::string& what) {
  ASSERT_FALSE(ref.tokens.empty());
  EXPECT_EQ(got.tokens, ref.tokens) << what;
  ASSERT_EQ(got.logits.size(), ref.logits.size()) << what;
  const size_t rows = ref.logits.size() / static_cast<size_t>(V);
  ASSERT_GT(rows, 0u);
  for (size_t r = 0; r < rows; ++r) {
    float scale = 0, diff = 0;
    for (int v = 0; v < V; ++v) {
      scale = std::max(scale, std::fabs(ref.logits[r * V + v]));
      diff = std::max(diff, std::fabs(got.logits[r * V + v] - ref.logits[r * V + v]));
    }
    ASSERT_LE(diff, 1e-4f * scale) << what << ": row " << r;
  }
}

void CheckWorlds(const std::string& model, const std::string& tag, int V, std::vector<int> worlds,
                 Load load = Load::kOpenDir) {
  RankOutput ref = RunGroup(model, tag, 0, load);
  ASSERT_EQ(ref.tokens.size(), static_cast<size_t>(2 * (kDecode + 1)));
  uint64_t prev_resident = ref.resident;
  ASSERT_GT(ref.routed, 0u);
  for (int W : worlds) {
    RankOutput got = RunGroup(model, tag, W, load);
    ExpectSameAsOneProcess(ref, got, V, tag + " world " + std::to_string(W));
    // Each rank holds exactly its 1/W of the routed experts.
    EXPECT_EQ(got.routed * static_cast<uint64_t>(W), ref.routed) << tag << " world " << W;
    // Each rank keeps only its experts: strictly less as the world grows.
    if (W > 1) {
      EXPECT_LT(got.resident, prev_resident) << "world " << W;
    }
    prev_resident = got.resident;
  }
}

TEST(ExpertParallel, TinyPresetAtWorldSizes124) {
  CheckWorlds(testing_util::TinyModel(1), "tiny", PresetConfig("tiny")->vocab_size, {1, 2, 4});
}

TEST(ExpertParallel, ThirtyTwoExpertsAtWorldSizes124) {
  CheckWorlds(GenerateVariant("e32", 32), "e32", PresetConfig("tiny")->vocab_size, {1, 2, 4});
}

TEST(ExpertParallel, UnevenRoutingStillMatches) {
  const std::string model = GenerateVariant("uneven", 16);
  // Experts 12..15 (rank 3 of 4, rank 1 of 2) win most selections.
  BiasTowardsLastExperts(model, 12, 1.0f);
  CheckWorlds(model, "uneven", PresetConfig("tiny")->vocab_size, {2, 4});
  RankOutput w4 = Read(OutPath("uneven", 4, 0));
  ASSERT_EQ(w4.rank_rows.size(), 4u);
  uint64_t total = 0;
  for (uint64_t r : w4.rank_rows) total += r;
  ASSERT_GT(total, 0u);
  // Balanced would be a quarter each; the bias makes rank 3 take far more.
  EXPECT_GT(w4.rank_rows[3] * 10, total * 4) << "rank 3 got " << w4.rank_rows[3] << " of " << total;
}

// BF16 experts (model.md 1.2): each rank holds only its slice of them too.
TEST(ExpertParallel, Bf16ExpertsAtWorldSize2) {
  CheckWorlds(testing_util::TinyModel(1, 2048, ExpertFormat::kBf16), "bf16", PresetConfig("tiny")->vocab_size, {2});
}

// A DeepSeek-V3.2 directory as published (FP8 block-scaled shards, sigmoid
// group-limited routing, shared experts, DSA) splits its routed experts the
// same way once converted onto the graph: each rank holds half of the
// routed experts' bytes.
TEST(ExpertParallel, DeepseekV32PublishedLayoutAtWorldSize2) {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  const std::string root = src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
  const std::string dir = ::testing::TempDir() + "/moe_ep_ds32_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string cmd = "/usr/bin/python3 " + root + "/tools/reference/families/deepseek_v32.py write --out " + dir +
                          " --layers 3 --index-topk 8 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto opened = OpenModelDir(dir);
  ASSERT_TRUE(opened) << opened.error().ToString();
  EXPECT_EQ(opened->family, "deepseek_v32");
  const int V = opened->config.vocab_size;
  CheckWorlds(dir, "ds32", V, {2});
  std::filesystem::remove_all(dir);
}

// Qwen3-Next as published (tools/reference/families/qwen3_next.py: 8
// experts, 3 of 4 layers MoE with a sigmoid-gated shared expert, DeltaNet
// and gated GQA layers), loaded through its family onto the graph.
TEST(ExpertParallel, Qwen3NextPublishedLayoutAtWorldSizes24) {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  const std::string root = src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
  const std::string dir = ::testing::TempDir() + "/moe_ep_qwen3_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string cmd = "/usr/bin/python3 " + root + "/tools/reference/families/qwen3_next.py write --out " + dir +
                          " --vocab 512 --layers 4 --seed 5 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto family = FindFamily(dir);
  ASSERT_TRUE(family) << family.error().ToString();
  EXPECT_STREQ((*family)->name, "qwen3_next");
  CheckWorlds(dir, "qwen3", 512, {2, 4}, Load::kFamily);
  std::filesystem::remove_all(dir);
}

TEST(ExpertParallel, WorldThatDoesNotDivideTheExpertsIsRefused) {
  auto dir = OpenModelDir(testing_util::TinyModel(1));
  ASSERT_TRUE(dir);
  // Three in-process ranks: the load fails before any collective is called.
  auto group = comm::MakeInProcessGroup(3);
  ModelOptions mo;
  mo.comm = group[0].get();
  auto model = Model::Load(*dir, mo);
  ASSERT_FALSE(model);
  EXPECT_NE(model.error().ToString().find("divisible"), std::string::npos) << model.error().ToString();
}

}  // namespace
}  // namespace moeserve::engine
