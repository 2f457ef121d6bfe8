// moe-daemon publish against s3rver (a real S3 protocol server) and a local
// folder: a Hugging Face-shaped directory goes up (a shard over the multipart
// threshold in several parts), `pull` brings identical bytes back; an
// interrupted multipart upload resumes without sending finished parts again; a
// file changed after a partial upload is detected; unsafe inputs and refused
// credentials fail clearly.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "moeserve/common/sha256.hpp"
#include "moeserve/engine/families/deepseek_v32.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/storage/commands.hpp"
#include "moeserve/storage/model_publisher.hpp"
#include "moeserve/storage/weight_puller.hpp"
#include "s3rver.hpp"
#include "test_servers.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::S3rver;

constexpr size_t kShard = 700000;       // over the test threshold: 7 parts of 100 KiB (the last shorter)
constexpr uint64_t kPart = 100 << 10;
constexpr int kShardParts = 7;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteText(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// What a Hugging Face download looks like: config, tokenizer, index, shards, a nested folder.
std::string MakeHfLikeModel(uint64_t seed) {
  std::string dir = MakeTempDir("publish-src");
  testing::WriteRandomModel(dir, {{"model-00001-of-00002.safetensors", kShard},
                                  {"model-00002-of-00002.safetensors", 50000},
                                  {"original/dtypes.json", 120}},
                            seed);
  fs::remove(dir + "/manifest.json");  // the publisher writes its own
  WriteText(dir + "/config.json", R"({"model_type": "gpt_oss", "num_hidden_layers": 24})");
  WriteText(dir + "/tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})");
  WriteText(dir + "/model.safetensors.index.json", R"({"weight_map": {}})");
  return dir;
}

class PublishTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = S3rver::Start("models", &why_).release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (!server_) GTEST_SKIP() << why_;
    src_ = MakeHfLikeModel(7);
    cache_ = MakeTempDir("publish-cache");
    state_ = MakeTempDir("publish-state");
    opts_.target.endpoint_url = server_->endpoint();
    opts_.target.credentials = AwsCredentials{S3rver::kAccessKey, S3rver::kSecretKey, ""};
    opts_.multipart_threshold = 256 << 10;
    opts_.part_size = kPart;
    opts_.allow_small_parts = true;  // s3rver does not enforce S3's 5 MiB minimum
    opts_.state_dir = state_;
    opts_.log_progress = false;
    opts_.retry.base_delay = std::chrono::milliseconds(10);
  }
  void TearDown() override {
    for (const auto& d : {src_, cache_, state_})
      if (!d.empty()) fs::remove_all(d);
  }

  Result<PulledModel> PullBack(const std::string& uri) {
    PullOptions po;
    po.revision = "v1";
    po.log_progress = false;
    po.part_size = 64 << 10;
    po.source = opts_.target;
    return WeightPuller({cache_}).Pull(uri, po);
  }

  // Every file the publisher listed arrives byte for byte.
  void ExpectSameFiles(const std::string& pulled_dir, int expected_files) {
    int compared = 0;
    for (const auto& e : fs::recursive_directory_iterator(src_)) {
      if (!e.is_regular_file() || e.path().filename() == "manifest.json") continue;
      fs::path rel = fs::relative(e.path(), src_);
      EXPECT_EQ(ReadAll(e.path()), ReadAll(fs::path(pulled_dir) / rel)) << rel;
      ++compared;
    }
    EXPECT_EQ(compared, expected_files);
  }

  static S3rver* server_;
  static std::string why_;
  std::string src_, cache_, state_;
  PublishOptions opts_;
};
S3rver* PublishTest::server_ = nullptr;
std::string PublishTest::why_;

TEST_F(PublishTest, PublishesInPartsThenPullsBackIdenticalBytes) {
  auto published = PublishModel(src_, "s3://models/hf/v1/", opts_);
  ASSERT_TRUE(published) << published.error().ToString();
  EXPECT_EQ(published->stats.files, 6);
  EXPECT_EQ(published->stats.files_sent, 6);
  EXPECT_EQ(published->stats.parts_sent, kShardParts);
  EXPECT_TRUE(fs::exists(src_ + "/manifest.json"));  // also left beside the model
  EXPECT_EQ(published->manifest_sha256, Sha256Hex(ReadAll(src_ + "/manifest.json")));

  auto pulled = PullBack("s3://models/hf/v1/");
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  ExpectSameFiles(pulled->dir, 6);

  // A second publish finds every object in place (size and sha256) and sends none.
  auto again = PublishModel(src_, "s3://models/hf/v1/", opts_);
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_EQ(again->stats.files_skipped, 6);
  EXPECT_EQ(again->stats.files_sent, 0);
  EXPECT_EQ(again->stats.bytes_sent, 0u);
}

