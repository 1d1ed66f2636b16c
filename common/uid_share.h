// Per-uid shares of the daemon's limits (limits.per_uid): a tally of what each uid holds and
// the one wording of "over its share" every component uses.
//
//   UidTally buffers;
//   if (buffers.of(uid) + 1 > limit)
//     return UidShareExhausted(uid, buffers.of(uid), limit, "persistent buffers",
//                              "persistent_buffers");
//   buffers.Add(uid, 1);
//   ...
//   buffers.Sub(uid, 1);
//
// Not thread-safe: each owner guards its tally with its own lock.
#ifndef COMMD_COMMON_UID_SHARE_H_
#define COMMD_COMMON_UID_SHARE_H_

#include <sys/types.h>

#include <cstdint>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace commd {

// How much of something each uid holds. A uid holding nothing has no entry, so uids that
// come and go leave nothing behind.
class UidTally {
 public:
  uint64_t of(uid_t uid) const {
    auto it = held_.find(uid);
    return it == held_.end() ? 0 : it->second;
  }
  void Add(uid_t uid, uint64_t n) {
    if (n != 0) held_[uid] += n;
  }
  // Never below zero: a release the tally did not see is clamped, not wrapped.
  void Sub(uid_t uid, uint64_t n) {
    auto it = held_.find(uid);
    if (it == held_.end()) return;
    it->second = it->second > n ? it->second - n : 0;
    if (it->second == 0) held_.erase(it);
  }
  size_t uids() const { return held_.size(); }

 private:
  std::map<uid_t, uint64_t> held_;
};

// RESOURCE_EXHAUSTED: "uid 1001 holds 256 of its 256 persistent buffers
// (limits.per_uid.persistent_buffers)". `held` and `limit` are already formatted when they are
// byte counts; `field` is the PerUidLimits field.
inline absl::Status UidShareExhausted(uid_t uid, absl::string_view held, absl::string_view limit,
                                      absl::string_view what, absl::string_view field,
                                      absl::string_view asked = "") {
  return absl::ResourceExhaustedError(
      absl::StrCat("uid ", uid, " holds ", held, " of its ", limit, " ", what,
                   asked.empty() ? "" : absl::StrCat("; ", asked, " more would exceed it"),
                   " (limits.per_uid.", field, ")"));
}
inline absl::Status UidShareExhausted(uid_t uid, uint64_t held, uint64_t limit,
                                      absl::string_view what, absl::string_view field) {
  return UidShareExhausted(uid, absl::StrCat(held), absl::StrCat(limit), what, field);
}

}  // namespace commd

#endif  // COMMD_COMMON_UID_SHARE_H_
