// Groups, symmetric buffers and persistent buffers against the real daemon, with real rank
// processes mapping real shared memory.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

// A daemon whose departed ranks' memory is released quickly, so leak checks need not wait.
constexpr char kConfig[] = R"(
session { release_grace_ms: 200 }
limits { max_allocation_bytes: 134217728 max_bytes_per_job: 268435456 }
)";

class GroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = StartDaemonWithConfig(tmp_, kConfig);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& job = "job") {
    ClientOptions options;
    options.runtime_dir = daemon_->runtime_dir();
    options.job_id = job;
    return Client::Connect(options);
  }

  std::unique_ptr<ChildProcess> Rank(const std::string& group, int rank, int world,
                                     const std::string& sizes, const std::string& mode = "run") {
    auto child = ChildProcess::Start(
        {COMMD_RANK_PROCESS, group, std::to_string(rank), std::to_string(world), sizes, mode},
        {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(), "COMMD_JOB_ID=job"});
    EXPECT_TRUE(child.ok()) << child.status();
    return child.ok() ? std::move(*child) : nullptr;
  }

  double Metric(const std::string& key) { return MetricValue(*daemon_, key); }

  // Waits until the daemon holds no client memory: no memfd open or mapped, and the memory
  // gauge at zero.
  void ExpectAllMemoryReleased() {
    for (int i = 0; i < 250; ++i) {
      if (daemon_->CountMemfds() == 0 && daemon_->CountMemfdMappings() == 0 &&
          Metric(R"(commd_memory_allocated_bytes{backend="host",device="host"})") == 0) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(daemon_->CountMemfds(), 0);
    EXPECT_EQ(daemon_->CountMemfdMappings(), 0);
    EXPECT_EQ(Metric(R"(commd_memory_allocated_bytes{backend="host",device="host"})"), 0);
  }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
};

class GroupWorldTest : public GroupsTest, public ::testing::WithParamInterface<int> {};

TEST_P(GroupWorldTest, EveryRankReadsEveryPeersPattern) {
  const int world = GetParam();
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(Rank("g", r, world, "8,4096,1048576,3000000"));
  for (int r = 0; r < world; ++r) {
    auto result = ranks[r]->Wait(absl::Seconds(120));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 0) << "rank " << r << ": " << result->output;
    EXPECT_THAT(result->output, HasSubstr(absl::StrCat("OK rank ", r, " verified ", world)));
  }
  EXPECT_GE(Metric("commd_rendezvous_duration_seconds_count"), 1);
  ExpectAllMemoryReleased();
  EXPECT_EQ(Metric("commd_groups"), 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, GroupWorldTest, ::testing::Values(2, 4, 8));

