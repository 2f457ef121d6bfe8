// moe-daemon: `moe-daemon pull ...` runs the weight puller alone, `moe-daemon
// publish ...` uploads a model directory where the puller reads it; anything
// else (or `moe-daemon serve ...`) serves the OpenAI-compatible API.
#include <cstring>

#include "moeserve/daemon/commands.hpp"
#include "moeserve/storage/commands.hpp"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "pull") == 0) return moeserve::storage::RunPullCommand(argc - 1, argv + 1);
  if (argc > 1 && std::strcmp(argv[1], "publish") == 0)
    return moeserve::storage::RunPublishCommand(argc - 1, argv + 1);
  if (argc > 1 && std::strcmp(argv[1], "serve") == 0) return moeserve::daemon::RunServeCommand(argc - 1, argv + 1);
  return moeserve::daemon::RunServeCommand(argc, argv);
}
