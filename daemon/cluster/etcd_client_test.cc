// The pure parts of the cluster module: etcd's prefix ranges, lease seconds, options from the
// config. What needs etcd is in tests/integration/cluster_test.cc (a real etcd).
#include "daemon/cluster/etcd_client.h"

#include "daemon/cluster/cluster.h"
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
  const ClusterOptions o = ClusterOptionsFromConfig(config, "gpu-7");
  EXPECT_EQ(o.node_name, "gpu-7");
  EXPECT_EQ(o.endpoints, std::vector<std::string>{"127.0.0.1:2379"});
  EXPECT_EQ(o.lease_ttl, absl::Seconds(5));
  EXPECT_EQ(o.retry_max, absl::Milliseconds(300));
  config.set_node_name("n1");
  EXPECT_EQ(ClusterOptionsFromConfig(config, "gpu-7").node_name, "n1");
}

}  // namespace
}  // namespace commd::cluster
