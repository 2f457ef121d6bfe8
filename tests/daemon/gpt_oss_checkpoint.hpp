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

namespace moeserve::daemon::testing {

inline const std::string& TinyGptOssDir() {
  static std::string dir = [] {
    std::string d = ::testing::TempDir() + "/moe_daemon_gptoss_ckpt_" + std::to_string(::getpid());
    std::filesystem::remove_all(d);
    std::string cmd = "/usr/bin/python3 " + SourceRoot() + "/tools/reference/gpt_oss.py write --out " + d +
                      " --layers 2 --window 8 --seed 3 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}

}  // namespace moeserve::daemon::testing
