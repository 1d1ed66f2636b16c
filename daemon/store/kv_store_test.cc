#include "daemon/store/kv_store.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace commd::store {
namespace {

const Namespace kJob{1000, "job"};

class KvStoreTest : public ::testing::Test {
 protected:
  server::TimerQueue timers_;
  KvStore store_{{.max_keys_per_job = 4,
                  .max_key_bytes = 8,
                  .max_value_bytes = 32,
                  .max_bytes_per_job = 64,
                  .max_bytes = 99,
                  .max_wait = absl::Minutes(1)},
                 &timers_};
};

TEST_F(KvStoreTest, SetGetDelete) {
  ASSERT_TRUE(store_.Set(kJob, "k", "v1").ok());
  EXPECT_EQ(*store_.Get(kJob, "k"), "v1");
  ASSERT_TRUE(store_.Set(kJob, "k", "v2").ok());
  EXPECT_EQ(*store_.Get(kJob, "k"), "v2");
  EXPECT_EQ(store_.key_count(), 1u);
  EXPECT_TRUE(*store_.Delete(kJob, "k"));
  EXPECT_FALSE(*store_.Delete(kJob, "k"));
  EXPECT_EQ(store_.Get(kJob, "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.key_count(), 0u);
}

TEST_F(KvStoreTest, NamespacesAreSeparate) {
  ASSERT_TRUE(store_.Set(kJob, "k", "mine").ok());
  EXPECT_EQ(store_.Get({1000, "other"}, "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.Get({1001, "job"}, "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(*store_.Delete({1001, "job"}, "k"));
  EXPECT_EQ(*store_.Get(kJob, "k"), "mine");
}

TEST_F(KvStoreTest, AddCountsAsDecimalText) {
  EXPECT_EQ(*store_.Add(kJob, "n", 5), 5);
  EXPECT_EQ(*store_.Add(kJob, "n", -7), -2);
  EXPECT_EQ(*store_.Get(kJob, "n"), "-2");
  ASSERT_TRUE(store_.Set(kJob, "t", "text").ok());
  EXPECT_EQ(store_.Add(kJob, "t", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_.Set(kJob, "big", "9223372036854775807").ok());
  EXPECT_EQ(store_.Add(kJob, "big", 1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(KvStoreTest, CompareSetFollowsTcpStoreRules) {
  EXPECT_EQ(*store_.CompareSet(kJob, "k", "", "first"), "first");  // absent matches ""
  EXPECT_EQ(*store_.CompareSet(kJob, "k", "wrong", "x"), "first");
  EXPECT_EQ(*store_.CompareSet(kJob, "k", "first", "second"), "second");
  EXPECT_EQ(*store_.CompareSet(kJob, "absent", "x", "y"), "");
  EXPECT_EQ(store_.Get(kJob, "absent").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(KvStoreTest, LimitsNameTheirField) {
  auto key = store_.Set(kJob, "123456789", "v");
  EXPECT_EQ(key.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(key.message().find("limits.max_store_key_bytes 8"), absl::string_view::npos);
  auto value = store_.Set(kJob, "k", std::string(33, 'x'));
  EXPECT_EQ(value.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(value.message().find("limits.max_store_value_bytes 32"), absl::string_view::npos);
  for (const char* k : {"a", "b", "c", "d"}) ASSERT_TRUE(store_.Set(kJob, k, "v").ok());
  auto count = store_.Set(kJob, "e", "v");
  EXPECT_EQ(count.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(count.message().find("limits.max_store_keys_per_job"), absl::string_view::npos);
  EXPECT_TRUE(store_.Set(kJob, "a", "overwriting is fine").ok());
  EXPECT_EQ(store_.Add(kJob, "e", 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_.CompareSet(kJob, "e", "", "v").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store_.Set({1000, "another"}, "e", "v").ok());  // the limit is per job
  EXPECT_TRUE(*store_.Delete(kJob, "a"));
  EXPECT_TRUE(store_.Set(kJob, "e", "v").ok());  // a deleted key frees its place
  EXPECT_EQ(store_.Set(kJob, "", "v").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, BytesAreBoundedPerJobAndPerNode) {
  const std::string v32(32, 'x');
  ASSERT_TRUE(store_.Set(kJob, "a", v32).ok());                   // 33 bytes
  ASSERT_TRUE(store_.Set(kJob, "b", std::string(30, 'x')).ok());  // 64: the job's limit
  EXPECT_EQ(store_.byte_count(), 64u);
  auto job = store_.Set(kJob, "c", "");
  EXPECT_EQ(job.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(job.message(),
            "store of job 'job' would hold 65 bytes, over limits.max_store_bytes_per_job 64");
  // Growing a value counts its growth; shrinking one gives bytes back.
  EXPECT_EQ(store_.Set(kJob, "b", std::string(31, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store_.Set(kJob, "b", "").ok());
  EXPECT_EQ(store_.byte_count(), 34u);
  ASSERT_TRUE(store_.Set({1000, "x"}, "a", v32).ok());  // 67 on the node
  auto node = store_.Set({1000, "y"}, "a", v32);
  EXPECT_EQ(node.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(node.message(),
            "the stores of all jobs would hold 100 bytes, over limits.max_store_bytes 99");
  // A pending wait holds its keys' bytes until it ends.
  auto id = store_.Wait({1000, "y"}, {"12345678"}, absl::Minutes(1), [](absl::Status) {});
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(store_.byte_count(), 75u);
  store_.CancelWait(*id);
  EXPECT_EQ(store_.byte_count(), 67u);
  EXPECT_TRUE(*store_.Delete({1000, "x"}, "a"));
  EXPECT_TRUE(*store_.Delete(kJob, "a"));
  EXPECT_TRUE(*store_.Delete(kJob, "b"));
  EXPECT_EQ(store_.byte_count(), 0u);
  EXPECT_EQ(store_.key_count(), 0u);
}

TEST_F(KvStoreTest, FailedWritesLeaveNothingBehind) {
  EXPECT_EQ(*store_.CompareSet(kJob, "k", "not there", "v"), "");
  EXPECT_FALSE(store_.Set(kJob, "k", std::string(33, 'x')).ok());
  EXPECT_EQ(store_.Get(kJob, "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_.key_count(), 0u);
  EXPECT_EQ(store_.byte_count(), 0u);
}

TEST_F(KvStoreTest, WaitCompletesWhenTheLastKeyAppears) {
  absl::Notification done;
  absl::Status result;
  auto id = store_.Wait(kJob, {"a", "b"}, absl::Seconds(30), [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(store_.Set(kJob, "a", "1").ok());
  ASSERT_TRUE(store_.Set({1000, "other"}, "b", "not this job's").ok());
  EXPECT_FALSE(done.HasBeenNotified());
  ASSERT_TRUE(store_.Set(kJob, "b", "2").ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(store_.waiter_count(), 0u);
  EXPECT_EQ(store_.byte_count(), 2u + 2u + (1u + 14u));  // no bytes held for the wait
}

TEST_F(KvStoreTest, WaitForKeysThatExistCompletesAtOnce) {
  ASSERT_TRUE(store_.Set(kJob, "k", "v").ok());
  absl::Status result = absl::UnknownError("not called");
  ASSERT_TRUE(
      store_.Wait(kJob, {"k"}, absl::ZeroDuration(), [&](absl::Status s) { result = s; }).ok());
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(store_.waiter_count(), 0u);
}

TEST_F(KvStoreTest, WaitTimesOutNamingTheMissingKeys) {
  ASSERT_TRUE(store_.Set(kJob, "here", "1").ok());
  absl::Notification done;
  absl::Status result;
  ASSERT_TRUE(store_
                  .Wait(kJob, {"here", "x", "y"}, absl::Milliseconds(50),
                        [&](absl::Status s) {
                          result = s;
                          done.Notify();
                        })
                  .ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(result.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(result.message(), "store keys still missing: \"x\", \"y\"");
  EXPECT_EQ(store_.waiter_count(), 0u);
  EXPECT_EQ(store_.byte_count(), 5u);  // "here" = "1"; the wait's bytes were given back
}

// A Wait may name 1024 keys: its timeout names a few, quoted, and counts the rest.
TEST_F(KvStoreTest, TimedOutWaitNamesAFewMissingKeys) {
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) keys.push_back(absl::StrCat("k", i));
  absl::Notification done;
  absl::Status result;
  ASSERT_TRUE(store_
                  .Wait(kJob, keys, absl::Milliseconds(10),
                        [&](absl::Status s) {
                          result = s;
                          done.Notify();
                        })
                  .ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(result.message(),
            "store keys still missing: \"k0\", \"k1\", \"k10\", \"k11\", \"k12\", "
            "\"k13\", \"k14\", \"k15\" and 12 more");
  EXPECT_EQ(store_.Get(kJob, "k\x01").status().message(), "no store key \"k\\001\" in job 'job'");
}

TEST_F(KvStoreTest, CancelledWaitNeverCalls) {
  std::atomic<int> calls{0};
  auto id = store_.Wait(kJob, {"k"}, absl::Milliseconds(30), [&](absl::Status) { ++calls; });
  ASSERT_TRUE(id.ok());
  store_.CancelWait(*id);
  ASSERT_TRUE(store_.Set(kJob, "k", "v").ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(store_.waiter_count(), 0u);
}

TEST_F(KvStoreTest, BadWaits) {
  auto cb = [](absl::Status) {};
  EXPECT_EQ(store_.Wait(kJob, {}, absl::Seconds(1), cb).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Wait(kJob, {"k"}, absl::Hours(2), cb).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.Wait(kJob, {"k"}, -absl::Seconds(1), cb).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, ConcurrentAddsAreExact) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) ASSERT_TRUE(store_.Add(kJob, "n", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store_.Get(kJob, "n"), "8000");
}

// A uid's jobs share one budget of keys and bytes (limits.per_uid.store_*); another uid's
// budget is untouched, and deleting gives the share back.
TEST(KvStoreUidShareTest, JobsOfOneUidShareItsKeysAndBytes) {
  server::TimerQueue timers;
  KvStore store({.max_keys_per_job = 100,
                 .max_key_bytes = 8,
                 .max_value_bytes = 64,
                 .max_bytes_per_job = 1000,
                 .max_bytes = 10000,
                 .max_keys_per_uid = 3,
                 .max_bytes_per_uid = 100},
                &timers);
  ASSERT_TRUE(store.Set({1001, "a"}, "k1", "v").ok());
  ASSERT_TRUE(store.Set({1001, "b"}, "k2", "v").ok());
  ASSERT_TRUE(store.Set({1001, "c"}, "k3", "v").ok());
  const absl::Status keys = store.Set({1001, "d"}, "k4", "v");
  EXPECT_EQ(keys.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(keys.message(), "uid 1001 holds 3 of its 3 store keys (limits.per_uid.store_keys)");
  // Overwriting a key adds none.
  EXPECT_TRUE(store.Set({1001, "a"}, "k1", "longer").ok());
  EXPECT_EQ(store.key_count(1001), 3u);
  EXPECT_TRUE(store.Set({1002, "a"}, "k1", "v").ok());
  EXPECT_TRUE(*store.Delete({1001, "b"}, "k2"));
  EXPECT_TRUE(store.Set({1001, "d"}, "k4", std::string(60, 'x')).ok());
  // 8 + 3 + 62 bytes held; growing k3's value by 59 would pass 100.
  const absl::Status bytes = store.Set({1001, "c"}, "k3", std::string(60, 'x'));
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bytes.message(),
            "uid 1001 holds 73 of its 100 bytes of store; 59 more would exceed it "
            "(limits.per_uid.store_bytes)");
  // A wait's keys are charged to the uid too.
  EXPECT_EQ(store
                .Wait({1001, "e"},
                      {std::string(8, 'w'), std::string(8, 'x'), std::string(8, 'y'),
                       std::string(8, 'z')},
                      absl::Minutes(1), [](absl::Status) {})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.byte_count(1001), 73u);
  EXPECT_EQ(store.byte_count(1002), 3u);
}

}  // namespace
}  // namespace commd::store
