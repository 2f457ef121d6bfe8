// SIGTERM and SIGINT turned into bytes on a pipe, so that shutdown work runs
// on an ordinary thread and the handler does nothing but write(2), which is
// async-signal-safe. A handler is used rather than a blocked mask and
// sigwait because threads started by static initialisers before main() would
// not inherit the mask, and a signal delivered to one of them would end the
// process without draining.
//
// Thread safety: Install once, from main, before any other thread waits.
#pragma once

#include "moeserve/common/status.hpp"

namespace moeserve {

// Installs the handlers; afterwards each SIGTERM or SIGINT writes its signal
// number as one byte.
Status InstallShutdownSignals();
// Blocks until a byte comes: the signal number, or 0 from WakeShutdownWaiter.
int WaitForShutdownSignal();
// Lets a thread blocked in WaitForShutdownSignal return 0 (for a process
// that ends for another reason and must join that thread).
void WakeShutdownWaiter();

}  // namespace moeserve
