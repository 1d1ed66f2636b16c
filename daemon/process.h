// Process-level life of the daemon: signals and systemd notification.
//
// Call BlockDaemonSignals() before any thread starts, so every thread inherits the mask and
// the signals reach only RunUntilStopped's signalfd.
#ifndef COMMD_DAEMON_PROCESS_H_
#define COMMD_DAEMON_PROCESS_H_

#include <functional>

#include "absl/status/status.h"
#include "daemon/daemon.h"

namespace commd {

absl::Status BlockDaemonSignals();

// Tells systemd and the log that the daemon is ready, then serves signals until SIGTERM or
// SIGINT: SIGHUP calls `reload`, WATCHDOG pings go out when systemd asked for them. Returns
// after the daemon has shut down.
absl::Status RunUntilStopped(Daemon& daemon, const std::function<void()>& reload);

}  // namespace commd

#endif  // COMMD_DAEMON_PROCESS_H_
