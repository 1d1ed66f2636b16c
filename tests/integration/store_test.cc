// The per-job store against the real daemon: its operations, waits completed by another
// process, waits abandoned by a dying one, job isolation, limits.
#include <signal.h>

#include <fstream>
#include <thread>

#include "commd/commd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace commd::testing {
namespace {

using ::testing::HasSubstr;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = StartDaemonWithConfig(tmp_, "limits { max_store_value_bytes: 1024 }");
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
  EXPECT_THAT(s.message(), HasSubstr("store keys still missing: missing-a, missing-b"));
}

TEST_F(StoreTest, AWaiterThatDiesLeavesNothingBehind) {
  auto waiting = ChildProcess::Start({COMMD_TEST_CLIENT, "store-wait", "never"},
                                     {"COMMD_RUNTIME_DIR=" + daemon_->runtime_dir()});
  ASSERT_TRUE(waiting.ok());
  for (int i = 0; i < 500 && Metric("commd_store_waiters") < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Metric("commd_store_waiters"), 1);
  ASSERT_TRUE((*waiting)->Stop(SIGKILL).ok());
  for (int i = 0; i < 500 && Metric("commd_store_waiters") > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Metric("commd_store_waiters"), 0);
}

TEST_F(StoreTest, JobsDoNotSeeEachOther) {
  ASSERT_TRUE(Connect("a")->store().Set("secret", "a's").ok());
  auto b = Connect("b");
  EXPECT_EQ(b->store().Get("secret").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(*b->store().Delete("secret"));
  EXPECT_EQ(*Connect("a")->store().Get("secret"), "a's");
}

TEST_F(StoreTest, LimitsAndBadInput) {
  auto client = Connect();
  const absl::Status big = client->store().Set("k", std::string(2000, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.message(), HasSubstr("limits.max_store_value_bytes 1024"));
  EXPECT_EQ(client->store().Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->store().Wait({}, absl::Seconds(1)).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(client->store().Set("t", "text").ok());
  EXPECT_EQ(client->store().Add("t", 1).status().code(), absl::StatusCode::kFailedPrecondition);
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

}  // namespace
}  // namespace commd::testing
