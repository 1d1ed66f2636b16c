// A client process for tests: connects to the daemon at $COMMD_RUNTIME_DIR and then does what
// its first argument says, so tests can watch the daemon react to real processes.
//   exit    connect, print "connected <job>", exit 0 without closing anything
//   wait    connect, print "connected <job>", sleep until killed
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "commd/commd.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_client exit|wait\n");
    return 2;
  }
  auto client = commd::Client::Connect();
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::printf("connected %s\n", (*client)->job_id().c_str());
  std::fflush(stdout);
  if (std::strcmp(argv[1], "wait") == 0) {
    for (;;) ::pause();
  }
  // Leave without destructors, as a crashing trainer would.
  ::_exit(0);
}
