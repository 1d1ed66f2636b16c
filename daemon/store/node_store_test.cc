// The node's store as the Store service's backend: answers come at once through `done`, in the
// session's namespace, and the store's gauges follow every change, waits included.
#include "daemon/store/node_store.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace commd::store {
namespace {

class NodeStoreTest : public ::testing::Test {
 protected:
  // The value of gauge `name` as the registry would export it.
  double Gauge(const std::string& name) {
    for (const auto& family : registry_.Collect()) {
      if (family.name == name) return family.metric.at(0).gauge.value;
    }
    ADD_FAILURE() << "no gauge " << name;
    return -1;
  }
  // Runs `call` with a `done` that keeps the answer, which must come before it returns.
  template <typename T, typename Call>
  absl::StatusOr<T> Now(Call call) {
    std::optional<absl::StatusOr<T>> answer;
    call([&](absl::StatusOr<T> r) { answer = std::move(r); });
    EXPECT_TRUE(answer.has_value()) << "no answer before the call returned";
    return answer.value_or(absl::UnknownError("no answer"));
  }

  server::TimerQueue timers_;
  KvStore kv_{{.max_wait = absl::Minutes(1)}, &timers_};
  prometheus::Registry registry_;
  NodeStore store_{&kv_, &registry_};
  server::Session job_{.token = "t", .job_id = "job", .uid = 1000};
};

TEST_F(NodeStoreTest, EveryOperationAnswersAtOnceInTheSessionsNamespace) {
  EXPECT_TRUE(*Now<bool>([&](auto done) { store_.Set(job_, "k", "v", done); }));
  EXPECT_EQ(*Now<std::string>([&](auto done) { store_.Get(job_, "k", done); }), "v");
  EXPECT_EQ(*kv_.Get({1000, "job"}, "k"), "v");
  EXPECT_EQ(*Now<int64_t>([&](auto done) { store_.Add(job_, "n", 5, done); }), 5);
  EXPECT_EQ(*Now<std::string>([&](auto done) { store_.CompareSet(job_, "k", "v", "w", done); }),
            "w");
  EXPECT_TRUE(*Now<bool>([&](auto done) { store_.Delete(job_, "k", done); }));
  EXPECT_FALSE(*Now<bool>([&](auto done) { store_.Delete(job_, "k", done); }));
  server::Session other = job_;
  other.job_id = "other";
  EXPECT_EQ(Now<int64_t>([&](auto done) { store_.Add(other, "n", 0, done); }).value_or(-1), 0);
  EXPECT_EQ(Now<std::string>([&](auto done) { store_.Get(other, "k", done); }).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(NodeStoreTest, GaugesFollowChanges) {
  EXPECT_TRUE(Now<bool>([&](auto done) { store_.Set(job_, "a", "12", done); }).ok());
  EXPECT_EQ(Gauge("commd_store_keys"), 1);
  EXPECT_EQ(Gauge("commd_store_bytes"), 3);  // key and value
  EXPECT_TRUE(Now<bool>([&](auto done) { store_.Delete(job_, "a", done); }).ok());
  EXPECT_EQ(Gauge("commd_store_keys"), 0);
  EXPECT_EQ(Gauge("commd_store_bytes"), 0);
}

TEST_F(NodeStoreTest, AWaitCountsUntilItEndsOrIsCancelled) {
  std::optional<absl::Status> waited;
  auto id = store_.Wait(job_, {"ready"}, absl::Minutes(1), [&](absl::Status s) { waited = s; });
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(Gauge("commd_store_waiters"), 1);
  EXPECT_TRUE(Now<bool>([&](auto done) { store_.Set(job_, "ready", "1", done); }).ok());
  ASSERT_TRUE(waited.has_value());
  EXPECT_TRUE(waited->ok()) << *waited;
  EXPECT_EQ(Gauge("commd_store_waiters"), 0);

  auto cancelled = store_.Wait(job_, {"never"}, absl::Minutes(1), [](absl::Status) {
    ADD_FAILURE() << "a cancelled wait is not answered";
  });
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(Gauge("commd_store_waiters"), 1);
  store_.CancelWait(*cancelled);
  EXPECT_EQ(Gauge("commd_store_waiters"), 0);
}

TEST_F(NodeStoreTest, ArgumentErrorsOfAWaitAreReturned) {
  auto id = store_.Wait(job_, {}, absl::Minutes(1), [](absl::Status) { ADD_FAILURE(); });
  EXPECT_FALSE(id.ok());
  EXPECT_EQ(Gauge("commd_store_waiters"), 0);
}

}  // namespace
}  // namespace commd::store
