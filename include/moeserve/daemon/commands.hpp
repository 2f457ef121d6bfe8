// Entry points of moe-daemon's subcommands; each returns the process exit code.
#pragma once

namespace moeserve::daemon {

// moe-daemon [serve] --model DIR|URI [--port N] [--config FILE] ...  (serve_command.cpp)
int RunServeCommand(int argc, char** argv);
// moe-daemon pull URI --revision R --cache DIR [--endpoint URL] ...   (storage/pull_command.cpp)
int RunPullCommand(int argc, char** argv);
// moe-daemon publish DIR URI [--endpoint URL] ...                   (storage/publish_command.cpp)
int RunPublishCommand(int argc, char** argv);

}  // namespace moeserve::daemon
