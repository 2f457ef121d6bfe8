// A tiny random gpt-oss checkpoint for daemon tests, written once per test
// process by the PyTorch reference (tools/reference/gpt_oss.py, with the
// o200k_harmony tokenizer beside the weights): 2 layers, an 8-token window.
// The caller removes it when done (about 100 MB).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "daemon_harness.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::daemon::testing {

// Writes the checkpoint into `dir` (replacing it), with the writer's
// `extra` arguments (--next for scripted output); false when the writer failed.
inline bool WriteTinyGptOss(const std::string& dir, const std::string& extra = "") {
  std::filesystem::remove_all(dir);
  std::string cmd = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/gpt_oss.py write --out " + dir +
                    " --layers 2 --window 8 --seed 3 " + extra + " 2>&1";
  const bool ok = std::system(cmd.c_str()) == 0;
  EXPECT_TRUE(ok) << cmd;
  return ok;
}

inline const std::string& TinyGptOssDir() {
  static std::string dir = [] {
    std::string d = ::testing::TempDir() + "/moe_daemon_gptoss_ckpt_" + std::to_string(::getpid());
    WriteTinyGptOss(d);
    return d;
  }();
  return dir;
}

// A daemon configuration serving `model` on a free loopback port: a 512-token
// context, 4096 cache tokens, 8 tokens by default at the low tier.
inline DaemonConfig TinyGptOssConfig(const std::string& model, const std::string& served_name) {
  DaemonConfig c;
  c.model = model;
  c.served_model_name = served_name;
  c.port = FreeLoopbackPort();
  c.max_context = 512;
  c.cache_tokens = 4096;
  c.default_max_tokens = 8;
  c.default_reasoning_effort = ReasoningEffort::kLow;
  c.shutdown_grace_seconds = 5;
  return c;
}

// A suite served by one daemon on the tiny checkpoint, with the checkpoint's
// tokenizer (to compare prompts with what the harmony renderer makes). The
// suite's SetUpTestSuite calls StartSuite with its configuration; the
// checkpoint is removed when the suite ends.
class TinyGptOssSuite : public ::testing::Test {
 protected:
  static void StartSuite(const DaemonConfig& config) {
    daemon_ = StartDaemon(config).release();
    port_ = daemon_ ? PortOf(*daemon_) : 0;
    auto t = engine::HfTokenizer::FromFile(TinyGptOssDir() + "/tokenizer.json");
    ASSERT_TRUE(t) << t.error().ToString();
    tok_ = new engine::HfTokenizer(std::move(*t));
  }
  static void TearDownTestSuite() {
    if (daemon_) daemon_->Shutdown(1);
    delete daemon_;
    daemon_ = nullptr;
    delete tok_;
    tok_ = nullptr;
    std::filesystem::remove_all(TinyGptOssDir());  // about 100 MB
  }
  void SetUp() override { ASSERT_NE(daemon_, nullptr); }

  inline static Daemon* daemon_ = nullptr;
  inline static int port_ = 0;
  inline static engine::HfTokenizer* tok_ = nullptr;
};

}  // namespace moeserve::daemon::testing
