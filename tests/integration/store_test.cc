// The per-job store against the real daemon: its operations, waits completed by another
// process, waits abandoned by a dying one, job and uid isolation, limits.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

// Small limits, so that each can be reached with little data.
constexpr char kConfig[] = R"(limits {
  max_store_keys_per_job: 8
  max_store_key_bytes: 32
  max_store_value_bytes: 1024
  max_store_bytes_per_job: 4096
  max_store_bytes: 6144
})";

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = StartDaemonWithConfig(tmp_, kConfig);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  std::unique_ptr<Client> Connect(const std::string& job = "job") {
    auto c = Client::Connect({.runtime_dir = daemon_->runtime_dir(), .job_id = job});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  ProcessResult TestClient(std::vector<std::string> args) {
    args.insert(args.begin(), COMMD_TEST_CLIENT);
    return RunProcess(args, absl::Seconds(60),
                      {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir(), "COMMD_JOB_ID=job"});
  }
  double Metric(const std::string& key) { return MetricValue(*daemon_, key); }
  // The daemon's open fds once the count holds still: a scrape's connection closes a moment
  // after its answer, so a count taken right after one can be one too high.
  int SettledFds() {
    int last = daemon_->CountOpenFds();
    for (int same = 0, i = 0; same < 5 && i < 250; ++i) {
      absl::SleepFor(absl::Milliseconds(20));
      const int now = daemon_->CountOpenFds();
      same = now == last ? same + 1 : 0;
      last = now;
    }
    return last;
  }

  TempDir tmp_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(StoreTest, EveryOperation) {
  auto client = Connect();
  Store& s = client->store();
  ASSERT_TRUE(s.Set("k", std::string("bin\0ary", 7)).ok());
  EXPECT_EQ(*s.Get("k"), std::string("bin\0ary", 7));
  EXPECT_EQ(s.Get("absent").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*s.Add("n", 3), 3);
  EXPECT_EQ(*s.Add("n", -10), -7);
  EXPECT_EQ(*s.CompareSet("c", "", "one"), "one");
  EXPECT_EQ(*s.CompareSet("c", "nope", "two"), "one");
  EXPECT_EQ(*s.CompareSet("c", "one", "two"), "two");
  EXPECT_TRUE(*s.Delete("c"));
  EXPECT_FALSE(*s.Delete("c"));
  EXPECT_TRUE(s.Wait({"k", "n"}, absl::Seconds(1)).ok());
  EXPECT_EQ(Metric("commd_store_keys"), 2);
}

TEST_F(StoreTest, WaitIsCompletedByAnotherProcess) {
  auto client = Connect();
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = client->store().Wait({"nccl_id"}, absl::Seconds(60)); });
  for (int i = 0; i < 500 && Metric("commd_store_waiters") < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ProcessResult setter = TestClient({"store-set", "nccl_id", "0123"});
  EXPECT_THAT(setter.output, HasSubstr("set"));
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(*client->store().Get("nccl_id"), "0123");
  EXPECT_EQ(Metric("commd_store_waiters"), 0);
}

TEST_F(StoreTest, WaitTimesOutNamingTheMissingKeys) {
  auto client = Connect();
  ASSERT_TRUE(client->store().Set("present", "1").ok());
  const absl::Status s =
      client->store().Wait({"present", "missing-a", "missing-b"}, absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("store keys still missing: \"missing-a\", \"missing-b\""));
}

