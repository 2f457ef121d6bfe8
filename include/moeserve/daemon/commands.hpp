// Entry point of moe-daemon's `serve` subcommand; it returns the process exit code.
#pragma once

namespace moeserve::daemon {

// moe-daemon [serve] --model DIR|URI [--port N] [--config FILE] ...  (serve_command.cpp)
int RunServeCommand(int argc, char** argv);
// `pull` and `publish` are the storage room's: moeserve/storage/commands.hpp.

}  // namespace moeserve::daemon
