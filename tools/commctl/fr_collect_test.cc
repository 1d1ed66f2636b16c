#include "tools/commctl/fr_collect.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace commd::ctl {
namespace {

namespace fs = std::filesystem;

constexpr char kId[] = "20261124T140102.345Z-hang-stuck-node-a";

// A rank's dump as the daemon writes it, reduced to what collect reads.
std::string RankJson(const std::string& ranks) {
  return absl::StrCat(
      R"({"version":"2.10","pg_config":{"g":{"name":"g","desc":"undefined","ranks":")", ranks,
      R"("}},"entries":[]})");
}

class FrCollectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fr-collect-XXXXXX";
    root_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(root_ + "/" + path).parent_path());
    std::ofstream(root_ + "/" + path) << text;
  }
  std::string Read(const std::string& path) {
    std::ifstream in(root_ + "/" + path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  std::string root_;
};

TEST_F(FrCollectTest, MergesEachNodesCopyIntoOneFolderPerGroup) {
  // node-a's dump dir holds global ranks 0-1 of g, node-b's 2-3; each also has another dump.
  for (int r : {0, 1})
    Write(absl::StrCat("a/job/", kId, "/g/rank", r, ".json"), RankJson("[0, 1, 2, 3]"));
  for (int r : {2, 3})
    Write(absl::StrCat("b/job/", kId, "/g/rank", r, ".json"), RankJson("[0, 1, 2, 3]"));
  Write(absl::StrCat("b/job/", kId, "/g/nccl_trace_rank_2"), "pickle");
  Write("a/job/20261124T000000.000Z-request/g/rank0.json", RankJson("[0, 1]"));
  Write(absl::StrCat("b/job/", kId, "/g/.rank3.json.tmp"), "half written");

  auto r = CollectDump({root_ + "/a", root_ + "/b"}, kId, root_ + "/out");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->directories.size(), 2u);
  EXPECT_EQ(r->files, 5);
  ASSERT_EQ(r->groups.count("g"), 1u);
  EXPECT_EQ(r->groups["g"].ranks, (std::set<int>{0, 1, 2, 3}));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(Read(absl::StrCat("out/g/rank", rank, ".json")), RankJson("[0, 1, 2, 3]"));
  }
  EXPECT_EQ(Read("out/g/nccl_trace_rank_2"), "pickle");
  EXPECT_FALSE(fs::exists(root_ + "/out/g/.rank3.json.tmp"));
  EXPECT_EQ(FormatCollect(*r, kId, "OUT"),
            absl::StrCat("collected dump ", kId,
                         " from 2 directories into OUT (5 file(s) copied):\n"
                         "  group g: global ranks 0-3 (4 of 4)\n"));
}

TEST_F(FrCollectTest, ASharedDumpDirNamedTwiceTakesEachFileOnceAndNamesTheMissingRanks) {
  for (int r : {0, 1, 3})
    Write(absl::StrCat("shared/job/", kId, "/g/rank", r, ".json"), RankJson("[0, 1, 2, 3]"));
  // The source as a dump dir, as the job's folder and as the dump's folder: the same files.
  auto r = CollectDump({root_ + "/shared", root_ + "/shared/job", root_ + "/shared/job/" + kId},
                       kId, root_ + "/out");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->files, 3);
  EXPECT_EQ(FormatCollect(*r, kId, "OUT"),
            absl::StrCat("collected dump ", kId,
                         " from 3 directories into OUT (3 file(s) copied):\n"
                         "  group g: global ranks 0-1, 3 (3 of 4); no dump of 2\n"));
}

TEST_F(FrCollectTest, TwoDifferentFilesForOneRankAreRefusedNamingBoth) {
  Write(absl::StrCat("a/job/", kId, "/g/rank1.json"), RankJson("[0, 1]"));
  Write(absl::StrCat("b/job/", kId, "/g/rank1.json"), RankJson("[1, 2]"));
  auto r = CollectDump({root_ + "/a", root_ + "/b"}, kId, root_ + "/out");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find(root_ + "/b/job/" + kId + "/g/rank1.json"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find(root_ + "/out/g/rank1.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("claim one global rank"), std::string::npos);
}

TEST_F(FrCollectTest, BadIdsAndMissingDumpsAreClearErrors) {
  auto bad = CollectDump({root_}, "../../etc", root_ + "/out");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"../../etc\" is not one commd makes"), std::string::npos)
      << bad.status();
  auto none = CollectDump({root_ + "/nowhere"}, kId, root_ + "/out");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(absl::StrCat("no directory of dump ", kId)),
            std::string::npos)
      << none.status();
  EXPECT_FALSE(fs::exists(root_ + "/out"));
  auto no_source = CollectDump({}, kId, root_ + "/out");
  EXPECT_EQ(no_source.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace commd::ctl