TEST_F(StoreTest, AWaiterThatDiesLeavesNothingBehind) {
  // One client's whole life first, so that the baseline holds whatever the daemon opens
  // once (gRPC's and the exposer's lazily made fds).
  ASSERT_EQ(TestClient({"store-set", "warm", "1"}).exit_code, 0);
  for (int i = 0; i < 500 && Metric("commd_sessions") > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const double baseline_bytes = Metric("commd_store_bytes");
  const int baseline_fds = SettledFds();
  auto waiting = ChildProcess::Start({COMMD_TEST_CLIENT, "store-wait", "never"},
                                     {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir()});
  ASSERT_TRUE(waiting.ok());
  for (int i = 0; i < 500 && Metric("commd_store_waiters") < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Metric("commd_store_waiters"), 1);
  EXPECT_EQ(Metric("commd_store_bytes"), baseline_bytes + 5);  // the wait holds "never"
  EXPECT_GT(daemon_->CountOpenFds(), baseline_fds);
  ASSERT_TRUE((*waiting)->Stop(SIGKILL).ok());
  for (int i = 0; i < 500 && Metric("commd_store_waiters") > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Metric("commd_store_waiters"), 0);
  EXPECT_EQ(Metric("commd_store_bytes"), baseline_bytes);
  EXPECT_LE(SettledFds(), baseline_fds);
  // The key it waited for can still be set and waited on by others.
  auto client = Connect();
  ASSERT_TRUE(client->store().Set("never", "now").ok());
  EXPECT_TRUE(client->store().Wait({"never"}, absl::Seconds(1)).ok());
}

TEST_F(StoreTest, JobsDoNotSeeEachOther) {
  ASSERT_TRUE(Connect("a")->store().Set("secret", "a's").ok());
  auto b = Connect("b");
  EXPECT_EQ(b->store().Get("secret").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(*b->store().Delete("secret"));
  EXPECT_EQ(*Connect("a")->store().Get("secret"), "a's");
}

TEST_F(StoreTest, EachLimitIsNamedWithItsConfigField) {
  auto client = Connect();
  Store& s = client->store();
  const absl::Status value = s.Set("k", std::string(2000, 'x'));
  EXPECT_EQ(value.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(value.message(), "store value of 2000 bytes exceeds limits.max_store_value_bytes 1024");
  const absl::Status key = s.Set(std::string(33, 'k'), "v");
  EXPECT_EQ(key.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(key.message(), "store key of 33 bytes exceeds limits.max_store_key_bytes 32");
  EXPECT_EQ(s.Wait({std::string(33, 'k')}, absl::Seconds(1)).code(),
            absl::StatusCode::kResourceExhausted);

  // Four keys of 1 + 1000 bytes fill 4004 of the job's 4096 bytes.
  const std::string kilo(1000, 'x');
  for (const char* k : {"a", "b", "c", "d"}) ASSERT_TRUE(s.Set(k, kilo).ok()) << k;
  const absl::Status bytes = s.Set("e", kilo);
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bytes.message(),
            "store of job 'job' would hold 5005 bytes, over limits.max_store_bytes_per_job 4096");
  for (const char* k : {"e", "f", "g", "h"}) ASSERT_TRUE(s.Set(k, "").ok()) << k;
  const absl::Status keys = s.Set("i", "");
  EXPECT_EQ(keys.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(keys.message(), "job 'job' holds 8 store keys, at limits.max_store_keys_per_job 8");
  EXPECT_EQ(s.Add("i", 1).status().code(), absl::StatusCode::kResourceExhausted);

  // Another job has its own 4096 bytes, but the node's 6144 hold only 2136 more.
  auto other_client = Connect("other");
  Store& other = other_client->store();
  ASSERT_TRUE(other.Set("a", kilo).ok());
  ASSERT_TRUE(other.Set("b", kilo).ok());
  const absl::Status node = other.Set("c", kilo);
  EXPECT_EQ(node.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(node.message(),
            "the stores of all jobs would hold 7011 bytes, over limits.max_store_bytes 6144");
  EXPECT_EQ(Metric("commd_store_bytes"), 4004 + 4 + 2002);
  // Deleting gives the room back.
  EXPECT_TRUE(*s.Delete("a"));
  EXPECT_TRUE(other.Set("c", kilo).ok());
}

TEST_F(StoreTest, BadInput) {
  auto client = Connect();
  Store& s = client->store();
  EXPECT_EQ(s.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Wait({}, absl::Seconds(1)).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status forever = s.Wait({"k"}, absl::Hours(25));
  EXPECT_EQ(forever.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(forever.message(), HasSubstr("groups.max_timeout_ms"));
  ASSERT_TRUE(s.Set("t", "text").ok());
  EXPECT_EQ(s.Add("t", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.Set("max", "9223372036854775807").ok());
  EXPECT_EQ(s.Add("max", 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*s.Get("max"), "9223372036854775807");
}

TEST_F(StoreTest, ConcurrentAddsFromManyClientsAreExact) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto client = Connect();
      for (int i = 0; i < 1000; ++i) ASSERT_TRUE(client->store().Add("n", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*Connect()->store().Get("n"), "8000");
}

// The same job name under another uid is another store: neither sees the other's keys, and
// the other uid hears NOT_FOUND, never PERMISSION_DENIED (which would tell it the key exists).
TEST(StoreIsolationTest, AnotherUidSeesNoneOfThisJobsKeys) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (setpriv)";
  TempDir tmp;
  // uid 65534 must reach the sockets: it may search the test's dir (0755), and the daemon
  // gives its runtime dir (0750) and sockets (0660) to group nogroup, uid 65534's group.
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);
  auto daemon = StartDaemonWithConfig(tmp, "socket_group: \"nogroup\"");
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto owner = Client::Connect({.runtime_dir = (*daemon)->runtime_dir(), .job_id = "job"});
  ASSERT_TRUE(owner.ok()) << owner.status();
  ASSERT_TRUE((*owner)->store().Set("secret", "mine").ok());

  auto as_nobody = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                               "--clear-groups", COMMD_TEST_CLIENT});
    return RunProcess(args, absl::Seconds(30),
                      {"COMMD_RUNTIME_DIR=" + (*daemon)->runtime_dir(), "COMMD_JOB_ID=job"});
  };
  ProcessResult get = as_nobody({"store-get", "secret"});
  EXPECT_THAT(get.output, HasSubstr("connected job"));
  EXPECT_THAT(get.output, HasSubstr("got NOT_FOUND"));
  // Its own key of the same name lives beside the owner's and changes nothing of it.
  EXPECT_THAT(as_nobody({"store-set", "secret", "theirs"}).output, HasSubstr("set"));
  EXPECT_THAT(as_nobody({"store-get", "secret"}).output, HasSubstr("got OK theirs"));
  EXPECT_EQ(*(*owner)->store().Get("secret"), "mine");
  EXPECT_EQ(MetricValue(**daemon, "commd_store_keys"), 2);
}

}  // namespace
}  // namespace commd::testing
