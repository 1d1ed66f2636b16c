// The dumper's per-uid shares: the dump rate (limits.per_uid.dumps_per_minute, dump_burst)
// and the bytes kept (limits.per_uid.dump_bytes: the oldest of the same job go first, never
// another uid's, never the newest). Real control blocks in memfds, real files in a temp dir.
#include "daemon/recorder/dumper.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "common/control_block_admin.h"
#include "gtest/gtest.h"

namespace commd::recorder {
namespace {

constexpr uint32_t kCapacity = 16;

class DumperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dumper_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // One rank's freshly initialised control block, as the group registry maps it.
  DumpSource Source(uid_t uid, const std::string& job) {
    const size_t bytes = ControlBlockBytes(kCapacity);
    const int fd = ::memfd_create("dumper_test", MFD_CLOEXEC);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    auto map = SharedMapping::Map(fd, bytes);
    ::close(fd);
    EXPECT_TRUE(map.ok()) << map.status();
    auto block = std::make_shared<SharedMapping>(*std::move(map));
    EXPECT_TRUE(
        InitControlBlock(block->data(), bytes, {.ring_capacity = kCapacity, .memory_is_zero = true})
            .ok());
    return {.job_id = job, .uid = uid, .group = "g", .world_size = 1, .block = block};
  }
  std::unique_ptr<Dumper> MakeDumper(uint64_t dump_bytes, uint32_t burst = 100) {
    return std::make_unique<Dumper>(DumperOptions{.dump_dir = dir_,
                                                  .host = "test",
                                                  .version = "0",
                                                  .dumps_per_minute = 1,
                                                  .dump_burst = burst,
                                                  .dump_bytes_per_uid = dump_bytes},
                                    registries_.emplace_back(new prometheus::Registry).get());
  }
  // Dumps `source` and returns the dump's directory and its size in bytes.
  std::pair<std::string, uint64_t> DumpOf(Dumper& dumper, const DumpSource& source) {
    auto r = dumper.Dump("request", {source}, std::nullopt);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    uint64_t bytes = 0;
    for (const std::string& f : r->files) bytes += std::filesystem::file_size(f);
    return {r->directories.at(0), bytes};
  }

  std::string dir_;
  std::vector<std::unique_ptr<prometheus::Registry>> registries_;  // one per dumper
};

TEST_F(DumperTest, OldestDumpsOfTheSameJobGoFirstAndNeverAnotherUids) {
  const DumpSource a = Source(1001, "a"), b = Source(1001, "b"), other = Source(1002, "a");
  // Every dump of an empty ring has the same size; measure one with no limit in sight.
  const uint64_t size = DumpOf(*MakeDumper(uint64_t{1} << 40), a).second;
  ASSERT_GT(size, 0u);
  std::filesystem::remove_all(dir_);
  // Room for two dumps and a half.
  auto dumper = MakeDumper(size * 5 / 2);
  const std::string a1 = DumpOf(*dumper, a).first;
  const std::string b1 = DumpOf(*dumper, b).first;
  const std::string a2 = DumpOf(*dumper, a).first;  // a third: a1, not the older b1, goes
  EXPECT_FALSE(std::filesystem::exists(a1));
  EXPECT_TRUE(std::filesystem::exists(b1));
  EXPECT_TRUE(std::filesystem::exists(a2));
  // Another uid's dumps of a job of the same name are charged to it alone.
  const std::string o1 = DumpOf(*dumper, other).first;
  const std::string o2 = DumpOf(*dumper, other).first;
  EXPECT_TRUE(std::filesystem::exists(b1));
  EXPECT_TRUE(std::filesystem::exists(a2));
  EXPECT_TRUE(std::filesystem::exists(o1));
  EXPECT_TRUE(std::filesystem::exists(o2));
  // A job with no older dump of its own takes the uid's oldest of another job.
  const std::string b2 = DumpOf(*dumper, b).first;
  EXPECT_FALSE(std::filesystem::exists(b1));
  const std::string c1 = DumpOf(*dumper, Source(1001, "c")).first;
  EXPECT_FALSE(std::filesystem::exists(a2));
  EXPECT_TRUE(std::filesystem::exists(b2));
  EXPECT_TRUE(std::filesystem::exists(c1));
  EXPECT_TRUE(std::filesystem::exists(o1));
}

TEST_F(DumperTest, TheNewestDumpIsKeptEvenOverTheShare) {
  auto dumper = MakeDumper(1);
  const std::string first = DumpOf(*dumper, Source(1001, "a")).first;
  EXPECT_TRUE(std::filesystem::exists(first));
  const std::string second = DumpOf(*dumper, Source(1001, "a")).first;
  EXPECT_FALSE(std::filesystem::exists(first));
  EXPECT_TRUE(std::filesystem::exists(second));
}

TEST_F(DumperTest, RateIsPerUidAndNamesItsFields) {
  auto dumper = MakeDumper(uint64_t{1} << 40, /*burst=*/2);
  EXPECT_TRUE(dumper->Admit(1001, "request").ok());
  EXPECT_TRUE(dumper->Admit(1001, "request").ok());
  const absl::Status refused = dumper->Admit(1001, "request");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("uid 1001 made its 2 dumps allowed at once, refilled at 1 a "
                                   "minute; the next is allowed in "),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("(limits.per_uid.dumps_per_minute, limits.per_uid.dump_burst)"),
            std::string::npos);
  EXPECT_TRUE(dumper->Admit(1002, "request").ok());
  // An automatic dump over the rate is dropped, not queued.
  EXPECT_EQ(dumper->DumpLater("rank_death", {Source(1001, "a")}).code(),
            absl::StatusCode::kResourceExhausted);
  dumper.reset();  // finishes what was queued
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/a"));
}

}  // namespace
}  // namespace commd::recorder
