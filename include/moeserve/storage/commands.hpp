// Entry points of moe-daemon's storage subcommands (the init container runs
// `pull`); each returns the process exit code.
#pragma once

namespace moeserve::storage {

// moe-daemon pull URI --revision R --cache DIR [--endpoint URL] ...   (storage/pull_command.cpp)
int RunPullCommand(int argc, char** argv);
// moe-daemon publish DIR URI [--endpoint URL] ...                   (storage/publish_command.cpp)
int RunPublishCommand(int argc, char** argv);

}  // namespace moeserve::storage
