// daemon.session_openai_client: the official `openai` npm client, unchanged,
// drives a server-kept session (tests/daemon/session_openai_client.mjs does
// the checks).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(SessionOpenAiClient, TurnsThroughTheOfficialClient) {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  std::string root = src ? src : ".";
  if (std::system("command -v node >/dev/null 2>&1") != 0 ||
      !std::filesystem::exists(root + "/node_modules/openai/package.json")) {
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  }
  auto d = StartDaemon();
  ASSERT_TRUE(d);
  std::string cmd = "cd '" + root + "' && node tests/daemon/session_openai_client.mjs " + d->url() + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[1024];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("all checks passed"), std::string::npos) << out;
  d->Shutdown(1);
}

}  // namespace
}  // namespace moeserve::daemon::testing