TEST_F(GroupsTest, RankKilledMidRendezvousFailsTheOthersNamingIt) {
  auto waiting = Rank("g", 0, 3, "4096");
  auto doomed = Rank("g", 1, 3, "4096");
  // Both are waiting in the rendezvous once the daemon lists two members.
  auto client = Connect();
  ASSERT_TRUE(client.ok());
  int joined = 0;
  for (int i = 0; i < 1000 && joined < 2; ++i) {
    auto groups = (*client)->ListGroups();
    ASSERT_TRUE(groups.ok()) << groups.status();
    joined = groups->groups().empty() ? 0 : groups->groups(0).joined();
    if (joined < 2) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(joined, 2);
  const pid_t doomed_pid = doomed->pid();
  ASSERT_TRUE(doomed->Stop(SIGKILL).ok());
  auto result = waiting->Wait(absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1);
  EXPECT_THAT(result->output, HasSubstr("ABORTED"));
  EXPECT_THAT(result->output, HasSubstr(absl::StrCat(
                                  "rank 1 (pid ", doomed_pid,
                                  ") exited: killed by SIGKILL during the rendezvous of group g")));
}

TEST_F(GroupsTest, RankKilledMidAllocationFailsTheOthersAndIsReleasedAfterGrace) {
  auto waiting = Rank("g", 0, 2, "4096");
  auto doomed = Rank("g", 1, 2, "4096", "hang-after-join");
  ASSERT_TRUE(doomed->WaitForLog("JOINED", absl::Seconds(30))) << doomed->Log();
  ASSERT_TRUE(waiting->WaitForLog("JOINED", absl::Seconds(30))) << waiting->Log();
  absl::SleepFor(absl::Milliseconds(300));  // rank 0 is now waiting in AllocateSymmetric
  const pid_t doomed_pid = doomed->pid();
  ASSERT_TRUE(doomed->Stop(SIGKILL).ok());
  auto result = waiting->Wait(absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1);
  EXPECT_THAT(result->output, HasSubstr("ABORTED"));
  EXPECT_THAT(result->output, HasSubstr(absl::StrCat("rank 1 (pid ", doomed_pid, ")")));
  EXPECT_GT(daemon_->CountMemfds(), 0);  // the dead rank's memory waits out the grace
  waiting.reset();
  ExpectAllMemoryReleased();
}

TEST_F(GroupsTest, MissingRankTimesOutNamingIt) {
  auto client = Connect();
  ASSERT_TRUE(client.ok());
  auto group = (*client)->JoinGroup(
      {.name = "g", .rank = 0, .world_size = 3, .timeout = absl::Milliseconds(300)});
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(group.status().message(), HasSubstr("rank(s) [1, 2] never joined"));
  EXPECT_THAT(group.status().message(), HasSubstr("joined: [0]"));
  EXPECT_EQ(Metric("commd_groups"), 0);
}

// Joins `world` ranks of group `name` from threads of this process, one Client each.
std::vector<absl::StatusOr<std::unique_ptr<Group>>> JoinAll(
    const std::vector<std::unique_ptr<Client>>& clients, const std::string& name,
    const std::vector<GroupOptions>& options) {
  std::vector<absl::StatusOr<std::unique_ptr<Group>>> groups(options.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < options.size(); ++i) {
    threads.emplace_back([&, i] { groups[i] = clients[i]->JoinGroup(options[i]); });
  }
  for (auto& t : threads) t.join();
  return groups;
}

TEST_F(GroupsTest, BadJoinsFailOnlyTheOffender) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 5; ++i) clients.push_back(*Connect());
  const absl::Duration t = absl::Seconds(20);
  // Rank 0 defines the group (world size 2) and waits in it.
  absl::StatusOr<std::unique_ptr<Group>> rank0;
  std::thread first([&] {
    rank0 = clients[0]->JoinGroup({.name = "g", .rank = 0, .world_size = 2, .timeout = t});
  });
  int joined = 0;
  for (int i = 0; i < 1000 && joined < 1; ++i) {
    auto groups = clients[1]->ListGroups();
    joined = groups.ok() && !groups->groups().empty() ? groups->groups(0).joined() : 0;
    if (joined < 1) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(joined, 1);
  // Each bad join fails at once, and only its caller.
  auto out_of_range =
      clients[1]->JoinGroup({.name = "g", .rank = 5, .world_size = 2, .timeout = t});
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out_of_range.status().message(),
              HasSubstr("rank 5 for group g of world size 2; allowed 0 to 1"));
  auto disagrees = clients[2]->JoinGroup({.name = "g", .rank = 1, .world_size = 3, .timeout = t});
  EXPECT_EQ(disagrees.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(disagrees.status().message(), HasSubstr("world size 3 disagrees"));
  auto duplicate = clients[3]->JoinGroup({.name = "g", .rank = 0, .world_size = 2, .timeout = t});
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(duplicate.status().message(), HasSubstr("rank 0 already joined group g"));
  // The group still forms for the right ranks.
  auto rank1 = clients[4]->JoinGroup({.name = "g", .rank = 1, .world_size = 2, .timeout = t});
  first.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ((*rank1)->world_size(), 2);
  EXPECT_EQ((*rank0)->member_pids(), (*rank1)->member_pids());
  auto late = clients[1]->JoinGroup({.name = "g", .rank = 1, .world_size = 2, .timeout = t});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(late.status().message(), HasSubstr("has already formed"));

  // Bad values that never reach a group.
  auto c = Connect();
  EXPECT_EQ((*c)->JoinGroup({.name = "", .rank = 0, .world_size = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT((*c)->JoinGroup({.name = "g h", .rank = 0, .world_size = 1}).status().message(),
              HasSubstr("group name \"g h\" is invalid: character ' ' at byte 1"));
  EXPECT_THAT((*c)->JoinGroup({.name = "x", .rank = 0, .world_size = 0}).status().message(),
              HasSubstr("world size 0 for group x; allowed 1 to 1024"));
  EXPECT_THAT((*c)->JoinGroup({.name = "x", .rank = 0, .world_size = 1, .device = Device::Cuda(0)})
                  .status()
                  .message(),
              HasSubstr("device cuda:0 is not available on this node"));
}

// A client's description is bounded: one over the limit (here 1 MiB, well within gRPC's
// message limit, so the daemon itself must refuse it) fails at once, quoting a bounded
// prefix; ranks that disagree are refused naming both; the daemon stays up and holds no
// group or memory for the refused joins.
TEST_F(GroupsTest, HostileAndDisagreeingDescriptionsAreRefused) {
  auto c = Connect();
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Duration t = absl::Seconds(20);
  for (int i = 0; i < 20; ++i) {  // a fixed count of hostile joins
    auto hostile = (*c)->JoinGroup({.name = absl::StrCat("h", i),
                                    .rank = 0,
                                    .world_size = 1,
                                    .description = std::string(1 << 20, 'x'),
                                    .timeout = t});
    ASSERT_EQ(hostile.status().code(), absl::StatusCode::kInvalidArgument) << hostile.status();
    EXPECT_THAT(hostile.status().message(),
                HasSubstr("(1048576 bytes) is longer than 63 bytes (the flight recorder's "
                          "process-group desc); allowed 0 to 63 bytes of printable ASCII"));
    EXPECT_LT(hostile.status().message().size(), 400u);  // a bounded echo, not 1 MiB
  }
  auto groups = (*c)->ListGroups();
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(groups->groups_size(), 0);

  auto other = Connect();
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<std::unique_ptr<Group>> rank0;
  std::thread first([&] {
    rank0 = (*c)->JoinGroup(
        {.name = "g", .rank = 0, .world_size = 2, .description = "default_pg", .timeout = t});
  });
  for (int i = 0; i < 1000; ++i) {
    auto listed = (*other)->ListGroups();
    if (listed.ok() && listed->groups_size() == 1) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto differs = (*other)->JoinGroup(
      {.name = "g", .rank = 1, .world_size = 2, .description = "tp", .timeout = t});
  EXPECT_EQ(differs.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(differs.status().message(),
              HasSubstr("rank 1 gives group g the description \"tp\" but the group's is "
                        "\"default_pg\" (set by the first rank to join)"));
  auto agrees = (*other)->JoinGroup(
      {.name = "g", .rank = 1, .world_size = 2, .description = "default_pg", .timeout = t});
  first.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(agrees.ok()) << agrees.status();
  groups = (*c)->ListGroups();
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->groups_size(), 1);
  EXPECT_EQ(groups->groups(0).description(), "default_pg");
  // And the watchdog's view: `commctl health` says which group torch meant (the watchdog
  // picks a new group up on its next poll).
  auto health = (*c)->GetHealth("g");
  for (int i = 0; i < 200 && absl::IsNotFound(health.status()); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    health = (*c)->GetHealth("g");
  }
  ASSERT_TRUE(health.ok()) << health.status();
  ASSERT_EQ(health->groups_size(), 1);
  EXPECT_EQ(health->groups(0).description(), "default_pg");
  ProcessResult shown = RunProcess(
      {COMMCTL_BINARY, "--runtime-dir", daemon_->runtime_dir(), "--job", "job", "health"});
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_THAT(shown.output, HasSubstr("DESC"));
  EXPECT_THAT(shown.output, ::testing::ContainsRegex("job +g +default_pg +ok"));
}

// Another uid's client of the same job id sees none of the group's health, description
// included (groups belong to their (uid, job)).
TEST(GroupHealthIsolationTest, AnotherUidSeesNoHealthOfTheGroup) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (setpriv)";
  TempDir tmp;
  // uid 65534 must reach the sockets: the test's dir is searchable and the daemon gives its
  // runtime dir and sockets to group nogroup, uid 65534's group.
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
  auto daemon = StartDaemonWithConfig(tmp, "socket_group: \"nogroup\"");
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect({.runtime_dir = (*daemon)->runtime_dir(), .job_id = "job"});
  ASSERT_TRUE(client.ok()) << client.status();
  auto group =
      (*client)->JoinGroup({.name = "g", .rank = 0, .world_size = 1, .description = "secret_pg"});
  ASSERT_TRUE(group.ok()) << group.status();
  auto health = (*client)->GetHealth("g");
  for (int i = 0; i < 200 && absl::IsNotFound(health.status()); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    health = (*client)->GetHealth("g");
  }
  ASSERT_TRUE(health.ok()) << health.status();  // the owner sees it
  auto as_nobody = [&](std::vector<std::string> args) {
    args.insert(args.begin(),
                {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 COMMCTL_BINARY, "--runtime-dir", (*daemon)->runtime_dir(), "--job", "job"});
    return RunProcess(args, absl::Seconds(30));
  };
  ProcessResult all = as_nobody({"health"});
  EXPECT_EQ(all.exit_code, 0) << all.output;
  EXPECT_THAT(all.output, HasSubstr("no groups"));
  EXPECT_THAT(all.output, ::testing::Not(HasSubstr("secret_pg")));
  ProcessResult one = as_nobody({"health", "--group", "g"});
  EXPECT_NE(one.exit_code, 0);
  EXPECT_THAT(one.output, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(one.output, ::testing::Not(HasSubstr("secret_pg")));
}

TEST_F(GroupsTest, SymmetricSizeMismatchFailsEveryRank) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 2; ++i) clients.push_back(*Connect());
  auto groups = JoinAll(clients, "g",
                        {{.name = "g", .rank = 0, .world_size = 2, .timeout = absl::Seconds(20)},
                         {.name = "g", .rank = 1, .world_size = 2, .timeout = absl::Seconds(20)}});
  ASSERT_TRUE(groups[0].ok() && groups[1].ok());
  absl::StatusOr<std::unique_ptr<SymmetricBuffer>> a, b;
  std::thread t([&] { a = (*groups[0])->AllocateSymmetric(4096); });
  b = (*groups[1])->AllocateSymmetric(8192);
  t.join();
  for (const auto* r : {&a, &b}) {
    ASSERT_FALSE(r->ok());
    EXPECT_EQ(r->status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r->status().message(), HasSubstr("rank 0: 4096, rank 1: 8192"));
  }
  // The group stays usable.
  std::thread t2([&] { a = (*groups[0])->AllocateSymmetric(64); });
  b = (*groups[1])->AllocateSymmetric(64);
  t2.join();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  static_cast<char*>((*a)->data())[0] = 'a';
  EXPECT_EQ(static_cast<char*>((*b)->peer(0))[0], 'a');
  EXPECT_EQ((*a)->peer(2), nullptr);
  // Zero and over-limit sizes are the caller's error alone.
  EXPECT_EQ((*groups[0])->AllocateSymmetric(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GroupsTest, AllocationLimitsNameTheirConfigField) {
  std::vector<std::unique_ptr<Client>> clients;
  clients.push_back(*Connect());
  auto groups = JoinAll(clients, "solo", {{.name = "solo", .rank = 0, .world_size = 1}});
  ASSERT_TRUE(groups[0].ok());
  auto big = (*groups[0])->AllocateSymmetric(size_t{200} << 20);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("limits.max_allocation_bytes"));
  std::vector<std::unique_ptr<SymmetricBuffer>> held;
  absl::Status last;
  for (int i = 0; i < 3 && last.ok(); ++i) {
    auto b = (*groups[0])->AllocateSymmetric(size_t{100} << 20);
    last = b.status();
    if (b.ok()) held.push_back(std::move(*b));
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(last.message(), HasSubstr("limits.max_bytes_per_job"));
  EXPECT_EQ(held.size(), 2u);
}

TEST_F(GroupsTest, PersistentBufferSurvivesItsProcessAndExpires) {
  {
    auto writer = Connect();
    ASSERT_TRUE(writer.ok());
    auto buf = (*writer)->AllocatePersistent("ckpt", 1 << 20, absl::Milliseconds(500));
    ASSERT_TRUE(buf.ok()) << buf.status();
    std::memset((*buf)->data(), 0x5a, (*buf)->size());
    EXPECT_EQ((*writer)->AllocatePersistent("ckpt", 10).status().code(),
              absl::StatusCode::kAlreadyExists);
  }
  // Another job sees nothing; the same job finds the same bytes.
  auto other = Connect("other-job");
  EXPECT_EQ((*other)->AttachPersistent("ckpt").status().code(), absl::StatusCode::kNotFound);
  {
    auto reader = Connect();
    auto buf = (*reader)->AttachPersistent("ckpt");
    ASSERT_TRUE(buf.ok()) << buf.status();
    ASSERT_EQ((*buf)->size(), size_t{1} << 20);
    const auto* bytes = static_cast<const unsigned char*>((*buf)->data());
    EXPECT_TRUE(
        std::all_of(bytes, bytes + (*buf)->size(), [](unsigned char c) { return c == 0x5a; }));
  }
  EXPECT_EQ(Metric(R"(commd_allocations{backend="host",lifetime="PERSISTENT"})"), 1);
  // Unused for longer than its TTL: gone.
  absl::SleepFor(absl::Milliseconds(1500));
  auto late = Connect();
  EXPECT_EQ((*late)->AttachPersistent("ckpt").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Metric(R"(commd_allocations{backend="host",lifetime="PERSISTENT"})"), 0);
}

TEST(GroupsIsolationTest, AnotherUidSeesNothingOfThisJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (setpriv)";
  TempDir tmp;
  ::chmod(tmp.path().c_str(), 0755);  // let the other uid reach the runtime dir below
  std::ofstream(tmp.Join("commd.textproto"))
      << "socket_group: \"nogroup\"\nadmin_group: \"users\"\n";
  auto daemon = DaemonProcess::Start(tmp.Join("run"),
                                     {.extra_args = {"--config", tmp.Join("commd.textproto")}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ClientOptions options;
  options.runtime_dir = (*daemon)->runtime_dir();
  options.job_id = "job";
  auto owner = Client::Connect(options);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto buffer = (*owner)->AllocatePersistent("ckpt", 4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto group = (*owner)->JoinGroup({.name = "g", .rank = 0, .world_size = 1});
  ASSERT_TRUE(group.ok()) << group.status();

  // The same job name under uid 65534 is another namespace: NOT_FOUND, and no groups.
  ProcessResult other = RunProcess(
      {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", COMMD_TEST_CLIENT,
       "peek", "ckpt"},
      absl::Seconds(30), {"COMMD_RUNTIME_DIR=" + (*daemon)->runtime_dir(), "COMMD_JOB_ID=job"});
  EXPECT_THAT(other.output, HasSubstr("connected job"));
  EXPECT_THAT(other.output, HasSubstr("persistent NOT_FOUND"));
  EXPECT_THAT(other.output, HasSubstr("groups 0"));
  // A member of the admin group (here as a supplementary group) sees every job's groups.
  ProcessResult admin = RunProcess(
      {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--groups=100", COMMD_TEST_CLIENT,
       "peek", "ckpt"},
      absl::Seconds(30), {"COMMD_RUNTIME_DIR=" + (*daemon)->runtime_dir(), "COMMD_JOB_ID=job"});
  EXPECT_THAT(admin.output, HasSubstr("groups 1"));
  // Root is an admin: it sees every job's groups.
  auto all = (*owner)->ListGroups();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->groups_size(), 1);
}

TEST_F(GroupsTest, DaemonRestartGivesUnavailableThenWorksAgain) {
  auto waiting = Rank("g", 0, 2, "4096");
  ASSERT_TRUE(daemon_->WaitForLog("session opened", absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(daemon_->Stop(SIGKILL).ok());
  auto result = waiting->Wait(absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1);
  EXPECT_THAT(result->output, HasSubstr("UNAVAILABLE"));

  auto restarted = DaemonProcess::Start(tmp_.Join("run"));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  daemon_ = std::move(*restarted);
  auto a = Rank("g", 0, 2, "4096");
  auto b = Rank("g", 1, 2, "4096");
  for (auto* r : {a.get(), b.get()}) {
    auto done = r->Wait(absl::Seconds(60));
    ASSERT_TRUE(done.ok());
    EXPECT_EQ(done->exit_code, 0) << done->output;
  }
}

}  // namespace
}  // namespace commd::testing
