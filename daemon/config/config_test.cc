#include "daemon/config/config.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "client/include/commd/limits.h"
#include "commd/v1/options.pb.h"
#include "common/control_block.h"
#include "gtest/gtest.h"

namespace commd::config {
namespace {

namespace pb = google::protobuf;

// Every field of the embedded defaults is written out, so --print-default-config documents
// every field and no default hides in code.
void ExpectAllFieldsSet(const pb::Message& msg, const std::string& path) {
  const pb::Descriptor* d = msg.GetDescriptor();
  const pb::Reflection* r = msg.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    EXPECT_TRUE(r->HasField(msg, f)) << "deploy/commd.textproto does not set " << path << f->name();
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && r->HasField(msg, f)) {
      ExpectAllFieldsSet(r->GetMessage(msg, f), path + f->name() + ".");
    }
  }
}

TEST(ConfigTest, EmbeddedDefaultsParseValidateAndSetEveryField) {
  auto parsed = ParseConfig(DefaultConfigText(), "defaults");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ExpectAllFieldsSet(*parsed, "");
  EXPECT_EQ(parsed->metrics_address(), "0.0.0.0:9464");
  EXPECT_EQ(parsed->log_level(), v1::INFO);
  EXPECT_EQ(parsed->limits().max_sessions(), 4096u);
}

// The collectives section's defaults: the measured one-shot/two-shot crossover of
// kernels::AllReduceThresholds, no NaN check, report only.
TEST(ConfigTest, CollectivesDefaultsAndOverrides) {
  const v1::CollectivesConfig d = DefaultConfig().collectives();
  EXPECT_EQ(d.one_shot_max_read_bytes(), 4096u);
  EXPECT_EQ(d.nan_check(), v1::NAN_CHECK_OFF);
  EXPECT_EQ(d.nan_sample_period(), 100u);
  EXPECT_EQ(d.nan_policy(), v1::NAN_POLICY_REPORT);
  auto parsed = ParseConfig(
      "collectives {\n  nan_check: NAN_CHECK_SAMPLED\n  nan_sample_period: 7\n"
      "  nan_policy: NAN_POLICY_FAIL\n  one_shot_max_read_bytes: 0\n}\n",
      "c.textproto");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->collectives().nan_check(), v1::NAN_CHECK_SAMPLED);
  EXPECT_EQ(parsed->collectives().nan_sample_period(), 7u);
  EXPECT_EQ(parsed->collectives().nan_policy(), v1::NAN_POLICY_FAIL);
  EXPECT_TRUE(parsed->collectives().has_one_shot_max_read_bytes());
  EXPECT_EQ(parsed->collectives().one_shot_max_read_bytes(), 0u);
}

// The range config.proto declares for a field (its (range) option).
v1::Range DeclaredRange(const pb::Descriptor* message, const std::string& field) {
  const pb::FieldDescriptor* f = message->FindFieldByName(field);
  if (f == nullptr) {
    ADD_FAILURE() << message->full_name() << " has no field " << field;
    return {};
  }
  return f->options().GetExtension(v1::range);
}

// Limits that are ranges of the config as well are stated once in code (commd/limits.h, the
// control block's ABI); config.proto repeats them for its validation and its docs, and must
// say the same.
TEST(ConfigTest, RangesThatAreLimitsInCodeAgreeWithThem) {
  const v1::Range period = DeclaredRange(v1::CollectivesConfig::descriptor(), "nan_sample_period");
  EXPECT_EQ(period.min(), kMinNanSamplePeriod);
  EXPECT_EQ(period.max(), kMaxNanSamplePeriod);
  // The ring's capacity may start above the ABI's least, but ends at its most.
  const v1::Range ring = DeclaredRange(v1::RecorderConfig::descriptor(), "ring_capacity");
  EXPECT_GE(ring.min(), kRingMinCapacity);
  EXPECT_EQ(ring.max(), kRingMaxCapacity);

  const auto period_config = [](uint64_t v) {
    return ParseConfig(absl::StrCat("collectives {\n  nan_sample_period: ", v, "\n}\n"),
                       "c.textproto");
  };
  EXPECT_TRUE(period_config(kMaxNanSamplePeriod).ok());
  EXPECT_TRUE(period_config(kMinNanSamplePeriod).ok());
  EXPECT_FALSE(period_config(uint64_t{kMaxNanSamplePeriod} + 1).ok());
  EXPECT_FALSE(period_config(kMinNanSamplePeriod - 1).ok());
}

TEST(ConfigTest, EmptyFileKeepsDefaults) {
  auto parsed = ParseConfig("", "empty.textproto");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->SerializeAsString(), DefaultConfig().SerializeAsString());
}

TEST(ConfigTest, FileOverridesOnlyWhatItNames) {
  auto parsed = ParseConfig("log_level: DEBUG\nlimits { max_sessions: 7 }\nruntime_dir: \"\"\n",
                            "c.textproto");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->log_level(), v1::DEBUG);
  EXPECT_EQ(parsed->limits().max_sessions(), 7u);
  EXPECT_EQ(parsed->limits().max_message_bytes(), DefaultConfig().limits().max_message_bytes());
  EXPECT_EQ(parsed->topology().nvml_library(), "libnvidia-ml.so.1");
}

