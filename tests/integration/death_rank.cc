// One rank of rank_death_test: joins group "d" (job "job", collective timeout 10 minutes, so
// that no outcome of the test can come from a timeout), runs all-reduces through the SDK,
// and ends as SCENARIO asks:
//
//   death_rank RANK WORLD POLICY SCENARIO VICTIM
//     POLICY    default | report | notify | terminate
//     SCENARIO  clean  20 checked all-reduces, "DONE", the Client destroyed, exit 0
//               kill   3 all-reduces; VICTIM prints "VICTIM" and sleeps (to be SIGKILLed)
//               exit3  3 all-reduces; VICTIM exits with status 3 without closing anything
//               exit0  3 all-reduces; VICTIM exits with status 0 without closing anything
//               leave  3 all-reduces; VICTIM destroys its Client (closing its session) and
//                      exits 0; the others wait for the file $DEATH_RANK_GO before their 4th,
//                      whose wait gives up after 1 s
// The other ranks print "WAITING", run a 4th all-reduce, which cannot complete, and print
// "FAILED <status>"; then a 5th: "LATER <status>"; then exit 0 after destroying their Client.
// Any other outcome prints "ERROR <what>" and exits 1.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#include "commd/commd.h"
#include "tests/integration/policy_arg.h"

namespace {

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Error(const std::string& what) {
  Say("ERROR " + what);
  return 1;
}

// One all-reduce of 64 floats, each rank contributing rank + 1; checks the sum.
absl::Status AllReduce(commd::Group& g, commd::SymmetricBuffer& buf,
                       const commd::CollectiveOptions& options = {}) {
  auto* p = static_cast<float*>(buf.data());
  for (int i = 0; i < 64; ++i) p[i] = static_cast<float>(g.rank() + 1);
  absl::Status s = g.AllReduce(buf, 64, commd::DataType::kFloat32, commd::ReduceOp::kSum, options);
  if (!s.ok()) return s;
  const float want = g.world_size() * (g.world_size() + 1) / 2.0f;
  for (int i = 0; i < 64; ++i) {
    if (p[i] != want) return absl::InternalError("wrong all-reduce result");
  }
  return absl::OkStatus();
}

int Run(int rank, int world, const std::string& policy, const std::string& scenario, int victim) {
  auto client = commd::Client::Connect({.job_id = "job"});
  if (!client.ok()) return Error("connect: " + client.status().ToString());
  auto group = (*client)->JoinGroup({.name = "d",
                                     .rank = rank,
                                     .world_size = world,
                                     .timeout = absl::Minutes(10),
                                     .watchdog_policy = commd::testing::ParsePolicy(policy)});
  if (!group.ok()) return Error("join: " + group.status().ToString());
  auto buf = (*group)->AllocateSymmetric(64 * sizeof(float));
  if (!buf.ok()) return Error("allocate: " + buf.status().ToString());
  const int before = scenario == "clean" ? 20 : 3;
  for (int i = 0; i < before; ++i) {
    if (absl::Status s = AllReduce(**group, **buf); !s.ok()) return Error(s.ToString());
  }
  if (scenario == "clean") {
    Say("DONE");
    return 0;
  }
  if (rank == victim) {
    if (scenario == "leave") return 0;  // the Client is destroyed on the way out
    if (scenario == "exit3") ::_exit(3);
    if (scenario == "exit0") ::_exit(0);
    Say("VICTIM");
    for (;;) ::pause();
  }
  Say("WAITING");
  commd::CollectiveOptions options;
  if (scenario == "leave") {
    const char* go = std::getenv("DEATH_RANK_GO");
    struct stat st;
    while (go != nullptr && ::stat(go, &st) != 0) absl::SleepFor(absl::Milliseconds(10));
    options.timeout = absl::Seconds(1);
  }
  absl::Status pending = AllReduce(**group, **buf, options);
  Say("FAILED " + pending.ToString());
  absl::Status later = AllReduce(**group, **buf, options);
  Say("LATER " + later.ToString());
  return pending.ok() || later.ok() ? Error("an all-reduce completed without the victim") : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: death_rank RANK WORLD POLICY SCENARIO VICTIM\n");
    return 2;
  }
  return Run(std::atoi(argv[1]), std::atoi(argv[2]), argv[3], argv[4], std::atoi(argv[5]));
}
