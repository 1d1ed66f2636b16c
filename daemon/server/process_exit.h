// How a process that is not our child ended, read through its pidfd.
//
// The daemon watches every client with a pidfd; when it turns readable the process has
// exited, but only its parent could wait(2) for the status. Linux 6.15+ keeps the status on
// the pidfd once the process is reaped (PIDFD_GET_INFO with PIDFD_INFO_EXIT); until then the
// process is a zombie and /proc/<pid>/stat shows it (field 52, exit_code).
//
//   ProcessExit exit = ReadProcessExit(pidfd, pid);  // after the pidfd turned readable
//   LOG << "pid " << pid << " " << exit.ToString();  // "killed by SIGKILL"
//
// Thread-safe; never blocks (one ioctl and one small /proc read).
#ifndef COMMD_DAEMON_SERVER_PROCESS_EXIT_H_
#define COMMD_DAEMON_SERVER_PROCESS_EXIT_H_

#include <sys/types.h>

#include <string>

namespace commd::server {

struct ProcessExit {
  bool known = false;   // false: the status could not be read
  int wait_status = 0;  // as wait(2) reports it, when known

  bool clean() const;  // exited with status 0
  // "exited with status 3", "killed by SIGKILL", "killed by SIGSEGV (core dumped)",
  // "exited, status unknown".
  std::string ToString() const;
};

// The exit of the process behind `pidfd` (whose pid is `pid`), which has exited. Reading
// /proc is safe from pid reuse: it is believed only when the pidfd still shows no reaped
// status afterwards, and a pid is not reused before its zombie is reaped.
ProcessExit ReadProcessExit(int pidfd, pid_t pid);

}  // namespace commd::server

#endif  // COMMD_DAEMON_SERVER_PROCESS_EXIT_H_
