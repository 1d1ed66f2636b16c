// The one loader against libraries every Linux machine has (libm, libc): what a missing
// library and a missing symbol are told as, a table resolved, and the choice among candidates
// (one the process already loaded first, then the usable ones in order).
#include "common/dl_library.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace commd {
namespace {

TEST(DlLibraryTest, AMissingLibraryIsNamedWithTheLoadersReason) {
  absl::StatusOr<DlLibrary> lib = DlLibrary::Open("/nonexistent/libfoo.so.1");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StartsWith(lib.status().message(), "cannot load /nonexistent/libfoo.so.1 ("))
      << lib.status();
}

TEST(DlLibraryTest, ResolvesATable) {
  absl::StatusOr<DlLibrary> lib = DlLibrary::Open("libm.so.6");
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_EQ(lib->name(), "libm.so.6");
  double (*cos_fn)(double) = nullptr;
  double (*sqrt_fn)(double) = nullptr;
  ASSERT_TRUE(
      lib->Resolve({{"cos", DlAddress(&cos_fn)}, {"sqrt", DlAddress(&sqrt_fn)}}, "a libm").ok());
  ASSERT_NE(cos_fn, nullptr);
  EXPECT_EQ(cos_fn(0.0), 1.0);
  EXPECT_EQ(sqrt_fn(16.0), 4.0);
}

TEST(DlLibraryTest, TheFirstMissingSymbolIsNamedAndTheOthersStillResolve) {
  absl::StatusOr<DlLibrary> lib = DlLibrary::Open("libm.so.6");
  ASSERT_TRUE(lib.ok()) << lib.status();
  void* missing = &missing;
  double (*cos_fn)(double) = nullptr;
  const absl::Status st = lib->Resolve(
      {{"cos", DlAddress(&cos_fn)}, {"ncclGetVersion", &missing}, {"cuInit", &missing}},
      "a usable NCCL");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "libm.so.6 is not a usable NCCL: it exports no ncclGetVersion");
  EXPECT_EQ(missing, nullptr);
  EXPECT_NE(cos_fn, nullptr);
}

TEST(DlLibraryTest, TellsALoadedLibraryFromAnAbsentOne) {
  EXPECT_TRUE(DlLibrary::IsLoaded("libc.so.6"));
  EXPECT_FALSE(DlLibrary::IsLoaded("libcommd-not-a-library.so.0"));
}

// `load` records what it was asked for; "fails" in a name makes it fail.
absl::StatusOr<std::string> Load(std::vector<std::string>* asked, const std::string& name) {
  asked->push_back(name);
  if (absl::StrContains(name, "fails")) return absl::UnavailableError(name + " failed");
  return name;
}

TEST(DlLoadFirstTest, TheUsableOnesInOrderAndWhyTheOthersWereNot) {
  std::vector<std::string> asked, why;
  const std::vector<DlCandidate> candidates = {
      {"libnew-fails.so", absl::OkStatus()},
      {"libnewer.so", absl::FailedPreconditionError("libnewer.so needs a newer driver")},
      {"libold.so", absl::OkStatus()}};
  const std::optional<std::string> chosen = DlLoadFirst<std::string>(
      candidates, /*prefer_loaded=*/true,
      [&](const std::string& name) { return Load(&asked, name); }, &why);
  EXPECT_EQ(chosen, "libold.so");
  EXPECT_EQ(asked, (std::vector<std::string>{"libnew-fails.so", "libold.so"}));
  EXPECT_EQ(why, (std::vector<std::string>{"libnew-fails.so failed",
                                           "libnewer.so needs a newer driver"}));
}

TEST(DlLoadFirstTest, OneTheProcessHasLoadedComesFirstEvenIfNotUsable) {
  std::vector<std::string> asked, why;
  const std::vector<DlCandidate> candidates = {
      {"libcommd-absent.so.0", absl::OkStatus()},
      {"libc.so.6", absl::FailedPreconditionError("not usable before it is opened")}};
  EXPECT_EQ(DlLoadFirst<std::string>(
                candidates, /*prefer_loaded=*/true,
                [&](const std::string& name) { return Load(&asked, name); }, &why),
            "libc.so.6");
  EXPECT_EQ(asked, (std::vector<std::string>{"libc.so.6"}));
  EXPECT_TRUE(why.empty());
  // Without the preference the order alone decides.
  asked.clear();
  EXPECT_EQ(DlLoadFirst<std::string>(
                candidates, /*prefer_loaded=*/false,
                [&](const std::string& name) { return Load(&asked, name); }, &why),
            "libcommd-absent.so.0");
}

TEST(DlLoadFirstTest, NoneServes) {
  std::vector<std::string> why;
  const std::vector<DlCandidate> candidates = {{"liba-fails.so", absl::OkStatus()}};
  std::vector<std::string> asked;
  EXPECT_FALSE(DlLoadFirst<std::string>(
                   candidates, /*prefer_loaded=*/true,
                   [&](const std::string& name) { return Load(&asked, name); }, &why)
                   .has_value());
  EXPECT_EQ(why, (std::vector<std::string>{"liba-fails.so failed"}));
}

}  // namespace
}  // namespace commd
