// The CPU barrier and exchange over a symmetric allocation's signal pads (protocols:
// kernels/signal_layout.h).
//
//   RETURN_IF_ERROR(HostBarrier(view, "all_reduce"));   // every rank's data is ready
//
//   HostExchange x(view, "all_reduce");                 // every rank's call, and small data
//   std::memcpy(x.own_payload(), input, bytes);
//   x.Send(words, bytes);
//   RETURN_IF_ERROR(x.WaitForAll());
//   Use(x.words(p), x.payload(p));
//
// Both block until every rank of the view has arrived at the same barrier (sent its message
// of the same exchange), the abort word is set (ABORTED) or the view's deadline passes
// (DEADLINE_EXCEEDED naming the ranks that did not arrive). Waits spin briefly, then sleep on
// a shared futex, so ranks may outnumber cores. Everything a rank wrote before arriving
// (sending) is visible to every rank after it leaves (has its message). One thread per rank
// and allocation at a time; the view must have been validated.
#ifndef COMMD_KERNELS_HOST_BARRIER_H_
#define COMMD_KERNELS_HOST_BARRIER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/host/comm_view.h"
#include "kernels/signal_layout.h"

namespace commd::kernels {

// One rank's wait for words of its own pad or exchange area to reach their targets, with the
// view's abort word, deadline, wait limit and heartbeat: spin, yield, then futex sleeps
// (barrier.cc says when). Internal to the barrier and the exchange.
class HostWait {
 public:
  enum class Result { kReached, kAborted, kDeadline };
  explicit HostWait(const HostCommView& view) : view_(view) {}
  ~HostWait();
  HostWait(const HostWait&) = delete;
  HostWait& operator=(const HostWait&) = delete;

  // `word` lies in this rank's own pad; its writer wakes it after storing (Wake below).
  // kReached whenever the word reached its target, even if the abort or the deadline came
  // first: a wait its peer has met never fails.
  Result Until(uint32_t* word, uint32_t target);
  // The writer's side: after storing `word` (seq_cst) in `owner`'s pad or area, wakes `owner`
  // when it may sleep.
  static void Wake(const HostCommView& view, int owner, uint32_t* word);

 private:
  const HostCommView& view_;
  bool sleeping_ = false;
  absl::Time last_beat_ = absl::InfinitePast();
  // The wait's deadline: the view's, or wait_limit after the first wait that needed the
  // clock (InfinitePast until then).
  absl::Time deadline_ = absl::InfinitePast();
};

// The node's online CPUs (read once): waits spin only while every rank can have one.
int OnlineCpus();

// `collective` names the caller in error messages ("all_reduce", "barrier").
absl::Status HostBarrier(const HostCommView& view, absl::string_view collective);

// The words a collective's exchange carries (kernels/signal_layout.h).
struct CallWords {
  uint32_t call = 0;       // 31-bit call hash << 1 | NaN/Inf found
  uint32_t nan_count = 0;  // saturated
  uint32_t count = 0;      // first tensor's count, saturated
  // kind | op << 4 | algorithm << 8 | dtype << 12 | tensors << 16 (broadcast: root << 16)
  uint32_t shape = 0;
};

// One exchange: constructing it takes this rank's next exchange on the view; the payload goes
// into own_payload() (at most payload_capacity() bytes), Send() passes the words and the first
// `payload_bytes` of it to every rank, WaitFor(p) returns once rank p's message is here (with
// HostBarrier's errors), after which words(p) and payload(p) read it, until this rank's next
// exchange on the view. Every rank takes one exchange where its peers do.
class HostExchange {
 public:
  HostExchange(const HostCommView& view, absl::string_view collective);
  HostExchange(const HostExchange&) = delete;
  HostExchange& operator=(const HostExchange&) = delete;

  std::byte* own_payload() const { return Slot(view_.rank, view_.rank) + kExchangePayloadOffset; }
  size_t payload_capacity() const;
  // payload_capacity() of every exchange on a view of `world_size` ranks.
  static size_t PayloadCapacity(int world_size);
  void Send(const CallWords& words, size_t payload_bytes);
  absl::Status WaitFor(int peer);
  absl::Status WaitForAll();

  CallWords words(int rank) const;
  const std::byte* payload(int rank) const {
    return Slot(view_.rank, rank) + kExchangePayloadOffset;
  }
  const HostCommView& view() const { return view_; }

 private:
  // Slot (parity, source) of `owner`'s exchange area.
  std::byte* Slot(int owner, int source) const;
  uint32_t* Flag(int owner, int source) const;

  const HostCommView& view_;
  absl::string_view collective_;
  size_t slot_bytes_;  // ExchangeSlotBytes of the view's world size
  uint32_t seq_ = 0;
  // Where this exchange's slots (its parity's) start in every exchange area: fixed for the
  // exchange, so a slot is one multiply-add from its owner's pad.
  size_t parity_offset_ = 0;
  HostWait wait_;
};

// Whether rank `peer` has sent this rank its message of this rank's next exchange on the
// allocation whose pad `own_pad` is this rank's (of `world_size` ranks): whether the peer has
// entered the collective that this rank is yet to enter. Reads this rank's own pad only and
// never blocks; meaningful only while no collective of this rank runs on the allocation (its
// own exchange count would move). Point-to-point's receive from any source asks it of each
// sender's channel.
bool PeerAwaitsNextExchange(const uint32_t* own_pad, int rank, int world_size, int peer);

// ABORTED when the view's abort word is set (checked on entry to every collective).
absl::Status CheckNotAborted(const HostCommView& view, absl::string_view collective);

}  // namespace commd::kernels

#endif  // COMMD_KERNELS_HOST_BARRIER_H_
