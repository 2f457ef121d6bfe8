// Expert parallelism on this machine and at the flagship's shapes.
//
// Part 1 (measured): the `small` preset at world sizes 1, 2 and 4, each rank
// a separate process over Gloo on loopback with one kernel thread, in
// lockstep (every rank runs the same passes, rank 0's greedy token
// broadcast). Per world size: decode tokens/s (batch 1, after a prefill),
// all-to-all bytes per decoded token (what every rank sent through
// AllToAllV and Broadcast, summed), and each rank's resident weight bytes.
// On a 2-core machine more ranks mean more processes sharing two cores:
// this shows the overhead of the exchanges, not a speed-up.
//
// Part 2 (modelled): the same exchanges at flagship shapes (defaults below,
// from the kernel benchmarks' expert projection 7168 x 2048) over 400 Gb/s
// links: bytes per token per MoE layer and the time per decode step for a
// batch, assuming uniform routing (a fraction (W-1)/W of the pairs leaves
// its rank) and the link as the only cost.
//
// Usage: bench_expert_parallel [--model DIR] [--decode N] [--worlds 1,2,4]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "moeserve/kernels/comm/exchange.hpp"
#include "moeserve/kernels/comm/gloo_group.hpp"
#include "moeserve/kernels/comm/rendezvous.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace {

using namespace moeserve;
namespace comm = kernels::comm;
using Clock = std::chrono::steady_clock;

const std::string kSecret = "bench-expert-parallel-secret-01";

struct RankResult {
  double decode_seconds = 0;
  uint64_t decode_bytes = 0;  // sent by this rank during decode
  uint64_t resident = 0;
  int tokens = 0;
};

int FreePort() {
  auto s = comm::RendezvousServer::Start("127.0.0.1", 0, kSecret, 1);
  return s ? (*s)->port() : 29555;  // released when s goes
}

int RunRank(const std::string& model_dir, int world, int rank, int port, int decode, const std::string& out) {
  kernels::RequestDefaultThreadPoolSize(1);
  std::unique_ptr<comm::RendezvousServer> server;
  if (rank == 0) {
    auto s = comm::RendezvousServer::Start("127.0.0.1", port, kSecret, world);
    if (!s) return 10;
    server = std::move(*s);
  }
  comm::GlooGroupOptions o;
  o.rank = rank;
  o.size = world;
  o.master_port = port;
  o.secret = kSecret;
  o.timeout = std::chrono::seconds(120);
  auto group = comm::JoinGlooGroup(o);
  if (!group) return std::fprintf(stderr, "rank %d: %s\n", rank, group.error().message.c_str()), 11;
  auto dir = engine::OpenModelDir(model_dir);
  if (!dir) return 12;
  engine::ModelOptions mo;
  mo.comm = group->get();
  auto model = engine::Model::Load(*dir, mo);
  if (!model) return 13;
  const int V = (*model)->config().vocab_size;
  engine::KvPool pool(64, 16, (*model)->cache_floats_per_token());
  engine::SequenceCache seq = (*model)->NewSequence();
  std::vector<int> tokens = {256, 258};
  for (int i = 0; i < 62; ++i) tokens.push_back(32 + (i * 7) % 90);
  RankResult res;
  auto step = [&](std::span<const int> in) -> int {
    if (!engine::EnsureBlocks(pool, seq, seq.length + static_cast<int64_t>(in.size()))) return -1;
    std::vector<engine::ForwardSegment> segs = {{&seq, in, false}};
    std::vector<float> logits;
    if (!(*model)->Forward(pool, segs, &logits)) return -1;
    int next = 0;
    for (int v = 1; v < V; ++v)
      if (logits[v] > logits[next]) next = v;
    std::vector<uint8_t> msg(4);
    std::memcpy(msg.data(), &next, 4);
    auto got = comm::BroadcastBytes(**group, msg, 0);
    if (!got) return -1;
    std::memcpy(&next, got->data(), 4);
    return next;
  };
  int next = step(tokens);
  if (next < 0) return 14;
  const uint64_t bytes0 = (*group)->bytes_sent();
  const auto t0 = Clock::now();
  for (int i = 0; i < decode; ++i) {
    int in = next;
    next = step(std::span<const int>(&in, 1));
    if (next < 0) return 15;
  }
  res.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  res.decode_bytes = (*group)->bytes_sent() - bytes0;
  res.resident = (*model)->resident_weight_bytes();
  res.tokens = decode;
  std::ofstream(out, std::ios::binary).write(reinterpret_cast<const char*>(&res), sizeof(res));
  return 0;
}

bool RunWorld(const std::string& model_dir, int world, int decode, const std::string& tmp) {
  const int port = FreePort();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(RunRank(model_dir, world, r, port, decode, tmp + "/rank" + std::to_string(r)));
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) return std::fprintf(stderr, "world %d: a rank failed\n", world), false;
  double seconds = 0;
  uint64_t bytes = 0, max_resident = 0, min_resident = UINT64_MAX;
  int tokens = 0;
  for (int r = 0; r < world; ++r) {
    RankResult res;
    std::ifstream(tmp + "/rank" + std::to_string(r), std::ios::binary).read(reinterpret_cast<char*>(&res), sizeof(res));
    seconds = std::max(seconds, res.decode_seconds);
    bytes += res.decode_bytes;
    max_resident = std::max<uint64_t>(max_resident, res.resident);
    min_resident = std::min<uint64_t>(min_resident, res.resident);
    tokens = res.tokens;
  }
  std::printf("%5d  %10.2f  %14.0f  %12.1f - %.1f\n", world, tokens / seconds, static_cast<double>(bytes) / tokens,
              min_resident / 1048576.0, max_resident / 1048576.0);
  return true;
}

// The exchanges of one decoded token at flagship-like shapes.
void Model400G() {
  const double D = 7168, k = 8, moe_layers = 92, link_Bps = 400e9 / 8;
  std::printf("\nmodel: flagship-like shapes (hidden %.0f, %.0f experts per token, %.0f MoE layers), 400 Gb/s per rank,\n"
              "uniform routing; per token per MoE layer a rank sends k rows to owners and gets k back\n",
              D, k, moe_layers);
  std::printf("%5s  %22s  %22s  %16s  %16s\n", "world", "dispatch+combine B/tok", "+all-gather (fp32) B/tok",
              "step ms, batch 64", "batch 256");
  for (int W : {2, 4, 8, 16, 32}) {
    const double remote = (W - 1.0) / W;
    // Bytes leaving ranks per decoded token: its k rows out to the owners
    // and k answers back, BF16 on the wire as a GPU deployment sends them.
    const double a2a = moe_layers * 2 * k * remote * D * 2;
    // This CPU path today: fp32 rows plus the expert id, and the all-gather
    // of each token's output row to the W-1 other ranks.
    const double cpu = moe_layers * (2 * k * remote * (D + 1) * 4 + (W - 1) * D * 4);
    // One rank's egress per step carries 1/W of the batch's bytes.
    auto step_ms = [&](double batch) { return batch * a2a / W / link_Bps * 1e3; };
    std::printf("%5d  %22.3g  %22.3g  %16.3f  %16.3f\n", W, a2a, cpu, step_ms(64), step_ms(256));
  }
  std::printf("(step time = the batch's dispatch+combine bytes through one rank's link; latency and overlap with\n"
              " the shared expert not counted. Rows are BF16 on the wire; this CPU path sends fp32 today.)\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  int decode = 24;
  std::vector<int> worlds = {1, 2, 4};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model_dir = argv[i + 1];
    else if (a == "--decode") decode = std::atoi(argv[i + 1]);
    else if (a == "--worlds") {
      worlds.clear();
      for (char* t = std::strtok(argv[i + 1], ","); t; t = std::strtok(nullptr, ",")) worlds.push_back(std::atoi(t));
    }
  }
  const std::string tmp = (std::filesystem::temp_directory_path() / ("moe_bench_ep_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(tmp);
  if (model_dir.empty()) {
    model_dir = tmp + "/small";
    engine::ModelGenOptions o;
    o.config = *engine::PresetConfig("small");
    o.seed = 3;
    if (auto st = engine::GenerateModel(o, model_dir); !st) {
      std::fprintf(stderr, "%s\n", st.error().ToString().c_str());
      return 1;
    }
  }
  std::printf("small preset, batch-1 greedy decode of %d tokens after a 64-token prefill; one kernel thread per rank,\n"
              "ranks are processes over Gloo on loopback (this machine: %ld cores)\n",
              decode, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%5s  %10s  %14s  %20s\n", "world", "tokens/s", "a2a bytes/tok", "resident MiB/rank");
  for (int W : worlds)
    if (!RunWorld(model_dir, W, decode, tmp)) return 1;
  Model400G();
  std::filesystem::remove_all(tmp);
  return 0;
}
