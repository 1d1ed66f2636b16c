// Flight-recorder dump cost against a real commd: 8 rank processes each record 20,000
// collectives (ring capacity 32768, nothing dropped), then the SDK asks for dumps; reports
// the time of each Dump call (read 8 rings + encode + write JSON files) and the bytes written.
//
//   build/bench/dump_latency [--dumps N]
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "commd/commd.h"
#include "tests/integration/daemon_process.h"

int main(int argc, char** argv) {
  int dumps = 10;
  if (argc == 3 && std::strcmp(argv[1], "--dumps") == 0) dumps = std::atoi(argv[2]);
  constexpr int kRanks = 8;
  constexpr int kEntries = 20000;
  commd::testing::TempDir tmp;
  auto daemon = commd::testing::StartDaemonWithConfig(tmp, "recorder { ring_capacity: 32768 }",
                                                      {"--dump-dir", tmp.Join("dumps")});
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<commd::testing::ChildProcess>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(*commd::testing::ChildProcess::Start(
        {COMMD_RANK_PROCESS, "g", std::to_string(r), std::to_string(kRanks), "0",
         absl::StrCat("record:", kEntries)},
        {"COMMD_RUNTIME_DIR=" + (*daemon)->runtime_dir(), "COMMD_JOB_ID=bench"}));
  }
  for (auto& r : ranks) {
    if (!r->WaitForLog(absl::StrCat("RECORDED ", kEntries), absl::Seconds(120))) {
      std::fprintf(stderr, "rank failed: %s\n", r->Log().c_str());
      return 1;
    }
  }
  auto client =
      commd::Client::Connect({.runtime_dir = (*daemon)->runtime_dir(), .job_id = "bench"});
  std::vector<double> ms;
  uint64_t bytes = 0, entries = 0;
  for (int i = 0; i < dumps; ++i) {
    const absl::Time t0 = absl::Now();
    auto dump = (*client)->Dump("g");
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (!dump.ok()) {
      std::fprintf(stderr, "%s\n", dump.status().ToString().c_str());
      return 1;
    }
    bytes = 0;
    for (const std::string& f : dump->files()) {
      struct stat st {};
      ::stat(f.c_str(), &st);
      bytes += static_cast<uint64_t>(st.st_size);
    }
    entries = dump->entries();
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "dump of %d ranks x %d entries (%llu entries): median %.1f ms, max %.1f ms over %d "
      "dumps; %.1f MB of JSON (target < 500 ms)\n",
      kRanks, kEntries, static_cast<unsigned long long>(entries), ms[ms.size() / 2], ms.back(),
      dumps, bytes / 1e6);
  return 0;
}