TEST_F(PublishTest, InterruptedMultipartUploadResumesWithoutResendingParts) {
  opts_.after_part = [](const std::string&, int n) {
    return n == 3 ? Fail(Error::Unavailable("interrupted after part 3")) : Ok();
  };
  auto cut = PublishModel(src_, "s3://models/resume/v1/", opts_);
  ASSERT_FALSE(cut);
  EXPECT_NE(cut.error().message().find("interrupted after part 3"), std::string::npos);
  // The manifest goes last: a puller sees no model yet.
  auto early = PullBack("s3://models/resume/v1/");
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().code(), ErrorCode::kNotFound) << early.error().ToString();

  opts_.after_part = nullptr;
  auto resumed = PublishModel(src_, "s3://models/resume/v1/", opts_);
  ASSERT_TRUE(resumed) << resumed.error().ToString();
  EXPECT_EQ(resumed->stats.parts_resumed, 3);
  EXPECT_EQ(resumed->stats.parts_sent, kShardParts - 3);
  EXPECT_EQ(resumed->stats.uploads_restarted, 0);
  // Sent now: everything but config.json (first in path order, sent by the cut run) and the shard's 3 parts.
  uint64_t expected = 0;
  for (const auto& f : resumed->manifest.files) expected += f.path == "config.json" ? 0 : f.size;
  EXPECT_EQ(resumed->stats.bytes_sent, expected - 3 * kPart);
  EXPECT_EQ(resumed->stats.files_skipped, 1);
  auto pulled = PullBack("s3://models/resume/v1/");
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  ExpectSameFiles(pulled->dir, 6);
}

TEST_F(PublishTest, FileChangedAfterAPartialUploadIsDetectedAndSentAfresh) {
  opts_.after_part = [](const std::string&, int n) { return n == 2 ? Fail(Error::Unavailable("cut")) : Ok(); };
  ASSERT_FALSE(PublishModel(src_, "s3://models/changed/v1/", opts_));
  {  // the shard's first part changes on disk
    std::fstream f(src_ + "/model-00001-of-00002.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.write("CHANGED", 7);
  }
  opts_.after_part = nullptr;
  auto resumed = PublishModel(src_, "s3://models/changed/v1/", opts_);
  ASSERT_TRUE(resumed) << resumed.error().ToString();
  EXPECT_EQ(resumed->stats.uploads_restarted, 1);
  EXPECT_EQ(resumed->stats.parts_resumed, 0);
  EXPECT_EQ(resumed->stats.parts_sent, kShardParts);
  auto pulled = PullBack("s3://models/changed/v1/");
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  ExpectSameFiles(pulled->dir, 6);
}

TEST_F(PublishTest, ServerErrorsAreRetried) {
  testing::FaultProxy proxy(server_->port(),
                            {.canned_response = "HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                             .faulty_connections = 2});
  opts_.target.endpoint_url = proxy.url();
  auto published = PublishModel(src_, "s3://models/retry/v1/", opts_);
  ASSERT_TRUE(published) << published.error().ToString();
  EXPECT_EQ(proxy.faults(), 2);
  auto pulled = PullBack("s3://models/retry/v1/");
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  ExpectSameFiles(pulled->dir, 6);
}

TEST_F(PublishTest, RefusedCredentialsAndMissingBucketFailClearly) {
  opts_.target.credentials = AwsCredentials{"NOSUCHKEY", "whatever", ""};
  auto refused = PublishModel(src_, "s3://models/denied/", opts_);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kPermissionDenied) << refused.error().ToString();
  EXPECT_NE(refused.error().message().find("InvalidAccessKeyId"), std::string::npos) << refused.error().message();

  opts_.target.credentials = AwsCredentials{S3rver::kAccessKey, S3rver::kSecretKey, ""};
  auto missing = PublishModel(src_, "s3://no-such-bucket/m/", opts_);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound) << missing.error().ToString();
  EXPECT_NE(missing.error().message().find("does not exist"), std::string::npos) << missing.error().message();
}

TEST_F(PublishTest, LocalFolderTargetThenPull) {
  std::string target = MakeTempDir("publish-target");
  auto published = PublishModel(src_, "file://" + target, opts_);
  ASSERT_TRUE(published) << published.error().ToString();
  EXPECT_EQ(published->stats.files_sent, 6);
  auto pulled = PullBack("file://" + target);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  ExpectSameFiles(pulled->dir, 6);
  auto again = PublishModel(src_, "file://" + target, opts_);
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_EQ(again->stats.files_skipped, 6);
  fs::remove_all(target);
}

// The two commands as an operator runs them: credentials from the AWS_* variables.
TEST_F(PublishTest, CommandLinePublishThenPull) {
  const char* bin = std::getenv("MOESERVE_BINARY_DIR");
  std::string exe = std::string(bin ? bin : MOESERVE_BINARY_DIR_DEFAULT) + "/daemon/moe-daemon";
  ASSERT_TRUE(fs::exists(exe)) << exe;
  std::vector<std::string> env = {std::string("AWS_ACCESS_KEY_ID=") + S3rver::kAccessKey,
                                  std::string("AWS_SECRET_ACCESS_KEY=") + S3rver::kSecretKey};
  testing::Subprocess publish({exe, "publish", src_, "s3://models/cli/", "--endpoint", server_->endpoint(),
                               "--multipart-threshold", "256KiB", "--state-dir", state_, "--quiet"},
                              env);
  std::string revision_line = publish.WaitForLine("revision: ", std::chrono::seconds(60));
  ASSERT_EQ(publish.Wait(), 0);
  std::string revision = revision_line.substr(revision_line.find(": ") + 2);
  EXPECT_EQ(revision, Sha256Hex(ReadAll(src_ + "/manifest.json")));
  testing::Subprocess pull({exe, "pull", "s3://models/cli/", "--revision", revision, "--cache", cache_, "--endpoint",
                            server_->endpoint(), "--quiet"},
                           env);
  std::string dir = pull.WaitForLine(cache_, std::chrono::seconds(60));
  ASSERT_EQ(pull.Wait(), 0);
  ASSERT_FALSE(dir.empty());
  ExpectSameFiles(dir, 6);
}

// Hostile or broken inputs: each is refused before anything is uploaded.
class PublishInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("publish-bad");
    outside_ = MakeTempDir("publish-outside");
    WriteText(dir_ + "/config.json", "{}");
    WriteText(outside_ + "/secret", "not part of the model");
    target_ = MakeTempDir("publish-bad-target");
    opts_.log_progress = false;
  }
  void TearDown() override {
    for (const auto& d : {dir_, outside_, target_}) fs::remove_all(d);
  }
  void ExpectRefused(const std::string& needle, ErrorCode code = ErrorCode::kInvalidArgument) {
    auto r = PublishModel(dir_, "file://" + target_, opts_);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), code) << r.error().ToString();
    EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
    EXPECT_TRUE(fs::is_empty(target_)) << "nothing may be published";
  }
  std::string dir_, outside_, target_;
  PublishOptions opts_;
};

TEST_F(PublishInputTest, SymlinkLeavingTheDirectory) {
  fs::create_symlink(outside_ + "/secret", dir_ + "/weights.bin");
  ExpectRefused("leaving the directory");
  opts_.follow_symlinks = true;  // asked for explicitly (a Hugging Face cache snapshot)
  auto r = PublishModel(dir_, "file://" + target_, opts_);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(ReadAll(target_ + "/weights.bin"), "not part of the model");
}

TEST_F(PublishInputTest, SymlinkedFolder) {
  fs::create_directory_symlink(outside_, dir_ + "/sub");
  ExpectRefused("symlinked folder");
}

TEST_F(PublishInputTest, NamesThatAreNotSafeObjectKeys) {
  WriteText(dir_ + "/a\\b.bin", "x");
  ExpectRefused("a\\b.bin");
  fs::remove(dir_ + "/a\\b.bin");
  WriteText(dir_ + "/bad\x01name", "x");
  ExpectRefused("bad");
  fs::remove(dir_ + "/bad\x01name");
  WriteText(dir_ + "/.pull/record", "x");  // reserved for the puller's resume record
  ExpectRefused(".pull");
}

TEST_F(PublishInputTest, SpecialFilesAndMissingDirectory) {
  ASSERT_EQ(::mkfifo((dir_ + "/pipe").c_str(), 0600), 0);
  ExpectRefused("not a regular file");
  fs::remove(dir_ + "/pipe");
  auto missing = PublishModel(dir_ + "/nope", "file://" + target_, opts_);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  auto http = PublishModel(dir_, "https://example.com/models/", opts_);
  ASSERT_FALSE(http);
  EXPECT_EQ(http.error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(PublishInputTest, UnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads every file";
  WriteText(dir_ + "/locked.bin", "x");
  fs::permissions(dir_ + "/locked.bin", fs::perms::none);
  ExpectRefused("unreadable", ErrorCode::kPermissionDenied);
}

TEST(PublishPartSize, StaysWithinS3Limits) {
  constexpr uint64_t MiB = 1 << 20, GiB = 1ull << 30;
  EXPECT_EQ(PlanPartSize(20 * GiB, 64 * MiB, false), 64 * MiB);  // 320 parts: as asked
  EXPECT_EQ(PlanPartSize(20 * GiB, 1 * MiB, false), 5 * MiB);    // S3's minimum part
  EXPECT_EQ(PlanPartSize(2 * GiB, 1 * MiB, true), 1 * MiB);      // allowed below it (test servers)
  // 1 TiB in 64 MiB parts would be 16,384 parts: raised to fit 10,000.
  uint64_t part = PlanPartSize(1024 * GiB, 64 * MiB, false);
  EXPECT_GT(part, 64 * MiB);
  EXPECT_LE((1024 * GiB + part - 1) / part, kS3MaxParts);
  EXPECT_GT((1024 * GiB + part - 2) / (part - 1), kS3MaxParts) << "the smallest size that fits";
}

TEST(PublishCommand, ExitCodes) {
  std::vector<char*> argv;
  for (std::vector<std::string> bad : {std::vector<std::string>{"publish", "--part-size"},
                                       {"publish", "d", "s3://b/p/", "--part-size", "6GiB"},
                                       {"publish", "d", "s3://b/p/", "--multipart-threshold", "6GiB"},
                                       {"publish", "d"}}) {
    argv.clear();
    for (auto& s : bad) argv.push_back(s.data());
    EXPECT_EQ(RunPublishCommand(static_cast<int>(argv.size()), argv.data()), 2) << bad.back();
  }
  std::string target = MakeTempDir("publish-cli");
  std::vector<std::string> missing = {"publish", target + "/absent", "file://" + target, "--quiet"};
  argv.clear();
  for (auto& s : missing) argv.push_back(s.data());
  EXPECT_EQ(RunPublishCommand(static_cast<int>(argv.size()), argv.data()), 1);
  fs::remove_all(target);
}

// --experts mxfp4: a DeepSeek-V3.2 directory as published goes up converted
// (its routed experts requantised, config.json marked), and what a node
// pulls loads with no conversion; a second publish reuses the converted
// directory; other models are refused.
TEST(PublishCommand, DeepseekExpertsConvertedThenPulled) {
  const std::string root = MakeTempDir("publish-ds32");
  const std::string src = root + "/published", converted = root + "/converted", target = root + "/target";
  const char* source_dir = std::getenv("MOESERVE_SOURCE_DIR");
  const std::string script =
      std::string(source_dir ? source_dir : MOESERVE_SOURCE_DIR_DEFAULT) + "/tools/reference/families/deepseek_v32.py";
  const std::string cmd = "/usr/bin/python3 " + script + " write --out " + src + " --layers 2 --index-topk 8 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::create_directories(target);
  const auto run = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return RunPublishCommand(static_cast<int>(argv.size()), argv.data());
  };
  ASSERT_EQ(run({"publish", src, "file://" + target, "--experts", "mxfp4", "--converted-dir", converted, "--quiet"}), 0);
  const auto written = fs::last_write_time(converted + "/config.json");
  ASSERT_EQ(run({"publish", src, "file://" + target, "--experts", "mxfp4", "--converted-dir", converted, "--quiet"}), 0);
  EXPECT_EQ(fs::last_write_time(converted + "/config.json"), written);  // not converted again

  PullOptions po;
  po.revision = "v1";
  po.log_progress = false;
  auto pulled = WeightPuller({root + "/cache"}).Pull("file://" + target, po);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_NE(ReadAll(pulled->dir + "/config.json").find("\"moeserve_converted\""), std::string::npos);
  auto opened = engine::deepseek_v32::OpenDirStreamed(pulled->dir);
  ASSERT_TRUE(opened) << opened.error().ToString();
  EXPECT_EQ(opened->config.expert_format, engine::ExpertFormat::kMxfp4);
  EXPECT_NE(opened->checkpoint.Find("layers.1.ffn.experts.w2.scales"), nullptr);
  EXPECT_EQ(opened->source, nullptr);

  // A family with no conversion to the format asked (gpt-oss: MXFP4 only);
  // --converted-dir alone; a converted directory of the other format.
  WriteText(root + "/other/config.json", "{\"model_type\": \"gpt_oss\"}");
  EXPECT_EQ(run({"publish", root + "/other", "file://" + target, "--experts", "bf16", "--quiet"}), 1);
  EXPECT_EQ(run({"publish", src, "file://" + target, "--converted-dir", converted, "--quiet"}), 2);
  EXPECT_EQ(run({"publish", src, "file://" + target, "--experts", "bf16", "--converted-dir", converted, "--quiet"}), 1);
  fs::remove_all(root);
}

// --experts mxfp4: a Qwen3-Next directory as published (BF16 experts) goes up
// converted, and what a node pulls loads MXFP4 experts with no
// requantisation (the converted tensors mapped as they are); a gpt-oss
// directory, whose published experts are MXFP4, goes up as it is.
TEST(PublishCommand, Qwen3NextExpertsConvertedAndGptOssAsItIs) {
  const std::string root = MakeTempDir("publish-qwen3");
  const std::string src = root + "/published", converted = root + "/converted", target = root + "/target";
  const char* source_dir = std::getenv("MOESERVE_SOURCE_DIR");
  const std::string tools = std::string(source_dir ? source_dir : MOESERVE_SOURCE_DIR_DEFAULT) + "/tools/reference/";
  const std::string cmd = "/usr/bin/python3 " + tools + "families/qwen3_next.py write --out " + src + " --vocab 4096 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  WriteText(src + "/generation_config.json", "{\"do_sample\": true}");  // what the model's other readers need
  fs::create_directories(target);
  const auto run = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return RunPublishCommand(static_cast<int>(argv.size()), argv.data());
  };
  ASSERT_EQ(run({"publish", src, "file://" + target, "--experts", "mxfp4", "--converted-dir", converted, "--quiet"}), 0);
  PullOptions po;
  po.revision = "v1";
  po.log_progress = false;
  auto pulled = WeightPuller({root + "/cache"}).Pull("file://" + target, po);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_NE(ReadAll(pulled->dir + "/config.json").find("\"moeserve_converted\""), std::string::npos);
  EXPECT_EQ(ReadAll(pulled->dir + "/generation_config.json"), "{\"do_sample\": true}");
  auto ck = engine::Checkpoint::Open(pulled->dir);
  ASSERT_TRUE(ck) << ck.error().ToString();
  EXPECT_NE(ck->Find("layers.0.ffn.experts.w13.blocks"), nullptr);
  EXPECT_EQ(ck->Find("model.layers.0.mlp.experts.0.gate_proj.weight"), nullptr);
  engine::ModelOptions mo;
  auto model = engine::LoadLayerGraph(pulled->dir, mo);
  ASSERT_TRUE(model) << model.error().ToString();
  EXPECT_EQ((*model)->config().expert_format, engine::ExpertFormat::kMxfp4);
  // Asked for BF16, the converted directory refuses (its experts are MXFP4's values now).
  mo.experts = engine::ExpertFormat::kBf16;
  auto refused = engine::LoadLayerGraph(pulled->dir, mo);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("holds its routed experts converted to mxfp4"), std::string::npos)
      << refused.error().message();

  // gpt-oss with --experts mxfp4: published as it is, no converted directory.
  const std::string gpt = root + "/gpt-oss", gpt_target = root + "/gpt-target";
  const std::string write = "/usr/bin/python3 " + tools + "gpt_oss.py write --out " + gpt + " --layers 1 --vocab 1000 2>&1";
  ASSERT_EQ(std::system(write.c_str()), 0) << write;
  fs::create_directories(gpt_target);
  ASSERT_EQ(run({"publish", gpt, "file://" + gpt_target, "--experts", "mxfp4", "--quiet"}), 0);
  EXPECT_FALSE(fs::exists(gpt + ".mxfp4"));
  EXPECT_EQ(ReadAll(gpt_target + "/config.json"), ReadAll(gpt + "/config.json"));
  fs::remove_all(root);
}

}  // namespace
}  // namespace moeserve::storage
