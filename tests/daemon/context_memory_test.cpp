// The daemon's side of memory and the context window: an oversized request
// (a chat completion, a session turn) is answered 400 context_length_exceeded
// when the KV pool bounds the window; an unset cache_tokens is sized from
// the machine's free memory (MemAvailable, or the cgroup's limit less its
// usage when lower) less the model's files; and the prefix cache's tier on
// disk (prefix_disk_dir) serves a restarted daemon the prefix the last one
// left, counted at /metrics.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../../daemon/model/machine_memory.hpp"
#include "daemon_harness.hpp"
#include "metric_sample.hpp"

namespace moeserve::daemon {
namespace {

namespace fs = std::filesystem;
using namespace testing;
using moeserve::testing::MetricSample;

std::string Scratch(const std::string& tag) {
  const std::string dir = ::testing::TempDir() + "/moe_ctxmem_" + tag + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A user message the tiny model's byte-level tokenizer renders to more than `tokens` tokens.
json LongMessages(int tokens) {
  return json::array({{{"role", "user"}, {"content", std::string(static_cast<size_t>(tokens), 'a')}}});
}

TEST(ContextMemory, APoolBoundWindowRefusesOversizedRequestsWith400) {
  DaemonConfig c = TestConfig();
  c.cache_tokens = 256;
  c.max_context = 0;  // the model's 1M positions: the pool is the bound
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  const int port = PortOf(*d);
  auto models = Http(port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(models.Json()["data"][0]["max_model_len"], 256);

  auto r = Chat(port, {{"model", "tiny"}, {"messages", LongMessages(400)}, {"max_tokens", 8}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "context_length_exceeded") << r.body;
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("256"), std::string::npos) << r.body;

  auto session = Http(port, "POST", "/v1/sessions", "{}");
  ASSERT_EQ(session.status, 200) << session.body;
  const std::string id = session.Json().value("id", "");
  auto turn = Http(port, "POST", "/v1/sessions/" + id + "/chat/completions",
                   json{{"messages", LongMessages(400)}, {"max_tokens", 8}}.dump());
  EXPECT_EQ(turn.status, 400) << turn.body;
  EXPECT_EQ(turn.Json()["error"]["code"], "context_length_exceeded") << turn.body;

  // What fits is served.
  auto ok = Chat(port, {{"model", "tiny"}, {"messages", LongMessages(20)}, {"max_tokens", 4}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  d->Shutdown(1);
}

TEST(ContextMemory, FreeMemoryIsTheLowerOfMemAvailableAndTheCgroupsRoom) {
  const std::string dir = Scratch("meminfo");
  std::ofstream(dir + "/meminfo") << "MemTotal:       32000000 kB\nMemFree:  1000 kB\nMemAvailable:   16000000 kB\n";
  fs::create_directories(dir + "/cg");
  MachineMemory m = ReadMachineMemory(dir + "/meminfo", dir + "/cg");  // no cgroup files
  EXPECT_EQ(m.available, int64_t{16000000} * 1024);
  EXPECT_EQ(m.source, "MemAvailable");
  std::ofstream(dir + "/cg/memory.max") << "max\n";  // v2 without a limit
  std::ofstream(dir + "/cg/memory.current") << "123456\n";
  EXPECT_EQ(ReadMachineMemory(dir + "/meminfo", dir + "/cg").available, int64_t{16000000} * 1024);
  std::ofstream(dir + "/cg/memory.max") << (int64_t{8} << 30) << "\n";  // an 8 GiB container using 1 GiB
  std::ofstream(dir + "/cg/memory.current") << (int64_t{1} << 30) << "\n";
  m = ReadMachineMemory(dir + "/meminfo", dir + "/cg");
  EXPECT_EQ(m.available, int64_t{7} << 30);
  EXPECT_EQ(m.source, "cgroup memory.max");

  EXPECT_EQ(CacheMemoryBudget(int64_t{10} << 30, int64_t{2} << 30, 0.5), int64_t{4} << 30);
  EXPECT_EQ(CacheMemoryBudget(int64_t{1} << 30, int64_t{2} << 30, 0.5), 0);  // weights past the free memory
  fs::create_directories(dir + "/model/sub");
  std::ofstream(dir + "/model/a.safetensors") << std::string(1000, 'x');
  std::ofstream(dir + "/model/config.json") << std::string(24, 'x');
  std::ofstream(dir + "/model/sub/ignored") << std::string(500, 'x');
  EXPECT_EQ(DirectoryBytes(dir + "/model"), 1024);
}

TEST(ContextMemory, AnUnsetCacheTokensIsSizedFromMemoryAndAnExplicitOneWins) {
  DaemonConfig c = TestConfig();
  c.cache_tokens = 0;
  c.max_context = 0;
  c.cache_memory_share = 0.01;
  const MachineMemory m = ReadMachineMemory();
  const int64_t budget = CacheMemoryBudget(m.available, DirectoryBytes(c.model), c.cache_memory_share);
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  auto models = Http(PortOf(*d), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  // The tiny preset: 1536 bytes per token row, 77824 bytes of DeltaNet state
  // per sequence (engine.context_bytes), 64 sequences set aside.
  const int64_t blocks = std::max<int64_t>((budget - 64 * 77824) / (16 * 1536), 1);
  const int64_t expected = std::min<int64_t>(blocks * 16, 1048576);  // the model's positions bound it too
  EXPECT_NEAR(models.Json()["data"][0]["max_model_len"].get<double>(), static_cast<double>(expected),
              static_cast<double>(expected) * 0.10)  // free memory moves between the two readings (other processes)
      << "free " << m.available << " bytes by " << m.source;
  d->Shutdown(1);
  d.reset();

  c.cache_tokens = 512;  // explicit: wins
  c.port = FreeLoopbackPort();
  auto e = StartDaemon(c);
  ASSERT_TRUE(e);
  auto explicit_models = Http(PortOf(*e), "GET", "/v1/models");
  EXPECT_EQ(explicit_models.Json()["data"][0]["max_model_len"], 512) << explicit_models.body;
  e->Shutdown(1);
}

TEST(ContextMemory, ARestartedDaemonReadsThePrefixTheLastOneLeftOnDisk) {
  const std::string disk = Scratch("disk");
  DaemonConfig c = TestConfig();
  c.prefix_disk_dir = disk;
  const json body = {{"model", "tiny"}, {"messages", LongMessages(200)}, {"max_tokens", 2}};
  {
    auto d = StartDaemon(c);
    ASSERT_TRUE(d);
    auto r = Chat(PortOf(*d), body);
    ASSERT_EQ(r.status, 200) << r.body;
    d->Shutdown(1);
  }
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(disk)) files += e.path().extension() == ".mpc";
  EXPECT_GE(files, 1u);
  c.port = FreeLoopbackPort();
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  auto r = Chat(PortOf(*d), body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(r.Json()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 150) << r.body;
  auto metrics = Http(PortOf(*d), "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200) << metrics.body;
  EXPECT_EQ(MetricSample(metrics.body, "moe_prefix_disk_hits_total"), 1.0);
  EXPECT_GE(MetricSample(metrics.body, "moe_prefix_disk_entries"), 1.0);
  EXPECT_EQ(MetricSample(metrics.body, "moe_prefix_disk_refused_total"), 0.0);
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon
