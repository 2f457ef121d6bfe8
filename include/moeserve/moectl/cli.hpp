// moectl's command line: parses arguments, reads the source, prints. Kept
// apart from main() so that tests can run it in process as well as through
// the binary.
//
// Exit status: 0 done; 1 the source failed (unreachable, refused, malformed);
// 2 the command line is wrong.
//
// Thread safety: one call at a time per process (it reads the environment).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace moeserve::moectl {

int RunMoectl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace moeserve::moectl
