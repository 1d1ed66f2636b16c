// commctl's text forms that need no daemon: `commctl groups` with ranks sharing a GPU.
#include "tools/commctl/commands.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace commd::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::GroupInfo Group(const std::string& name, const std::vector<std::string>& devices) {
  v1::GroupInfo g;
  g.set_job_id("job");
  g.set_name(name);
  g.set_world_size(static_cast<int32_t>(devices.size()));
  g.set_joined(static_cast<int32_t>(devices.size()));
  for (size_t r = 0; r < devices.size(); ++r) {
    v1::Member* m = g.add_members();
    m->set_rank(static_cast<int32_t>(r));
    m->set_pid(static_cast<int64_t>(100 + r));
    m->set_device(devices[r]);
  }
  return g;
}

// Several ranks on one GPU (issue #36) read as one entry per device, in rank order.
TEST(FormatGroupsTest, RanksSharingAGpuAreListedUnderTheirDevice) {
  v1::ListGroupsResponse groups;
  *groups.add_groups() = Group("one_gpu", {"cuda:0", "cuda:0", "cuda:0", "cuda:0"});
  *groups.add_groups() = Group("two_each", {"cuda:0", "cuda:0", "cuda:1", "cuda:1"});
  *groups.add_groups() = Group("cpu", {"host", "host"});
  const std::string text = FormatGroups(groups);
  EXPECT_THAT(text, HasSubstr("DEVICES"));
  EXPECT_THAT(text, HasSubstr("cuda:0=0,1,2,3 "));
  EXPECT_THAT(text, HasSubstr("cuda:0=0,1 cuda:1=2,3 "));
  EXPECT_THAT(text, HasSubstr("0:100 1:101 2:102 3:103"));
  // The host group's row says "-" where a GPU group names its devices.
  EXPECT_THAT(text, ::testing::ContainsRegex("cpu .* - +0:100 1:101\n"));
}

// A node with host groups only prints what it always did: no DEVICES column.
TEST(FormatGroupsTest, HostGroupsHaveNoDevicesColumn) {
  v1::ListGroupsResponse groups;
  *groups.add_groups() = Group("cpu", {"host", "host"});
  EXPECT_THAT(FormatGroups(groups), Not(HasSubstr("DEVICES")));
  EXPECT_EQ(FormatGroups(v1::ListGroupsResponse()), "no groups\n");
}

}  // namespace
}  // namespace commd::ctl
