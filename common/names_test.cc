#include "common/names.h"

#include <string>

#include "gtest/gtest.h"

namespace commd {
namespace {

TEST(QuoteForErrorTest, ShortValuesWhole) {
  EXPECT_EQ(QuoteForError(""), "\"\"");
  EXPECT_EQ(QuoteForError("job-1"), "\"job-1\"");
  EXPECT_EQ(QuoteForError("a\nb"), "\"a\\nb\"");
  EXPECT_EQ(QuoteForError(std::string(kMaxEchoedBytes, 'x')),
            "\"" + std::string(kMaxEchoedBytes, 'x') + "\"");
}

TEST(QuoteForErrorTest, LongValuesCutWithTheirLength) {
  EXPECT_EQ(QuoteForError(std::string(8192, 'a')),
            "\"" + std::string(kMaxEchoedBytes, 'a') + "…\" (8192 bytes)");
  // Bytes past the cut never reach the message, escaped or not.
  const std::string q = QuoteForError(std::string(kMaxEchoedBytes, 'a') + std::string(1 << 20, 0));
  EXPECT_EQ(q, "\"" + std::string(kMaxEchoedBytes, 'a') + "…\" (1048640 bytes)");
}

TEST(ValidateNameTest, MessagesSayWhatAndWhy) {
  EXPECT_EQ(ValidateName("group name", "").message(),
            "group name \"\" is invalid: empty; allowed 1 to 256 bytes");
  const absl::Status big = ValidateName("group name", std::string(8192, 'a'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big.message(), "group name \"" + std::string(kMaxEchoedBytes, 'a') +
                               "…\" (8192 bytes) is invalid: longer than 256 bytes");
  EXPECT_EQ(ValidateName("buffer name", "/x").message(),
            "buffer name \"/x\" is invalid: must not start with '.', '-' or '/'");
  EXPECT_EQ(ValidateName("group name", "a b").message(),
            "group name \"a b\" is invalid: character ' ' at byte 1; allowed letters, digits and "
            ". _ - : /");
  EXPECT_EQ(ValidateJobId("a/b").message(),
            "job id \"a/b\" is invalid: character '/' at byte 1; allowed letters, digits and "
            ". _ - :");
  EXPECT_TRUE(ValidateName("group name", "train/dp:0").ok());
  EXPECT_TRUE(ValidateJobId(std::string(128, 'j')).ok());
  EXPECT_FALSE(ValidateJobId(std::string(129, 'j')).ok());
  EXPECT_EQ(JobIdRule(), "1 to 128 of letters, digits and . _ - :");
}

}  // namespace
}  // namespace commd
