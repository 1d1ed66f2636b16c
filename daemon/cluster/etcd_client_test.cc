// The pure parts of the cluster module: etcd's prefix ranges, lease seconds, options from the
// config. What needs etcd is in tests/integration/cluster_test.cc (a real etcd).
#include "daemon/cluster/etcd_client.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "daemon/cluster/cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd::cluster {
namespace {

TEST(PrefixEndTest, IncrementsTheLastByteThatCanBe) {
  EXPECT_EQ(PrefixEnd("/commd/jobs/"), "/commd/jobs0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));  // every key
  EXPECT_EQ(PrefixEnd(""), std::string(1, '\0'));
}

TEST(LeaseSecondsTest, RoundsUpToWholeSeconds) {
  EXPECT_EQ(LeaseSeconds(absl::Milliseconds(2000)), 2);
  EXPECT_EQ(LeaseSeconds(absl::Milliseconds(2001)), 3);
  EXPECT_EQ(LeaseSeconds(absl::Milliseconds(1)), 1);
  EXPECT_EQ(LeaseSeconds(absl::ZeroDuration()), 1);
}

TEST(ClusterOptionsTest, NodeNameDefaultsToTheHostAndBackoffIsOrdered) {
  v1::ClusterConfig config;
  config.add_etcd_endpoints("127.0.0.1:2379");
  config.set_prefix("/p");
  config.set_lease_ttl_ms(5000);
  config.set_retry_initial_ms(300);
  config.set_retry_max_ms(100);  // below the initial wait: the initial wait is the cap
  const ClusterOptions o = *ClusterOptionsFromConfig(config, "gpu-7");
  EXPECT_EQ(o.node_name, "gpu-7");
  EXPECT_EQ(o.endpoints, std::vector<std::string>{"127.0.0.1:2379"});
  EXPECT_EQ(o.lease_ttl, absl::Seconds(5));
  EXPECT_EQ(o.retry_max, absl::Milliseconds(300));
  config.set_node_name("n1");
  EXPECT_EQ(ClusterOptionsFromConfig(config, "gpu-7")->node_name, "n1");
}

// TLS files are read at start; each bad one is named with what is allowed.
TEST(ClusterOptionsTest, TlsFilesAreReadAndEachBadOneIsNamed) {
  const std::string dir = ::testing::TempDir();
  const std::string pem = dir + "/ca.pem", junk = dir + "/junk.pem";
  std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  std::ofstream(junk) << "not a certificate\n";
  v1::ClusterConfig config;
  config.add_etcd_endpoints("127.0.0.1:2379");
  config.mutable_tls()->set_ca_file(pem);  // not enabled: not read
  EXPECT_FALSE(ClusterOptionsFromConfig(config, "h")->tls.has_value());

  config.mutable_tls()->set_enabled(true);
  config.mutable_tls()->set_server_name("etcd.example");
  auto o = ClusterOptionsFromConfig(config, "h");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(o->tls.has_value());
  EXPECT_THAT(o->tls->ca_pem, ::testing::StartsWith("-----BEGIN CERTIFICATE-----"));
  EXPECT_EQ(o->tls->server_name, "etcd.example");
  EXPECT_TRUE(o->tls->cert_pem.empty());

  config.mutable_tls()->set_cert_file(pem);  // without key_file
  EXPECT_EQ(ClusterOptionsFromConfig(config, "h").status(),
            absl::InvalidArgumentError(
                absl::StrCat("cluster.tls: cert_file \"", pem,
                             "\" and key_file \"\" go together (allowed: both or neither)")));
  config.mutable_tls()->set_key_file(dir + "/missing.pem");
  EXPECT_EQ(ClusterOptionsFromConfig(config, "h").status(),
            absl::InvalidArgumentError(absl::StrCat("cluster.tls.key_file \"", dir,
                                                    "/missing.pem\" cannot be read: No such file "
                                                    "or directory")));
  config.mutable_tls()->set_key_file(junk);
  EXPECT_EQ(ClusterOptionsFromConfig(config, "h").status(),
            absl::InvalidArgumentError(
                absl::StrCat("cluster.tls.key_file \"", junk,
                             "\" holds no PEM block (allowed: a PEM file, -----BEGIN ...)")));
}

}  // namespace
}  // namespace commd::cluster