struct BadConfig {
  std::string text;
  std::vector<std::string> message_parts;  // each must appear in the error
};

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, RejectedWithFileLineAndField) {
  auto parsed = ParseConfig(GetParam().text, "/etc/commd/c.textproto");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& part : GetParam().message_parts) {
    EXPECT_NE(parsed.status().message().find(part), std::string::npos)
        << "'" << part << "' missing from: " << parsed.status().message();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Errors, BadConfigTest,
    ::testing::Values(
        // Unknown field: file, line and the field's name.
        BadConfig{"log_level: INFO\nmetrics_adress: \"x:1\"\n",
                  {"/etc/commd/c.textproto:2", "metrics_adress"}},
        // Unknown nested field.
        BadConfig{"limits {\n  max_session: 3\n}\n", {"c.textproto:2", "max_session"}},
        // Wrong type: the line text names the field.
        BadConfig{"\nlimits { max_sessions: \"many\" }\n",
                  {"c.textproto:2", "max_sessions", "integer"}},
        // Negative for an unsigned field.
        BadConfig{"limits { max_message_bytes: -5 }\n", {"c.textproto:1", "max_message_bytes"}},
        // Out of the declared range: the value and the range.
        BadConfig{"\n\nlimits {\n  max_sessions: 0\n}\n",
                  {"c.textproto:4", "limits.max_sessions = 0", "allowed 1 to 1048576"}},
        BadConfig{"limits { max_message_bytes: 100 }\n",
                  {"limits.max_message_bytes = 100", "allowed 4096 to 268435456"}},
        // Unknown enum value and the unspecified one.
        BadConfig{"log_level: LOUD\n", {"c.textproto:1", "LOUD"}},
        BadConfig{"log_level: LOG_LEVEL_UNSPECIFIED\n",
                  {"c.textproto:1", "log_level must be one of DEBUG, INFO, WARNING, ERROR"}},
        // A metrics address that is not HOST:PORT.
        BadConfig{"metrics_address: \"localhost\"\n", {"c.textproto:1", "metrics_address"}},
        BadConfig{"recorder { ring_capacity: 1000 }\n",
                  {"c.textproto:1", "recorder.ring_capacity = 1000 is not a power of two"}},
        BadConfig{"metrics_address: \"127.0.0.1:70000\"\n", {"metrics_address", "0 to 65535"}},
        BadConfig{"collectives {\n  nan_sample_period: 0\n}\n",
                  {"c.textproto:2", "collectives.nan_sample_period = 0", "allowed 1 to 1000000"}},
        BadConfig{"collectives { nan_check: NAN_CHECK_UNSPECIFIED }\n",
                  {"collectives.nan_check must be one of NAN_CHECK_OFF, NAN_CHECK_ON, "
                   "NAN_CHECK_SAMPLED"}},
        BadConfig{"collectives { nan_policy: FAIL }\n", {"c.textproto:1", "FAIL"}},
        BadConfig{
            "collectives { one_shot_max_read_bytes: 2000000000000 }\n",
            {"collectives.one_shot_max_read_bytes = 2000000000000", "allowed 0 to 1099511627776"}},
        // The cluster section: a TTL etcd cannot keep, endpoints and names it cannot use.
        BadConfig{"cluster {\n  lease_ttl_ms: 500\n}\n",
                  {"c.textproto:2", "cluster.lease_ttl_ms = 500", "allowed 2000 to 3600000"}},
        BadConfig{"cluster {\n  etcd_endpoints: \"10.0.0.1:2379\"\n  etcd_endpoints: \"etcd\"\n}\n",
                  {"c.textproto:3", "cluster.etcd_endpoints: 'etcd' is not HOST:PORT"}},
        BadConfig{"cluster { prefix: \"commd/\" }\n",
                  {"c.textproto:1", "cluster.prefix = 'commd/' must start with '/'"}},
        BadConfig{"cluster { node_name: \"a/b\" }\n",
                  {"c.textproto:1", "cluster.node_name = 'a/b' must be 1 to 128 of letters"}}));

// No cluster unless endpoints are named; the rest of the section has its defaults.
TEST(ConfigTest, ClusterDefaultsToASingleNode) {
  const v1::ClusterConfig c = DefaultConfig().cluster();
  EXPECT_EQ(c.etcd_endpoints_size(), 0);
  EXPECT_EQ(c.prefix(), "/commd");
  EXPECT_EQ(c.lease_ttl_ms(), 10000u);
  auto parsed = ParseConfig("cluster { etcd_endpoints: \"127.0.0.1:2379\" node_name: \"n-1\" }",
                            "c.textproto");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->cluster().etcd_endpoints(0), "127.0.0.1:2379");
  EXPECT_EQ(parsed->cluster().job_lease_ttl_ms(), 60000u);
}

TEST(ConfigTest, MissingFileNamesThePath) {
  auto parsed = LoadConfigFile("/nonexistent/commd.textproto");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(parsed.status().message().find("/nonexistent/commd.textproto"), std::string::npos);
}

TEST(ConfigTest, ParseHostPort) {
  auto hp = ParseHostPort("[::1]:0");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->port, 0);
  EXPECT_FALSE(ParseHostPort(":80").ok());
  EXPECT_FALSE(ParseHostPort("h:").ok());
  EXPECT_FALSE(ParseHostPort("h:-1").ok());
}

}  // namespace
}  // namespace commd::config
