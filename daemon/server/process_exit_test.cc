// ReadProcessExit against real child processes: while each is a zombie (the /proc path) and
// after it is reaped (the pidfd path).
#include "daemon/server/process_exit.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace commd::server {
namespace {

struct Child {
  pid_t pid = -1;
  int pidfd = -1;
};

// A child that exits with status `value`, or raises signal `value`; returned once exited.
Child Spawn(bool by_signal, int value) {
  Child c;
  c.pid = ::fork();
  if (c.pid == 0) {
    if (by_signal) ::raise(value);
    ::_exit(value);
  }
  c.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, c.pid, 0));
  pollfd p{c.pidfd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 10000), 1);  // exited (a zombie: not reaped yet)
  return c;
}

void Reap(Child& c) {
  int status = 0;
  ASSERT_EQ(::waitpid(c.pid, &status, 0), c.pid);
}

TEST(ProcessExitTest, ExitStatusWhileAZombieAndAfterReaping) {
  Child c = Spawn(false, 3);
  ProcessExit zombie = ReadProcessExit(c.pidfd, c.pid);
  EXPECT_TRUE(zombie.known);
  EXPECT_EQ(zombie.ToString(), "exited with status 3");
  EXPECT_FALSE(zombie.clean());
  Reap(c);
  EXPECT_EQ(ReadProcessExit(c.pidfd, c.pid).ToString(), "exited with status 3");
  ::close(c.pidfd);
}

TEST(ProcessExitTest, KilledBySignal) {
  Child c = Spawn(true, SIGKILL);
  EXPECT_EQ(ReadProcessExit(c.pidfd, c.pid).ToString(), "killed by SIGKILL");
  Reap(c);
  EXPECT_EQ(ReadProcessExit(c.pidfd, c.pid).ToString(), "killed by SIGKILL");
  ::close(c.pidfd);
}

TEST(ProcessExitTest, CleanExit) {
  Child c = Spawn(false, 0);
  EXPECT_TRUE(ReadProcessExit(c.pidfd, c.pid).clean());
  Reap(c);
  const ProcessExit e = ReadProcessExit(c.pidfd, c.pid);
  EXPECT_TRUE(e.clean());
  EXPECT_EQ(e.ToString(), "exited with status 0");
  ::close(c.pidfd);
}

TEST(ProcessExitTest, UnknownWhenNothingTells) {
  EXPECT_EQ(ProcessExit{}.ToString(), "exited, status unknown");
  EXPECT_FALSE(ProcessExit{}.clean());
}

}  // namespace
}  // namespace commd::server
