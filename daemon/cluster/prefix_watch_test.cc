// Where a watch resumes after each kind of answer etcd gives (ResumeRevision). The watch itself,
// against a real etcd, is in tests/integration/cluster_at_scale_test.cc.
#include "daemon/cluster/prefix_watch.h"

#include <cstdint>
#include <initializer_list>

#include "gtest/gtest.h"

namespace commd::cluster {
namespace {

pb::WatchResponse Events(int64_t header_revision, std::initializer_list<int64_t> revisions) {
  pb::WatchResponse r;
  r.mutable_header()->set_revision(header_revision);
  for (int64_t revision : revisions) {
    mvccpb::Event* e = r.add_events();
    e->mutable_kv()->set_key("/p/k");
    e->mutable_kv()->set_mod_revision(revision);
  }
  return r;
}

// A backlog comes in batches stamped with the store's current revision: resuming past the
// header would skip every event of the batches not yet sent.
TEST(ResumeRevisionTest, ABatchOfABacklogResumesPastItsLastEventNotPastTheHeader) {
  EXPECT_EQ(ResumeRevision(100, Events(5000, {100, 101, 1099})), 1100);
  EXPECT_EQ(ResumeRevision(1100, Events(5000, {1100, 2099})), 2100);
  // Events of one transaction share a revision.
  EXPECT_EQ(ResumeRevision(0, Events(40, {37, 37})), 38);
  // Never backwards.
  EXPECT_EQ(ResumeRevision(50, Events(60, {20})), 50);
}

TEST(ResumeRevisionTest, CreatedMovesOnlyAWatchFromNow) {
  pb::WatchResponse created = Events(700, {});
  created.set_created(true);
  // From now: everything after the revision it was created at is still to come.
  EXPECT_EQ(ResumeRevision(0, created), 701);
  // From revision 12: 12..700 are still to come.
  EXPECT_EQ(ResumeRevision(12, created), 12);
}

TEST(ResumeRevisionTest, AProgressNotificationMovesToItsRevision) {
  // etcd sends one only to a watch that has delivered everything up to its revision.
  EXPECT_EQ(ResumeRevision(12, Events(700, {})), 701);
  EXPECT_EQ(ResumeRevision(900, Events(700, {})), 900);
}

TEST(ResumeRevisionTest, ACompactionGoesOnFromTheOldestRevisionKept) {
  pb::WatchResponse compacted = Events(900, {});
  compacted.set_canceled(true);
  compacted.set_compact_revision(850);
  EXPECT_EQ(ResumeRevision(12, compacted), 850);
  // Cancelled for another reason (no leader): where it was.
  pb::WatchResponse canceled = Events(900, {});
  canceled.set_canceled(true);
  EXPECT_EQ(ResumeRevision(12, canceled), 12);
}

}  // namespace
}  // namespace commd::cluster
